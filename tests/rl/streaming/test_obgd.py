"""ObGD against the algorithm written out step by step (Elsayed et al. 2024, Algorithm 3)."""

from __future__ import annotations

import torch
from torch import nn

from onlinerec.rl.streaming.obgd import ObGD
from tests.helpers import rel_err


def reference(params, traces, grads, delta, lr, decay, kappa):
    """One step by the book, on copies: z <- decay z + g; alpha' = lr / max(1, lr kappa max(|delta|, 1) sum |z|)."""
    traces = [decay * z + g for z, g in zip(traces, grads)]
    norm = sum(float(z.abs().sum()) for z in traces)
    bound = lr * kappa * max(abs(delta), 1.0) * norm
    step = lr / bound if bound > 1 else lr
    return [p + step * delta * z for p, z in zip(params, traces)], traces, step


def test_obgd_step_equals_the_algorithm_and_bounds_the_step():
    torch.manual_seed(0)
    net = nn.Linear(4, 3).double()
    opt = ObGD(net.parameters(), lr=1.0, gamma=0.99, lam=0.8, kappa=2.0)
    params = [p.detach().clone() for p in net.parameters()]
    traces = [torch.zeros_like(p) for p in params]
    bounded = 0
    for t in range(6):
        grads = [torch.randn_like(p) * (10 if t == 3 else 0.1) for p in params]
        for p, g in zip(net.parameters(), grads):
            p.grad = g.clone()
        delta = float(torch.randn(()) * 3)
        params, traces, step = reference(params, traces, grads, delta, 1.0, 0.99 * 0.8, 2.0)
        got = opt.step(torch.tensor(delta, dtype=torch.float64), reset=False)
        bounded += step < 1.0
        assert abs(float(got) - step) <= 1e-12 * max(step, 1e-300)
        for p, want in zip(net.parameters(), params):
            assert rel_err(p.detach(), want) <= 1e-12
        for z, want in zip(opt.traces, traces):
            assert rel_err(z, want) <= 1e-12
    assert bounded  # the overshooting bound was active on some step


def test_an_episode_end_zeroes_the_traces_after_the_update():
    net = nn.Linear(2, 1)
    opt = ObGD(net.parameters(), lr=0.5, gamma=0.9, lam=0.9, kappa=1.0)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in net.parameters()]
    opt.step(torch.tensor(0.3), reset=True)
    assert all(not torch.equal(p.detach(), b) for p, b in zip(net.parameters(), before))  # it moved
    assert all(torch.count_nonzero(z) == 0 for z in opt.traces)


def test_the_traces_follow_the_module_and_its_state_dict():
    net = nn.Linear(2, 2)
    opt = ObGD(net.parameters(), lr=1.0, gamma=0.9, lam=0.8, kappa=1.0)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step(torch.tensor(0.1), reset=False)
    state = opt.state_dict()
    assert set(state) == {"trace_0", "trace_1"}
    other = ObGD(nn.Linear(2, 2).parameters(), lr=1.0, gamma=0.9, lam=0.8, kappa=1.0)
    other.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(other.traces, opt.traces))
    net.double()
    opt.double()
    assert all(z.dtype == torch.float64 for z in opt.traces)
