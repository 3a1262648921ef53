"""Recurrent cells: element-wise ones (exact RTRL is cheap) and a fully recurrent one (SnAP-1, TBPTT)."""

from __future__ import annotations

from typing import Any

from onlinerec.cells.base import ElementwiseCell, FullyRecurrentCell
from onlinerec.cells.elstm import ELSTMCell, FELSTMCell
from onlinerec.cells.qrnn import QRNNCell
from onlinerec.cells.sru import SRUCell

CELLS: dict[str, type[ElementwiseCell]] = {
    "elstm": ELSTMCell,
    "felstm": FELSTMCell,
    "qrnn": QRNNCell,
    "sru": SRUCell,
}
"""String aliases of the built-in cells, for configs and the command line."""


def make_cell(name: str, input_size: int, hidden_size: int, **kwargs: Any) -> ElementwiseCell:
    """Build a built-in cell from its alias ("elstm", "felstm", "qrnn", "sru")."""
    try:
        cls = CELLS[name.lower()]
    except KeyError:
        raise ValueError(f"Unknown cell {name!r}; choose one of {sorted(CELLS)} or pass a cell instance.") from None
    return cls(input_size, hidden_size, **kwargs)


__all__ = ["CELLS", "ELSTMCell", "ElementwiseCell", "FELSTMCell", "FullyRecurrentCell", "QRNNCell", "SRUCell", "make_cell"]
