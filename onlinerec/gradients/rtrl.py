"""Real-time recurrent learning for element-wise cells, exact and O(N*D) per step.

The Jacobian dc_t/dc_{t-1} of an element-wise cell is diagonal, so the sensitivities decay element-wise and the
time loop is differentiated by :func:`~onlinerec.gradients.scan.diagonal_scan` (for units of K > 1 components it is
block-diagonal, one K x K block per unit: :func:`~onlinerec.gradients.scan.block_scan`). The carried sensitivities and
their batched propagation are shared with SnAP (:mod:`onlinerec.gradients.sensitivity`); docs/rtrl.md derives them.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from onlinerec.cells.base import ElementwiseCell, FullyRecurrentCell
from onlinerec.gradients.derivatives import has_closed_form
from onlinerec.gradients.elementwise import NotElementwiseError, recurrence_parameters, verify_linearization
from onlinerec.gradients.scan import Linearization, RecomputedBlocks, block_scan, diagonal_scan
from onlinerec.gradients.sensitivity import SensitivityMethod


class RTRL(SensitivityMethod):
    """Exact real-time recurrent learning for any element-wise cell.

    Carries c and S = dc/dtheta for the input projection and every per-unit parameter the recurrence reads; the
    gradient equals full BPTT over each stream's whole history (for fixed parameters). Units of K > 1 components
    (e.g. :class:`~onlinerec.cells.LRUCell`) are exact too, at about K times the memory and time of the
    sensitivities. A :class:`~onlinerec.cells.Stack` is unrolled layer by layer, each layer carrying its own. The diagonal Jacobians and
    immediate derivatives come from ``cell.recurrence`` by autodiff; a cell whose recurrence mixes hidden units is
    refused with :class:`NotElementwiseError`: before training, by a trace of its ops and numeric probes at several
    scales; during training, by a verification on the live states (``verify``).

    Args:
        verify: how often to check, on the live states of a segment, that the recurrence is element-wise there: one
            Jacobian-vector product with a random tangent against the diagonal derivatives RTRL uses.
            ``"sampled"`` (the default) checks one step (all streams) of the first segment and of every
            ``verify_every``-th segment after it, per cell: measured at 0.1 % of the training time or less with the
            default 100 (docs/custom_cell.md#what-the-element-wise-check-guarantees); ``"always"`` checks every step of
            every segment (3 % to 37 %, most on tiny models: for debugging a new cell); ``"off"`` never.
        verify_every: the sampling period of ``"sampled"``, in segments.
    """

    name = "rtrl"

    def __init__(self, verify: Literal["sampled", "always", "off"] = "sampled", verify_every: int = 100) -> None:
        if verify not in ("sampled", "always", "off"):
            raise ValueError(f"RTRL(verify=...) must be 'sampled', 'always' or 'off', got {verify!r}.")
        if not isinstance(verify_every, int) or isinstance(verify_every, bool) or verify_every < 1:
            raise ValueError(f"RTRL(verify_every=...) must be a positive int, got {verify_every!r}.")
        self.verify = verify
        self.verify_every = verify_every
        self._segments: dict[int, int] = {}  # id(cell) -> segments unrolled (which ones get verified)

    def __repr__(self) -> str:
        if (self.verify, self.verify_every) == ("sampled", 100):
            return "RTRL()"
        return f"RTRL(verify={self.verify!r}, verify_every={self.verify_every})"

    def unit_parameters(self, cell: ElementwiseCell) -> tuple[str, ...]:
        if isinstance(cell, FullyRecurrentCell):
            raise NotElementwiseError(
                f"{type(cell).__name__} is fully recurrent (its gates read all of c_prev through recurrent_proj), so "
                "exact RTRL would cost O(N^4) per step and onlinerec's RTRL refuses it. Use SnAPStrategy (SnAP-1, "
                "a diagonal approximation) or TBPTTStrategy for this cell."
            )
        return recurrence_parameters(
            cell, "recurrence", ("input_proj.",), cell.num_gates, cell.hidden_size, cell.num_components
        )

    def linearized_scan(
        self, cell: ElementwiseCell, params: dict[str, Tensor], gates: Tensor, c0: Tensor, keep: Tensor
    ) -> tuple[Tensor, Linearization | RecomputedBlocks]:
        names = self.unit_parameters(cell)
        if cell.num_components > 1:  # cheap derivatives (a checked closed form) are recomputed rather than kept
            states, lin = block_scan(cell, names, params, gates, c0, keep, recompute=has_closed_form(cell))
        else:
            states, lin = diagonal_scan(cell, names, params, gates, c0, keep)
        steps = self._steps_to_verify(cell, gates.shape[0])
        if steps is not None and not torch.is_inference_mode_enabled():
            self._verify(cell, names, params, gates, c0, keep, states, lin, steps)
        return states, lin

    def step_check(self, cell, tracked, params, c0, keep):
        steps = self._steps_to_verify(cell, 1)
        if steps is None or torch.is_inference_mode_enabled():
            return None
        names = tuple(tr.name for tr in tracked if tr.kind == "unit")
        params = {**params, **{tr.name: params[tr.name].detach() for tr in tracked}}
        return lambda gates, value, lin: self._verify(
            cell, names, params, gates, c0, keep, value.unsqueeze(0), lin, steps
        )

    def _steps_to_verify(self, cell: ElementwiseCell, m: int) -> range | None:
        """The steps of this segment to verify: all (``"always"``), one of every ``verify_every``-th segment
        (``"sampled"``, a different step each time), or none."""
        if self.verify == "off":
            return None
        count = self._segments.get(id(cell), 0)
        self._segments[id(cell)] = count + 1
        if self.verify == "always":
            return range(m)
        if count % self.verify_every:
            return None
        t = m - 1 - (count // self.verify_every) % m  # the last step first: states deepest into the segment
        return range(t, t + 1)

    def _verify(self, cell, names, params, gates, c0, keep, states, lin, steps: range) -> None:
        count = self._segments[id(cell)] - 1
        at = slice(steps.start, steps.stop)
        with torch.no_grad():
            before = states[max(at.start - 1, 0) : at.stop - 1].detach()  # c_{t-1} for t in steps, but c0 for t = 0
            if at.start == 0:
                before = torch.cat([c0.detach().unsqueeze(0), before])
            part = lin[at]  # (a recomputed linearisation computes only these steps)
            mask = keep[at].reshape(len(steps), keep.shape[1], *([1] * (c0.dim() - 1)))
            where = f"segment {count} of this RTRL, step{'s' if len(steps) > 1 else ''} {steps.start}"
            where += f" to {steps.stop - 1}" if len(steps) > 1 else ""
            verify_linearization(
                cell,
                names,
                params,
                gates[at],
                before * mask,
                keep[at],
                part.jh,
                part.d_gates,
                {k: part.d_params[k] for k in names},
                where=where,
                seed=count,
            )

    def exact_carry(self, cell: ElementwiseCell) -> bool:
        return True  # the carried S is dc/dtheta: M = 1 reads the gradient off it (and updates it in place if donated)
