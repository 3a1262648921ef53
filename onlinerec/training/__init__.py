"""The Lightning side: the module that carries per-stream state, the strategies, callbacks and checkpoint IO."""

from onlinerec.training._lightning import StepProgressBar
from onlinerec.training.callbacks import FiniteGuard, NonFiniteError
from onlinerec.training.checkpoint import AtomicCheckpointIO, drop_carried_state, load_checkpoint_file
from onlinerec.training.module import OnlineRecurrentModule
from onlinerec.training.strategies import (
    STRATEGIES,
    OnlineStrategy,
    RTRLStrategy,
    SnAPStrategy,
    TBPTTStrategy,
    make_strategy,
)
from onlinerec.training.stream_order import StreamOrderError, check_stream_order

__all__ = [
    "STRATEGIES",
    "AtomicCheckpointIO",
    "FiniteGuard",
    "NonFiniteError",
    "OnlineRecurrentModule",
    "OnlineStrategy",
    "RTRLStrategy",
    "SnAPStrategy",
    "StepProgressBar",
    "StreamOrderError",
    "TBPTTStrategy",
    "check_stream_order",
    "drop_carried_state",
    "load_checkpoint_file",
    "make_strategy",
]
