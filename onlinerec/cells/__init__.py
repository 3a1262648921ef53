"""Recurrent cells: pure single steps. Element-wise ones (exact RTRL is cheap) and fully recurrent ones (SnAP-1, TBPTT)."""

from __future__ import annotations

from typing import Any

from onlinerec.cells.base import ElementwiseCell, FullyRecurrentCell
from onlinerec.cells.elstm import ELSTMCell, FELSTMCell
from onlinerec.cells.qrnn import QRNNCell
from onlinerec.cells.sru import SRUCell
from onlinerec.registry import Registry

CELLS: Registry[ElementwiseCell] = Registry(
    "cell", ElementwiseCell, {"elstm": ELSTMCell, "felstm": FELSTMCell, "qrnn": QRNNCell, "sru": SRUCell}
)
"""Cells by name, for configs and the command line. ``CELLS.register("mine", MyCell)`` adds one; a class path
("my_package.cells.MyCell") works everywhere a name does, without registering."""


def make_cell(cell: str | type | ElementwiseCell, input_size: int, hidden_size: int, **kwargs: Any) -> ElementwiseCell:
    """A cell from a registered name ("elstm", "qrnn", ...), a class path, a class, or an instance.

    An instance is returned as it is after checking that its sizes are ``input_size`` and ``hidden_size``
    (``kwargs`` must then be empty).
    """
    if isinstance(cell, ElementwiseCell):
        if kwargs:
            raise ValueError(
                f"got a {type(cell).__name__} instance and cell keyword arguments {sorted(kwargs)}; pass one or the other."
            )
        if (cell.input_size, cell.hidden_size) != (input_size, hidden_size):
            raise ValueError(
                f"the given {type(cell).__name__} has input_size={cell.input_size}, hidden_size={cell.hidden_size}, but this "
                f"model feeds it {input_size} features and expects {hidden_size} units: build it as "
                f"{type(cell).__name__}({input_size}, {hidden_size}, ...) or pass its name instead."
            )
        return cell
    return CELLS.build(cell, input_size, hidden_size, **kwargs)


__all__ = [
    "CELLS",
    "ELSTMCell",
    "ElementwiseCell",
    "FELSTMCell",
    "FullyRecurrentCell",
    "QRNNCell",
    "SRUCell",
    "make_cell",
]
