"""Units of K > 1 components whose local derivatives have a checked closed form (the LRU) keep only the gates and c_prev
of a segment: backward and the carry recompute the derivatives a chunk of steps at a time (``scan.RecomputedBlocks``).
The gradients and carries are those of keeping every derivative, in every mode of the carry."""

from __future__ import annotations

import pytest
import torch

import onlinerec.gradients.rtrl as rtrl
import onlinerec.gradients.scan as scan
from onlinerec import RTRL, ELSTMCell
from onlinerec.cells import LRUCell, Stack
from onlinerec.gradients.check import bptt_gradients
from onlinerec.gradients.scan import RecomputedBlocks
from tests.gradients.test_inplace import assert_same_run, run
from tests.helpers import rel_err


@pytest.fixture(params=[False, True], ids=["one-chunk", "chunked"])
def chunked(request, monkeypatch):
    """The test problem is small, so it is one chunk unless the threshold is lowered (then 8 chunks of 3 steps)."""
    if request.param:
        monkeypatch.setattr(scan, "CHUNK_MIN_ELEMENTS", 1)
    return request.param


def lru(d, n, seed=0):
    torch.manual_seed(seed)
    return LRUCell(d, n, r_min=0.4, r_max=0.95).double()


def kept(monkeypatch):
    """Makes RTRL keep the derivatives, as for a cell without a closed form (the reference path)."""
    monkeypatch.setattr(rtrl, "has_closed_form", lambda cell: False)


def test_the_lru_takes_the_recomputing_path_for_segments_only(problem):
    inputs, _, _, d, n = problem
    cell, method = lru(d, n), RTRL(verify="off")
    names = method.unit_parameters(cell)
    params = dict(cell.named_parameters())
    gates = torch.randn(5, 4, 2, n, dtype=torch.float64)
    keep = torch.ones(5, 4, dtype=torch.float64)
    c0 = torch.zeros(4, 2, n, dtype=torch.float64)
    _, lin = method.linearized_scan(cell, params, gates, c0, keep)
    assert isinstance(lin, RecomputedBlocks) and names == lin.names
    _, one = method.linearized_scan(cell, params, gates[:1], c0, keep[:1])
    assert not isinstance(one, RecomputedBlocks)  # M = 1 computes its few derivatives at once
    elstm = ELSTMCell(d, n).double()
    _, lin = method.linearized_scan(elstm, dict(elstm.named_parameters()), gates, c0[:, 0], keep)
    assert not isinstance(lin, RecomputedBlocks)  # one component per unit: its own path


@pytest.mark.parametrize("donate", [False, True], ids=["functional", "donated"])
@pytest.mark.parametrize("seg_len", [1, 6, 23])
def test_recomputed_derivatives_give_the_kept_ones_gradients_and_carries(
    seg_len, donate, chunked, problem, monkeypatch
):
    inputs, reset, weights, d, n = problem
    recomputed = run(RTRL(), lru(d, n), inputs, reset, weights, seg_len, donate)
    kept(monkeypatch)
    reference = run(RTRL(), lru(d, n), inputs, reset, weights, seg_len, donate)
    assert_same_run(reference, recomputed)


def test_one_segment_over_the_whole_sequence_is_full_bptt(chunked, problem):
    inputs, reset, weights, d, n = problem
    cell = lru(d, n)
    expected, _ = bptt_gradients(cell, inputs, reset, weights.unsqueeze(-2))
    grads, _, _ = run(RTRL(verify="always"), cell, inputs, reset, weights, inputs.shape[0], donate=True)
    for key in expected:
        assert rel_err(grads[0][key], expected[key]) <= 1e-10, key


def test_a_carry_read_before_backward_leaves_the_gradient_exact(chunked, problem, monkeypatch):
    """The carry is then computed out of place from recomputed derivatives; backward recomputes them again."""
    inputs, reset, weights, d, n = problem
    w = weights.unsqueeze(-2)
    out = {}
    for path in ("recomputed", "kept"):
        if path == "kept":
            kept(monkeypatch)
        cell, method = lru(d, n), RTRL()
        _, carry = method.unroll(cell, inputs[:4], reset[:4], method.init_carry(cell, inputs.shape[1]))
        states, new = method.unroll(cell, inputs[4:14], reset[4:14], carry, donate=True)
        snapshot = {k: v.clone() for k, v in new.sensitivities.items()}  # read first
        (states * w[4:14]).sum().backward()
        out[path] = ({k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None}, snapshot)
    for a, b in zip(out["recomputed"], out["kept"]):
        assert a.keys() == b.keys() and b
        for k in b:
            assert rel_err(a[k], b[k]) <= 1e-12, k


def test_a_stack_of_lrus_recomputes_every_layer(chunked, problem, monkeypatch):
    inputs, reset, weights, d, n = problem

    def stack():
        torch.manual_seed(3)
        return Stack([LRUCell(d, n, r_min=0.4), ELSTMCell(d, n), LRUCell(n, n, r_min=0.4)]).double()

    recomputed = run(RTRL(), stack(), inputs, reset, weights, 7, donate=True)
    kept(monkeypatch)
    assert_same_run(run(RTRL(), stack(), inputs, reset, weights, 7, donate=True), recomputed)


def test_a_second_backward_through_a_donated_recomputed_segment_names_the_fix(problem):
    inputs, reset, weights, d, n = problem
    cell, method = lru(d, n), RTRL()
    states, _ = method.unroll(cell, inputs[:6], reset[:6], method.init_carry(cell, inputs.shape[1]), donate=True)
    loss = (states * weights[:6].unsqueeze(-2)).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match=r"backward ran a second time .* Unroll without donate=True"):
        loss.backward()
