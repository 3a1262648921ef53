"""Shared fixtures: small float64 problems and a slow, obviously right reference (full-sequence BPTT)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("PYTHONHASHSEED", "0")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def reference_states(cell, inputs, reset, c0=None, window=None):
    """Step-by-step unroll with the cell's own single-step forward (no onlinerec time loop involved)."""
    m, b, d = inputs.shape
    c = torch.zeros(b, cell.hidden_size, dtype=inputs.dtype) if c0 is None else c0
    past = [torch.zeros(b, d, dtype=inputs.dtype) for _ in range(cell.window - 1)] if window is None else window
    states = []
    for t in range(m):
        keep = (~reset[t]).to(inputs.dtype).unsqueeze(-1)
        past = [p * keep for p in past]
        c = cell(torch.cat([inputs[t], *past], dim=-1), c * keep)
        states.append(c)
        past = ([inputs[t]] + past)[: cell.window - 1]
    return torch.stack(states)


def bptt_gradients(cell, inputs, reset, weights):
    """Gradient of sum(weights * states) by full-sequence autograd BPTT."""
    cell.zero_grad()
    x = inputs.detach().requires_grad_(True)
    (reference_states(cell, x, reset) * weights).sum().backward()
    grads = {k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None}
    return grads, x.grad.clone()


def method_gradients(method, cell, inputs, reset, weights, seg_len):
    """Gradient of the same loss accumulated over consecutive segments of ``seg_len`` steps."""
    cell.zero_grad()
    x = inputs.detach().requires_grad_(True)
    carry = method.init_carry(cell, inputs.shape[1])
    for s in range(0, inputs.shape[0], seg_len):
        states, carry = method.unroll(cell, x[s : s + seg_len], reset[s : s + seg_len], carry)
        (states * weights[s : s + seg_len]).sum().backward()
    grads = {k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None}
    return grads, x.grad.clone(), carry


def rel_err(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


@pytest.fixture
def problem():
    """T=23 steps, B=4 streams, resets at the start and in the middle (a different step per stream)."""
    gen = torch.Generator().manual_seed(1234)
    t, b, d, n = 23, 4, 3, 5
    inputs = torch.randn(t, b, d, generator=gen, dtype=torch.float64)
    reset = torch.zeros(t, b, dtype=torch.bool)
    reset[0] = True
    reset[9, 1] = reset[13, 2] = reset[5, 3] = reset[6, 3] = True
    weights = torch.randn(t, b, n, generator=gen, dtype=torch.float64)
    return inputs, reset, weights, d, n
