"""A cell's optional closed-form local derivatives (``recurrence_derivatives``): used only after they match autodiff,
refused with a clear error when they do not, and RTRL stays exact with them (the LRU's and the eLSTM's)."""

from __future__ import annotations

import pytest
import torch

from onlinerec import RTRL, ClosedFormMismatchError
from onlinerec.cells import ELSTMCell, LRUCell
from onlinerec.gradients import derivatives, elementwise
from onlinerec.gradients.check import bptt_gradients, method_gradients
from tests.helpers import rel_err


class WrongPhaseLRU(LRUCell):
    """The LRU with the sign of dc/dtheta_log flipped: a plausible slip in a hand-written derivative."""

    def recurrence_derivatives(self, gates, c_prev, params):
        value, d_state, d_gates, d_params = super().recurrence_derivatives(gates, c_prev, params)
        return value, d_state, d_gates, {**d_params, "theta_log": -d_params["theta_log"]}


class MisshapenLRU(LRUCell):
    """Forgets the parameter-row axis of dc/dnu_log."""

    def recurrence_derivatives(self, gates, c_prev, params):
        value, d_state, d_gates, d_params = super().recurrence_derivatives(gates, c_prev, params)
        return value, d_state, d_gates, {**d_params, "nu_log": d_params["nu_log"][:, :, 0]}


class AutodiffLRU(LRUCell):
    """Declines the closed form: the derivatives come from autodiff of the recurrence."""

    def recurrence_derivatives(self, gates, c_prev, params):
        return None


def _gradients(cell, problem, seg_len=3):
    inputs, reset, _, _, _ = problem
    gen = torch.Generator().manual_seed(7)
    weights = torch.randn(*inputs.shape[:2], *cell.state_shape, generator=gen, dtype=torch.float64)
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    got, _, _ = method_gradients(RTRL(), cell, inputs, reset, weights, seg_len)
    return expected, got


def _assert_exact(cell, problem, closed: bool) -> None:
    """RTRL's gradients equal full BPTT's (float64), with the closed form in use or not as ``closed`` says."""
    expected, got = _gradients(cell.double(), problem)
    assert derivatives._CLOSED[cell]["recurrence"] is closed
    for key in expected:
        assert rel_err(got[key], expected[key]) <= 1e-10, key


@pytest.mark.parametrize(
    "make",
    [
        lambda d, n: LRUCell(d, n, r_min=0.4, r_max=0.95, train_gamma=True),
        lambda d, n: LRUCell(d, n, r_min=0.4, r_max=0.95, train_gamma=False),
        ELSTMCell,
    ],
    ids=["lru-train-gamma", "lru", "elstm"],
)
def test_closed_form_is_used_and_rtrl_stays_exact(make, problem):
    _, _, _, d, n = problem
    torch.manual_seed(0)
    _assert_exact(make(d, n), problem, closed=True)


def test_closed_form_equals_autodiff_at_a_live_point():
    torch.manual_seed(1)
    cell = LRUCell(4, 6, train_gamma=True).double()
    names = ("nu_log", "theta_log", "gamma_log")
    elementwise.recurrence_parameters(cell, "recurrence", ("input_proj.weight",), 2, 6, 2)
    params = {k: v.detach() for k, v in cell.named_parameters() if k in names}
    gates, c_prev = torch.randn(9, 2, 6, dtype=torch.float64), torch.randn(9, 2, 6, dtype=torch.float64)
    closed = derivatives.local_derivatives(cell, "recurrence", params, gates, c_prev)
    auto = derivatives.forward_mode(cell, "recurrence", params, gates, c_prev)
    assert torch.allclose(closed.d_state, auto.d_state, atol=1e-12)
    assert torch.allclose(closed.d_gates, auto.d_gates, atol=1e-12)
    for k in names:
        assert torch.allclose(closed.d_params[k], auto.d_params[k], atol=1e-12), k


@pytest.mark.parametrize(
    ("cls", "says"), [(WrongPhaseLRU, "dc/dtheta_log has a relative error"), (MisshapenLRU, "dc/dnu_log has shape")]
)
def test_a_wrong_closed_form_is_refused_before_it_trains(cls, says, problem):
    _, _, _, d, n = problem
    cell = cls(d, n).double()
    with pytest.raises(ClosedFormMismatchError, match=f"{cls.__name__}.recurrence_derivatives disagrees") as info:
        _gradients(cell, problem)
    assert says in str(info.value)
    assert "delete the override" in str(info.value)


def test_declining_the_closed_form_falls_back_to_autodiff(problem):
    _, _, _, d, n = problem
    torch.manual_seed(0)
    _assert_exact(AutodiffLRU(d, n), problem, closed=False)


class WrongFarOutLRU(LRUCell):
    """A closed form that is right near the origin (where the probe looks) and wrong for |c_prev| > 40."""

    def recurrence_derivatives(self, gates, c_prev, params):
        value, d_state, d_gates, d_params = super().recurrence_derivatives(gates, c_prev, params)
        far = (c_prev.abs() > 40).any(1, keepdim=True).unsqueeze(2)  # (R, 1, 1, N)
        return value, torch.where(far, 0.5 * d_state, d_state), d_gates, d_params


def test_a_closed_form_wrong_only_on_live_states_is_caught_there():
    torch.manual_seed(0)
    cell = WrongFarOutLRU(3, 4, r_min=0.99, r_max=0.999)
    with torch.no_grad():
        cell.input_proj.weight.fill_(30.0)
    carry = RTRL().init_carry(cell, 2)  # the probe passes: it looks at small states
    method = RTRL(verify="always")
    with pytest.raises(
        ClosedFormMismatchError, match=r"^WrongFarOutLRU.recurrence_derivatives disagrees .* live states"
    ):
        for _ in range(6):
            states, carry = method.unroll(cell, torch.full((5, 2, 3), 3.0), torch.zeros(5, 2, dtype=torch.bool), carry)
            states.sum().backward()


class LeakyELSTM(ELSTMCell):
    """A subclass that changes the step (a leak on the state): the eLSTM's closed form no longer applies."""

    def recurrence(self, gates, c_prev):
        return 0.9 * super().recurrence(gates, c_prev)


def test_elstm_closed_form_equals_autodiff_at_a_live_point():
    torch.manual_seed(1)
    cell = ELSTMCell(4, 6).double()
    params = {"recurrent_weight": cell.recurrent_weight.detach() * 5}  # large weights: every term matters
    gates, c_prev = torch.randn(9, 2, 6, dtype=torch.float64), 2 * torch.randn(9, 6, dtype=torch.float64)
    value, d_state, d_gates, d_params = cell.recurrence_derivatives(gates, c_prev, params)
    auto = derivatives.forward_mode(cell, "recurrence", params, gates, c_prev)
    with derivatives.substituted(cell, params):
        assert torch.allclose(value, cell.recurrence(gates, c_prev), atol=1e-12)
    assert torch.allclose(d_state, auto.d_state, atol=1e-12)
    assert torch.allclose(d_gates, auto.d_gates, atol=1e-12)
    assert torch.allclose(d_params["recurrent_weight"], auto.d_params["recurrent_weight"], atol=1e-12)


def test_a_subclass_that_changes_the_elstm_step_gets_autodiff(problem):
    _, _, _, d, n = problem
    torch.manual_seed(0)
    cell = LeakyELSTM(d, n).double()
    gates, c_prev = torch.randn(3, 2, n, dtype=torch.float64), torch.randn(3, n, dtype=torch.float64)
    assert cell.recurrence_derivatives(gates, c_prev, {}) is None
    _assert_exact(cell, problem, closed=False)
