"""Recurrent Trace Unit (Elelimy et al. 2024): the LRU's complex diagonal recurrence in real "cosine" form, each unit a
K = 2 pair, with a nonlinearity on the output (linear RTU) or inside the recurrence (non-linear RTU)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from typing_extensions import override

from onlinerec.cells.base import ElementwiseCell
from onlinerec.cells.lru import eigenvalue, ring_parameters, rotation_derivatives

ACTIVATIONS = ("relu", "tanh", "identity")
"""The nonlinearities f an :class:`RTUCell` takes."""

_LECUN_TRUNCATION = 0.87962566103423978
"""The standard deviation of a standard normal truncated to [-2, 2]: dividing by it gives the truncated draw the
variance 1 / fan_in (LeCun normal)."""


class RTUCell(ElementwiseCell):
    """Recurrent Trace Unit of Elelimy, White, Bowling and White, "Real-Time Recurrent Learning using Trace Units in
    Reinforcement Learning" (NeurIPS 2024, arXiv:2409.01449); the recurrent layer of the streaming actor-critic of
    Farr et al., "Streaming Reinforcement Learning under Partial Observability with Real-Time Recurrent Learning"
    (2026, arXiv:2605.24709).

    Each of the N units holds a complex number c1 + i c2 as K = 2 real components (``num_components = 2``; the state is
    (..., 2, N), ``[..., 0, :]`` = c1, ``[..., 1, :]`` = c2). The eigenvalue lambda = r e^(i theta) acts on the pair as
    a 2 x 2 rotation-and-decay block::

        r = exp(-exp(nu_log)),  theta = exp(theta_log)             # r < 1 for every nu_log: stable by construction
        g = r cos(theta),  phi = r sin(theta),  gamma = sqrt(1 - r^2)
        a1 = g c1_{t-1} - phi c2_{t-1} + gamma W1 x_t
        a2 = g c2_{t-1} + phi c1_{t-1} + gamma W2 x_t

    - Linear RTU (``nonlinear=False``, the default): the recurrence stays linear, ``c_t = (a1, a2)``, and the output
      is ``h_t = [f(c1_t), f(c2_t)]``.
    - Non-linear RTU (``nonlinear=True``): the nonlinearity is inside the recurrence, ``c_t = (f(a1), f(a2))``, and
      the output is the state itself, ``h_t = [c1_t, c2_t]``.

    Either way the output has 2N features (``output_size == 2 * hidden_size``) and f is ``activation``: "relu" (the
    default, as in the authors' RTU layers), "tanh" or "identity".

    - W1 and W2 are two real input matrices (no bias) and form the input projection with G = 2 gates:
      ``gates[..., 0, :] = W1 x`` and ``gates[..., 1, :] = W2 x``, each drawn from a LeCun normal (variance 1/D,
      truncated at two standard deviations), as in the authors' code.
    - gamma normalises the input as in the LRU; it is not a parameter of its own but follows r (and nu_log's gradient
      runs through it).
    - Ring initialisation as in the LRU: r uniform in area on the ring r_min <= r <= r_max, theta uniform in
      [0, max_phase]. The defaults (0, 1, 6.28) are those of the authors' code.
    - The linear RTU is the default because it is the variant the authors' published control configuration trains.
      Its Jacobian is the constant rotation-and-decay block; the non-linear RTU's scales each row of that block by
      f'(a), and with a 1-Lipschitz f (relu, tanh) it is a contraction too.

    The recurrence is element-wise per unit with a 2 x 2 Jacobian, so RTRL is exact and costs O(N D) per step. The
    local derivatives have a closed form (:meth:`recurrence_derivatives`), checked against autodiff before use.
    """

    num_gates = 2
    num_components = 2

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        nonlinear: bool = False,
        activation: str = "relu",
        r_min: float = 0.0,
        r_max: float = 1.0,
        max_phase: float = 6.28,
    ) -> None:
        super().__init__(input_size, hidden_size)
        if not isinstance(nonlinear, bool):
            raise ValueError(f"RTUCell: nonlinear must be True or False, got {nonlinear!r}.")
        if activation not in ACTIVATIONS:
            raise ValueError(f"RTUCell: activation must be one of {list(ACTIVATIONS)}, got {activation!r}.")
        if not 0.0 <= r_min < r_max <= 1.0 or not max_phase > 0:
            raise ValueError(
                f"RTUCell needs 0 <= r_min < r_max <= 1 and max_phase > 0, got r_min={r_min}, r_max={r_max}, "
                f"max_phase={max_phase}."
            )
        self.nonlinear = nonlinear
        self.activation = activation
        n, d = hidden_size, input_size
        self.input_proj = nn.Linear(d, 2 * n, bias=False)  # [W1; W2]
        nu_log, theta_log = ring_parameters(torch.rand(n), torch.rand(n), r_min, r_max, max_phase)
        self.nu_log, self.theta_log = nn.Parameter(nu_log), nn.Parameter(theta_log)
        with torch.no_grad():
            std = math.sqrt(1.0 / d) / _LECUN_TRUNCATION
            nn.init.trunc_normal_(self.input_proj.weight, std=std, a=-2 * std, b=2 * std)

    def _f(self, a: Tensor) -> Tensor:
        if self.activation == "relu":
            return torch.relu(a)
        if self.activation == "tanh":
            return torch.tanh(a)
        return a

    def _f_slope(self, a: Tensor, fa: Tensor) -> Tensor:
        """f'(a), given a and f(a)."""
        if self.activation == "relu":
            return (a > 0).to(a.dtype)
        if self.activation == "tanh":
            return 1 - fa * fa
        return torch.ones_like(a)

    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        _, _, g, phi, gamma = eigenvalue(self.nu_log, self.theta_log, None)
        c1, c2 = c_prev[..., 0, :], c_prev[..., 1, :]
        a1 = g * c1 - phi * c2 + gamma * gates[..., 0, :]
        a2 = g * c2 + phi * c1 + gamma * gates[..., 1, :]
        a = torch.stack([a1, a2], dim=-2)
        return self._f(a) if self.nonlinear else a

    @override
    def recurrence_derivatives(
        self, gates: Tensor, c_prev: Tensor, params: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
        # The LRU's closed form with gamma = sqrt(1 - r^2); the non-linear RTU multiplies row k of each by f'(a_k).
        nu_log, theta_log = params.get("nu_log", self.nu_log), params.get("theta_log", self.theta_log)
        a, d_state, d_gates, d_params = rotation_derivatives(gates, c_prev, nu_log, theta_log, None)
        d_params = {k: d for k, d in d_params.items() if k in params}
        value = a
        if self.nonlinear:
            value = self._f(a)
            slope = self._f_slope(a, value)  # (R, 2, N)
            d_state = slope.unsqueeze(2) * d_state
            d_gates = slope.unsqueeze(2) * d_gates
            d_params = {k: slope * d for k, d in d_params.items()}
        return value, d_state, d_gates, {k: d.unsqueeze(2) for k, d in d_params.items() if k in params}

    def readout(self, c: Tensor, x: Tensor) -> Tensor:
        return (c if self.nonlinear else self._f(c)).flatten(-2)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, nonlinear={self.nonlinear}, activation={self.activation!r}"
