"""Cells made of cells: the shared part of :class:`~onlinerec.cells.Stack` (layers on top of each other) and
:class:`~onlinerec.cells.Parallel` (branches side by side)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from torch import Tensor, nn

from onlinerec.cells.base import ElementwiseCell


class CompositeCell(ElementwiseCell):
    """A cell whose parts (``layers``) are cells with their own carried states.

    Every gradient method unrolls a composite part by part over a whole segment, each part with its own carry (a
    :class:`~onlinerec.gradients.carry.StackCarry`, one carry per part), through :meth:`unroll_layers`; what a method's
    ``unroll`` returns for a composite is already its output (M, B, output_size), so :meth:`readout` is the identity.
    A subclass sets ``self.layers``, ``self.input_size`` and ``self.hidden_size`` and writes :meth:`unroll_layers`.
    """

    layers: nn.ModuleList
    parts_name: ClassVar[str] = "parts"
    """What error messages call the parts ("layers" of a stack, "branches" of a parallel cell)."""

    def _init_parts(self, cells: Sequence[ElementwiseCell], what: str) -> list[ElementwiseCell]:
        nn.Module.__init__(self)  # a composite has no input projection of its own
        cells = list(cells)
        if not cells:
            raise ValueError(f"{type(self).__name__} needs at least one cell.")
        for i, cell in enumerate(cells):
            if not isinstance(cell, ElementwiseCell):
                raise TypeError(
                    f"{type(self).__name__} {what} {i} must be an onlinerec ElementwiseCell, got {type(cell).__name__}."
                )
        return cells

    @property
    def num_layers(self) -> int:
        """The number of parts (layers of a stack, branches of a parallel cell)."""
        return len(self.layers)

    @property
    def state_shape(self) -> tuple[int, ...]:
        """(output_size,): what a method's unroll returns per stream and step for a composite (its parts' states live
        in its carry)."""
        return (self.output_size,)

    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        raise TypeError(
            f"a {type(self).__name__} has no recurrence of its own: unroll it with a gradient method "
            f"(method.unroll(cell, inputs, reset, carry)), which runs its parts one after the other."
        )

    def forward(self, u: Tensor, c_prev: Tensor) -> Tensor:
        return self.recurrence(u, c_prev)

    def readout(self, c: Tensor, x: Tensor) -> Tensor:
        """The identity: a method's unroll of a composite already returns its output."""
        return c

    def unroll_layers(
        self, unroll_layer: Callable[[ElementwiseCell, Tensor, Any], tuple[Tensor, Any]], inputs: Tensor, carries: list
    ) -> tuple[Tensor, list]:
        """Run the parts over a whole segment: ``unroll_layer(cell, inputs, carry) -> (states, carry)`` unrolls one
        part (a gradient method's unroll); returns the composite's outputs and the new carries."""
        raise NotImplementedError
