"""The classic fully recurrent LSTM and GRU, as PyTorch defines them: baselines for TBPTT and SnAP-1."""

from __future__ import annotations

import torch
from torch import Tensor

from onlinerec.cells.base import FullyRecurrentCell


class _TorchInit(FullyRecurrentCell):
    recurrent_bias = True

    def _init_like_torch(self) -> None:
        """PyTorch's default for nn.LSTMCell / nn.GRUCell: every weight and bias uniform in [-1/sqrt(N), 1/sqrt(N)]."""
        bound = self.hidden_size**-0.5
        with torch.no_grad():
            for p in (
                self.input_proj.weight,
                self.recurrent_proj.weight,
                self.input_proj.bias,
                self.recurrent_proj.bias,
            ):
                p.uniform_(-bound, bound)


class LSTMCell(_TorchInit):
    """The LSTM of Hochreiter & Schmidhuber (1997) with a forget gate (Gers et al., 2000), as ``torch.nn.LSTMCell``::

        [i; f; g; o] = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh
        c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)          h_t = sigmoid(o) * tanh(c_t)

    Each unit holds (c, h): ``num_components = 2``, state (..., 2, N) with ``[..., 0, :] = c`` and
    ``[..., 1, :] = h``, and the gates read all of h_{t-1} through the dense W_hh (``recurrent_proj``). The
    Jacobian is dense, so RTRL refuses this cell; TBPTT trains it, and SnAP-1 with the per-unit 2 x 2 blocks of the
    Jacobian (:class:`~onlinerec.gradients.SnAP`). The readout is h. ``input_proj`` holds W_ih and b_ih,
    ``recurrent_proj`` W_hh and b_hh, gates in PyTorch's order (i, f, g, o), initialised like PyTorch's (uniform in
    [-1/sqrt(N), 1/sqrt(N)]): copying ``torch.nn.LSTMCell`` weights gives the same steps.

    Args:
        forget_bias: added to b_ih of the forget gate (PyTorch: 0; Jozefowicz et al. 2015 recommend 1).
    """

    num_gates = 4
    num_components = 2

    def __init__(self, input_size: int, hidden_size: int, forget_bias: float = 0.0) -> None:
        super().__init__(input_size, hidden_size)
        self._init_like_torch()
        with torch.no_grad():
            self.input_proj.bias[hidden_size : 2 * hidden_size] += forget_bias

    def pointwise(self, pre_gates: Tensor, c_prev: Tensor) -> Tensor:
        i = torch.sigmoid(pre_gates[..., 0, :])
        f = torch.sigmoid(pre_gates[..., 1, :])
        g = torch.tanh(pre_gates[..., 2, :])
        o = torch.sigmoid(pre_gates[..., 3, :])
        c = f * c_prev[..., 0, :] + i * g
        return torch.stack([c, o * torch.tanh(c)], dim=-2)

    @property
    def output_size(self) -> int:
        return self.hidden_size

    def readout(self, c: Tensor, x: Tensor) -> Tensor:
        return c[..., 1, :]


class GRUCell(_TorchInit):
    """The GRU of Cho et al. (2014), as ``torch.nn.GRUCell``::

        r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)      z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
        n_t = tanh(W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))
        h_t = (1 - z_t) * n_t + z_t * h_{t-1}

    The state is h (one number per unit) and the gates read all of it through the dense W_hh (``recurrent_proj``),
    so RTRL refuses this cell; TBPTT and SnAP-1 train it. Since r multiplies the recurrent projection of the
    candidate, the cell overrides ``combine`` rather than ``pointwise``. ``input_proj`` holds W_ih and b_ih,
    ``recurrent_proj`` W_hh and b_hh, gates in PyTorch's order (r, z, n), initialised like PyTorch's.

    Args:
        update_bias: added to b_iz (PyTorch: 0); positive values start z near 1, i.e. with long memory.
    """

    num_gates = 3

    def __init__(self, input_size: int, hidden_size: int, update_bias: float = 0.0) -> None:
        super().__init__(input_size, hidden_size)
        self._init_like_torch()
        with torch.no_grad():
            self.input_proj.bias[hidden_size : 2 * hidden_size] += update_bias

    def combine(self, gates: Tensor, mixed: Tensor, c_prev: Tensor) -> Tensor:
        r = torch.sigmoid(gates[..., 0, :] + mixed[..., 0, :])
        z = torch.sigmoid(gates[..., 1, :] + mixed[..., 1, :])
        n = torch.tanh(gates[..., 2, :] + r * mixed[..., 2, :])
        return (1.0 - z) * n + z * c_prev
