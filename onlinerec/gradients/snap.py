"""SnAP-1 (Menick et al., 2021): sensitivities cut to the entries that one step makes nonzero."""

from __future__ import annotations

import torch
from torch import Tensor

from onlinerec.cells.base import ElementwiseCell, FullyRecurrentCell
from onlinerec.gradients.base import autograd_scan
from onlinerec.gradients.derivatives import local_derivatives
from onlinerec.gradients.elementwise import NotElementwiseError, recurrence_parameters
from onlinerec.gradients.scan import Linearization, block_scan, diagonal_scan
from onlinerec.gradients.sensitivity import SensitivityMethod, Tracked


class SnAP(SensitivityMethod):
    """SnAP-n with n = 1: keep only the sensitivity entries dc_i/dtheta that are nonzero after one step.

    - On an element-wise cell the true Jacobian is diagonal, so SnAP-1 *is* exact RTRL (same numbers).
    - On a :class:`FullyRecurrentCell` (e.g. FELSTMCell, GRUCell) the recurrent matrix R (and its bias, if any) also
      carries a sensitivity (B, G, N, N), and sensitivities decay with the Jacobian's diagonal
      ``J_ii = d combine/d c_prev_i + sum_g dc_i/dmixed_{g,i} * R_g[i, i]`` (mixed = R c_prev + b_R).
    - For units of K > 1 components (LSTMCell: (c, h)) "diagonal" means the per-unit K x K blocks of the dense
      Jacobian: ``J[n]_{kj} = dc_{k,n}/dc_prev_{j,n}`` through the element-wise part, plus
      ``sum_g dc_{k,n}/dmixed_{g,n} * R_g[n, n]`` in the column j of the component R reads (the LSTM's h). Every
      entry coupling unit n to another unit n' (R_g[n, n'], n' != n) is dropped when the sensitivities are carried,
      and each sensitivity keeps only the entries dc_{k,n}/dtheta for the parameters theta of row n (B, K, G, N, F).

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
        g, n, k = cell.num_gates, cell.hidden_size, cell.num_components
        try:
            if isinstance(cell, FullyRecurrentCell):
                method, gates = _pointwise_method(cell)
                return recurrence_parameters(cell, method, ("input_proj.", "recurrent_proj."), gates, n, k)
            return recurrence_parameters(cell, "recurrence", ("input_proj.",), g, n, k)
        except NotElementwiseError as err:
            raise NotElementwiseError(
                f"SnAP-1 needs the diagonal of {type(cell).__name__}'s recurrent Jacobian. It gets it for element-wise "
                "cells and for FullyRecurrentCell subclasses (whose pointwise() must be element-wise); this cell is "
                f"neither. Write it as a FullyRecurrentCell, or use TBPTTStrategy. ({err})"
            ) from err

    def tracked(self, cell: ElementwiseCell) -> list[Tracked]:
        out = super().tracked(cell)
        if isinstance(cell, FullyRecurrentCell):
            out.insert(1, Tracked("recurrent_proj.weight", "weight", "state", via="mixed"))
            if cell.recurrent_proj.bias is not None:
                out.insert(
                    3 if cell.input_proj.bias is not None else 2, Tracked("recurrent_proj.bias", "bias", via="mixed")
                )
        return out

    def exact_carry(self, cell: ElementwiseCell) -> bool:
        return not isinstance(cell, FullyRecurrentCell)

    def linearized_scan(
        self, cell: ElementwiseCell, params: dict[str, Tensor], gates: Tensor, c0: Tensor, keep: Tensor
    ) -> tuple[Tensor, Linearization]:
        blocks = cell.num_components > 1
        if not isinstance(cell, FullyRecurrentCell):
            scan = block_scan if blocks else diagonal_scan
            return scan(cell, self.unit_parameters(cell), params, gates, c0, keep)
        states = autograd_scan(cell, gates, c0, keep)  # a dense Jacobian: exact backprop inside the segment by autograd
        with torch.no_grad():
            mask = keep[:, :, None, None] if blocks else keep.unsqueeze(-1)
            c_prev = torch.cat([c0.detach().unsqueeze(0), states[:-1].detach()]) * mask
            lin = self._diagonal_linearization(cell, params, gates.detach(), c_prev)
            lin.jh = lin.jh * (mask.unsqueeze(-1) if blocks else mask)  # a reset zeroes the carried sensitivities
        return states, lin

    def _diagonal_linearization(
        self, cell: FullyRecurrentCell, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor
    ) -> Linearization:
        """J_ii (per-unit K x K blocks for K > 1), dc/dgates, dc/dmixed and dc/dp of the element-wise part at the
        input gates and mixed = R r(c_prev) + b_R, per step."""
        m, b, g, n = gates.shape
        r = params["recurrent_proj.weight"].detach()
        h_prev = cell.recurrent_input(c_prev)  # what R multiplies (M, B, N)
        mixed = h_prev @ r.T
        if cell.recurrent_proj.bias is not None:
            mixed = mixed + params["recurrent_proj.bias"].detach()
        mixed = mixed.unflatten(-1, (g, n))
        names = self.unit_parameters(cell)
        unit = {k: params[k] for k in names}
        rows = lambda x: x.reshape(m * b, *x.shape[2:])  # noqa: E731
        if _pointwise_method(cell)[0] == "pointwise":  # mixed enters as gates + mixed: one derivative for both
            local = local_derivatives(cell, "pointwise", unit, rows(gates + mixed), rows(c_prev))
            d_gates, d_mixed = local.d_gates, None
        else:
            local = local_derivatives(cell, "joint_pointwise", unit, rows(torch.cat([gates, mixed], -2)), rows(c_prev))
            d_gates, d_mixed = local.d_gates[..., :g, :], local.d_gates[..., g:, :]
        r_diag = r.view(g, n, n).diagonal(dim1=-2, dim2=-1)  # R_g[i, i]
        through_r = ((d_gates if d_mixed is None else d_mixed) * r_diag).sum(-2)
        if cell.num_components == 1:
            j = local.d_state + through_r
        else:  # the R path reaches dc_k through the component R reads: column recurrent_component of each block
            j = local.d_state.clone()
            j[:, :, cell.recurrent_component, :] += through_r
        unfold = lambda x: x.reshape(m, b, *x.shape[1:])  # noqa: E731
        return Linearization(
            unfold(j),
            unfold(d_gates),
            {k: unfold(v) for k, v in local.d_params.items()},
            h_prev,
            None if d_mixed is None else unfold(d_mixed),
        )


def _pointwise_method(cell: FullyRecurrentCell) -> tuple[str, int]:
    """The element-wise part of a fully recurrent cell whose derivatives SnAP-1 takes, and its number of gates:
    ``pointwise`` at gates + mixed (G), unless the cell overrides ``combine``: then ``joint_pointwise`` (2G)."""
    if type(cell).combine is FullyRecurrentCell.combine:
        return "pointwise", cell.num_gates
    return "joint_pointwise", 2 * cell.num_gates
