"""QRNN-like cell: fo-pooling over a width-2 input window (Bradbury et al., 2017)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from onlinerec.cells.base import ElementwiseCell


class QRNNCell(ElementwiseCell):
    """Quasi-recurrent cell with fo-pooling.

    ``[a^z; a^f] = W [x_t; x_{t-1}] + b`` (a width-2 causal filter), ``c = f * c_prev + (1 - f) * tanh(a^z)``
    with ``f = sigmoid(a^f)``, and ``h = sigmoid(W_o x_t + b_o) * c``. The recurrence has no parameters of
    its own; x_{t-1} is feed-forward state that the framework carries across segments (zeroed on reset).
    """

    num_gates = 2
    window = 2

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        self.output_gate = nn.Linear(input_size, hidden_size)

    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        z = torch.tanh(gates[..., 0, :])
        f = torch.sigmoid(gates[..., 1, :])
        return f * c_prev + (1.0 - f) * z

    def readout(self, c: Tensor, x: Tensor) -> Tensor:
        return torch.sigmoid(self.output_gate(x)) * c
