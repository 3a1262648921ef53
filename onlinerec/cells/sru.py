"""SRU-like cell: element-wise recurrent terms in the forget gate, highway readout (Lei et al., 2018)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from onlinerec.cells.base import ElementwiseCell, normal_


class SRUCell(ElementwiseCell):
    """Simple recurrent unit with element-wise recurrence.

    ``f = sigmoid(W_f x + v_f * c_prev + b_f)``, ``c = f * c_prev + (1 - f) * (W x + b)``; readout
    ``r = sigmoid(W_r x + v_r * c + b_r)``, ``h = r * c + (1 - r) * skip(x)`` with skip the identity when
    D == N and a bias-free linear map otherwise. The highway gate reads the new state c (like the eLSTM's
    output gate) so that c stays the only quantity carried through time.
    """

    num_gates = 2

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        self.forget_recurrent = nn.Parameter(torch.empty(hidden_size))
        self.reset_gate = nn.Linear(input_size, hidden_size)
        self.reset_recurrent = nn.Parameter(torch.empty(hidden_size))
        self.skip = nn.Identity() if input_size == hidden_size else nn.Linear(input_size, hidden_size, bias=False)
        normal_(self.forget_recurrent, 0.1)
        normal_(self.reset_recurrent, 0.1)

    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        candidate = gates[..., 0, :]
        f = torch.sigmoid(gates[..., 1, :] + self.forget_recurrent * c_prev)
        return f * c_prev + (1.0 - f) * candidate

    def readout(self, c: Tensor, x: Tensor) -> Tensor:
        r = torch.sigmoid(self.reset_gate(x) + self.reset_recurrent * c)
        return r * c + (1.0 - r) * self.skip(x)
