"""minGRU and minLSTM (Feng et al. 2024, "Were RNNs All We Needed?"): gates that read only the input, no parameters in
the recurrence."""

from __future__ import annotations

import torch
from torch import Tensor

from onlinerec.cells.base import ElementwiseCell


class MinGRUCell(ElementwiseCell):
    """minGRU of Feng et al., "Were RNNs All We Needed?" (2024), in its sequential form (their Algorithm 1)::

        z_t = sigmoid(W_z x_t + b_z)          h~_t = W_h x_t + b_h
        h_t = (1 - z_t) * h_{t-1} + z_t * h~_t

    The gates read only x_t, so the recurrence has no parameters of its own and its Jacobian is 1 - z_t (exact RTRL
    carries only the input projection's sensitivities). ``input_proj`` holds [W_z; W_h] (gate 0: z, gate 1: the
    candidate) with PyTorch's default initialisation, as in the paper's code. (The paper's log-space variant, which
    also forces h~ > 0, exists to run a parallel scan; it computes the same recurrence.)

    Args:
        update_bias: added to b_z. The paper's value is 0 (z starts near 1/2, a memory of a few steps); a negative
            value (e.g. -3) starts z near 0, so that h keeps its content for many steps, which long delays need.
    """

    num_gates = 2

    def __init__(self, input_size: int, hidden_size: int, update_bias: float = 0.0) -> None:
        super().__init__(input_size, hidden_size)
        with torch.no_grad():
            self.input_proj.bias[:hidden_size] += update_bias

    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        z = torch.sigmoid(gates[..., 0, :])
        return (1.0 - z) * c_prev + z * gates[..., 1, :]


class MinLSTMCell(ElementwiseCell):
    """minLSTM of Feng et al., "Were RNNs All We Needed?" (2024), in its sequential form (their Algorithm 3)::

        f_t = sigmoid(W_f x_t + b_f)          i_t = sigmoid(W_i x_t + b_i)          h~_t = W_h x_t + b_h
        f'_t, i'_t = f_t / (f_t + i_t), i_t / (f_t + i_t)                           (length-independent scaling)
        h_t = f'_t * h_{t-1} + i'_t * h~_t

    ``input_proj`` holds [W_f; W_i; W_h] with PyTorch's default initialisation. As for :class:`MinGRUCell`, the
    recurrence has no parameters of its own.

    Args:
        forget_bias: added to b_f. The paper's value is 0 (f' starts near 1/2); a positive value (e.g. 3) starts f'
            near 1, i.e. with long memory.
        normalize: apply the length-independent scaling (the paper's default); False keeps f and i as they are.
    """

    num_gates = 3

    def __init__(self, input_size: int, hidden_size: int, forget_bias: float = 0.0, normalize: bool = True) -> None:
        super().__init__(input_size, hidden_size)
        self.normalize = normalize
        with torch.no_grad():
            self.input_proj.bias[:hidden_size] += forget_bias

    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        f = torch.sigmoid(gates[..., 0, :])
        i = torch.sigmoid(gates[..., 1, :])
        if self.normalize:
            total = f + i
            f, i = f / total, i / total
        return f * c_prev + i * gates[..., 2, :]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, normalize={self.normalize}"
