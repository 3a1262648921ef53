"""R2AC's loss terms as pure functions of time-major (T, B) tensors (docs/r2ac.md#the-losses).

The IMPALA actor-critic of Espeholt et al. 2018 (section 4.2, "Actor-critic algorithm"), as R2AC uses it (Irie et al.
2024, "Exploring the Promise and Limits of Real-Time Recurrent Learning"): a policy-gradient term on V-trace's
advantages, a value (baseline) term on V-trace's targets and an entropy term, each reduced over the T steps and B
streams of a segment (``"sum"``, the paper's, or ``"mean"``). PPO's clipped-ratio objective (Schulman et al. 2017,
"Proximal Policy Optimization Algorithms", eq. 7) can replace the policy-gradient term.

Every function returns the term to minimise, unweighted: the caller multiplies by its cost (``baseline_cost``,
``entropy_cost``) and adds the terms. The targets (:func:`onlinerec.rl.vtrace.vtrace`) are constants here: pass them
detached. Episode ends need no mask: they enter through V-trace's discounts, and every step of a segment is a real
agent step, so every (t, b) entry counts.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["Reduction", "baseline_loss", "clipped_ratio_loss", "entropy_loss", "policy_gradient_loss"]

Reduction = Literal["sum", "mean"]


def _reduce(values: Tensor, reduction: str) -> Tensor:
    """The sum (the paper's) or the mean of ``values`` over every step and stream."""
    if reduction == "sum":
        return values.sum()
    if reduction == "mean":
        return values.mean()
    raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}.")


def _check_shapes(loss: str, **tensors: Tensor) -> None:
    """Time-major (T, B) tensors of one shape, as :func:`onlinerec.rl.vtrace.vtrace` takes and returns them."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
        raise ValueError(f"{loss} needs time-major (T, B) tensors of one shape; got {shapes}.")


def policy_gradient_loss(log_probs: Tensor, advantages: Tensor, reduction: Reduction = "sum") -> Tensor:
    """The policy-gradient loss ``-sum_{t,b} log pi(a_t|x_t) adv_t`` (``"mean"``: divided by T B).

    Its gradient is minus IMPALA's policy-gradient direction ``rho_t grad log pi(a_t|x_t) (r_t + gamma_t v_{t+1} -
    V(x_t))`` (Espeholt et al. 2018, section 4.2) when ``advantages`` are V-trace's (``vtrace``'s ``pg_advantages``,
    which hold the truncated importance weight ``rho_t``).

    Args:
        log_probs: (T, B) log pi(a_t|x_t) of the actions taken, under the policy being learned (with gradient).
        advantages: (T, B) the advantages, constants (detached).
        reduction: ``"sum"`` (the paper's) or ``"mean"`` over the T B entries.

    Returns:
        The scalar loss.
    """
    _check_shapes("policy_gradient_loss", log_probs=log_probs, advantages=advantages)
    return -_reduce(log_probs * advantages, reduction)


def clipped_ratio_loss(
    log_probs: Tensor,
    behaviour_log_probs: Tensor,
    advantages: Tensor,
    clip: float,
    reduction: Reduction = "sum",
) -> tuple[Tensor, Tensor]:
    """PPO's clipped-ratio loss ``-sum_{t,b} min(rho_t adv_t, clip(rho_t, 1 - eps, 1 + eps) adv_t)`` (Schulman et al.
    2017, eq. 7, the objective L^CLIP with its sign turned), where ``rho_t = pi(a_t|x_t) / mu(a_t|x_t)`` against the
    behaviour policy mu that acted and ``eps = clip``.

    The ratio takes the place of V-trace's importance weight, so ``advantages`` are V-trace's without it
    (``vtrace(..., weight_advantages=False)``: ``r_t + gamma_t v_{t+1} - V(x_t)``).

    Args:
        log_probs: (T, B) log pi(a_t|x_t) under the policy being learned (with gradient).
        behaviour_log_probs: (T, B) log mu(a_t|x_t) under the policy that acted, in the dtype of ``log_probs``.
        advantages: (T, B) the advantages, constants (detached).
        clip: eps > 0, how far the ratio may move from 1 before the objective stops rewarding it.
        reduction: ``"sum"`` (the paper's) or ``"mean"`` over the T B entries.

    Returns:
        ``(loss, clip_fraction)``: the scalar loss, and the fraction of entries whose ratio lies outside
        [1 - eps, 1 + eps] (detached), a measure of how far the policy has moved from the one that acted.
    """
    _check_shapes(
        "clipped_ratio_loss", log_probs=log_probs, behaviour_log_probs=behaviour_log_probs, advantages=advantages
    )
    if not clip > 0:
        raise ValueError(f"clip must be a number > 0 (PPO uses 0.1 to 0.3), got {clip!r}.")
    ratio = torch.exp(log_probs - behaviour_log_probs)
    objective = torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    clip_fraction = ((ratio - 1).abs() > clip).to(ratio.dtype).mean().detach()
    return -_reduce(objective, reduction), clip_fraction


def baseline_loss(targets: Tensor, values: Tensor, reduction: Reduction = "sum") -> Tensor:
    """The value (baseline) loss ``1/2 sum_{t,b} (v_t - V(x_t))^2`` (``"mean"``: divided by T B).

    Its gradient is minus IMPALA's value update ``(v_t - V(x_t)) grad V(x_t)`` (Espeholt et al. 2018, section 4.2)
    when ``targets`` are V-trace's ``v_t``.

    Args:
        targets: (T, B) the value targets v_t, constants (detached).
        values: (T, B) the learner's values V(x_t) (with gradient).
        reduction: ``"sum"`` (the paper's) or ``"mean"`` over the T B entries.

    Returns:
        The scalar loss.
    """
    _check_shapes("baseline_loss", targets=targets, values=values)
    return 0.5 * _reduce((targets - values) ** 2, reduction)


def entropy_loss(entropy: Tensor, reduction: Reduction = "sum") -> Tensor:
    """The entropy loss ``sum_{t,b} sum_a pi(a|x_t) log pi(a|x_t) = -sum_{t,b} H(pi(.|x_t))`` (``"mean"``: divided by
    T B): minimised, it raises the policy's entropy, the exploration bonus of Espeholt et al. 2018, section 4.2.

    Args:
        entropy: (T, B) the entropy H(pi(.|x_t)) of the policy at every step (with gradient).
        reduction: ``"sum"`` (the paper's) or ``"mean"`` over the T B entries.

    Returns:
        The scalar loss.
    """
    _check_shapes("entropy_loss", entropy=entropy)
    return _reduce(-entropy, reduction)
