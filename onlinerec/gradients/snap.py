"""SnAP-1 (Menick et al., 2021): sensitivities cut to the entries that one step makes nonzero."""

from __future__ import annotations

import torch
from torch import Tensor

from onlinerec.cells.base import ElementwiseCell, FullyRecurrentCell
from onlinerec.gradients.base import autograd_scan
from onlinerec.gradients.derivatives import NotElementwiseError, local_derivatives, recurrence_parameters
from onlinerec.gradients.scan import Linearization, diagonal_scan
from onlinerec.gradients.sensitivity import SensitivityMethod, Tracked


class SnAP(SensitivityMethod):
    """SnAP-n with n = 1: keep only the sensitivity entries dc_i/dtheta that are nonzero after one step.

    - On an element-wise cell the true Jacobian is diagonal, so SnAP-1 *is* exact RTRL (same numbers).
    - On a :class:`FullyRecurrentCell` (e.g. FELSTMCell) the recurrent matrix R also carries a sensitivity
      (B, G, N, N), and sensitivities decay with the Jacobian's diagonal
      ``J_ii = d pointwise/d c_prev_i + sum_g dc_i/dgate_{g,i} * R_g[i, i]``.

    The gradient of a segment is exact backprop within the segment plus lambda_0 . S~_0, where S~ are the SnAP-1
    sensitivities carried across segment boundaries (the same surrogate as RTRL). So the approximation only touches
    what crosses a boundary; Menick et al.'s per-step SnAP-1 additionally masks the product J_t S~_{t-1} before
    reading the gradient, which this never does. On one-step sequences both equal BPTT.
    """

    name = "snap"

    def __init__(self, n: int = 1) -> None:
        if n != 1:
            raise ValueError(
                f"SnAP(n={n}) is not implemented: only n = 1 is. For a dense recurrent matrix SnAP-2 already has "
                "full RTRL's O(N^3) memory; for element-wise cells SnAP-1 is already exact."
            )
        self.n = n

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n})"

    def unit_parameters(self, cell: ElementwiseCell) -> tuple[str, ...]:
        g, n = cell.num_gates, cell.hidden_size
        try:
            if isinstance(cell, FullyRecurrentCell):
                return recurrence_parameters(cell, "pointwise", ("input_proj.", "recurrent_proj."), g, n)
            return recurrence_parameters(cell, "recurrence", ("input_proj.",), g, n)
        except NotElementwiseError as err:
            raise NotElementwiseError(
                f"SnAP-1 needs the diagonal of {type(cell).__name__}'s recurrent Jacobian. It gets it for element-wise "
                "cells and for FullyRecurrentCell subclasses (whose pointwise() must be element-wise); this cell is "
                f"neither. Write it as a FullyRecurrentCell, or use TBPTTStrategy. ({err})"
            ) from err

    def tracked(self, cell: ElementwiseCell) -> list[Tracked]:
        out = super().tracked(cell)
        if isinstance(cell, FullyRecurrentCell):
            out.insert(1, Tracked("recurrent_proj.weight", "weight", "state"))
        return out

    def exact_carry(self, cell: ElementwiseCell) -> bool:
        return not isinstance(cell, FullyRecurrentCell)

    def linearized_scan(
        self, cell: ElementwiseCell, params: dict[str, Tensor], gates: Tensor, c0: Tensor, keep: Tensor
    ) -> tuple[Tensor, Linearization]:
        if not isinstance(cell, FullyRecurrentCell):
            return diagonal_scan(cell, self.unit_parameters(cell), params, gates, c0, keep)
        states = autograd_scan(cell, gates, c0, keep)  # a dense Jacobian: exact backprop inside the segment by autograd
        with torch.no_grad():
            mask = keep.unsqueeze(-1)
            c_prev = torch.cat([c0.detach().unsqueeze(0), states[:-1].detach()]) * mask
            lin = self._diagonal_linearization(cell, params, gates.detach(), c_prev)
            lin.jh = lin.jh * mask  # a reset zeroes the sensitivities carried into its step
        return states, lin

    def _diagonal_linearization(
        self, cell: FullyRecurrentCell, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor
    ) -> Linearization:
        """J_ii, dc/dgates and dc/dp of ``pointwise`` at the full pre-activations gates + R c_prev, per step."""
        m, b, g, n = gates.shape
        r = params["recurrent_proj.weight"].detach()
        pre = gates + (c_prev @ r.T).unflatten(-1, (g, n))
        names = self.unit_parameters(cell)
        local = local_derivatives(
            cell, "pointwise", {k: params[k] for k in names}, pre.reshape(m * b, g, n), c_prev.reshape(m * b, n)
        )
        r_diag = r.view(g, n, n).diagonal(dim1=-2, dim2=-1)  # R_g[i, i]
        j = local.d_state + (local.d_gates * r_diag).sum(-2)
        unfold = lambda x: x.reshape(m, b, *x.shape[1:])  # noqa: E731
        return Linearization(
            unfold(j), unfold(local.d_gates), {k: unfold(v) for k, v in local.d_params.items()}, c_prev
        )
