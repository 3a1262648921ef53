"""Fused fully online steps (M = 1) for cells whose RTRL recursion is short in closed form: the linear RTU.

The generic step (:func:`~onlinerec.gradients.inplace.online_step`) serves any element-wise cell: it asks the cell
for its local derivatives, builds each unit's K x K Jacobian and applies it to every sensitivity. At the streaming
agent's size (one stream, N = 64) that bookkeeping costs more than the arithmetic, so for the linear RTU the same
recursion is written out here in a few in-place calls. It updates the same carry in the same layout (checkpoints
and the generic step read it unchanged); tests check it against the generic step and full BPTT in float64.

Linear RTU (:class:`~onlinerec.cells.RTUCell`, docs/streaming.md), per unit with lambda = g + i phi and the keep
flag k (0 after a reset): the state a = k R c_prev + gamma W x with R = [[g, -phi], [phi, g]], and its
sensitivities S = da/dtheta (two components, one per row of R) follow

    S <- k R S + I,  I_W[comp, gate] = [comp == gate] gamma x,
    I_nu = -e (k R c_prev) + (e exp(-2 e) / gamma) W x,   I_theta = phase * i (k R c_prev)   (e = exp(nu_log))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from onlinerec.cells.rtu import RTUCell

__all__ = ["fused_online_step"]

_RTU_TRACKED = ("input_proj.weight", "nu_log", "theta_log")


class _FusedState(torch.autograd.Function):
    """The new state (B, 2, N), whose backward sends dL/da into the features (through gamma W) and, for each tracked
    parameter, sum_{b, k} dL/da[b, k, n] S[b, k, ..., n, :] into its gradient."""

    @staticmethod
    def forward(ctx, value: Tensor, feats: Tensor, gamma: Tensor, weight: Tensor, s_w, s_nu, s_theta, *params):
        ctx.save_for_backward(gamma, weight, s_w, s_nu, s_theta)
        return value.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        gamma, weight, s_w, s_nu, s_theta = ctx.saved_tensors
        needs = ctx.needs_input_grad
        g_feats = (grad * gamma).flatten(1) @ weight if needs[1] else None  # dL/dx = (gamma dL/da) . W
        lam = grad.unsqueeze(2).unsqueeze(-1)  # (B, 2, 1, N, 1)
        g_w = (lam * s_w).sum((0, 1)).flatten(0, 1) if needs[7] else None  # (2N, F), rows [W1; W2]
        g_nu = (lam * s_nu).sum((0, 1, 2, 4)) if needs[8] else None
        g_theta = (lam * s_theta).sum((0, 1, 2, 4)) if needs[9] else None
        return None, g_feats, None, None, None, None, None, g_w, g_nu, g_theta


def _rotate_(s: Tensor, g: Tensor, phi: Tensor) -> None:
    """s[:, 0], s[:, 1] <- g s[:, 0] - phi s[:, 1], g s[:, 1] + phi s[:, 0] in place, for s (B, 2, P, N, F) and
    g, phi (B, 1, N, 1): each unit's 2 x 2 block applied to its two component rows."""
    s0, s1 = s.unbind(1)
    first = s0.clone()
    s0.mul_(g).addcmul_(s1, phi, value=-1)
    s1.mul_(g).addcmul_(first, phi)


def fused_online_step(
    cell, params: dict[str, Tensor], feats: Tensor, keep: Tensor, c0: Tensor, sens: dict[str, Tensor]
) -> tuple[Tensor, Tensor, dict[str, Tensor]] | None:
    """The fully online step of ``cell`` in fused form, or None where none applies (any cell but a plain linear
    :class:`~onlinerec.cells.RTUCell`, other tracked parameters, mixed dtypes, autocast). Arguments and results as
    :func:`~onlinerec.gradients.inplace.online_step`: features (1, B, F), keep (1, B), the state c0 (B, 2, N) and the
    donated sensitivities, updated in place (contiguous, as the caller's in-place check ensures)."""
    if type(cell) is not RTUCell or cell.nonlinear or tuple(sens) != _RTU_TRACKED:
        return None
    weight, nu_log, theta_log = (params[k] for k in _RTU_TRACKED)
    dtype = c0.dtype
    if torch.is_autocast_enabled() or any(t.dtype != dtype for t in (weight, feats, *sens.values())):
        return None
    s_w, s_nu, s_theta = sens.values()
    n = cell.hidden_size
    x = feats[0]  # (B, F)
    with torch.no_grad():
        e, phase = nu_log.detach().exp(), theta_log.detach().exp()
        r = e.neg().exp_()  # |lambda|
        g, phi = torch.view_as_real(torch.polar(r, phase)).unbind(-1)  # lambda = g + i phi
        gamma = e.mul(-2).expm1_().neg_().sqrt_()  # sqrt(1 - |lambda|^2), accurate where |lambda| is near 1
        x_in = x.detach()
        wx = F.linear(x_in, weight.detach()).view(-1, 2, n)  # (B, 2, N): W1 x, W2 x
        k = keep[0].to(dtype)[:, None]  # (B, 1)
        gk, pk = g * k, phi * k  # (B, N): this step's block, cut by a reset
        c1, c2 = c0.unbind(1)
        rot = torch.stack([gk * c1 - pk * c2, gk * c2 + pk * c1], 1)  # (B, 2, N): k R c_prev
        value = torch.addcmul(rot, gamma, wx)
        gb, pb = gk[:, None, :, None], pk[:, None, :, None]
        for s in (s_w, s_nu, s_theta):
            _rotate_(s, gb, pb)
        gamma_x = gamma[:, None] * x_in[:, None, :]  # (B, N, F): the input's share, on the diagonal
        s_w[:, 0, 0].add_(gamma_x)
        s_w[:, 1, 1].add_(gamma_x)
        s_nu.view(-1, 2, n).addcmul_(rot, e, value=-1).addcmul_(wx, e.mul_(r).mul_(r).div_(gamma))
        s_theta.view(-1, 2, n).addcmul_(torch.stack([rot[:, 1].neg(), rot[:, 0]], 1), phase)
    state = _FusedState.apply(value, x, gamma, weight.detach(), s_w, s_nu, s_theta, weight, nu_log, theta_log)
    return state, value, sens
