"""Linear Recurrent Unit (Orvieto et al. 2023): a complex diagonal recurrence, each unit a K = 2 (real, imaginary) pair."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from typing_extensions import override

from onlinerec.cells.base import ElementwiseCell


class LRUCell(ElementwiseCell):
    """Linear Recurrent Unit of Orvieto et al., "Resurrecting Recurrent Neural Networks for Long Sequences" (ICML 2023).

    Each of the N units holds one complex number h = h_re + i h_im, stored as K = 2 real components
    (``num_components = 2``; the state is (..., 2, N) with ``[..., 0, :]`` the real and ``[..., 1, :]`` the imaginary
    part)::

        lambda = exp(-exp(nu_log) + i exp(theta_log))               # |lambda| < 1: stable by construction
        h_t    = lambda * h_{t-1} + gamma * (B_re x_t + i B_im x_t)   # gamma = exp(gamma_log)
        y_t    = Re(C h_t) + D * x_t = C_re h_re - C_im h_im + D * x_t

    - The complex input matrix B = B_re + i B_im is the input projection with G = 2 gates (no bias, as in the paper):
      ``gates[..., 0, :] = B_re x`` and ``gates[..., 1, :] = B_im x``, N(0, 1/(2D)) each.
    - gamma normalises the input so that the state's variance does not grow as |lambda| -> 1. As in the paper's
      listing it is a trainable per-unit parameter ``gamma_log`` started at log sqrt(1 - |lambda|^2); with
      ``train_gamma=False`` it is recomputed from nu_log at every step, gamma = sqrt(1 - |lambda|^2).
    - Ring initialisation: |lambda| uniform on the ring r_min <= |lambda| <= r_max (uniform in area) and the phase
      uniform in [0, max_phase]. The defaults are those of the paper's listing (0, 1, 6.28); the paper's long-range
      experiments use r_min >= 0.9 and r_max close to 1, which gives long memory from the start.
    - ``slow_fraction`` > 0 draws the last ``round(slow_fraction * N)`` units from a second ring instead,
      ``slow_r_min <= |lambda| <= r_max`` with phases in [0, ``slow_max_phase``] (defaults 0.95 and pi/10): slow units
      that neither fade nor rotate, which count or integrate over long spans, next to the fast units of the first ring
      (docs/r2ac.md#the-networks-options measures both kinds of memory task). 0 (the default) is the paper's single ring.
    - The readout is feed-forward (dense C: ``output_re``, ``output_im`` of shape (D, N), N(0, 1/N); ``skip`` = D of
      shape (D,), N(0, 1)) and maps back to the input width: ``output_size == input_size``, so layers stack with a
      residual connection.

    The recurrence is element-wise per unit with a 2 x 2 rotation-and-decay Jacobian, so RTRL is exact
    (Zucchet et al. 2023, "Online learning of long-range dependencies", train it online this way).
    """

    num_gates = 2
    num_components = 2

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        r_min: float = 0.0,
        r_max: float = 1.0,
        max_phase: float = 6.28,
        train_gamma: bool = True,
        slow_fraction: float = 0.0,
        slow_r_min: float = 0.95,
        slow_max_phase: float = 0.314,
    ) -> None:
        super().__init__(input_size, hidden_size)
        if not 0.0 <= r_min < r_max <= 1.0 or not max_phase > 0:
            raise ValueError(
                f"LRUCell needs 0 <= r_min < r_max <= 1 and max_phase > 0, got r_min={r_min}, r_max={r_max}, "
                f"max_phase={max_phase}."
            )
        if not 0.0 <= slow_fraction <= 1.0 or (
            slow_fraction > 0 and not (0.0 <= slow_r_min < r_max and slow_max_phase > 0)
        ):
            raise ValueError(
                f"LRUCell needs 0 <= slow_fraction <= 1 and, for slow units, 0 <= slow_r_min < r_max and "
                f"slow_max_phase > 0; got slow_fraction={slow_fraction}, slow_r_min={slow_r_min}, r_max={r_max}, "
                f"slow_max_phase={slow_max_phase}."
            )
        n, d = hidden_size, input_size
        self.input_proj = nn.Linear(d, 2 * n, bias=False)  # [B_re; B_im]
        u1, u2 = torch.rand(n), torch.rand(n)
        fast = n - round(slow_fraction * n)
        rings = [
            ring_parameters(u1[units], u2[units], lo, r_max, phase)
            for units, lo, phase in ((slice(0, fast), r_min, max_phase), (slice(fast, n), slow_r_min, slow_max_phase))
        ]
        nu_log, theta_log = (torch.cat(parts) for parts in zip(*rings))
        self.nu_log = nn.Parameter(nu_log)
        self.theta_log = nn.Parameter(theta_log)
        self.train_gamma = train_gamma
        gamma_log = 0.5 * torch.log1p(-torch.exp(-2 * torch.exp(nu_log)))  # log sqrt(1 - |lambda|^2)
        self.register_parameter("gamma_log", nn.Parameter(gamma_log) if train_gamma else None)
        self.output_re = nn.Parameter(torch.randn(d, n) / math.sqrt(n))
        self.output_im = nn.Parameter(torch.randn(d, n) / math.sqrt(n))
        self.skip = nn.Parameter(torch.randn(d))
        with torch.no_grad():
            self.input_proj.weight.normal_(0.0, (2 * d) ** -0.5)

    @property
    def output_size(self) -> int:
        return self.input_size

    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        _, _, lam_re, lam_im, gamma = eigenvalue(self.nu_log, self.theta_log, self.gamma_log)
        h_re, h_im = c_prev[..., 0, :], c_prev[..., 1, :]
        new_re = lam_re * h_re - lam_im * h_im + gamma * gates[..., 0, :]
        new_im = lam_re * h_im + lam_im * h_re + gamma * gates[..., 1, :]
        return torch.stack([new_re, new_im], dim=-2)

    @override
    def recurrence_derivatives(
        self, gates: Tensor, c_prev: Tensor, params: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
        # Closed form, about 5x faster than autodiff at the Atari shape (checked against autodiff before use):
        # dc/dc_prev is the rotation-and-decay block of lambda; dlambda/dnu_log = -exp(nu_log) lambda and
        # dlambda/dtheta_log = i exp(theta_log) lambda; dc/dgates = gamma on the diagonal.
        nu_log, theta_log = params.get("nu_log", self.nu_log), params.get("theta_log", self.theta_log)
        value, d_state, d_gates, d_params = rotation_derivatives(
            gates, c_prev, nu_log, theta_log, params.get("gamma_log", self.gamma_log)
        )
        return value, d_state, d_gates, {k: d.unsqueeze(2) for k, d in d_params.items() if k in params}

    def readout(self, c: Tensor, x: Tensor) -> Tensor:
        return c[..., 0, :] @ self.output_re.T - c[..., 1, :] @ self.output_im.T + self.skip * x

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, train_gamma={self.train_gamma}"


def ring_parameters(u1: Tensor, u2: Tensor, r_min: float, r_max: float, max_phase: float) -> tuple[Tensor, Tensor]:
    """(nu_log, theta_log) of units with |lambda| uniform in area on the ring r_min <= |lambda| <= r_max and the phase
    uniform in [0, max_phase] (Orvieto et al. 2023, their Lemma 3.2), for lambda = exp(-exp(nu_log) + i exp(theta_log)),
    from uniform draws u1, u2 in [0, 1), one per unit."""
    return torch.log(-0.5 * torch.log(u1 * (r_max**2 - r_min**2) + r_min**2)), torch.log(max_phase * u2)


def rotation_derivatives(
    gates: Tensor, c_prev: Tensor, nu_log: Tensor, theta_log: Tensor, gamma_log: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
    """The step a = lambda c_prev + gamma gates of a complex diagonal unit (rows (R, 2, ...)) and its local derivatives
    in closed form: da/dc_prev is the rotation-and-decay block of lambda, dlambda/dnu_log = -exp(nu_log) lambda,
    dlambda/dtheta_log = i exp(theta_log) lambda, da/dgates = gamma on the diagonal; gamma = exp(gamma_log), or
    sqrt(1 - |lambda|^2) (which also depends on nu_log) for ``gamma_log=None``. Returns (a, d_state (R, 2, 2, N),
    d_gates (R, 2, 2, N), {"nu_log", "theta_log", "gamma_log": (R, 2, N)})."""
    r = c_prev.shape[0]
    e, phase, lam_re, lam_im, gamma = eigenvalue(nu_log, theta_log, gamma_log)
    h_re, h_im = c_prev[:, 0], c_prev[:, 1]
    rot_re, rot_im = lam_re * h_re - lam_im * h_im, lam_re * h_im + lam_im * h_re  # lambda h
    in_re, in_im = gamma * gates[:, 0], gamma * gates[:, 1]
    value = torch.stack([rot_re + in_re, rot_im + in_im], dim=1)
    d_state = torch.stack([lam_re, -lam_im, lam_im, lam_re]).view(2, 2, -1).expand(r, -1, -1, -1)
    zero = torch.zeros_like(gamma)
    d_gates = torch.stack([gamma, zero, zero, gamma]).view(2, 2, -1).expand(r, -1, -1, -1)
    d_nu = torch.stack([-e * rot_re, -e * rot_im], dim=1)
    if gamma_log is None:  # gamma = sqrt(1 - exp(-2 e)) depends on nu_log too
        d_nu = d_nu + (e * torch.exp(-2 * e) / gamma) * gates
    d_params = {"nu_log": d_nu, "theta_log": torch.stack([-phase * rot_im, phase * rot_re], dim=1)}
    if gamma_log is not None:
        d_params["gamma_log"] = torch.stack([in_re, in_im], dim=1)
    return value, d_state, d_gates, d_params


def eigenvalue(nu_log: Tensor, theta_log: Tensor, gamma_log: Tensor | None) -> tuple[Tensor, ...]:
    """(exp(nu_log), the phase exp(theta_log), Re lambda, Im lambda, gamma) for lambda = exp(-exp(nu_log) + i phase);
    gamma = exp(gamma_log), or sqrt(1 - |lambda|^2) when it is not trained."""
    e, phase = torch.exp(nu_log), torch.exp(theta_log)
    modulus = torch.exp(-e)
    gamma = torch.exp(gamma_log) if gamma_log is not None else torch.sqrt(-torch.expm1(-2 * e))
    return e, phase, modulus * torch.cos(phase), modulus * torch.sin(phase), gamma
