"""Lightning strategies that pick the gradient method: ``Trainer(strategy=RTRLStrategy(M=50))``.

Each is a :class:`~lightning.pytorch.strategies.DDPStrategy`, so the same object trains on one device and
under DDP on several processes or nodes. With a world size of 1 it neither starts a process group nor wraps
the model, and behaves like Lightning's single-device strategy.
"""

from __future__ import annotations

from typing import Any, ClassVar

from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO
from lightning.pytorch.strategies import DDPStrategy, Strategy, StrategyRegistry
from torch.nn import Module
from typing_extensions import override

from onlinerec.checkpoint import AtomicCheckpointIO
from onlinerec.gradients.base import GradientMethod
from onlinerec.gradients.rtrl import RTRL
from onlinerec.gradients.snap import SnAP
from onlinerec.gradients.tbptt import TBPTT


def check_segment_length(M: Any) -> int:
    if isinstance(M, bool) or not isinstance(M, int) or M < 1:
        raise ValueError(f"M (steps between weight updates) must be an int >= 1, got {M!r}. M = 1 is fully online learning.")
    return M


class OnlineStrategy(DDPStrategy):
    """Base of the onlinerec strategies: a segment length ``M`` and a :class:`GradientMethod`.

    ``M`` is the one source of truth for segment length: data modules read ``trainer.strategy.M``.
    Extra keyword arguments go to :class:`DDPStrategy` (and on to ``DistributedDataParallel``). Each rank
    owns its streams; their carried state lives outside the module's buffers, so DDP never overwrites it.
    Checkpoints are written atomically and loaded weights-only (:class:`~onlinerec.checkpoint.AtomicCheckpointIO`)
    unless ``checkpoint_io=`` (or a ``CheckpointIO`` plugin) says otherwise.
    """

    strategy_name: ClassVar[str]

    def __init__(self, M: int = 50, **kwargs: Any) -> None:
        self.M = check_segment_length(M)
        super().__init__(**kwargs)
        self.method: GradientMethod = self._make_method()

    def _make_method(self) -> GradientMethod:
        raise NotImplementedError

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.num_processes

    @property  # type: ignore[override]
    def checkpoint_io(self) -> CheckpointIO:
        io = self._checkpoint_io
        if io is None:
            self._checkpoint_io = io = AtomicCheckpointIO()
        elif isinstance(io, _WrappingCheckpointIO) and io.checkpoint_io is None:
            io.checkpoint_io = AtomicCheckpointIO()
        return io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO | None) -> None:
        self._checkpoint_io = io

    @override
    def _configure_launcher(self) -> None:
        if self.world_size > 1 or self.cluster_environment is None or self.cluster_environment.creates_processes_externally:
            super()._configure_launcher()

    @override
    def setup(self, trainer: Any) -> None:
        # As a DDPStrategy (even on one device), Lightning would put a DistributedSampler into every map-style
        # DataLoader, a shuffling one for training. Segments must come in stream order, and under DDP every rank
        # serves its own streams (data modules shard by trainer.global_rank), so no sampler is injected.
        connector = getattr(trainer, "_accelerator_connector", None)
        if connector is not None:
            connector.use_distributed_sampler = False
        if self.world_size > 1:
            super().setup(trainer)
        else:  # one process: the plain single-device path (no DDP wrapper, no module-state sync without a process group)
            Strategy.setup(self, trainer)

    @override
    def _setup_model(self, model: Module) -> Module:
        return super()._setup_model(model) if self.world_size > 1 else model

    @override
    def setup_distributed(self) -> None:
        if self.world_size > 1:
            super().setup_distributed()
        else:
            self.set_world_ranks()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(M={self.M}, method={self.method!r})"

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        name = getattr(cls, "strategy_name", None)
        if name and name not in strategy_registry:
            strategy_registry.register(name, cls, description=f"onlinerec {cls.__name__} (M=50 unless given)")


class RTRLStrategy(OnlineStrategy):
    """Exact RTRL for element-wise cells; weights update every M steps (design §4.1)."""

    strategy_name = "rtrl"

    def __init__(self, M: int = 50, carry: str = "batched", **kwargs: Any) -> None:
        self._carry = carry
        super().__init__(M, **kwargs)

    def _make_method(self) -> GradientMethod:
        return RTRL(carry=self._carry)  # type: ignore[arg-type]


class TBPTTStrategy(OnlineStrategy):
    """Truncated BPTT: backprop within each M-step segment only."""

    strategy_name = "tbptt"

    def _make_method(self) -> GradientMethod:
        return TBPTT()


class SnAPStrategy(OnlineStrategy):
    """SnAP-n (n = 1): exact on element-wise cells, a diagonal approximation on fully recurrent ones."""

    strategy_name = "snap"

    def __init__(self, M: int = 50, n: int = 1, **kwargs: Any) -> None:
        self.n = n
        super().__init__(M, **kwargs)

    def _make_method(self) -> GradientMethod:
        return SnAP(n=self.n)


for _cls in (RTRLStrategy, TBPTTStrategy, SnAPStrategy):
    _cls.register_strategies(StrategyRegistry)

STRATEGIES = {cls.strategy_name: cls for cls in (RTRLStrategy, TBPTTStrategy, SnAPStrategy)}
