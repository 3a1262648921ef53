"""Recurrent cells: pure single steps. Element-wise ones (exact RTRL is cheap) and fully recurrent ones (SnAP-1, TBPTT),
and :class:`Stack` for deep models."""

from __future__ import annotations

from typing import Any

from onlinerec.cells.base import ElementwiseCell, FullyRecurrentCell
from onlinerec.cells.classic import GRUCell, LSTMCell
from onlinerec.cells.elstm import ELSTMCell, FELSTMCell
from onlinerec.cells.indrnn import IndRNNCell
from onlinerec.cells.lru import LRUCell
from onlinerec.cells.minimal import MinGRUCell, MinLSTMCell
from onlinerec.cells.qrnn import QRNNCell
from onlinerec.cells.sru import SRUCell
from onlinerec.cells.stack import Stack
from onlinerec.registry import Registry

CELLS: Registry[ElementwiseCell] = Registry(
    "cell",
    ElementwiseCell,
    {
        "elstm": ELSTMCell,
        "felstm": FELSTMCell,
        "qrnn": QRNNCell,
        "sru": SRUCell,
        "lru": LRUCell,
        "mingru": MinGRUCell,
        "minlstm": MinLSTMCell,
        "indrnn": IndRNNCell,
        "lstm": LSTMCell,
        "gru": GRUCell,
    },
)
"""Cells by name, for configs and the command line. ``CELLS.register("mine", MyCell)`` adds one; a class path
("my_package.cells.MyCell") works everywhere a name does, without registering."""


def make_cell(
    cell: str | type | ElementwiseCell,
    input_size: int,
    hidden_size: int,
    *,
    layers: int = 1,
    residual: bool = False,
    norm: str | None = None,
    **kwargs: Any,
) -> ElementwiseCell:
    """A cell from a registered name ("elstm", "lru", ...), a class path, a class, or an instance.

    An instance is returned as it is after checking that its sizes are ``input_size`` and ``hidden_size``
    (``kwargs`` must then be empty).

    ``layers > 1`` (or ``residual`` / ``norm``) builds a :class:`Stack` of ``layers`` such cells with ``hidden_size``
    units each, the first reading ``input_size`` features and each next one its predecessor's ``output_size``; every
    layer gets the same ``kwargs``. So a config or the command line names a deep model with the same three fields
    as a single cell (e.g. ``R2AC(cell="lru", cell_kwargs={"layers": 4, "residual": True})``).
    """
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise ValueError(f"layers must be a positive int, got {layers!r}.")
    if layers > 1 or residual or norm is not None:
        if isinstance(cell, ElementwiseCell):
            raise ValueError(
                f"got a {type(cell).__name__} instance and layers={layers}, residual={residual}, norm={norm!r}: "
                "pass a cell name or class to build a stack of new layers, or build Stack([...]) yourself."
            )
        built, width = [], input_size
        for _ in range(layers):
            built.append(CELLS.build(cell, width, hidden_size, **kwargs))
            width = built[-1].output_size
        return Stack(built, residual=residual, norm=norm)
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
    "GRUCell",
    "IndRNNCell",
    "LRUCell",
    "LSTMCell",
    "MinGRUCell",
    "MinLSTMCell",
    "QRNNCell",
    "SRUCell",
    "Stack",
    "make_cell",
]
