"""eLSTM (docs/rtrl.md#the-elstm-cell): coupled forget/input gate, element-wise recurrent weights, output gate on [x; c]."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from typing_extensions import override

from onlinerec.cells.base import ElementwiseCell, FullyRecurrentCell, normal_


def _elstm_update(a: Tensor, c_prev: Tensor) -> Tensor:
    # a[..., 0, :] is the candidate pre-activation, a[..., 1, :] the forget gate's (Z first, as in docs/rtrl.md#parameters-and-initialisation).
    z = torch.tanh(a[..., 0, :])
    f = torch.sigmoid(a[..., 1, :])
    return f * c_prev + (1.0 - f) * z


class _OutputGate(nn.Module):
    """h = sigmoid(W_o [x; c] + b_o) * c: feed-forward, reads the new state c (docs/rtrl.md#forward-equations)."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(input_size + hidden_size, hidden_size)

    def forward(self, c: Tensor, x: Tensor) -> Tensor:
        return torch.sigmoid(self.linear(torch.cat([x, c], dim=-1))) * c


class ELSTMCell(ElementwiseCell):
    """Element-wise LSTM of Irie et al. (2024), eqs. 5-7.

    ``a^z = Z x + w_z * c_prev + b_z``, ``a^f = F x + w_f * c_prev + b_f``,
    ``c = f * c_prev + (1 - f) * tanh(a^z)`` and ``h = sigmoid(W_o [x; c] + b_o) * c``.
    ``input_proj`` holds [Z; F] and [b_z; b_f]; ``recurrent_weight`` holds [w_z; w_f] with shape (2, N).
    All of these start N(0, 0.1^2) (plus ``forget_bias`` on b_f); the output gate uses PyTorch's default.
    """

    num_gates = 2

    def __init__(self, input_size: int, hidden_size: int, forget_bias: float = 0.0) -> None:
        super().__init__(input_size, hidden_size)
        self.recurrent_weight = nn.Parameter(torch.empty(2, hidden_size))
        self.output_gate = _OutputGate(input_size, hidden_size)
        for p in (self.input_proj.weight, self.input_proj.bias, self.recurrent_weight):
            normal_(p, 0.1)
        with torch.no_grad():
            self.input_proj.bias[hidden_size:] += forget_bias

    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        return _elstm_update(gates + self.recurrent_weight * c_prev.unsqueeze(-2), c_prev)

    @override
    def recurrence_derivatives(
        self, gates: Tensor, c_prev: Tensor, params: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]] | None:
        # Closed form, about 2x faster than autodiff at the Atari shape (checked against autodiff before use):
        # dc/da^z = (1 - f)(1 - z^2), dc/da^f = (c_prev - z) f (1 - f), dc/dc_prev = f + w_z dc/da^z + w_f dc/da^f,
        # dc/dw = dc/da * c_prev.
        if type(self).recurrence is not ELSTMCell.recurrence:  # a subclass changed the step: autodiff, not this
            return None
        w = params.get("recurrent_weight", self.recurrent_weight)
        a = gates + w * c_prev.unsqueeze(-2)
        z, f = torch.tanh(a[:, 0]), torch.sigmoid(a[:, 1])
        value = f * c_prev + (1.0 - f) * z
        d_z = (1.0 - f) * (1.0 - z * z)
        d_f = (c_prev - z) * f * (1.0 - f)
        d_gates = torch.stack([d_z, d_f], dim=1)
        d_state = f + w[0] * d_z + w[1] * d_f
        d_params = {"recurrent_weight": d_gates * c_prev.unsqueeze(1)}
        return value, d_state, d_gates, {k: d for k, d in d_params.items() if k in params}

    def readout(self, c: Tensor, x: Tensor) -> Tensor:
        return self.output_gate(c, x)


class FELSTMCell(FullyRecurrentCell):
    """Fully recurrent eLSTM (docs/rtrl.md#the-fully-recurrent-elstm-felstm): the vectors w_z, w_f become dense matrices R_z, R_f.

    ``a = [Z; F] x + [R_z; R_f] c_prev + b``; the state update and output gate are the eLSTM's. The
    Jacobian is dense, so RTRL refuses this cell; train it with SnAP-1 (a diagonal approximation) or TBPTT.
    R starts N(0, 1/N) so that its spectral radius is about 1; the rest follows :class:`ELSTMCell`.
    """

    num_gates = 2

    def __init__(self, input_size: int, hidden_size: int, forget_bias: float = 0.0) -> None:
        super().__init__(input_size, hidden_size)
        self.output_gate = _OutputGate(input_size, hidden_size)
        normal_(self.input_proj.weight, 0.1)
        normal_(self.input_proj.bias, 0.1)
        normal_(self.recurrent_proj.weight, hidden_size**-0.5)
        with torch.no_grad():
            self.input_proj.bias[hidden_size:] += forget_bias

    def pointwise(self, pre_gates: Tensor, c_prev: Tensor) -> Tensor:
        return _elstm_update(pre_gates, c_prev)

    def readout(self, c: Tensor, x: Tensor) -> Tensor:
        return self.output_gate(c, x)
