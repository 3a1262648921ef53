"""Cells side by side: independent branches whose outputs are concatenated (e.g. an actor's and a critic's core)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from onlinerec.cells.base import ElementwiseCell
from onlinerec.cells.composite import CompositeCell


class Parallel(CompositeCell):
    """Branches that run side by side at every step, each with its own carried state; the output is the concatenation
    of the branches' outputs, in order.

    With ``split_inputs=True`` (the default) branch i reads its own slice of the input, the next
    ``branches[i].input_size`` features, so ``input_size`` is their sum; with ``False`` every branch reads the whole
    input (all branches must then take the same width). The branches never read each other's state, so the cell is
    as element-wise as its branches: every gradient method unrolls each branch with its own carry, and RTRL's gradient
    of a branch of single cells is exact (a branch that is a :class:`~onlinerec.cells.Stack` gets a stack's per-layer
    gradient). A loss that reads one branch's output only trains that branch (and what feeds its inputs).

    Args:
        branches: the cells (single cells or stacks), in output order.
        split_inputs: each branch reads its own slice of the input (else all read all of it).
    """

    parts_name = "branches"

    def __init__(self, branches: Sequence[ElementwiseCell], split_inputs: bool = True) -> None:
        cells = self._init_parts(branches, "branch")
        self.layers = nn.ModuleList(cells)
        self.split_inputs = bool(split_inputs)
        if self.split_inputs:
            self.input_size = sum(c.input_size for c in cells)
        else:
            widths = {c.input_size for c in cells}
            if len(widths) != 1:
                raise ValueError(
                    f"Parallel(split_inputs=False): every branch reads the whole input, so all must take the same "
                    f"width; got input sizes {[c.input_size for c in cells]}. Use split_inputs=True to give each "
                    f"branch its own slice."
                )
            self.input_size = cells[0].input_size
        self.hidden_size = sum(c.output_size for c in cells)

    @property
    def output_size(self) -> int:
        return self.hidden_size

    @property
    def output_sizes(self) -> tuple[int, ...]:
        """Each branch's output width, in order (where to split the output)."""
        return tuple(c.output_size for c in self.layers)

    def branch_input(self, branch: int, x: Tensor) -> Tensor:
        """What branch ``branch`` reads of the cell's input x (..., input_size)."""
        if not self.split_inputs:
            return x
        start = sum(c.input_size for c in self.layers[:branch])
        return x[..., start : start + self.layers[branch].input_size]

    def unroll_layers(
        self, unroll_layer: Callable[[ElementwiseCell, Tensor, Any], tuple[Tensor, Any]], inputs: Tensor, carries: list
    ) -> tuple[Tensor, list]:
        outs, new = [], []
        for i, (cell, carry) in enumerate(zip(self.layers, carries)):
            x = self.branch_input(i, inputs)
            states, carry = unroll_layer(cell, x, carry)
            outs.append(cell.readout(states, x))
            new.append(carry)
        return torch.cat(outs, dim=-1), new

    def extra_repr(self) -> str:
        return f"split_inputs={self.split_inputs}"
