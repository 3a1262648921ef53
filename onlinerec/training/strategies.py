"""Lightning strategies that pick the gradient method: ``Trainer(strategy=RTRLStrategy(M=50))``.

Each is a :class:`~lightning.pytorch.strategies.DDPStrategy`, so the same object trains on one device and under DDP
on several processes or nodes. With a world size of 1 it neither starts a process group nor wraps the model, and
behaves like Lightning's single-device strategy. The method comes from :data:`onlinerec.gradients.METHODS`: every
registered name is also a Trainer alias (``Trainer(strategy="rtrl")``, M = 50).
"""

from __future__ import annotations

import atexit
import inspect
import os
from typing import Any, ClassVar

import torch
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import DDPStrategy, Strategy, StrategyRegistry
from lightning.pytorch.utilities import rank_zero_info
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from onlinerec.data.segment import check_segment_length
from onlinerec.gradients import METHODS, GradientMethod
from onlinerec.training._lightning import complete_checkpoint_io, keep_loader_order
from onlinerec.training.checkpoint import AtomicCheckpointIO

__all__ = ["STRATEGIES", "OnlineStrategy", "RTRLStrategy", "SnAPStrategy", "TBPTTStrategy", "make_strategy"]


def _check_ddp_kwargs(cls: type, kwargs: dict[str, Any]) -> None:
    """DDPStrategy forwards unknown keyword arguments to DistributedDataParallel, which would reject a typo only when
    (and if) a multi-process run wraps the model; refuse it now, naming the accepted ones."""
    accepted = set(inspect.signature(DDPStrategy.__init__).parameters) | set(
        inspect.signature(DistributedDataParallel.__init__).parameters
    )
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise TypeError(
            f"{cls.__name__} got unexpected keyword argument(s) {unknown}: it takes M, its method's options, and the "
            "arguments of Lightning's DDPStrategy and torch's DistributedDataParallel."
        )


class OnlineStrategy(DDPStrategy):
    """A segment length ``M`` and a :class:`~onlinerec.gradients.GradientMethod`, as a Lightning strategy.

    ``M`` is the one source of truth for segment length: data modules read ``trainer.strategy.M``.
    ``method`` is a registered name ("rtrl", "tbptt", "snap"), a class path or a GradientMethod instance.
    Extra keyword arguments go to :class:`DDPStrategy` (and on to ``DistributedDataParallel``). Each rank owns its
    streams; their carried state lives outside the module's buffers, so DDP never overwrites it. Checkpoints are
    written atomically and loaded weights-only (:class:`~onlinerec.training.checkpoint.AtomicCheckpointIO`) unless
    ``checkpoint_io=`` (or a ``CheckpointIO`` plugin) says otherwise.
    """

    default_method: ClassVar[str | None] = None

    def __init__(
        self, M: int = 50, method: str | GradientMethod | None = None, threads: int | str | None = "auto", **kwargs: Any
    ) -> None:
        self.M = check_segment_length(M)
        if not (threads is None or threads == "auto" or (isinstance(threads, int) and threads >= 1)):
            raise ValueError(f"threads must be 'auto', None or an int >= 1, got {threads!r}.")
        self.threads = threads
        method = self.default_method if method is None else method
        if method is None:
            raise ValueError(
                f"OnlineStrategy needs a gradient method: one of {sorted(METHODS)}, a class path or an instance."
            )
        self.method: GradientMethod = METHODS.build(method)
        _check_ddp_kwargs(type(self), kwargs)
        super().__init__(**kwargs)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.num_processes

    @property  # type: ignore[override]
    def checkpoint_io(self) -> CheckpointIO:
        self._checkpoint_io = complete_checkpoint_io(self._checkpoint_io, AtomicCheckpointIO())
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO | None) -> None:
        self._checkpoint_io = io

    # One process: neither a launcher (so notebooks work), nor a process group, nor a DDP wrapper.
    @override
    def _configure_launcher(self) -> None:
        if (
            self.world_size > 1
            or self.cluster_environment is None
            or self.cluster_environment.creates_processes_externally
        ):
            super()._configure_launcher()

    @override
    def setup(self, trainer: Any) -> None:
        keep_loader_order(trainer)
        if self.root_device.type == "cpu":
            set_cpu_threads(self.threads)
        if self.world_size > 1:
            super().setup(trainer)
        else:
            Strategy.setup(self, trainer)

    @override
    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Before a training batch moves to the device, the module checks its stream order on the host (no wait for
        the device, as the same check on the moved batch would need)."""
        model = self.lightning_module
        trainer = getattr(model, "_trainer", None)
        if trainer is not None and trainer.training and hasattr(model, "_check_order_on_host"):
            model._check_order_on_host(batch)
        return super().batch_to_device(batch, device, dataloader_idx)

    @override
    def _setup_model(self, model: Module) -> Module:
        return super()._setup_model(model) if self.world_size > 1 else model

    @override
    def setup_distributed(self) -> None:
        if self.world_size > 1:
            super().setup_distributed()
            destroy_process_group_at_exit()
        else:
            self.set_world_ranks()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(M={self.M}, method={self.method!r})"


def destroy_process_group_at_exit() -> None:
    """Destroy the default process group when the interpreter exits, while Python is still alive (once per process).

    Lightning registers this for NCCL only. A gloo process group left to the interpreter's finalisation can abort
    the process (SIGABRT, "terminate called without an active exception") after training has finished and
    every checkpoint was written, so that a successful CPU DDP run exits with status -6.
    """
    atexit.unregister(_destroy_process_group)  # registered once however many fits run in this process
    atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # a no-op when the user destroyed it already
        dist.destroy_process_group()


def set_cpu_threads(threads: int | str | None) -> None:
    """Apply a strategy's ``threads`` to torch on the CPU: an int sets it, None leaves torch alone, and "auto" uses one
    thread on machines with at most 4 cores unless the thread count was chosen already (``OMP_NUM_THREADS``, or
    ``torch.set_num_threads`` to anything but torch's default). Measured on the 2-core development machine
    (``benchmarks/threads.py``, README): one thread is 1.2-1.6x faster for onlinerec's workloads, and 3-6x under load."""
    if threads is None:
        return
    if threads != "auto":
        torch.set_num_threads(int(threads))
        return
    chosen = (
        any(os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"))
        or torch.get_num_threads() != _TORCH_DEFAULT
    )
    if not chosen and (os.cpu_count() or 1) <= 4 and torch.get_num_threads() > 1:
        torch.set_num_threads(1)
        rank_zero_info(
            "onlinerec: 1 torch thread on this CPU (faster for recurrent models on small machines); "
            "RTRLStrategy(..., threads=None) keeps torch's default, threads=n sets n."
        )


_TORCH_DEFAULT = torch.get_num_threads()  # torch's own choice, before anyone changes it (read at import)


class RTRLStrategy(OnlineStrategy):
    """Exact RTRL for element-wise cells; weights update every M steps (docs/rtrl.md)."""

    default_method = "rtrl"

    def __init__(self, M: int = 50, **kwargs: Any) -> None:
        super().__init__(M, **kwargs)


class TBPTTStrategy(OnlineStrategy):
    """Truncated BPTT: backprop within each M-step segment only."""

    default_method = "tbptt"

    def __init__(self, M: int = 50, **kwargs: Any) -> None:
        super().__init__(M, **kwargs)


class SnAPStrategy(OnlineStrategy):
    """SnAP-n (n = 1): exact on element-wise cells, a diagonal approximation on fully recurrent ones."""

    default_method = "snap"

    def __init__(self, M: int = 50, n: int = 1, **kwargs: Any) -> None:
        self.n = n
        super().__init__(M, method=METHODS["snap"](n=n), **kwargs)


STRATEGIES: dict[str, type[OnlineStrategy]] = {
    cls.default_method: cls for cls in (RTRLStrategy, TBPTTStrategy, SnAPStrategy) if cls.default_method
}
"""The strategy class of each built-in method name (others take :class:`OnlineStrategy` with ``method=name``)."""


def make_strategy(method: str | GradientMethod, M: int = 50, **kwargs: Any) -> OnlineStrategy:
    """The strategy for a method name (any name in :data:`~onlinerec.gradients.METHODS`), class path or instance."""
    if isinstance(method, str) and method.lower() in STRATEGIES:
        return STRATEGIES[method.lower()](M=M, **kwargs)
    return OnlineStrategy(M=M, method=method, **kwargs)


def register_strategy_aliases() -> None:
    """Make every registered method name a Trainer alias (``Trainer(strategy="rtrl")``) with M = 50."""
    for name in METHODS:
        if name not in StrategyRegistry:
            cls = STRATEGIES.get(name, OnlineStrategy)
            init = {} if name in STRATEGIES else {"method": name}
            StrategyRegistry.register(name, cls, description=f"onlinerec {cls.__name__} (M=50 unless given)", **init)


register_strategy_aliases()
