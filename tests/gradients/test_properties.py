"""Property-based: for random reset patterns, stream counts, lengths and segmentations, every method computes what it
claims: RTRL == full BPTT, SnAP-1 == RTRL on element-wise cells, TBPTT == truncated backprop (float64)."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onlinerec import RTRL, TBPTT, ELSTMCell, FELSTMCell, QRNNCell, SnAP, SRUCell
from onlinerec.cells import GRUCell, LRUCell, LSTMCell, MinGRUCell
from onlinerec.gradients.check import bptt_gradients, method_gradients, reference_states, stepwise, truncated_gradients
from tests.gradients.rotation import Rotation3Cell

ELEMENTWISE = [ELSTMCell, QRNNCell, SRUCell, LRUCell, MinGRUCell, Rotation3Cell]  # K = 1, 2 and 3
FULLY_RECURRENT = [FELSTMCell, LSTMCell, GRUCell]
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
D, N = 2, 3


@st.composite
def problems(draw, cells):
    t = draw(st.integers(1, 12))
    b = draw(st.integers(1, 3))
    seg_len = draw(st.integers(1, 5))
    flags = draw(st.lists(st.booleans(), min_size=t * b, max_size=t * b))
    reset = torch.tensor(flags, dtype=torch.bool).reshape(t, b)
    cls = draw(st.sampled_from(cells))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(t, b, D, generator=gen, dtype=torch.float64)
    torch.manual_seed(seed)
    cell = cls(D, N).double()
    weights = torch.randn(t, b, *cell.state_shape, generator=gen, dtype=torch.float64)
    return cell, inputs, reset, weights, seg_len


def assert_same(got: dict, expected: dict, rtol: float) -> None:
    assert got.keys() == expected.keys()
    for name, e in expected.items():
        err = (got[name] - e).norm().item()
        assert err <= rtol * e.norm().item() + 1e-13, f"{name}: |diff| = {err:.3g}, |expected| = {e.norm().item():.3g}"


@SETTINGS
@given(problems(ELEMENTWISE), st.sampled_from(["batched", "stepwise"]))
def test_rtrl_equals_full_bptt_for_any_reset_pattern(problem, carry):
    cell, inputs, reset, weights, seg_len = problem
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    method = RTRL() if carry == "batched" else stepwise(RTRL())
    got, got_x, _ = method_gradients(method, cell, inputs, reset, weights, seg_len)
    assert_same(got, expected, 1e-9)
    # what lies below the cell (inputs, a stem) gets within-segment backprop, as with TBPTT
    _, tbptt_x, _ = method_gradients(TBPTT(), cell, inputs, reset, weights, seg_len)
    torch.testing.assert_close(got_x, tbptt_x, rtol=1e-9, atol=1e-12)


@SETTINGS
@given(problems(ELEMENTWISE))
def test_snap_equals_rtrl_on_elementwise_cells_for_any_reset_pattern(problem):
    cell, inputs, reset, weights, seg_len = problem
    rtrl, _, rtrl_carry = method_gradients(RTRL(), cell, inputs, reset, weights, seg_len)
    snap, _, snap_carry = method_gradients(SnAP(), cell, inputs, reset, weights, seg_len)
    assert_same(snap, rtrl, 1e-10)
    torch.testing.assert_close(snap_carry.c, rtrl_carry.c, rtol=0, atol=1e-13)


@SETTINGS
@given(problems([*ELEMENTWISE, *FULLY_RECURRENT]))
def test_tbptt_equals_truncated_backprop_for_any_reset_pattern(problem):
    cell, inputs, reset, weights, seg_len = problem
    expected = truncated_gradients(cell, inputs, reset, weights, seg_len)
    got, _, carry = method_gradients(TBPTT(), cell, inputs, reset, weights, seg_len)
    assert_same(got, expected, 1e-10)
    assert not carry.sensitivities


@SETTINGS
@given(problems([*ELEMENTWISE, *FULLY_RECURRENT]), st.sampled_from([RTRL, SnAP, TBPTT]))
def test_every_method_gives_the_forward_states_of_the_reference(problem, method_cls):
    """Whatever the gradient method, the states it returns are the cell's own step-by-step outputs."""
    cell, inputs, reset, weights, seg_len = problem
    if method_cls is RTRL and isinstance(cell, tuple(FULLY_RECURRENT)):
        return  # refused (tested elsewhere)
    method = method_cls()
    carry = method.init_carry(cell, inputs.shape[1])
    chunks = []
    with torch.no_grad():
        for s in range(0, inputs.shape[0], seg_len):
            states, carry = method.unroll(cell, inputs[s : s + seg_len], reset[s : s + seg_len], carry)
            chunks.append(states)
        expected = reference_states(cell, inputs, reset)
    torch.testing.assert_close(torch.cat(chunks), expected, rtol=1e-12, atol=1e-12)
