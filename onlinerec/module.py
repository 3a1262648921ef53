"""OnlineRecurrentModule: a LightningModule that unrolls a cell over segments with the trainer's method."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from onlinerec.cells.base import ElementwiseCell
from onlinerec.data.segment import Segment
from onlinerec.gradients import RTRL, TBPTT, Carry, GradientMethod, SnAP

_METHODS = {"rtrl": RTRL, "tbptt": TBPTT, "snap": SnAP}
_CHECKPOINT_KEY = "onlinerec"


class OnlineRecurrentModule(L.LightningModule):
    """Trains a recurrent cell online: each training batch is a :class:`Segment` of M steps from B streams.

    The module carries each stream's state (and, for RTRL/SnAP, its sensitivities) from one batch to the
    next, zeroes it where ``segment.reset`` is set, and stores it in checkpoints so that training resumes
    exactly. The gradient method comes from the trainer's strategy (``RTRLStrategy``, ``TBPTTStrategy``,
    ``SnAPStrategy``); pass ``method=`` to use the module outside a Trainer.

    A subclass writes only :meth:`segment_loss` (and any heads it needs); :meth:`encode` may map raw inputs
    to the cell's inputs (an embedding, a vision stem). Everything below the cell gets within-segment backprop.

    Args:
        cell: the recurrent cell.
        lr: learning rate of the default Adam optimizer (override :meth:`configure_optimizers` for others).
        method: a gradient method or its alias ("rtrl", "tbptt", "snap"); None takes the trainer's.
    """

    def __init__(self, cell: ElementwiseCell, lr: float = 1e-3, method: GradientMethod | str | None = None) -> None:
        super().__init__()
        if not isinstance(cell, ElementwiseCell):
            raise TypeError(f"cell must be an onlinerec ElementwiseCell, got {type(cell).__name__}.")
        self.cell = cell
        self.lr = lr
        self._method_override = _METHODS[method]() if isinstance(method, str) else method
        self._carries: dict[str, Carry] = {}  # a plain dict, not buffers: DDP must not broadcast rank 0's streams

    # -- the gradient method -------------------------------------------------------------
    @property
    def method(self) -> GradientMethod:
        """The gradient method in use: ``method=`` if given, else the trainer strategy's."""
        if self._method_override is not None:
            return self._method_override
        trainer = self._trainer
        method = getattr(getattr(trainer, "strategy", None), "method", None)
        if not isinstance(method, GradientMethod):
            where = "outside a Trainer" if trainer is None else f"with strategy {type(trainer.strategy).__name__}"
            raise RuntimeError(
                f"{type(self).__name__} is used {where}, which names no gradient method. Use "
                "Trainer(strategy=RTRLStrategy(M=...)) (or TBPTTStrategy / SnAPStrategy, or strategy='rtrl'), "
                "or pass method='rtrl' to the module."
            )
        return method

    # -- unrolling -----------------------------------------------------------------------
    def encode(self, inputs: Tensor) -> Tensor:
        """Map a segment's raw inputs (M, B, ...) to cell inputs (M, B, D). Default: unchanged."""
        return inputs

    def unroll(self, inputs: Tensor, reset: Tensor, stream: str = "train") -> Tensor:
        """Run the cell over one segment of ``stream`` ("train", "val", ...) and return states (M, B, N).

        The "train" streams use the gradient method; any other stream runs without sensitivities
        (evaluation needs no gradient through time). Each stream name has its own carried state.
        """
        method = self.method if stream == "train" else _EVAL
        b = inputs.shape[1] if inputs.dim() >= 2 else -1
        carry = self._carries.get(stream)
        if carry is not None and carry.batch_size != b:
            if stream == "train":
                raise ValueError(
                    f"the training streams changed from B = {carry.batch_size} to B = {b} between segments. Each slot "
                    "of a Segment is one stream whose state is carried: keep B fixed (drop_last=True for a loader)."
                )
            carry = None
        if carry is None:
            carry = method.init_carry(self.cell, b)
        elif carry.c.device != inputs.device:
            carry = carry.to(inputs.device)
        carry = self._adapt(carry, method)
        states, self._carries[stream] = method.unroll(self.cell, inputs, reset, carry)
        return states

    def _adapt(self, carry: Carry, method: GradientMethod) -> Carry:
        # A carry made by another method (resuming with a new strategy) keeps c; missing sensitivities start at zero.
        needed = method.sensitivity_names(self.cell)
        if carry.sensitivities.keys() == set(needed):
            return carry
        if set(needed) <= carry.sensitivities.keys():
            return Carry(carry.c, carry.window, {k: carry.sensitivities[k] for k in needed})
        rank_zero_warn(f"The carried state has no sensitivities for {method!r}; they restart from zero (gradients truncate once).")
        fresh = method.init_carry(self.cell, carry.batch_size, device=carry.c.device, dtype=carry.c.dtype)
        return Carry(carry.c, carry.window, fresh.sensitivities)

    def reset_streams(self, stream: str | None = None) -> None:
        """Forget the carried state of one stream name (or of all)."""
        if stream is None:
            self._carries.clear()
        else:
            self._carries.pop(stream, None)

    @override
    def forward(self, inputs: Tensor, reset: Tensor, stream: str = "train") -> Tensor:
        """Outputs (M, B, ...) = readout of the unrolled states, for one segment of raw inputs."""
        x = self.encode(inputs)
        return self.cell.readout(self.unroll(x, reset, stream), x)

    # -- what a subclass writes ----------------------------------------------------------
    def segment_loss(self, outputs: Tensor, segment: Segment) -> Tensor | dict[str, Tensor]:
        """The loss of one segment from the cell's outputs (M, B, ...); a tensor or a dict with "loss"."""
        raise NotImplementedError(f"{type(self).__name__} must implement segment_loss(outputs, segment).")

    # -- Lightning hooks -----------------------------------------------------------------
    def _step(self, segment: Segment, stream: str) -> Tensor:
        result = self.segment_loss(self(segment.inputs, segment.reset, stream), segment)
        loss = result["loss"] if isinstance(result, dict) else result
        metrics = result if isinstance(result, dict) else {"loss": loss}
        for name, value in metrics.items():
            self.log(f"{stream}/{name}", value, prog_bar=name == "loss", batch_size=segment.num_streams)
        return loss

    @override
    def training_step(self, batch: Segment, batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    @override
    def validation_step(self, batch: Segment, batch_idx: int) -> Tensor:
        return self._step(batch, "val")

    @override
    def test_step(self, batch: Segment, batch_idx: int) -> Tensor:
        return self._step(batch, "test")

    @override
    def on_validation_epoch_start(self) -> None:
        self.reset_streams("val")  # every evaluation starts its streams afresh

    @override
    def on_test_epoch_start(self) -> None:
        self.reset_streams("test")

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[_CHECKPOINT_KEY] = {"carries": {k: v.state_dict() for k, v in self._carries.items()}}

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get(_CHECKPOINT_KEY, {}).get("carries", {})
        self._carries = {k: Carry.from_state_dict(v) for k, v in saved.items()}


_EVAL = TBPTT()
