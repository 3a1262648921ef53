"""V-trace against the direct sum formula of docs/r2ac.md#v-trace, evaluated by a slow, obviously right loop."""

from __future__ import annotations

import pytest
import torch

from onlinerec.rl.vtrace import vtrace


def reference(blogp, tlogp, rewards, discounts, values, bootstrap, clip_rho, clip_c, clip_pg_rho, lam=1.0):
    """v_s = V(x_s) + sum_{k>=s} (prod_{i=s}^{k-1} gamma_i c_i) rho_k (r_k + gamma_k V(x_{k+1}) - V(x_k)),
    c_i = lam min(clip_c, rho_i)."""
    t_len, b_len = values.shape
    vs = torch.zeros_like(values)
    adv = torch.zeros_like(values)
    for b in range(b_len):
        rho = [float(torch.exp(tlogp[t, b] - blogp[t, b])) for t in range(t_len)]
        v = [float(values[t, b]) for t in range(t_len)] + [float(bootstrap[b])]
        g = [float(discounts[t, b]) for t in range(t_len)]
        r = [float(rewards[t, b]) for t in range(t_len)]
        for s in range(t_len):
            total = v[s]
            for k in range(s, t_len):
                prod = 1.0
                for i in range(s, k):
                    prod *= g[i] * lam * min(clip_c, rho[i])
                total += prod * min(clip_rho, rho[k]) * (r[k] + g[k] * v[k + 1] - v[k])
            vs[s, b] = total
        for s in range(t_len):
            v_next = float(vs[s + 1, b]) if s + 1 < t_len else v[t_len]
            adv[s, b] = min(clip_pg_rho, rho[s]) * (r[s] + g[s] * v_next - v[s])
    return vs, adv


def problem(t_len=9, b_len=4, seed=0, done_at=None):
    gen = torch.Generator().manual_seed(seed)
    kw = {"generator": gen, "dtype": torch.float64}
    blogp = -torch.rand(t_len, b_len, **kw) * 2
    tlogp = -torch.rand(t_len, b_len, **kw) * 2  # ratios on both sides of 1
    rewards = torch.randn(t_len, b_len, **kw)
    discounts = torch.full((t_len, b_len), 0.99, dtype=torch.float64)
    if done_at is not None:
        discounts[done_at] = 0.0
    values = torch.randn(t_len, b_len, **kw)
    bootstrap = torch.randn(b_len, **kw)
    return blogp, tlogp, rewards, discounts, values, bootstrap


@pytest.mark.parametrize("lam", [1.0, 0.8, 0.0])
@pytest.mark.parametrize("clips", [(1.0, 1.0, 1.0), (2.0, 0.5, 1.5), (1e9, 1e9, 1e9)])
def test_matches_direct_sum(clips, lam):
    args = problem()
    vs, adv = vtrace(*args, clip_rho=clips[0], clip_c=clips[1], clip_pg_rho=clips[2], trace_lambda=lam)
    ref_vs, ref_adv = reference(*args, *clips, lam=lam)
    torch.testing.assert_close(vs, ref_vs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("position", range(9))
def test_episode_end_at_every_position(position):
    """Discount zeroed at one position (a different stream pattern each time): nothing crosses it."""
    t_len = 9
    args = problem(t_len=t_len, seed=position + 1, done_at=(position, slice(0, 2)))
    vs, adv = vtrace(*args)
    ref_vs, ref_adv = reference(*args, 1.0, 1.0, 1.0)
    torch.testing.assert_close(vs, ref_vs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-12, atol=1e-12)
    # targets up to the end depend only on steps up to it: changing later rewards must not move them
    blogp, tlogp, rewards, discounts, values, bootstrap = args
    rewards2 = rewards.clone()
    rewards2[position + 1 :] += 10.0
    bootstrap2 = bootstrap + 10.0
    vs2, adv2 = vtrace(blogp, tlogp, rewards2, discounts, values, bootstrap2)
    torch.testing.assert_close(vs2[: position + 1, :2], vs[: position + 1, :2])
    torch.testing.assert_close(adv2[: position + 1, :2], adv[: position + 1, :2])


def test_on_policy_no_discount_is_monte_carlo():
    t_len, b_len = 6, 3
    rewards = torch.randn(t_len, b_len, dtype=torch.float64)
    logp = torch.zeros(t_len, b_len, dtype=torch.float64)
    values = torch.randn(t_len, b_len, dtype=torch.float64)
    bootstrap = torch.randn(b_len, dtype=torch.float64)
    ones = torch.ones(t_len, b_len, dtype=torch.float64)
    vs, _ = vtrace(logp, logp, rewards, ones, values, bootstrap)
    expected = rewards.flip(0).cumsum(0).flip(0) + bootstrap
    torch.testing.assert_close(vs, expected)


@pytest.mark.parametrize("lam", [0.95, 0.8, 0.3])
def test_on_policy_lambda_is_gae(lam):
    """On-policy, v_s - V(x_s) is GAE(gamma, lambda) by its textbook recursion A_t = delta_t + gamma_t lambda A_{t+1};
    the advantage keeps the first step whole: delta_s + (GAE_s - delta_s) / lambda."""
    _, _, rewards, discounts, values, bootstrap = problem(seed=3, done_at=(4, slice(1, 3)))
    logp = torch.zeros_like(values)
    vs, adv = vtrace(logp, logp, rewards, discounts, values, bootstrap, trace_lambda=lam)
    values_next = torch.cat([values[1:], bootstrap.unsqueeze(0)])
    deltas = rewards + discounts * values_next - values
    gae = torch.zeros_like(values)
    running = torch.zeros_like(bootstrap)
    for t in reversed(range(values.shape[0])):
        running = deltas[t] + discounts[t] * lam * running
        gae[t] = running
    torch.testing.assert_close(vs - values, gae, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(adv, deltas + (gae - deltas) / lam, rtol=1e-12, atol=1e-12)


def test_lambda_zero_is_one_step_td():
    args = problem(seed=4)
    _, _, rewards, discounts, values, bootstrap = args
    vs, _ = vtrace(*args, trace_lambda=0.0)
    values_next = torch.cat([values[1:], bootstrap.unsqueeze(0)])
    rhos = torch.exp(args[1] - args[0]).clamp(max=1.0)
    torch.testing.assert_close(vs, values + rhos * (rewards + discounts * values_next - values))


@pytest.mark.parametrize("lam", [-0.1, 1.5, float("nan")])
def test_lambda_out_of_range_is_refused(lam):
    with pytest.raises(ValueError, match="trace_lambda must be in"):
        vtrace(*problem(), trace_lambda=lam)


def test_no_grad_and_shape_errors():
    args = [a.requires_grad_(True) if a.is_floating_point() else a for a in problem()]
    vs, adv = vtrace(*args)
    assert not vs.requires_grad and not adv.requires_grad
    with pytest.raises(ValueError, match="bootstrap_value"):
        vtrace(*args[:5], torch.zeros(7))
    with pytest.raises(ValueError, match="time-major"):
        vtrace(args[0][:3], *args[1:])
