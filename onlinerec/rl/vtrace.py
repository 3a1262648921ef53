"""V-trace off-policy actor-critic targets (Espeholt et al. 2018; docs/r2ac.md#v-trace).

Everything here runs without gradient: the targets are constants for the loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["vtrace"]


@torch.no_grad()
def vtrace(
    behaviour_logp: Tensor,
    target_logp: Tensor,
    rewards: Tensor,
    discounts: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    clip_rho: float | None = 1.0,
    clip_c: float | None = 1.0,
    clip_pg_rho: float | None = 1.0,
    weight_advantages: bool = True,
    trace_lambda: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace value targets and policy-gradient advantages on time-major (T, B) tensors.

    With ``rho_t = pi(a_t|x_t) / mu(a_t|x_t)``, ``rho-bar_t = min(clip_rho, rho_t)``,
    ``c_t = lambda min(clip_c, rho_t)`` (``lambda = trace_lambda``, Espeholt et al.'s remark 2: 1 is plain V-trace)
    and ``delta_t = rho-bar_t (r_t + gamma_t V(x_{t+1}) - V(x_t))``::

        v_s   = V(x_s) + sum_{k >= s} (prod_{i=s}^{k-1} gamma_i c_i) delta_k
        adv_s = min(clip_pg_rho, rho_s) (r_s + gamma_s v_{s+1} - V(x_s))

    where ``V(x_T)`` and ``v_T`` are ``bootstrap_value``. Computed by the backward recursion
    ``v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1}))``.

    On-policy (``rho_t = 1``) ``v_s`` is the TD(lambda) return and ``v_s - V(x_s)`` is GAE(gamma, lambda)'s advantage;
    ``adv_s`` keeps the first step's ``r_s + gamma_s v_{s+1}`` whole, so it equals
    ``delta_s + (GAE_s - delta_s) / lambda`` (the same as GAE at ``lambda = 1``).

    Args:
        behaviour_logp: (T, B) log mu(a_t|x_t) of the actions taken, under the acting policy.
        target_logp: (T, B) log pi(a_t|x_t) under the policy being learned.
        rewards: (T, B) r_t, the reward that followed a_t (already clipped if clipping is wanted).
        discounts: (T, B) gamma_t; 0 where the episode ended at the step after t (no bootstrap across it).
        values: (T, B) V(x_t) from the learner.
        bootstrap_value: (B,) V(x_T).
        clip_rho, clip_c, clip_pg_rho: truncation levels (None: no truncation).
        weight_advantages: False leaves the importance weight out of the advantages (``adv_s = r_s + gamma_s v_{s+1}
            - V(x_s)``, ``clip_pg_rho`` unused), for an objective that applies pi/mu itself (PPO's clipped ratio).
        trace_lambda: lambda in [0, 1], how far the targets trace the rewards ahead: 0 bootstraps after one step,
            1 is the paper's V-trace. Smaller values trade bias for less variance, as GAE's lambda does.

    Returns:
        ``(vs, pg_advantages)``, both (T, B), detached.
    """
    shapes = {t.shape for t in (behaviour_logp, target_logp, rewards, discounts, values)}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(
            f"vtrace needs time-major (T, B) tensors of one shape; got shapes {sorted(map(tuple, shapes))}."
        )
    if tuple(bootstrap_value.shape) != tuple(values.shape[1:]):
        raise ValueError(
            f"bootstrap_value must have shape (B,) = {tuple(values.shape[1:])}; got {tuple(bootstrap_value.shape)}."
        )
    if not 0.0 <= trace_lambda <= 1.0:
        raise ValueError(f"trace_lambda must be in [0, 1] (1: plain V-trace), got {trace_lambda!r}.")
    rhos = torch.exp(target_logp - behaviour_logp)
    clipped_rhos = rhos if clip_rho is None else rhos.clamp(max=clip_rho)
    cs = trace_lambda * (rhos if clip_c is None else rhos.clamp(max=clip_c))
    values_next = torch.cat([values[1:], bootstrap_value.unsqueeze(0)])
    deltas = clipped_rhos * (rewards + discounts * values_next - values)

    acc = torch.zeros_like(bootstrap_value)
    vs_minus_v = torch.empty_like(values)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values

    vs_next = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)])
    if not weight_advantages:
        return vs, rewards + discounts * vs_next - values
    pg_rhos = rhos if clip_pg_rho is None else rhos.clamp(max=clip_pg_rho)
    pg_advantages = pg_rhos * (rewards + discounts * vs_next - values)
    return vs, pg_advantages
