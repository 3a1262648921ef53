"""onlinerec: train recurrent networks online with untruncated gradients (RTRL) in PyTorch Lightning.

Layers, each importing only from the ones before it: ``cells`` -> ``gradients`` (pure torch) and ``data`` (streams)
-> ``training`` (the Lightning side) -> ``tasks`` (supervised models) and ``rl`` (R2AC) -> ``cli``.
See docs/architecture.md.
"""

from onlinerec.cells import (
    CELLS,
    ElementwiseCell,
    ELSTMCell,
    FELSTMCell,
    FullyRecurrentCell,
    GRUCell,
    IndRNNCell,
    LRUCell,
    LSTMCell,
    MinGRUCell,
    MinLSTMCell,
    QRNNCell,
    RTUCell,
    SRUCell,
    Stack,
    make_cell,
)
from onlinerec.data import Segment, SegmentStream
from onlinerec.gradients import (
    METHODS,
    RTRL,
    TBPTT,
    Carry,
    ClosedFormMismatchError,
    GradientMethod,
    NotElementwiseError,
    SnAP,
    StackCarry,
    check_gradients,
)
from onlinerec.registry import Registry
from onlinerec.training import (
    STRATEGIES,
    AtomicCheckpointIO,
    FiniteGuard,
    NonFiniteError,
    OnlineRecurrentModule,
    OnlineStrategy,
    RTRLStrategy,
    SnAPStrategy,
    StreamOrderError,
    TBPTTStrategy,
    make_strategy,
)

__version__ = "0.2.0"

__all__ = [
    "CELLS",
    "METHODS",
    "RTRL",
    "STRATEGIES",
    "TBPTT",
    "AtomicCheckpointIO",
    "Carry",
    "ELSTMCell",
    "ElementwiseCell",
    "FELSTMCell",
    "FiniteGuard",
    "FullyRecurrentCell",
    "GRUCell",
    "IndRNNCell",
    "LRUCell",
    "LSTMCell",
    "MinGRUCell",
    "MinLSTMCell",
    "GradientMethod",
    "NonFiniteError",
    "ClosedFormMismatchError",
    "NotElementwiseError",
    "OnlineRecurrentModule",
    "OnlineStrategy",
    "QRNNCell",
    "RTRLStrategy",
    "RTUCell",
    "Registry",
    "SRUCell",
    "Segment",
    "SegmentStream",
    "SnAP",
    "SnAPStrategy",
    "Stack",
    "StackCarry",
    "StreamOrderError",
    "TBPTTStrategy",
    "check_gradients",
    "make_cell",
    "make_strategy",
]
