"""RTRL refuses a recurrence that mixes units only in some region of its state.

One numeric probe at one random point is not enough: a cell that reads its neighbour only where |c| > 3 passes it,
``check_gradients`` passes at 2e-16, and on inputs scaled x4 RTRL's gradient differs from BPTT's by about 100 % without
a word. Three checks stand between such a cell and a wrong gradient: a trace of its ops (structural), the numeric
probe at several scales, and a verification on the live states during training (docs/custom_cell.md)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from onlinerec import RTRL, ElementwiseCell, NotElementwiseError, SnAP, check_gradients
from onlinerec.cells import LRUCell, make_cell
from onlinerec.gradients import elementwise
from onlinerec.gradients.check import bptt_gradients, method_gradients
from tests.gradients.rotation import Rotation2Cell, Rotation3Cell
from tests.helpers import rel_err


class NeighbourWhenLarge(ElementwiseCell):
    """Reads its left neighbour, but only where |c| > 3 (never at the scale of check_gradients' inputs)."""

    num_gates = 2

    def recurrence(self, gates, c_prev):
        neighbour = torch.where(c_prev.abs() > 3, c_prev.roll(1, -1), torch.zeros_like(c_prev))
        return 0.5 * c_prev + gates[..., 0, :] + torch.sigmoid(gates[..., 1, :]) * neighbour


class Unchecked(NeighbourWhenLarge):
    structural_check = False


class HiddenDecision(ElementwiseCell):
    """The same mixing, decided in Python from ``.tolist()``: invisible to a trace (``if`` on a list, not a tensor)."""

    num_gates = 2
    threshold = 3.0

    def recurrence(self, gates, c_prev):
        large = torch.tensor([[abs(v) > self.threshold for v in row] for row in c_prev.detach().tolist()])
        neighbour = c_prev.roll(1, -1) * large.to(c_prev.dtype) if bool(large.any()) else torch.zeros_like(c_prev)
        return 0.5 * c_prev + gates[..., 0, :] + torch.sigmoid(gates[..., 1, :]) * neighbour


class HiddenFarAway(HiddenDecision):
    """Mixes only beyond |c| > 1000: no probe reaches it, live states of a growing integrator do."""

    threshold = 1000.0

    def recurrence(self, gates, c_prev):
        return super().recurrence(gates, c_prev) + 0.5 * c_prev  # an integrator: c grows with a constant input


def _x4_gradient_error(cell, method):
    gen = torch.Generator().manual_seed(0)
    inputs = 4 * torch.randn(30, 3, 3, generator=gen, dtype=torch.float64)
    reset = torch.zeros(30, 3, dtype=torch.bool)
    reset[0] = True
    weights = torch.randn(30, 3, 8, generator=gen, dtype=torch.float64)
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    got, _, _ = method_gradients(method, cell, inputs, reset, weights, 7)
    return max(rel_err(got[k], v) for k, v in expected.items())


def test_region_mixing_passes_a_single_probe_at_one_scale(monkeypatch):
    """One probe at scale 1, without the trace or the live verification, misses region mixing."""
    monkeypatch.setattr(elementwise, "PROBE_SCALES", (1.0,))
    torch.manual_seed(0)
    cell = Unchecked(3, 8).double()
    assert max(check_gradients(cell, RTRL(verify="off")).values()) < 1e-10  # looks exact
    assert _x4_gradient_error(cell, RTRL(verify="off")) > 0.5  # and is wrong by ~100 % on larger states


def test_rtrl_refuses_it_by_tracing_both_branches_of_the_where():
    with pytest.raises(NotElementwiseError) as err:
        RTRL().init_carry(NeighbourWhenLarge(3, 8), 2)
    assert str(err.value) == (
        "NeighbourWhenLarge.recurrence is not element-wise: it combines values of hidden unit 0 and hidden unit 7 in "
        "aten.where.self. Exact RTRL needs a diagonal recurrent Jacobian (one K x K block per unit for units of K components); for a "
        "cell like this use SnAPStrategy (a diagonal approximation, for FullyRecurrentCell subclasses) or TBPTTStrategy."
    )
    with pytest.raises(NotElementwiseError, match="NeighbourWhenLarge"):
        check_gradients(NeighbourWhenLarge(3, 8))
    with pytest.raises(NotElementwiseError, match="NeighbourWhenLarge"):
        SnAP().init_carry(NeighbourWhenLarge(3, 8), 2)


def test_without_the_trace_the_probe_at_several_scales_refuses_it():
    with pytest.raises(NotElementwiseError, match=r"^Unchecked.recurrence is not element-wise in .* scaled x(4|16)\)"):
        RTRL().init_carry(Unchecked(3, 8), 2)


def test_a_decision_the_trace_cannot_see_is_refused_by_the_scaled_probes():
    with pytest.raises(NotElementwiseError, match=r"^HiddenDecision.recurrence is not element-wise in .* scaled x"):
        RTRL().init_carry(HiddenDecision(3, 8), 2)


def _grow(cell, method, segments=6, m=5):
    """Constant inputs drive the integrator's states far out; a reset in the middle of stream 1."""
    carry = method.init_carry(cell, 2)
    reset = torch.zeros(m, 2, dtype=torch.bool)
    for s in range(segments):
        reset[2, 1] = s == 1
        states, carry = method.unroll(cell, torch.full((m, 2, 3), 3.0), reset, carry)
        states.sum().backward()
    return carry


def test_mixing_that_no_probe_reaches_is_caught_on_live_states():
    torch.manual_seed(0)
    cell = HiddenFarAway(3, 8)
    with torch.no_grad():
        cell.input_proj.weight.fill_(10.0)
    RTRL().init_carry(cell, 2)  # trace and probes see nothing: the mixing starts beyond |c| > 1000
    _grow(cell, RTRL(verify="off"))  # off: no check, the gradient is silently wrong (the documented trade-off)
    with pytest.raises(NotElementwiseError) as err:
        _grow(cell, RTRL(verify="always"))
    message = str(err.value)
    assert message.startswith("HiddenFarAway.recurrence mixed hidden units (or batch rows) on live states (segment ")
    assert "TBPTTStrategy" in message and "a vector-Jacobian product" in message
    with pytest.raises(NotElementwiseError, match=r"on live states \(segment \d+ of this RTRL, step \d\)"):
        _grow(cell, RTRL(verify="sampled", verify_every=1))


def test_the_sampled_default_checks_the_first_segment_then_every_100th():
    method = RTRL()
    assert (method.verify, method.verify_every) == ("sampled", 100) and repr(method) == "RTRL()"
    cell = make_cell("elstm", 3, 4)
    due = [method._steps_to_verify(cell, 5) for _ in range(201)]
    assert [i for i, steps in enumerate(due) if steps is not None] == [0, 100, 200]
    assert [due[i] for i in (0, 100, 200)] == [range(4, 5), range(3, 4), range(2, 3)]  # last step first, then earlier
    assert all(s is not None for s in (RTRL(verify="always")._steps_to_verify(cell, 5) for _ in range(3)))
    assert RTRL(verify="off")._steps_to_verify(cell, 5) is None
    with pytest.raises(ValueError, match="verify"):
        RTRL(verify="yes")
    with pytest.raises(ValueError, match="verify_every"):
        RTRL(verify_every=0)


@pytest.mark.parametrize("name", ["elstm", "qrnn", "sru", "lru", "mingru", "minlstm", "indrnn"])
def test_the_live_verification_accepts_every_builtin_cell_in_float32(name):
    """No false alarm from float32 rounding: every step of every segment verified, resets included."""
    torch.manual_seed(0)
    cell = make_cell(name, 3, 6)
    method = RTRL(verify="always")
    carry = method.init_carry(cell, 3)
    gen = torch.Generator().manual_seed(1)
    for m in (4, 1, 3):
        inputs = 3 * torch.randn(m, 3, 3, generator=gen)
        reset = torch.rand(m, 3, generator=gen) < 0.2
        states, carry = method.unroll(cell, inputs, reset, carry)
        states.sum().backward()


# -- what the trace allows and refuses -------------------------------------------------------------------------------
class _Base(ElementwiseCell):
    num_gates = 3

    def __init__(self, input_size, hidden_size):
        super().__init__(input_size, hidden_size)
        self.w = nn.Parameter(torch.rand(hidden_size))

    def mix(self, c):
        return c

    def recurrence(self, gates, c_prev):
        return torch.tanh(gates[..., 0, :] + self.w * self.mix(c_prev))


def _cell(mix):
    return type(mix.__name__, (_Base,), {"mix": lambda self, c: mix(self, c)})(3, 5)


def rolled(self, c):
    return c.roll(1, -1)


def flipped(self, c):
    return c.flip(-1)


def gathered(self, c):
    return c[..., [1, 0, 2, 3, 4]]


def matmul(self, c):
    return c @ torch.eye(c.shape[-1], dtype=c.dtype)


def unit_sum(self, c):
    return c - c.sum(-1, keepdim=True)


def unit_softmax(self, c):
    return torch.softmax(c, -1)


def cumsum(self, c):
    return c.cumsum(-1)


def python_if(self, c):
    return c * 2 if c[0, 0] > 0 else c


def batch_mean(self, c):
    return c - c.mean(0)


def parameter_norm(self, c):
    return c * (self.w / self.w.norm())


def data_index(self, c):
    return c[..., c[0].argsort()]


@pytest.mark.parametrize(
    ("mix", "op"),
    [
        (rolled, "combines values of hidden unit 0 and hidden unit 4 in aten.mul.Tensor"),
        (flipped, "combines values of hidden unit 0 and hidden unit 4 in aten.mul.Tensor"),
        (gathered, "combines values of hidden unit 0 and hidden unit 1 in aten.mul.Tensor"),
        (matmul, "sums over hidden units (hidden unit 0 and hidden unit 4) in aten.mm.default"),
        (unit_sum, "reduces over hidden units (hidden unit 0 and hidden unit 4) in aten.sum.dim_IntList"),
        (unit_softmax, "reduces over hidden units (hidden unit 0 and hidden unit 4) in aten._softmax.default"),
        (cumsum, "reduces over hidden units (hidden unit 0 and hidden unit 4) in aten.cumsum.default"),
        (python_if, "reads a value computed from the state as a Python number (aten._local_scalar_dense.default"),
        (batch_mean, "reduces over batch rows (batch row 0 and batch row 3) in aten.mean.dim"),
        (parameter_norm, "reduces over hidden units (hidden unit 0 and hidden unit 4) in aten.linalg_vector_norm"),
        (data_index, "reduces over hidden units (hidden unit 0 and hidden unit 4) in aten.sort.default"),
    ],
)
def test_the_trace_names_the_op_that_mixes(mix, op):
    with pytest.raises(NotElementwiseError) as err:
        RTRL().init_carry(_cell(mix), 2)
    message = str(err.value)
    assert message.startswith(f"{mix.__name__}.recurrence is not element-wise: it ") and op in message, message
    assert "SnAPStrategy" in message and "TBPTTStrategy" in message


def masked_assign(self, c):
    out = c.clone()
    out[c.abs() > 1] = 0.0
    return out


def masked_select_and_back(self, c):
    out = torch.zeros_like(c)
    out[c > 0] = c[c > 0] * 2
    return out


def where_both_branches(self, c):
    return torch.where(c > 0, c, 0.1 * c)


def casts_and_views(self, c):
    z = torch.complex(c, torch.zeros_like(c)) * (1 + 0j)  # complex numbers, read back through view_as_real
    return z.real.to(torch.float64).unsqueeze(0).expand(2, *c.shape)[1].reshape(c.shape).contiguous()


def constant_index(self, c):
    return c[:, None, :].repeat(1, 2, 1)[:, 1]


@pytest.mark.parametrize(
    "mix", [masked_assign, masked_select_and_back, where_both_branches, casts_and_views, constant_index]
)
def test_element_wise_code_passes_the_trace(mix):
    cell = _cell(mix)
    RTRL().init_carry(cell, 2)
    assert max(check_gradients(cell).values()) < 1e-10


class BlockEinsum(ElementwiseCell):
    """Each unit mixes its own K = 2 components with a per-unit 2 x 2 matrix (einsum: a bmm over the unit axis)."""

    num_gates = 2
    num_components = 2

    def __init__(self, input_size, hidden_size):
        super().__init__(input_size, hidden_size)
        self.block = nn.Parameter(0.3 * torch.randn(2, 2, hidden_size))

    def recurrence(self, gates, c_prev):
        mixed = torch.einsum("kjn,...jn->...kn", torch.tanh(self.block), c_prev)
        return mixed + torch.softmax(gates, -2) * c_prev.sum(-2, keepdim=True).tanh()


class SoftmaxOverUnits(BlockEinsum):
    def recurrence(self, gates, c_prev):
        return super().recurrence(gates, c_prev) * torch.softmax(c_prev, -1)


@pytest.mark.parametrize("cls", [BlockEinsum, Rotation2Cell, Rotation3Cell, LRUCell])
def test_mixing_a_units_own_components_passes_the_trace(cls):
    cell = cls(3, 5)
    RTRL().init_carry(cell, 2)
    assert max(check_gradients(cell).values()) < 1e-10


def test_mixing_units_of_k_components_is_refused_by_the_trace():
    with pytest.raises(NotElementwiseError, match=r"^SoftmaxOverUnits.* reduces over hidden units .* aten._softmax"):
        RTRL().init_carry(SoftmaxOverUnits(3, 5), 2)


class ComponentNorm(ElementwiseCell):
    """Layer norm over each unit's K components: element-wise per unit, through an op the trace does not know."""

    num_gates = 2
    num_components = 2

    def recurrence(self, gates, c_prev):
        normed = nn.functional.layer_norm(c_prev.transpose(-1, -2), (2,)).transpose(-1, -2)
        return 0.5 * normed + torch.tanh(gates)


class ComponentNormTrusted(ComponentNorm):
    structural_check = False


def test_an_op_the_trace_does_not_know_is_refused_with_the_way_out():
    with pytest.raises(NotElementwiseError) as err:
        RTRL().init_carry(ComponentNorm(3, 5), 2)
    message = str(err.value)
    assert "aten.native_layer_norm.default, which the structural check does not know" in message
    assert message.endswith(
        "If you know that it is element-wise, set `structural_check = False` on ComponentNorm: RTRL then relies on the "
        "numeric probes and its runtime verification."
    )
    cell = ComponentNormTrusted(3, 5)
    RTRL().init_carry(cell, 2)  # the numeric probes agree that it is element-wise per unit
    assert max(check_gradients(cell, RTRL(verify="always")).values()) < 1e-10
