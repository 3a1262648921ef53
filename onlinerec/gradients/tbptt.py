"""Truncated backprop through time: the state crosses segments, its gradient does not."""

from __future__ import annotations

from torch import Tensor

from onlinerec.cells.base import ElementwiseCell
from onlinerec.gradients.base import GradientMethod, autograd_scan, project, window_features
from onlinerec.gradients.carry import Carry


class TBPTT(GradientMethod):
    """Backprop within each segment only; the carried state c is a constant (detached).

    Equivalent to full BPTT over the concatenated stream with the gradient path cut at every segment start.
    Trains any cell, element-wise or not.
    """

    name = "tbptt"

    def _unroll(self, cell: ElementwiseCell, inputs: Tensor, reset: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        keep = (~reset).to(inputs.dtype)
        feats, window = window_features(cell, inputs, keep, carry.window)
        states = autograd_scan(cell, project(cell, feats), carry.c, keep)
        return states, Carry(c=states[-1].detach(), window=window)
