"""Real-time recurrent learning for element-wise cells, exact and O(N*D) per step.

The Jacobian dc_t/dc_{t-1} of an element-wise cell is diagonal, so the sensitivities decay element-wise and the
time loop is differentiated by :func:`~onlinerec.gradients.scan.diagonal_scan` (for units of K > 1 components it is
block-diagonal, one K x K block per unit: :func:`~onlinerec.gradients.scan.block_scan`). The carried sensitivities and
their batched propagation are shared with SnAP (:mod:`onlinerec.gradients.sensitivity`); docs/rtrl.md derives them.
"""

from __future__ import annotations

from torch import Tensor

from onlinerec.cells.base import ElementwiseCell, FullyRecurrentCell
from onlinerec.gradients.derivatives import NotElementwiseError, recurrence_parameters
from onlinerec.gradients.scan import Linearization, block_scan, diagonal_scan
from onlinerec.gradients.sensitivity import SensitivityMethod


class RTRL(SensitivityMethod):
    """Exact real-time recurrent learning for any element-wise cell.

    Carries c and S = dc/dtheta for the input projection and every per-unit parameter the recurrence reads; the
    gradient equals full BPTT over each stream's whole history (for fixed parameters). Units of K > 1 components
    (e.g. :class:`~onlinerec.cells.LRUCell`) are exact too, at about K times the memory and time of the
    sensitivities. A :class:`~onlinerec.cells.Stack` is unrolled layer by layer, each layer carrying its own. The diagonal Jacobians and
    immediate derivatives come from ``cell.recurrence`` by autodiff; a cell whose recurrence mixes hidden units is
    refused with :class:`NotElementwiseError`.
    """

    name = "rtrl"

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
    ) -> tuple[Tensor, Linearization]:
        if cell.num_components > 1:
            return block_scan(cell, self.unit_parameters(cell), params, gates, c0, keep)
        return diagonal_scan(cell, self.unit_parameters(cell), params, gates, c0, keep)

    def exact_carry(self, cell: ElementwiseCell) -> bool:
        return True
