"""Callbacks that keep an online run safe: stop on non-finite numbers; refuse loaders that reorder streams.

:class:`FiniteGuard` is added to every fit of an :class:`~onlinerec.OnlineRecurrentModule` by the module's
``configure_callbacks`` (unless the Trainer already has one; ``Trainer(callbacks=[FiniteGuard(enabled=False)])``
turns it off). :func:`check_stream_order` runs once, when the first training segment is unrolled.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SubsetRandomSampler, WeightedRandomSampler
from torch.utils.data.distributed import DistributedSampler
from typing_extensions import override

__all__ = ["FiniteGuard", "NonFiniteError", "StreamOrderError", "check_stream_order"]


class NonFiniteError(FloatingPointError):
    """Training produced a NaN or infinite loss or gradient; raised by :class:`FiniteGuard`."""


class FiniteGuard(Callback):
    """Stop training at the first NaN/inf loss or gradient, before the optimizer applies it.

    The check runs after backward and DDP's gradient all-reduce, before gradient clipping and the optimizer step
    (Lightning's ``on_before_optimizer_step``). On a non-finite value it raises :class:`NonFiniteError` naming the
    global step, epoch and batch, the loss value, and the parameters whose gradients are not finite. The step is
    not applied, so the parameters stay those of the last good step, and no checkpoint is written after it: the
    last checkpoint ModelCheckpoint wrote stays the last good one (the message names it).

    Under DDP the decision is taken jointly (one boolean all-reduce per checked step) so that every rank stops at
    the same step instead of one rank hanging in the next collective. With mixed precision and a gradient scaler
    (``precision="16-mixed"``), inf/NaN gradients are the scaler's normal overflow signal (it skips that step and
    lowers its scale), so only the loss is checked there.

    Args:
        enabled: False turns the guard off (pass ``FiniteGuard(enabled=False)`` to the Trainer).
        check_grads: also check gradients (one pass over them per checked step).
        every_n_steps: check every n-th optimizer step only (1 = every step).
    """

    def __init__(self, enabled: bool = True, check_grads: bool = True, every_n_steps: int = 1) -> None:
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be an int >= 1, got {every_n_steps!r}.")
        self.enabled = enabled
        self.check_grads = check_grads
        self.every_n_steps = every_n_steps
        self._losses: list[Tensor] = []  # losses backpropagated since the last optimizer step
        self._batch_idx: int | None = None

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self._batch_idx = batch_idx

    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        if self.enabled:
            self._losses.append(loss.detach())

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer) -> None:
        losses, self._losses = self._losses, []
        if not self.enabled or trainer.global_step % self.every_n_steps != 0:
            return
        named = []
        if self.check_grads and not _has_grad_scaler(trainer):
            named = [(n, p.grad) for n, p in pl_module.named_parameters() if p.grad is not None]
        checks = [torch.isfinite(x).all() for x in losses] + [torch.isfinite(g).all() for _, g in named]
        ok = torch.stack(checks).cpu().tolist() if checks else []  # one device sync
        bad_losses = [float(x.float().sum()) for x, fine in zip(losses, ok) if not fine]
        bad_grads = [n for (n, _), fine in zip(named, ok[len(losses) :]) if not fine]
        local = bool(bad_losses or bad_grads)
        stop = trainer.strategy.reduce_boolean_decision(local, all=False) if trainer.world_size > 1 else local
        if stop:
            raise NonFiniteError(self._message(trainer, bad_losses[0] if bad_losses else None, bad_grads, local))

    def _message(self, trainer: L.Trainer, bad_loss: float | None, bad_grads: list[str], local: bool) -> str:
        step = trainer.global_step  # optimizer steps finished; Lightning names checkpoints "step=<this>"
        what = []
        if bad_loss is not None:
            what.append(f"the loss is {bad_loss}")
        if bad_grads:
            shown = ", ".join(bad_grads[:8]) + (f" and {len(bad_grads) - 8} more" if len(bad_grads) > 8 else "")
            what.append(f"gradients of {shown} are not finite")
        if not local:
            what.append(f"another rank saw a non-finite loss or gradient (this is rank {trainer.global_rank})")
        cb = trainer.checkpoint_callback
        ckpt = (getattr(cb, "last_model_path", "") or getattr(cb, "best_model_path", "")) if cb is not None else ""
        last = f" The last checkpoint, {ckpt}, was written before it and is intact." if ckpt else ""
        return (
            f"FiniteGuard stopped training at global step {step} (epoch {trainer.current_epoch}, batch {self._batch_idx}): "
            f"{'; '.join(what)}. This step's update was not applied: the parameters are those after {step} steps.{last} "
            "Lower the learning rate, clip gradients (Trainer(gradient_clip_val=...)), or inspect this batch; "
            "Trainer(callbacks=[FiniteGuard(enabled=False)]) turns this check off."
        )


def _has_grad_scaler(trainer: L.Trainer) -> bool:
    return getattr(trainer.precision_plugin, "scaler", None) is not None


# -- stream order ---------------------------------------------------------------------------------------------
class StreamOrderError(ValueError):
    """The training data would hand a stream's carried state to another stream (shuffling, interleaving)."""


_ADVICE = (
    "onlinerec carries each stream's state from one training batch to the next, so batch k+1 must continue the "
    "streams of batch k, slot for slot. Serve Segments in order: a SegmentStream, a SequenceDataModule, or a "
    "DataLoader(dataset, batch_size=None, shuffle=False, num_workers=0)."
)


def _describe_order_problem(loader: DataLoader, world_size: int) -> str | None:
    samplers = [loader.sampler, getattr(loader.batch_sampler, "sampler", None)]
    for s in samplers:
        if isinstance(s, (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)):
            return f"the training DataLoader samples in random order ({type(s).__name__}, e.g. from shuffle=True)"
        if isinstance(s, DistributedSampler):
            if s.shuffle:
                return "the training DataLoader's DistributedSampler shuffles"
            if s.num_replicas > 1:
                return (
                    f"the training DataLoader has a DistributedSampler that deals every {s.num_replicas}-th batch to each "
                    "rank, so a rank's consecutive batches are not consecutive segments. Under DDP give each rank its own "
                    "streams (shard by trainer.global_rank) and pass Trainer(use_distributed_sampler=False)"
                )
    if isinstance(loader.dataset, IterableDataset) and loader.num_workers > 0:
        return (
            f"the training DataLoader reads an IterableDataset with num_workers={loader.num_workers}: each worker "
            "iterates its own copy and their batches are interleaved, so consecutive batches come from different "
            "copies of the streams. Use num_workers=0"
        )
    return None


def check_stream_order(trainer: L.Trainer | None) -> None:
    """Raise :class:`StreamOrderError` if the trainer's training loader(s) reorder streams between batches.

    Detected: a ``DataLoader`` with a random sampler (``shuffle=True``, ``RandomSampler``, ``SubsetRandomSampler``,
    ``WeightedRandomSampler``); a ``DistributedSampler`` that shuffles or splits batches across ranks; an
    ``IterableDataset`` read by several worker processes. Loaders that are not ``DataLoader`` s (a SegmentStream,
    a rollout stream) are trusted. SequenceSegment batches are also checked for continuity as they arrive (see
    ``OnlineRecurrentModule``).
    """
    if trainer is None:
        return
    try:
        loaders = trainer.train_dataloader
    except Exception:  # noqa: BLE001  (no fit loop yet: nothing to check)
        return
    if loaders is None:
        return
    flat = _flatten(loaders)
    for loader in flat:
        if isinstance(loader, DataLoader):
            problem = _describe_order_problem(loader, trainer.world_size)
            if problem:
                raise StreamOrderError(f"{problem}. {_ADVICE}")


def _flatten(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _flatten(v)]
    if isinstance(obj, (list, tuple)):
        return [x for v in obj for x in _flatten(v)]
    return [obj]
