"""The in-place fully online step: ``unroll(..., donate=True)`` at M = 1 updates the carried
sensitivities in place, lazily scaled on the CPU and decayed where they lie on a GPU
(docs/performance.md#the-m--1-online-step), and gives the gradients and sensitivities of the functional step, which
leaves the old carry intact."""

from __future__ import annotations

import pytest
import torch

import onlinerec.gradients.inplace as inplace
import onlinerec.gradients.sensitivity as sensitivity
from onlinerec import RTRL, TBPTT, ELSTMCell, FELSTMCell, QRNNCell, SnAP, SRUCell
from onlinerec.cells import GRUCell, IndRNNCell, LRUCell, MinGRUCell, MinLSTMCell, RTUCell, Stack
from onlinerec.gradients.carry import Carry, StackCarry, load_carry
from onlinerec.gradients.check import bptt_gradients, stepwise
from tests.helpers import Regressor, on, quiet_trainer, rel_err

K1_CELLS = [ELSTMCell, QRNNCell, SRUCell, IndRNNCell, MinGRUCell, MinLSTMCell]


def make(cls, d, n, seed=0, device="cpu"):
    torch.manual_seed(seed)
    return cls(d, n).double().to(device)


def run(method, cell, inputs, reset, weights, seg_len, donate):
    """Gradients after every segment, and the final carry, of sum(weights * states) by ``method`` (weights (T, B, N)
    for units of K > 1 components weigh every component alike)."""
    x = inputs.detach().requires_grad_(True)
    if getattr(cell, "num_components", 1) > 1 and not isinstance(cell, Stack):
        weights = weights.unsqueeze(-2)
    carry = method.init_carry(cell, inputs.shape[1])
    grads = []
    for s in range(0, inputs.shape[0], seg_len):
        cell.zero_grad()
        states, carry = method.unroll(cell, x[s : s + seg_len], reset[s : s + seg_len], carry, donate=donate)
        (states * weights[s : s + seg_len]).sum().backward()
        grads.append({k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None})
    return grads, x.grad.clone(), carry


@pytest.fixture(autouse=True)
def lazily_scaled(monkeypatch):
    """These tests exercise the lazily scaled carry, which small carries skip (inplace.SMALL_CARRY): every carry here
    is scaled unless a test says otherwise."""
    monkeypatch.setattr(inplace, "SMALL_CARRY", 0)


def assert_same_run(a, b, tol=1e-12):
    (grads_a, x_a, carry_a), (grads_b, x_b, carry_b) = a, b
    assert len(grads_a) == len(grads_b)
    for ga, gb in zip(grads_a, grads_b):
        assert ga.keys() == gb.keys()
        for name in ga:
            assert rel_err(gb[name], ga[name]) <= tol, name
    assert rel_err(x_b, x_a) <= tol
    layers_a = carry_a.layers if isinstance(carry_a, StackCarry) else [carry_a]
    layers_b = carry_b.layers if isinstance(carry_b, StackCarry) else [carry_b]
    for la, lb in zip(layers_a, layers_b):
        assert rel_err(lb.c, la.c) <= tol
        sa, sb = la.sensitivities, lb.sensitivities
        assert sa.keys() == sb.keys()
        for name in sa:
            assert rel_err(sb[name], sa[name]) <= tol, name


def assert_adds_up_to_full_bptt(cell, grads, inputs, reset, weights):
    """The per-segment gradients add up to the full-BPTT gradient of the whole sequence."""
    w = weights.unsqueeze(-2) if cell.num_components > 1 else weights
    expected, _ = bptt_gradients(cell, inputs, reset, w)
    total = {k: sum(g[k] for g in grads) for k in expected}
    for name in expected:
        assert rel_err(total[name], expected[name]) <= 1e-10, name


@pytest.mark.parametrize("method", [RTRL(), SnAP()], ids=repr)
@pytest.mark.parametrize("cls", K1_CELLS)
def test_donated_online_step_equals_the_functional_one_and_full_bptt(cls, method, problem, device):
    inputs, reset, weights, d, n = problem
    inputs, reset, weights = on(device, inputs, reset, weights)
    cell = make(cls, d, n, device=device)
    kept = run(method, cell, inputs, reset, weights, 1, donate=False)
    donated = run(method, cell, inputs, reset, weights, 1, donate=True)
    assert_same_run(kept, donated)
    assert kept[2].scale is None  # the donated carry is lazily scaled on the CPU, decayed where it lies elsewhere
    assert (donated[2].scale is not None) == inplace.scales_lazily(torch.device(device))
    assert_adds_up_to_full_bptt(cell, donated[0], inputs, reset, weights)


@pytest.mark.parametrize("method", [RTRL(), SnAP()], ids=repr)
@pytest.mark.parametrize("cls", [*K1_CELLS, LRUCell])
def test_a_small_donated_carry_is_decayed_directly_and_equals_the_lazy_one(cls, method, problem, monkeypatch):
    """Small carries skip the lazy scale (inplace.SMALL_CARRY): the same gradients and sensitivities, unscaled."""
    inputs, reset, weights, d, n = problem
    cell = make(cls, d, n)
    lazy = run(method, cell, inputs, reset, weights, 1, donate=True)
    monkeypatch.setattr(inplace, "SMALL_CARRY", 1 << 30)
    direct = run(method, cell, inputs, reset, weights, 1, donate=True)
    assert lazy[2].scale is not None and direct[2].scale is None
    assert_same_run(lazy, direct)
    assert_adds_up_to_full_bptt(cell, direct[0], inputs, reset, weights)


def test_donated_step_equals_the_stepwise_reference(problem):
    inputs, reset, weights, d, n = problem
    cell = make(ELSTMCell, d, n)
    reference = run(stepwise(RTRL()), cell, inputs, reset, weights, 1, donate=False)
    assert_same_run(reference, run(RTRL(), cell, inputs, reset, weights, 1, donate=True))


def test_the_donated_step_writes_into_the_old_tensors_and_the_functional_one_does_not(problem):
    inputs, reset, _, d, n = problem
    cell, method = make(ELSTMCell, d, n), RTRL()
    carry = method.init_carry(cell, inputs.shape[1])
    _, carry = method.unroll(cell, inputs[:1], reset[:1], carry)  # a non-zero carry
    before = {k: v.clone() for k, v in carry.sensitivities.items()}
    c_before = carry.c.clone()
    _, new = method.unroll(cell, inputs[1:2], reset[1:2], carry)  # functional default: the old carry is intact
    for k, v in carry.sensitivities.items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
        assert v.data_ptr() != new.sensitivities[k].data_ptr()
    torch.testing.assert_close(carry.c, c_before, rtol=0, atol=0)
    storage = {k: v.data_ptr() for k, v in carry.raw_sensitivities()[0].items()}
    _, again = method.unroll(cell, inputs[1:2], reset[1:2], carry, donate=True)  # given up: written in place
    assert {k: v.data_ptr() for k, v in again.raw_sensitivities()[0].items()} == storage
    for k, v in again.sensitivities.items():
        assert rel_err(v, new.sensitivities[k]) <= 1e-12, k


def test_the_functional_default_keeps_the_old_carry_intact_at_every_segment_length(problem):
    inputs, reset, _, d, n = problem
    for cell in (make(ELSTMCell, d, n), make(LRUCell, d, n)):
        for method in (RTRL(), SnAP()):
            carry = method.init_carry(cell, inputs.shape[1])
            _, carry = method.unroll(cell, inputs[:3], reset[:3], carry)
            for m in (1, 4):
                snapshot = {k: v.clone() for k, v in carry.sensitivities.items()}
                states, _ = method.unroll(cell, inputs[3 : 3 + m], reset[3 : 3 + m], carry)
                states.sum().backward()
                for k, v in carry.sensitivities.items():
                    torch.testing.assert_close(v, snapshot[k], rtol=0, atol=0)


def test_a_donated_carry_cannot_be_used_again(problem):
    inputs, reset, _, d, n = problem
    cell, method = make(ELSTMCell, d, n), RTRL()
    carry = method.init_carry(cell, inputs.shape[1])
    _, new = method.unroll(cell, inputs[:1], reset[:1], carry, donate=True)
    with pytest.raises(RuntimeError, match=r"donate=True.*Use the returned carry"):
        carry.sensitivities  # noqa: B018
    with pytest.raises(RuntimeError, match="donate=True"):
        method.unroll(cell, inputs[1:2], reset[1:2], carry)
    with pytest.raises(RuntimeError, match="donate=True"):
        carry.state_dict()
    assert "donated" in repr(carry)
    method.unroll(cell, inputs[1:2], reset[1:2], new)  # the returned one is fine
    tb = TBPTT()  # a method that never writes in place gives the carry up all the same
    old = tb.init_carry(cell, inputs.shape[1])
    tb.unroll(cell, inputs[:1], reset[:1], old, donate=True)
    with pytest.raises(RuntimeError, match="donate=True"):
        tb.unroll(cell, inputs[1:2], reset[1:2], old)


def test_backward_after_the_next_donated_step_is_refused(problem):
    """The injection reads the sensitivities in backward: a step that overwrote them first must not go unnoticed."""
    inputs, reset, _, d, n = problem
    cell, method = make(ELSTMCell, d, n), RTRL()
    carry = method.init_carry(cell, inputs.shape[1])
    first, carry = method.unroll(cell, inputs[:1], reset[:1], carry, donate=True)
    second, carry = method.unroll(cell, inputs[1:2], reset[1:2], carry, donate=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        first.sum().backward()
    second.sum().backward()  # the latest step is fine


@pytest.mark.parametrize("gather_max", [1.0, 0.0], ids=["gathered-rows", "whole-tensor"])
def test_folding_the_lazy_scale_is_exact(gather_max, problem, monkeypatch):
    """With a range so narrow that units fold at almost every step (and whole streams at resets), still exact, whether
    a fold gathers the rows it scales or multiplies the whole tensor."""
    inputs, reset, weights, d, n = problem
    cell = make(ELSTMCell, d, n)
    kept = run(RTRL(), cell, inputs, reset, weights, 1, donate=False)
    monkeypatch.setattr(inplace, "_scale_bounds", lambda dtype: (0.7, 1 / 0.7))
    monkeypatch.setattr(inplace, "_GATHER_FOLD_MAX", gather_max)
    assert_same_run(kept, run(RTRL(), cell, inputs, reset, weights, 1, donate=True))


@pytest.mark.parametrize("cls", [ELSTMCell, LRUCell, RTUCell])  # scaled by a factor; by K x K blocks
@pytest.mark.parametrize("seg_lens", [(1, 1, 4, 1, 3, 1), (1, 2, 1, 1)])
def test_mixed_segment_lengths_after_donated_steps(seg_lens, cls, problem):
    """M > 1 segments from a lazily scaled carry (donated: folded in place; kept: computed) stay exact."""
    inputs, reset, weights, d, n = problem
    cell = make(cls, d, n)
    if cell.num_components > 1:
        weights = weights.unsqueeze(-2)

    def run_mixed(donate):
        method, x = RTRL(), inputs.detach().requires_grad_(True)
        carry, t, grads = method.init_carry(cell, inputs.shape[1]), 0, []
        while t < inputs.shape[0]:
            m = seg_lens[len(grads) % len(seg_lens)]
            cell.zero_grad()
            states, carry = method.unroll(cell, x[t : t + m], reset[t : t + m], carry, donate=donate)
            (states * weights[t : t + m]).sum().backward()
            grads.append({k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None})
            t += m
        return grads, x.grad.clone(), carry

    assert_same_run(run_mixed(False), run_mixed(True))


def test_units_of_two_components_are_scaled_by_blocks_and_fully_recurrent_cells_in_place(problem, device):
    """K > 1 (LRU): the donated online step keeps S = A S~ with a K x K block per unit (no pass over S for the decay;
    on a GPU it decays S by the blocks where it lies); SnAP on fully recurrent cells (its carry is not the gradient:
    no lazy scale) updates the carry in place. Same results as the functional step, and the donated tensors are the
    old ones."""
    inputs, reset, weights, d, n = problem
    inputs, reset, weights = on(device, inputs, reset, weights)
    lazy = inplace.scales_lazily(torch.device(device))
    for cls, method in ((LRUCell, RTRL()), (LRUCell, SnAP()), (FELSTMCell, SnAP()), (GRUCell, SnAP())):
        cell = make(cls, d, n, device=device)
        kept = run(method, cell, inputs, reset, weights, 1, donate=False)
        donated = run(method, cell, inputs, reset, weights, 1, donate=True)
        assert_same_run(kept, donated)
        if cls is LRUCell and lazy:  # element-wise: SnAP-1 is exact there too, so its carry is scaled alike
            assert donated[2].scale.shape == (inputs.shape[1], 2, 2, n), cls.__name__
        else:
            assert donated[2].scale is None, cls.__name__
    cell, method = make(LRUCell, d, n, device=device), RTRL()
    carry = method.init_carry(cell, inputs.shape[1])
    storage = {k: v.data_ptr() for k, v in carry.raw_sensitivities()[0].items()}
    for t in range(3):
        states, carry = method.unroll(cell, inputs[t : t + 1], reset[t : t + 1], carry, donate=True)
        states.sum().backward()
    assert {k: v.data_ptr() for k, v in carry.raw_sensitivities()[0].items()} == storage


class _LazyFor:
    """``inplace.scales_lazily`` as on a CPU for the first ``steps`` steps, then as on a GPU."""

    def __init__(self, steps: int) -> None:
        self.left = steps

    def __call__(self, device: torch.device) -> bool:
        self.left -= 1
        return self.left >= 0


@pytest.mark.parametrize("cls", [ELSTMCell, LRUCell, RTUCell])  # a (B, N) scale; K x K blocks (B, K, K, N)
def test_off_the_cpu_the_step_decays_in_place_and_a_scaled_carry_is_folded_first(cls, problem, monkeypatch):
    """Where the lazy scale's host-side checks would wait for the device (a GPU: inplace.scales_lazily), the step
    decays the donated sensitivities where they lie; a carry scaled on the CPU (a resumed checkpoint) is folded at
    its first step there. Both runs equal the functional one and add up to full BPTT."""
    inputs, reset, weights, d, n = problem
    cell = make(cls, d, n)
    kept = run(RTRL(), cell, inputs, reset, weights, 1, donate=False)
    for first_lazy_steps in (0, 7):
        monkeypatch.setattr(inplace, "scales_lazily", _LazyFor(first_lazy_steps))
        donated = run(RTRL(), cell, inputs, reset, weights, 1, donate=True)
        assert donated[2].scale is None
        assert_same_run(kept, donated)
    assert_adds_up_to_full_bptt(cell, donated[0], inputs, reset, weights)


@pytest.mark.parametrize("bound", ["condition", "range"])
def test_block_scales_folded_at_every_step_stay_exact(bound, problem, monkeypatch):
    """Folding the K x K scale into S~ (as an ill-conditioned or out-of-range block is) gives the same run."""
    from tests.gradients.rotation import RotationCell

    inputs, reset, weights, d, n = problem
    kept = run(RTRL(), make(RotationCell, d, n), inputs, reset, weights, 1, donate=False)
    if bound == "condition":
        monkeypatch.setattr(inplace, "_BLOCK_CONDITION_MAX", 0.0)  # every block is "ill-conditioned"
    else:
        monkeypatch.setattr(inplace, "_scale_bounds", lambda dtype: (1e300, 1e-300))  # every norm is out of range
    donated = run(RTRL(), make(RotationCell, d, n), inputs, reset, weights, 1, donate=True)
    assert_same_run(kept, donated)
    eye = torch.eye(3, dtype=torch.float64)[None, :, :, None].expand_as(donated[2].scale)
    assert torch.equal(donated[2].scale, eye)  # folded: the identity


@pytest.mark.parametrize("seg_len", [1, 5])
def test_units_of_three_components_are_decayed_in_place_exactly(seg_len, problem):
    """The in-place decay of S_0 by the K x K blocks (a copy of K - 1 components, the last updated where it lies)
    with dense 3 x 3 blocks: the donated run equals the functional one."""
    from tests.gradients.rotation import RotationCell

    inputs, reset, weights, d, n = problem
    kept = run(RTRL(), make(RotationCell, d, n), inputs, reset, weights, seg_len, donate=False)
    donated = run(RTRL(), make(RotationCell, d, n), inputs, reset, weights, seg_len, donate=True)
    assert_same_run(kept, donated)


def test_a_stack_donates_every_layer(problem):
    inputs, reset, _, d, n = problem
    torch.manual_seed(0)
    stack = Stack([ELSTMCell(d, n), SRUCell(n, n), LRUCell(n, n)]).double()
    weights = torch.randn(inputs.shape[0], inputs.shape[1], stack.output_size, dtype=torch.float64)
    kept = run(RTRL(), stack, inputs, reset, weights, 1, donate=False)
    donated = run(RTRL(), stack, inputs, reset, weights, 1, donate=True)
    assert_same_run(kept, donated)
    assert [layer.scale is not None for layer in donated[2].layers] == [True, True, True]  # the LRU's: K x K blocks


@pytest.mark.parametrize("cls", [ELSTMCell, LRUCell, RTUCell])  # a (B, N) scale; K x K blocks (B, K, K, N)
def test_a_scaled_carry_round_trips_and_resumes_bit_for_bit(cls, problem):
    inputs, reset, weights, d, n = problem
    cell, method = make(cls, d, n), RTRL()
    if cell.num_components > 1:
        weights = weights.unsqueeze(-2)
    carry = method.init_carry(cell, inputs.shape[1])
    for t in range(6):
        states, carry = method.unroll(cell, inputs[t : t + 1], reset[t : t + 1], carry, donate=True)
        states.sum().backward()
    state = carry.state_dict()
    assert set(state) == {"c", "window", "sensitivities", "scale"}
    loaded = load_carry({k: (v.clone() if torch.is_tensor(v) else v) for k, v in state.items()})
    loaded = Carry.from_state_dict(
        {**loaded.state_dict(), "sensitivities": {k: v.clone() for k, v in state["sensitivities"].items()}}
    )
    for k, v in carry.sensitivities.items():
        torch.testing.assert_close(loaded.sensitivities[k], v, rtol=0, atol=0)
    assert carry.nbytes() == loaded.nbytes()

    def go_on(c):
        cell.zero_grad()
        for t in range(6, 12):
            states, c = method.unroll(cell, inputs[t : t + 1], reset[t : t + 1], c, donate=True)
            (states * weights[t : t + 1]).sum().backward()
        return c, {k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None}

    a, ga = go_on(carry)
    b, gb = go_on(loaded)
    for k in ga:
        torch.testing.assert_close(gb[k], ga[k], rtol=0, atol=0)
    for k, v in a.sensitivities.items():
        torch.testing.assert_close(b.sensitivities[k], v, rtol=0, atol=0)


def test_fold_makes_the_stored_tensors_the_sensitivities(problem):
    inputs, reset, _, d, n = problem
    cell, method = make(ELSTMCell, d, n), RTRL()
    carry = method.init_carry(cell, inputs.shape[1])
    for t in range(4):
        _, carry = method.unroll(cell, inputs[t : t + 1], reset[t : t + 1], carry, donate=True)
    true = carry.sensitivities
    raw, _ = carry.raw_sensitivities()
    assert carry.fold_() is carry and carry.scale is None
    assert carry.sensitivities is raw  # the live dict again
    for k, v in true.items():
        assert rel_err(raw[k], v) <= 1e-15


def test_donated_step_under_autocast_keeps_the_sensitivity_dtype():
    torch.manual_seed(0)
    cell, method = ELSTMCell(6, 8), RTRL()
    inputs = torch.randn(12, 3, 6)
    reset = torch.zeros(12, 3, dtype=torch.bool)
    reset[5, 1] = True
    outs = {}
    for donate in (False, True):
        carry, grads = method.init_carry(cell, 3), []
        for t in range(12):
            cell.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                states, carry = method.unroll(cell, inputs[t : t + 1], reset[t : t + 1], carry, donate=donate)
                loss = cell.readout(states, inputs[t : t + 1]).float().pow(2).sum()
            loss.backward()
            grads.append({k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None})
        assert all(v.dtype == torch.float32 for v in carry.sensitivities.values())
        assert carry.scale is None or carry.scale.dtype == torch.float32
        outs[donate] = grads, carry
    for ga, gb in zip(outs[False][0], outs[True][0]):
        for k in ga:
            torch.testing.assert_close(gb[k], ga[k], rtol=1e-4, atol=1e-6, msg=k)


def test_the_module_donates_its_training_streams_and_trains_as_before(monkeypatch):
    """OnlineRecurrentModule at M = 1 updates its carry in place; the parameters equal those of the functional step."""
    from onlinerec import RTRLStrategy, Segment
    from onlinerec.data.stream import SegmentStream

    def segments(epoch: int):
        gen = torch.Generator().manual_seed(epoch)
        for _ in range(12):
            x = torch.randn(1, 3, 2, generator=gen)
            yield Segment(x, torch.rand(1, 3, generator=gen) < 0.1, x.cumsum(-1)[..., :1])

    def fit():
        torch.manual_seed(0)
        model = Regressor()
        quiet_trainer(RTRLStrategy(M=1), max_steps=10).fit(model, SegmentStream(segments))
        return model

    donated = fit()
    assert donated.carry().scale is not None
    monkeypatch.setattr(sensitivity.SensitivityMethod, "supports_donation", False)
    kept = fit()
    assert kept.carry().scale is None
    for (name, a), b in zip(kept.state_dict().items(), donated.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    for k, v in kept.carry().sensitivities.items():
        torch.testing.assert_close(donated.carry().sensitivities[k], v, rtol=1e-5, atol=1e-6)


# -- M > 1: the donated carry is written over the old sensitivities once backward has read them ----------------------
@pytest.mark.parametrize("cls", [*K1_CELLS, LRUCell, RTUCell])
def test_donated_segments_equal_the_functional_ones_and_full_bptt(cls, problem):
    inputs, reset, weights, d, n = problem
    cell = make(cls, d, n)
    kept = run(RTRL(), cell, inputs, reset, weights, 5, donate=False)
    donated = run(RTRL(), cell, inputs, reset, weights, 5, donate=True)
    assert_same_run(kept, donated)
    assert_adds_up_to_full_bptt(cell, donated[0], inputs, reset, weights)


@pytest.mark.parametrize("cls", [ELSTMCell, LRUCell, RTUCell])
def test_a_donated_segment_overwrites_the_old_sensitivities_after_backward(cls, problem):
    inputs, reset, _, d, n = problem
    cell, method = make(cls, d, n), RTRL()
    carry = method.init_carry(cell, inputs.shape[1])
    _, carry = method.unroll(cell, inputs[:3], reset[:3], carry)
    storage = {k: v.data_ptr() for k, v in carry.raw_sensitivities()[0].items()}
    _, expected = method.unroll(cell, inputs[3:8], reset[3:8], carry)  # the functional result
    states, new = method.unroll(cell, inputs[3:8], reset[3:8], carry, donate=True)
    assert "update pending" in repr(new)
    states.sum().backward()
    assert "update pending" not in repr(new)
    got = new.raw_sensitivities()[0]
    assert {k: v.data_ptr() for k, v in got.items()} == storage  # written where S_0 was: no new tensor
    for k, v in expected.sensitivities.items():
        assert rel_err(got[k], v) <= 1e-12, k


@pytest.mark.parametrize("cls", [ELSTMCell, LRUCell, RTUCell])
def test_reading_a_donated_carry_before_backward_keeps_the_gradient_exact(cls, problem):
    """A carry read before backward (a checkpoint, the next segment) is computed out of place; S_0 stays intact."""
    inputs, reset, weights, d, n = problem
    cell, method = make(cls, d, n), RTRL()
    w = weights.unsqueeze(-2) if cell.num_components > 1 else weights
    grads = {}
    for donate in (False, True):
        carry = method.init_carry(cell, inputs.shape[1])
        _, carry = method.unroll(cell, inputs[:4], reset[:4], carry)
        cell.zero_grad()
        states, new = method.unroll(cell, inputs[4:9], reset[4:9], carry, donate=donate)
        snapshot = {k: v.clone() for k, v in new.sensitivities.items()}  # read first
        (states * w[4:9]).sum().backward()
        for k, v in new.sensitivities.items():
            torch.testing.assert_close(v, snapshot[k], rtol=0, atol=0)
        grads[donate] = ({k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None}, snapshot)
    for k, g in grads[False][0].items():
        assert rel_err(grads[True][0][k], g) <= 1e-12, k
    for k, s in grads[False][1].items():
        assert rel_err(grads[True][1][k], s) <= 1e-12, k


def test_a_donated_segment_without_a_graph_is_updated_at_once(problem):
    inputs, reset, _, d, n = problem
    cell, method = make(LRUCell, d, n), RTRL()
    carry = method.init_carry(cell, inputs.shape[1])
    _, carry = method.unroll(cell, inputs[:3], reset[:3], carry)
    _, expected = method.unroll(cell, inputs[3:8], reset[3:8], carry)
    with torch.no_grad():
        _, new = method.unroll(cell, inputs[3:8], reset[3:8], carry, donate=True)
    assert "update pending" not in repr(new)
    for k, v in expected.sensitivities.items():
        assert rel_err(new.sensitivities[k], v) <= 1e-12, k


def test_a_stack_of_donated_segments_equals_the_functional_one(problem):
    inputs, reset, _, d, n = problem
    torch.manual_seed(0)
    stack = Stack([ELSTMCell(d, n), LRUCell(n, n)]).double()
    weights = torch.randn(inputs.shape[0], inputs.shape[1], stack.output_size, dtype=torch.float64)
    assert_same_run(
        run(RTRL(), stack, inputs, reset, weights, 6, donate=False),
        run(RTRL(), stack, inputs, reset, weights, 6, donate=True),
    )


def test_a_second_backward_through_a_donated_segment_is_refused_with_the_fix(problem):
    inputs, reset, _, d, n = problem
    cell, method = make(LRUCell, d, n), RTRL()
    carry = method.init_carry(cell, inputs.shape[1])
    _, carry = method.unroll(cell, inputs[:3], reset[:3], carry)
    states, carry = method.unroll(cell, inputs[3:8], reset[3:8], carry, donate=True)
    states.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second time.*Unroll without donate=True"):
        states.sum().backward()


@pytest.mark.parametrize("cls", [FELSTMCell, GRUCell, LRUCell, RTUCell])
def test_snap_donated_segments_equal_the_functional_ones(cls, problem):
    """SnAP's carry (approximate, and with dense recurrent weights for fully recurrent cells) takes the same deferred
    path: the same gradients and carries as without donation."""
    inputs, reset, weights, d, n = problem
    cell = make(cls, d, n)
    assert_same_run(
        run(SnAP(), cell, inputs, reset, weights, 5, donate=False),
        run(SnAP(), cell, inputs, reset, weights, 5, donate=True),
    )
