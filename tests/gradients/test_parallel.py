"""Cells side by side (Parallel): each branch is unrolled with its own carry, so the outputs and every gradient method's
gradients are the branches' own (to rounding: a branch reads a strided slice of the input); for element-wise branches RTRL is exact
across segments (full BPTT in float64)."""

from __future__ import annotations

import pytest
import torch

from onlinerec import RTRL, TBPTT, ELSTMCell, QRNNCell, SnAP
from onlinerec.cells import LRUCell, MinGRUCell, Parallel, Stack, make_cell
from onlinerec.gradients.carry import StackCarry
from onlinerec.gradients.check import bptt_gradients, check_gradients, method_gradients
from tests.helpers import rel_err

METHODS = {"rtrl": RTRL, "snap": SnAP, "tbptt": TBPTT}


def _readout_gradients(method, cell, inputs, reset, weights, seg_len):
    """As check.method_gradients, but the loss reads the cell's readout (what a Parallel outputs for each branch)."""
    cell.zero_grad()
    x = inputs.detach().requires_grad_(True)
    carry = method.init_carry(cell, inputs.shape[1])
    for s in range(0, inputs.shape[0], seg_len):
        states, carry = method.unroll(cell, x[s : s + seg_len], reset[s : s + seg_len], carry)
        (cell.readout(states, x[s : s + seg_len]) * weights[s : s + seg_len]).sum().backward()
    return {k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None}, x.grad.clone()


def _branches(d):
    # an input window (QRNN), units of K = 2 components (LRU), a gated cell: every kind of carry
    return [QRNNCell(d, 4), LRUCell(d, 3), MinGRUCell(d, 2)]


@pytest.mark.parametrize("split", [True, False], ids=["split-inputs", "shared-inputs"])
def test_rtrl_is_full_bptt_across_segments(split):
    torch.manual_seed(0)
    d = 3
    cell = Parallel(_branches(d), split_inputs=False) if not split else Parallel([ELSTMCell(2, 4), LRUCell(3, 3)])
    errors = check_gradients(cell, RTRL(), steps=30, segment=7)
    assert errors and max(errors.values()) <= 1e-10, errors
    assert {k.split(".")[1] for k in errors} == {str(i) for i in range(cell.num_layers)}  # every branch is checked


@pytest.mark.parametrize("method", METHODS)
def test_outputs_and_gradients_are_each_branchs_own(method, problem):
    """A Parallel's outputs and gradients equal those of its branches unrolled one by one on their slices."""
    inputs, reset, _, d, _ = problem
    torch.manual_seed(1)
    a, b = ELSTMCell(2, 4).double(), LRUCell(d - 2, 3).double()
    both = Parallel([a, b])
    gen = torch.Generator().manual_seed(5)
    weights = torch.randn(*inputs.shape[:2], both.output_size, generator=gen, dtype=torch.float64)
    got, x_got, carry = method_gradients(METHODS[method](), both, inputs, reset, weights, 6)
    assert isinstance(carry, StackCarry) and len(carry.layers) == 2
    split = [a.output_size, b.output_size]
    for i, (cell, x, w) in enumerate(zip((a, b), inputs.split([2, d - 2], -1), weights.split(split, -1))):
        want, x_want = _readout_gradients(METHODS[method](), cell, x, reset, w, 6)
        for key, value in want.items():
            torch.testing.assert_close(got[f"layers.{i}.{key}"], value, rtol=1e-12, atol=1e-14, msg=key)
        torch.testing.assert_close(
            x_got[..., sum([2, d - 2][:i]) :][..., : x.shape[-1]], x_want, rtol=1e-12, atol=1e-14
        )


@pytest.mark.parametrize("method", METHODS)
def test_branches_that_are_stacks_are_exact_within_a_segment(method, problem):
    inputs, reset, _, d, _ = problem
    torch.manual_seed(2)
    stack = make_cell(["lru", "mingru"], d, d, residual=True, norm="rms")
    cell = Parallel([stack, Stack([ELSTMCell(d, 4), QRNNCell(4, 4)])], split_inputs=False).double()
    gen = torch.Generator().manual_seed(5)
    weights = torch.randn(*inputs.shape[:2], cell.output_size, generator=gen, dtype=torch.float64)
    expected, x_expected = bptt_gradients(cell, inputs, reset, weights)
    got, x_got, carry = method_gradients(METHODS[method](), cell, inputs, reset, weights, inputs.shape[0])
    assert expected.keys() == got.keys() and any(k.startswith("layers.1.layers.1.") for k in got)
    for key in expected:
        assert rel_err(got[key], expected[key]) <= 1e-10, key
    assert rel_err(x_got, x_expected) <= 1e-10
    assert all(isinstance(c, StackCarry) for c in carry.layers)


def test_mistakes_name_the_fix():
    with pytest.raises(ValueError, match="at least one cell"):
        Parallel([])
    with pytest.raises(TypeError, match="Parallel branch 1 must be an onlinerec ElementwiseCell"):
        Parallel([ELSTMCell(2, 3), torch.nn.Linear(2, 3)])
    with pytest.raises(ValueError, match="same width.*split_inputs=True"):
        Parallel([ELSTMCell(2, 3), ELSTMCell(4, 3)], split_inputs=False)
    cell = Parallel([ELSTMCell(2, 3), ELSTMCell(4, 3)])
    assert (cell.input_size, cell.output_size, cell.output_sizes) == (6, 6, (3, 3))
    with pytest.raises(ValueError, match="D = 5 features but the Parallel was built with input_size = 6"):
        RTRL().unroll(cell, torch.zeros(2, 1, 5), torch.zeros(2, 1, dtype=torch.bool), RTRL().init_carry(cell, 1))
    with pytest.raises(ValueError, match="a single cell's carry for a Parallel of 2 branches"):
        RTRL().unroll(
            cell, torch.zeros(2, 1, 6), torch.zeros(2, 1, dtype=torch.bool), RTRL().init_carry(ELSTMCell(2, 3), 1)
        )
    with pytest.raises(TypeError, match="Parallel has no recurrence of its own"):
        cell(torch.zeros(1, 6), torch.zeros(1, 6))
