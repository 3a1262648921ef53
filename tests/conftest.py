"""Shared fixtures (a small float64 problem, the device a test runs on) and test-wide settings; shared helpers live in
tests/helpers.py."""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers import needs_cuda

os.environ.setdefault("PYTHONHASHSEED", "0")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


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


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=needs_cuda)])
def device(request) -> str:
    """The device a test runs on: "cpu" always, "cuda" where torch sees a GPU (else that case skips)."""
    return request.param
