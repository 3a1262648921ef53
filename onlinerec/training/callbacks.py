"""Callbacks that keep an online run safe.

:class:`FiniteGuard` is added to every fit of an :class:`~onlinerec.OnlineRecurrentModule` by the module's
``configure_callbacks`` (unless the Trainer already has one; ``Trainer(callbacks=[FiniteGuard(enabled=False)])``
turns it off).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from typing_extensions import override

__all__ = ["FiniteGuard", "NonFiniteError"]


class NonFiniteError(FloatingPointError):
    """Training produced a NaN or infinite loss or gradient; raised by :class:`FiniteGuard`."""


class FiniteGuard(Callback):
    """Stop training at the first NaN/inf loss or gradient, before the optimizer applies it.

    The check runs after backward and DDP's gradient all-reduce, before gradient clipping and the optimizer step
    (Lightning's ``on_before_optimizer_step``). On a non-finite value it raises :class:`NonFiniteError` naming the
    global step, epoch and batch, the loss value, and the parameters whose gradients are not finite; where the
    segment's own data (``inputs``, ``targets``, an RL segment's ``rewards``) holds NaN or inf, it names that tensor,
    how many entries and the first one's step and stream, and blames the data, not the learning rate. The step is
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
        # the batches they came from (references, read only when training stops), and the last batch seen
        self._batches: deque[Any] = deque(maxlen=16)
        self._last_batch: Any = None
        self._batch_idx: int | None = None

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_idx = batch_idx
        if self.enabled:
            self._batches.append(batch)
            self._last_batch = batch

    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        if self.enabled:
            self._losses.append(loss.detach())

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        losses, self._losses = self._losses, []
        batches = list(self._batches) or [self._last_batch]  # several passes step more than once per batch
        self._batches.clear()
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
            data = [d for batch in batches for d in _non_finite_data(batch)] if local else []
            raise NonFiniteError(self._message(trainer, bad_losses[0] if bad_losses else None, bad_grads, local, data))

    def _message(
        self, trainer: L.Trainer, bad_loss: float | None, bad_grads: list[str], local: bool, data: Sequence[str] = ()
    ) -> str:
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
        head = (
            f"FiniteGuard stopped training at global step {step} (epoch {trainer.current_epoch}, batch {self._batch_idx}): "
            f"{'; '.join(what)}."
        )
        kept = f"This step's update was not applied: the parameters are those after {step} steps.{last}"
        off = "Trainer(callbacks=[FiniteGuard(enabled=False)]) turns this check off."
        if data:  # the data, not the training, is at fault: no advice about learning rates
            return (
                f"{head} The training data is not finite: {'; '.join(data)}. {kept} Clean the data source (replace "
                f"or drop the NaN/inf entries, e.g. with torch.nan_to_num) before it reaches the model. {off}"
            )
        return (
            f"{head} {kept} Lower the learning rate, clip gradients (Trainer(gradient_clip_val=...)), or inspect this "
            f"batch; {off}"
        )


_DATA_FIELDS = ("inputs", "targets", "rewards")
"""The fields of a segment that come from the data source (a loader, an env), not from the model."""


def _non_finite_data(batch: Any) -> list[str]:
    """One description per data field of ``batch`` (a Segment: inputs, targets, an RL segment's rewards; a dict of
    tensors counts as one field per key) that holds NaN or inf: how many entries, and the first one's position."""
    found = []
    for field in _DATA_FIELDS:
        value = getattr(batch, field, None)
        items = value.items() if isinstance(value, dict) else [("", value)]
        for key, tensor in items:
            if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
                continue
            bad = ~torch.isfinite(tensor.detach())
            count = int(bad.sum())
            if not count:
                continue
            first = [int(i) for i in bad.nonzero()[0]]
            where = f"step {first[0]}, stream {first[1]}" if len(first) >= 2 else f"index {first}"
            if len(first) > 2:
                where += f", feature {tuple(first[2:]) if len(first) > 3 else first[2]}"
            name = f"segment.{field}" + (f"[{key!r}]" if key else "")
            kinds = ", ".join(
                k for k, n in (("NaN", int(torch.isnan(tensor).sum())), ("inf", int(torch.isinf(tensor).sum()))) if n
            )
            found.append(f"{name} holds {count} non-finite ({kinds}) of {tensor.numel()} entries, the first at {where}")
    return found


def _has_grad_scaler(trainer: L.Trainer) -> bool:
    return getattr(trainer.precision_plugin, "scaler", None) is not None
