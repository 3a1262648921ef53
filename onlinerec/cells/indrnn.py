"""IndRNN (Li et al. 2018): every unit has one recurrent weight on its own previous state."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from onlinerec.cells.base import ElementwiseCell

_ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh}


class IndRNNCell(ElementwiseCell):
    """Independently recurrent neural network of Li et al., "Independently Recurrent Neural Network (IndRNN): Building
    A Longer and Deeper RNN" (CVPR 2018)::

        h_t = sigma(W x_t + u * h_{t-1} + b)          sigma = ReLU (the paper's) or tanh

    u is a vector (one recurrent weight per unit, ``recurrent_weight``), so the recurrence is element-wise and its
    Jacobian is sigma'(.) * u. ``input_proj`` holds W and b with PyTorch's default initialisation; u starts uniform in
    [0, 1) (clamped to ``recurrent_max`` when given).

    Args:
        nonlinearity: "relu" (the paper) or "tanh".
        recurrent_max: the paper's constraint |u| <= u_max, which keeps gradients from exploding or vanishing over
            T steps (e.g. u_max = 2^(1/T) for ReLU). The paper clips u after each update; here the forward pass uses
            clamp(u, -u_max, u_max) and the gradient passes through the clamp unchanged (straight-through), so a
            weight beyond the bound acts as the bound and can still move back inside. None (the default):
            unconstrained.
    """

    num_gates = 1

    def __init__(
        self, input_size: int, hidden_size: int, nonlinearity: str = "relu", recurrent_max: float | None = None
    ) -> None:
        super().__init__(input_size, hidden_size)
        if nonlinearity not in _ACTIVATIONS:
            raise ValueError(f"IndRNNCell: nonlinearity must be one of {sorted(_ACTIVATIONS)}, got {nonlinearity!r}.")
        if recurrent_max is not None and not recurrent_max > 0:
            raise ValueError(f"IndRNNCell: recurrent_max must be positive or None, got {recurrent_max!r}.")
        self.nonlinearity = nonlinearity
        self.recurrent_max = recurrent_max
        self.recurrent_weight = nn.Parameter(torch.rand(hidden_size))
        if recurrent_max is not None:
            with torch.no_grad():
                self.recurrent_weight.clamp_(-recurrent_max, recurrent_max)

    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        u = self.recurrent_weight
        if self.recurrent_max is not None:  # straight-through: forward clamped, gradient as if not
            u = u + (u.clamp(-self.recurrent_max, self.recurrent_max) - u).detach()
        return _ACTIVATIONS[self.nonlinearity](gates[..., 0, :] + u * c_prev)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, nonlinearity={self.nonlinearity!r}, recurrent_max={self.recurrent_max}"
