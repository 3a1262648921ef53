"""Stacked layers: a 1-layer Stack is its cell; one segment over the whole sequence is full BPTT; across segments the
gradient is exactly the per-layer approximation (Zucchet et al. 2023) that a hand-written reference computes."""

from __future__ import annotations

import pytest
import torch

from onlinerec import RTRL, TBPTT, ELSTMCell, NotElementwiseError, QRNNCell, SnAP, SRUCell
from onlinerec.cells import GRUCell, IndRNNCell, LRUCell, LSTMCell, MinGRUCell, MinLSTMCell, Stack, make_cell
from onlinerec.gradients.carry import Carry, StackCarry, load_carry
from onlinerec.gradients.check import (
    bptt_gradients,
    check_gradients,
    method_gradients,
    reference_run,
    truncated_gradients,
)
from tests.gradients.rotation import Rotation3Cell
from tests.helpers import rel_err

METHODS = {"rtrl": RTRL, "snap": SnAP, "tbptt": TBPTT}


def _lru_blocks(d):  # (RMSNorm: torch's LayerNorm is slow with 2 threads on a busy CPU, and this is run step by step)
    return make_cell("lru", d, 4, layers=3, residual=True, norm="rms")


def _mixed(d):
    # an input window (QRNN), K = 3 and K = 2 units, residuals where the widths allow one
    return Stack([ELSTMCell(d, 5), QRNNCell(5, 5), Rotation3Cell(5, 2), LRUCell(6, 3), MinGRUCell(6, 6)], residual=True)


def _small(d):
    return Stack([IndRNNCell(d, 4, nonlinearity="tanh"), MinLSTMCell(4, 3), SRUCell(3, 3)])


def _lru_mingru(d):  # the list form of make_cell: popgym.yaml's core (an LRU on two rings under a minGRU)
    return make_cell(["lru", "mingru"], d, 4, residual=True, norm="rms", layer_kwargs=[{"slow_fraction": 0.5}, {}])


STACKS = {"lru-blocks": _lru_blocks, "mixed": _mixed, "small": _small, "lru-mingru": _lru_mingru}


def make(builder, d, seed=0):
    torch.manual_seed(seed)
    return builder(d).double()


def weights_for(stack, inputs, seed=5):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*inputs.shape[:2], stack.output_size, generator=gen, dtype=torch.float64)


# -- a 1-layer stack is its cell ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("cls", [ELSTMCell, QRNNCell, LRUCell, LSTMCell], ids=lambda c: c.__name__)
def test_a_one_layer_stack_equals_its_cell_exactly(cls, method, problem):
    if method == "rtrl" and cls is LSTMCell:
        pytest.skip("RTRL refuses the LSTM")
    inputs, reset, _, d, n = problem
    torch.manual_seed(0)
    cell = cls(d, n).double()
    stack = Stack([cell])
    weights = weights_for(stack, inputs)
    m = METHODS[method]()
    outputs, carry = [], m.init_carry(cell, inputs.shape[1])
    cell.zero_grad()
    for s in range(0, inputs.shape[0], 5):
        x = inputs[s : s + 5]
        states, carry = m.unroll(cell, x, reset[s : s + 5], carry)
        out = cell.readout(states, x)
        (out * weights[s : s + 5]).sum().backward()
        outputs.append(out.detach())
    expected = {f"layers.0.{k}": p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None}
    stack_outputs, stack_carry = [], m.init_carry(stack, inputs.shape[1])
    stack.zero_grad()
    for s in range(0, inputs.shape[0], 5):
        out, stack_carry = m.unroll(stack, inputs[s : s + 5], reset[s : s + 5], stack_carry)
        (stack.readout(out, inputs[s : s + 5]) * weights[s : s + 5]).sum().backward()
        stack_outputs.append(out.detach())
    got = {k: p.grad for k, p in stack.named_parameters() if p.grad is not None}
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, msg=key)
    torch.testing.assert_close(torch.cat(stack_outputs), torch.cat(outputs), rtol=0, atol=0)
    (layer,) = stack_carry.layers
    torch.testing.assert_close(layer.c, carry.c, rtol=0, atol=0)
    assert layer.sensitivities.keys() == carry.sensitivities.keys()
    for key, value in carry.sensitivities.items():
        torch.testing.assert_close(layer.sensitivities[key], value, rtol=0, atol=0)


# -- within a segment: exact backprop through all layers and steps -----------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", STACKS)
def test_one_segment_over_the_whole_sequence_is_full_bptt(name, method, problem):
    inputs, reset, _, d, _ = problem
    stack = make(STACKS[name], d)
    weights = weights_for(stack, inputs)
    expected, x_expected = bptt_gradients(stack, inputs, reset, weights)
    got, x_got, carry = method_gradients(METHODS[method](), stack, inputs, reset, weights, inputs.shape[0])
    assert expected.keys() == got.keys()
    for key in expected:
        assert rel_err(got[key], expected[key]) <= 1e-10, key
    assert rel_err(x_got, x_expected) <= 1e-10
    assert isinstance(carry, StackCarry) and len(carry.layers) == stack.num_layers


def test_a_stack_with_a_fully_recurrent_layer_is_exact_within_a_segment_for_snap_and_refused_by_rtrl(problem):
    inputs, reset, _, d, _ = problem
    stack = make(lambda d: Stack([LRUCell(d, 4), GRUCell(d, 5), LSTMCell(5, 3)]), d)
    weights = weights_for(stack, inputs)
    assert max(check_gradients(stack, SnAP(), steps=12, segment=12).values()) <= 1e-10
    with pytest.raises(NotElementwiseError, match="GRUCell"):
        RTRL().init_carry(stack, 2)
    expected, _ = bptt_gradients(stack, inputs, reset, weights)
    got, _, _ = method_gradients(TBPTT(), stack, inputs, reset, weights, inputs.shape[0])
    for key in expected:
        assert rel_err(got[key], expected[key]) <= 1e-10, key


# -- across segments: the per-layer approximation ----------------------------------------------------------------------
def _layer_inputs(stack, inputs, reset):
    """What each layer reads at every step, v^l (M, B, D_l), from a step-by-step run of the whole stack."""
    vs = [[] for _ in stack.layers]
    states = [None] * stack.num_layers
    for t in range(inputs.shape[0]):
        u = inputs[t : t + 1]
        for i, layer in enumerate(stack.layers):
            v = stack.layer_input(i, u)
            vs[i].append(v)
            out, states[i] = reference_run(layer, v, reset[t : t + 1], states[i])
            u = stack.layer_output(i, u, layer.readout(out, v))
    return [torch.cat(v) for v in vs]


def _per_layer_reference(stack, inputs, reset, weights, seg_len):
    """The approximation written out: per segment, autograd through all layers and steps from the layers' detached
    carried states (the within-segment gradient, and lambda^l_0 = dL/dc^l_0 for every layer l); plus, for each layer l,
    the gradient of sum(lambda^l_0 * c^l_0) where c^l_0 is recomputed by layer l *alone* from the stream's start on its
    own recorded (detached) inputs: the dependence of c^l_0 on layer l's parameters through its own recurrence. Every
    path that crosses the segment start through another layer's state or input is left out."""
    with torch.no_grad():
        v = _layer_inputs(stack, inputs, reset)
    stack.zero_grad()
    state = None
    for s in range(0, inputs.shape[0], seg_len):
        if state is None:
            starts = [None] * stack.num_layers
        else:
            starts = [(c.detach().requires_grad_(True), [p.detach() for p in past]) for c, past in state]
        out, state = reference_run(stack, inputs[s : s + seg_len], reset[s : s + seg_len], starts)
        (out * weights[s : s + seg_len]).sum().backward()
        if s > 0:
            for i, layer in enumerate(stack.layers):
                lam = starts[i][0].grad
                c0 = reference_run(layer, v[i][:s], reset[:s])[0][-1]
                (lam * c0).sum().backward()
    return {k: p.grad.clone() for k, p in stack.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("method", "seg_len"), [("rtrl", 1), ("rtrl", 4), ("rtrl", 5), ("snap", 4)])
@pytest.mark.parametrize("name", STACKS)
def test_across_segments_a_stack_gets_exactly_the_per_layer_approximation(name, method, seg_len, problem):
    inputs, reset, _, d, _ = problem
    inputs, reset = inputs[:14], reset[:14]  # resets mid-segment at steps 5, 6 and 9; the reference costs O(T^2)
    stack = make(STACKS[name], d)
    weights = weights_for(stack, inputs)
    expected = _per_layer_reference(stack, inputs, reset, weights, seg_len)
    got, _, _ = method_gradients(METHODS[method](), stack, inputs, reset, weights, seg_len)
    assert expected.keys() == got.keys()
    for key in expected:
        assert rel_err(got[key], expected[key]) <= 1e-10, key
    full, _ = bptt_gradients(stack, inputs, reset, weights)
    # the top layer's recurrence is exact; the layers below are not (the dropped terms are real)
    top = stack.num_layers - 1
    assert rel_err(got[f"layers.{top}.input_proj.weight"], full[f"layers.{top}.input_proj.weight"]) <= 1e-10
    assert rel_err(got["layers.0.input_proj.weight"], full["layers.0.input_proj.weight"]) > 1e-4


@pytest.mark.parametrize("name", STACKS)
def test_tbptt_on_a_stack_is_truncated_backprop(name, problem):
    inputs, reset, _, d, _ = problem
    stack = make(STACKS[name], d)
    weights = weights_for(stack, inputs)
    expected = truncated_gradients(stack, inputs, reset, weights, 4)
    got, _, carry = method_gradients(TBPTT(), stack, inputs, reset, weights, 4)
    for key in expected:
        assert rel_err(got[key], expected[key]) <= 1e-12, key
    assert all(not layer.sensitivities for layer in carry.layers)


# -- construction, carries, errors ---------------------------------------------------------------------------------------
def test_make_cell_builds_stacks_from_names():
    stack = make_cell("lru", 7, 16, layers=3, residual=True, norm="layer", r_min=0.9)
    assert isinstance(stack, Stack) and stack.num_layers == 3
    assert (stack.input_size, stack.hidden_size, stack.output_size) == (7, 16, 7)
    assert stack.residual_layers == (0, 1, 2) and all(isinstance(x, torch.nn.LayerNorm) for x in stack.norms)
    deep = make_cell("elstm", 7, 16, layers=2, forget_bias=1.0)
    assert [(c.input_size, c.hidden_size) for c in deep.layers] == [(7, 16), (16, 16)]
    assert make_cell("elstm", 7, 16, layers=2, residual=True).residual_layers == (1,)
    assert isinstance(make_cell("elstm", 7, 16), ELSTMCell)  # one layer stays a plain cell
    with pytest.raises(ValueError, match="instance"):
        make_cell(ELSTMCell(7, 16), 7, 16, layers=2)
    with pytest.raises(ValueError, match="layers"):
        make_cell("elstm", 7, 16, layers=0)


def test_stack_refuses_inconsistent_layers():
    with pytest.raises(ValueError, match="layer 1 .* reads 5 features but layer 0 .* outputs 4"):
        Stack([ELSTMCell(3, 4), ELSTMCell(5, 4)])
    with pytest.raises(ValueError, match="residual"):
        Stack([ELSTMCell(3, 4)], residual=True)
    with pytest.raises(ValueError, match="norm"):
        Stack([ELSTMCell(3, 4)], norm="batch")
    with pytest.raises(ValueError, match="at least one"):
        Stack([])
    with pytest.raises(TypeError, match="unroll it with a gradient method"):
        Stack([ELSTMCell(3, 4)])(torch.zeros(2, 3), torch.zeros(2, 4))


def test_stack_carries_round_trip_and_mismatches_are_explained():
    stack = Stack([ELSTMCell(3, 4), QRNNCell(4, 5)])
    carry = RTRL().init_carry(stack, 2)
    assert isinstance(carry, StackCarry) and carry.batch_size == 2
    assert carry.nbytes() == sum(layer.nbytes() for layer in carry.layers)
    assert RTRL().sensitivity_names(stack)[0] == "layers.0.input_proj.weight"
    _, carry = RTRL().unroll(stack, torch.randn(3, 2, 3), torch.zeros(3, 2, dtype=torch.bool), carry)
    restored = load_carry(carry.to("cpu").state_dict())
    assert isinstance(restored, StackCarry) and isinstance(restored.layers[1], Carry)
    for a, b in zip(restored.layers, carry.layers):
        torch.testing.assert_close(a.c, b.c, rtol=0, atol=0)
        assert a.sensitivities.keys() == b.sensitivities.keys()
    assert restored.layers[1].window is not None and not restored.state_only().layers[0].sensitivities
    # a carry made by TBPTT: RTRL restarts the sensitivities (and says so); the other way drops them quietly
    tbptt = TBPTT().init_carry(stack, 2)
    adapted, restarted = RTRL().adapt_carry(stack, tbptt)
    assert restarted and all(layer.sensitivities for layer in adapted.layers)
    adapted, restarted = TBPTT().adapt_carry(stack, carry)
    assert not restarted and not any(layer.sensitivities for layer in adapted.layers)
    x, r = torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="single cell's carry for a Stack of 2 layers"):
        RTRL().unroll(stack, x, r, RTRL().init_carry(ELSTMCell(3, 4), 2))
    with pytest.raises(ValueError, match="carry of 2 layers for a single ELSTMCell"):
        RTRL().unroll(ELSTMCell(3, 4), x, r, carry)
    with pytest.raises(ValueError, match="carry of 2 layers for a Stack of 3 layers"):
        TBPTT().unroll(Stack([ELSTMCell(3, 4), ELSTMCell(4, 4), ELSTMCell(4, 4)]), x, r, carry)


def test_a_stack_names_its_input_size_when_the_inputs_do_not_fit():
    stack = Stack([ELSTMCell(3, 4)], norm="layer")
    with pytest.raises(ValueError, match="D = 7 .* input_size = 3"):
        TBPTT().unroll(stack, torch.zeros(2, 2, 7), torch.zeros(2, 2, dtype=torch.bool), TBPTT().init_carry(stack, 2))
