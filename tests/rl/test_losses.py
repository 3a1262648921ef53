"""R2AC's loss terms against slow, obviously right loops over every step and stream (docs/r2ac.md#the-losses).

Each reference adds up one entry at a time in float64 scalars, so autograd also gives the reference gradient. The loss
functions take no mask: episode ends reach the losses through V-trace's discounts, so every (t, b) entry counts.
"""

from __future__ import annotations

import pytest
import torch

from onlinerec.rl.losses import baseline_loss, clipped_ratio_loss, entropy_loss, policy_gradient_loss

T, B = 7, 3


def problem(seed=0):
    """Time-major (T, B) float64 tensors: log-probs under the learned and the acting policy (ratios on both sides of
    1), advantages of both signs, values, targets and entropies."""
    gen = torch.Generator().manual_seed(seed)
    kw = {"generator": gen, "dtype": torch.float64}
    return {
        "log_probs": (-torch.rand(T, B, **kw) * 2).requires_grad_(True),
        "behaviour": -torch.rand(T, B, **kw) * 2,
        "advantages": torch.randn(T, B, **kw),
        "targets": torch.randn(T, B, **kw),
        "values": torch.randn(T, B, **kw).requires_grad_(True),
        "entropy": (torch.rand(T, B, **kw) * 1.5).requires_grad_(True),
    }


def entries():
    return [(t, b) for t in range(T) for b in range(B)]


def reduced(total, reduction):
    """The sum over the T B entries, or their mean."""
    return total / (T * B) if reduction == "mean" else total


def grad(loss, tensor):
    (g,) = torch.autograd.grad(loss, tensor)
    return g


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_policy_gradient_loss_is_minus_log_prob_times_advantage_over_every_step_and_stream(reduction):
    p = problem(1)
    total = torch.zeros((), dtype=torch.float64)
    for t, b in entries():
        total = total - p["log_probs"][t, b] * p["advantages"][t, b]
    want = reduced(total, reduction)
    got = policy_gradient_loss(p["log_probs"], p["advantages"], reduction)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        grad(got, p["log_probs"]), grad(want, p["log_probs"]), rtol=1e-12, atol=1e-12
    )  # d/d log pi(a_t|x_t) = -adv_t (divided by T B for the mean)


def clipped_objective(rho, adv, clip):
    """PPO's L^CLIP of one entry, case by case (Schulman et al. 2017, figure 1): with a positive advantage the
    objective stops growing once the ratio passes 1 + eps, with a negative one once it falls below 1 - eps; there it
    is a constant (no gradient)."""
    if adv >= 0:
        return rho * adv if rho.item() <= 1 + clip else torch.tensor((1 + clip) * adv.item(), dtype=torch.float64)
    return rho * adv if rho.item() >= 1 - clip else torch.tensor((1 - clip) * adv.item(), dtype=torch.float64)


@pytest.mark.parametrize("clip", [0.1, 0.3])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_clipped_ratio_loss_is_ppos_objective_over_every_step_and_stream(reduction, clip):
    p = problem(2)
    total = torch.zeros((), dtype=torch.float64)
    outside, cases = 0, set()
    for t, b in entries():
        rho = torch.exp(p["log_probs"][t, b] - p["behaviour"][t, b])
        adv = p["advantages"][t, b]
        total = total - clipped_objective(rho, adv, clip)
        outside += abs(rho.item() - 1) > clip
        cases.add((adv.item() >= 0, rho.item() > 1 + clip, rho.item() < 1 - clip))
    assert cases == {(s, hi, lo) for s in (True, False) for hi, lo in ((True, False), (False, True), (False, False))}
    want = reduced(total, reduction)
    got, clip_fraction = clipped_ratio_loss(p["log_probs"], p["behaviour"], p["advantages"], clip, reduction)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad(got, p["log_probs"]), grad(want, p["log_probs"]), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(clip_fraction, torch.tensor(outside / (T * B), dtype=torch.float64))
    assert not clip_fraction.requires_grad


def test_clipped_ratio_loss_on_policy_is_the_policy_gradient_loss_in_value_and_gradient():
    """At rho = 1 (the first pass over a segment, on-policy) nothing is clipped and the gradient of rho A is
    grad log pi A: the plain policy-gradient loss's, whose value is -sum A there."""
    p = problem(3)
    logp = p["log_probs"]
    got, clip_fraction = clipped_ratio_loss(logp, logp.detach(), p["advantages"], 0.2)
    torch.testing.assert_close(got, -p["advantages"].sum(), rtol=1e-12, atol=1e-12)
    pg = policy_gradient_loss(logp, p["advantages"])
    torch.testing.assert_close(grad(got, logp), grad(pg, logp), rtol=1e-12, atol=1e-12)
    assert clip_fraction.item() == 0.0


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_baseline_loss_is_half_the_squared_error_over_every_step_and_stream(reduction):
    p = problem(4)
    total = torch.zeros((), dtype=torch.float64)
    for t, b in entries():
        total = total + 0.5 * (p["targets"][t, b] - p["values"][t, b]) ** 2
    want = reduced(total, reduction)
    got = baseline_loss(p["targets"], p["values"], reduction)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        grad(got, p["values"]), grad(want, p["values"]), rtol=1e-12, atol=1e-12
    )  # d/dV(x_t) = -(v_t - V(x_t)): IMPALA's value update, descended


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_entropy_loss_is_minus_the_entropy_over_every_step_and_stream(reduction):
    p = problem(5)
    total = torch.zeros((), dtype=torch.float64)
    for t, b in entries():
        total = total - p["entropy"][t, b]
    want = reduced(total, reduction)
    got = entropy_loss(p["entropy"], reduction)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad(got, p["entropy"]), grad(want, p["entropy"]), rtol=1e-12, atol=1e-12)


def test_the_entropy_loss_of_a_categorical_policy_is_sum_pi_log_pi():
    """With a softmax policy's entropy, the term is sum_t sum_a pi(a|x_t) log pi(a|x_t) (docs/r2ac.md#the-losses)."""
    logits = torch.randn(T, B, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    entropy = torch.distributions.Categorical(logits=logits).entropy()
    total = 0.0
    for t, b in entries():
        pi = torch.softmax(logits[t, b], -1)
        total += sum(float(pi[a] * torch.log(pi[a])) for a in range(4))
    torch.testing.assert_close(entropy_loss(entropy), torch.tensor(total, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_shapes_reductions_and_clips_are_checked():
    p = problem()
    logp, adv = p["log_probs"], p["advantages"]
    with pytest.raises(ValueError, match=r"policy_gradient_loss needs time-major \(T, B\) tensors of one shape"):
        policy_gradient_loss(logp, adv[:3])
    with pytest.raises(ValueError, match="time-major"):
        policy_gradient_loss(logp.reshape(-1), adv.reshape(-1))
    with pytest.raises(ValueError, match="clipped_ratio_loss needs time-major"):
        clipped_ratio_loss(logp, p["behaviour"][:, :2], adv, 0.2)
    with pytest.raises(ValueError, match="baseline_loss needs time-major"):
        baseline_loss(p["targets"], p["values"].unsqueeze(-1))
    with pytest.raises(ValueError, match="entropy_loss needs time-major"):
        entropy_loss(p["entropy"][0])
    with pytest.raises(ValueError, match="reduction must be 'sum' or 'mean'"):
        entropy_loss(p["entropy"], "avg")
    for clip in (0.0, -0.2, float("nan")):
        with pytest.raises(ValueError, match="clip must be a number > 0"):
            clipped_ratio_loss(logp, p["behaviour"], adv, clip)
