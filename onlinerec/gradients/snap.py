"""SnAP-1 (Menick et al., 2021): RTRL with the Jacobian cut to its diagonal."""

from __future__ import annotations

from torch import Tensor

from onlinerec.cells.base import ElementwiseCell, FullyRecurrentCell
from onlinerec.gradients.derivatives import NotElementwiseError, local_derivatives, recurrence_parameters
from onlinerec.gradients.rtrl import RTRL, Tracked


class SnAP(RTRL):
    """SnAP-n with n = 1: keep only the sensitivity entries dc_i/dtheta that are nonzero after one step.

    - On an element-wise cell the true Jacobian is diagonal, so SnAP-1 *is* exact RTRL (same numbers).
    - On a :class:`FullyRecurrentCell` (e.g. FELSTMCell) the recurrent matrix R also carries a sensitivity
      (B, G, N, N), and sensitivities decay with the Jacobian's diagonal
      ``J_ii = d pointwise/d c_prev_i + sum_g dc_i/dgate_{g,i} * R_g[i, i]`` (spec §4.2).

    The gradient of a segment is exact backprop within the segment plus lambda_0 . S~_0, where S~ are the
    SnAP-1 sensitivities carried across segment boundaries (the same surrogate as RTRL, design §4.1). So the
    approximation only touches what crosses a boundary; Menick et al.'s per-step SnAP-1 additionally masks the
    product J_t S~_{t-1} before reading the gradient, which this never does. On one-step sequences both equal BPTT.
    """

    name = "snap"

    def __init__(self, n: int = 1, carry: str = "batched") -> None:
        if n != 1:
            raise ValueError(
                f"SnAP(n={n}) is not implemented: only n = 1 is. For a dense recurrent matrix SnAP-2 already has "
                "full RTRL's O(N^3) memory; for element-wise cells SnAP-1 is already exact."
            )
        super().__init__(carry=carry)  # type: ignore[arg-type]
        self.n = n

    def __repr__(self) -> str:
        return f"SnAP(n={self.n}, carry={self.carry_mode!r})"

    def check_cell(self, cell: ElementwiseCell) -> None:
        if not isinstance(cell, ElementwiseCell):
            raise TypeError(f"SnAP trains onlinerec cells (ElementwiseCell subclasses), got {type(cell).__name__}.")
        try:
            self._unit_parameters(cell)
        except NotElementwiseError as err:
            raise NotElementwiseError(
                f"SnAP-1 needs the diagonal of {type(cell).__name__}'s recurrent Jacobian. It gets it for element-wise "
                "cells and for FullyRecurrentCell subclasses (whose pointwise() must be element-wise); this cell is "
                f"neither. Write it as a FullyRecurrentCell, or use TBPTTStrategy. ({err})"
            ) from err

    def _unit_parameters(self, cell: ElementwiseCell) -> tuple[str, ...]:
        if isinstance(cell, FullyRecurrentCell):
            return recurrence_parameters(cell, "pointwise", ("input_proj.", "recurrent_proj."), cell.num_gates, cell.hidden_size)
        return super()._unit_parameters(cell)

    def tracked(self, cell: ElementwiseCell) -> list[Tracked]:
        out = super().tracked(cell)
        if isinstance(cell, FullyRecurrentCell):
            out.insert(1, Tracked("recurrent_proj.weight", "weight", "state"))
        return out

    def _linearize(self, cell: ElementwiseCell, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor):
        if not isinstance(cell, FullyRecurrentCell):
            return super()._linearize(cell, params, gates, c_prev)
        m, b, g, n = gates.shape
        r = params["recurrent_proj.weight"].detach()
        pre = gates + (c_prev @ r.T).unflatten(-1, (g, n))
        names = self._unit_parameters(cell)
        local = local_derivatives(cell, "pointwise", {k: params[k] for k in names}, pre.reshape(m * b, g, n), c_prev.reshape(m * b, n))
        r_diag = r.view(g, n, n).diagonal(dim1=-2, dim2=-1)  # R_g[i, i]
        j = local.d_state + (local.d_gates * r_diag).sum(-2)
        unfold = lambda x: x.reshape(m, b, *x.shape[1:])  # noqa: E731
        return unfold(j), unfold(local.d_gates), {k: unfold(v) for k, v in local.d_params.items()}
