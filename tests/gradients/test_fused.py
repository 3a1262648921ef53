"""The fused fully online step of the linear RTU against the generic step and full BPTT in float64: the same
gradients (parameters and inputs), states and carries, alone and in a stack; and which cells take it."""

from __future__ import annotations

import pytest
import torch

import onlinerec.gradients.sensitivity as sensitivity
from onlinerec import RTRL, TBPTT, LRUCell, RTUCell
from onlinerec.cells import Stack
from onlinerec.gradients.check import bptt_gradients
from onlinerec.gradients.fused import fused_online_step
from tests.helpers import on, rel_err


def _online(cell, inputs, reset, weights, method=None, by_step=False):
    """Donated M = 1 steps (RTRL never verified, so that every step may take the fused form), by ``unroll`` or by
    ``step``: the parameter gradient of each step, the inputs' gradient, the states and the final carry."""
    method = method or RTRL(verify="off")
    x = inputs.detach().requires_grad_(True)
    carry = method.init_carry(cell, inputs.shape[1])
    grads, states = [], []
    for t in range(inputs.shape[0]):
        cell.zero_grad()
        if by_step:
            out, carry = method.step(cell, x[t], reset[t], carry)
            out = out.unsqueeze(0)
        else:
            out, carry = method.unroll(cell, x[t : t + 1], reset[t : t + 1], carry, donate=True)
        (out * weights[t : t + 1]).sum().backward()
        grads.append({k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None})
        states.append(out.detach())
    return grads, x.grad.clone(), torch.cat(states), carry


def _counted(monkeypatch):
    """Count the steps that took the fused form."""
    taken = []

    def counting(*args):
        out = fused_online_step(*args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(sensitivity, "fused_online_step", counting)
    return taken


def _weights(problem, shape):
    gen = torch.Generator().manual_seed(7)
    return torch.randn(*problem[0].shape[:2], *shape, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("by_step", [False, True], ids=["unroll", "step"])
@pytest.mark.parametrize("layers", [1, 2])
def test_fused_rtu_step_equals_the_generic_step_and_full_bptt(layers, by_step, problem, monkeypatch, device):
    inputs, reset, _, d, n = problem
    torch.manual_seed(0)
    cell = (RTUCell(d, n) if layers == 1 else Stack([RTUCell(d, n), RTUCell(2 * n, n)])).double().to(device)
    weights = _weights(problem, cell.state_shape if layers == 1 else (cell.output_size,))
    inputs, reset, weights = on(device, inputs, reset, weights)
    taken = _counted(monkeypatch)
    grads, x_grad, states, carry = _online(cell, inputs, reset, weights, by_step=by_step)
    assert taken and all(taken)  # every step of every layer took the fused form
    monkeypatch.setattr(sensitivity, "fused_online_step", lambda *args: None)  # the generic step
    ref_grads, ref_x_grad, ref_states, ref_carry = _online(cell, inputs, reset, weights)
    for got, ref in zip(grads, ref_grads):
        assert set(got) == set(ref)
        for name in ref:
            assert rel_err(got[name], ref[name]) <= 1e-12, name
    assert rel_err(x_grad, ref_x_grad) <= 1e-12
    assert rel_err(states, ref_states) <= 1e-12
    carries = carry.layers if layers == 2 else [carry]
    ref_carries = ref_carry.layers if layers == 2 else [ref_carry]
    for c, ref in zip(carries, ref_carries):
        for name, s in ref.sensitivities.items():
            assert rel_err(c.sensitivities[name], s) <= 1e-12, name
    if layers == 2:
        return  # a stack's lower layers get no gradient through the upper layers' past (RTRL per layer)
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    total = {k: sum(g[k] for g in grads) for k in expected}  # the per-step gradients add up to full BPTT
    for name in expected:
        assert rel_err(total[name], expected[name]) <= 1e-10, name


class ScaledRTU(RTUCell):
    """A subclass with a recurrence of its own: the fused form, written for RTUCell's, must not be taken."""

    def recurrence(self, gates, c_prev):
        return 0.5 * super().recurrence(gates, c_prev)

    def recurrence_derivatives(self, gates, c_prev, params):
        return None  # from autodiff of the recurrence above


@pytest.mark.parametrize(
    "make",
    [
        lambda d, n: RTUCell(d, n, nonlinear=True),
        lambda d, n: ScaledRTU(d, n),
        lambda d, n: LRUCell(d, n),
    ],
    ids=["nonlinear-rtu", "rtu-subclass", "lru"],
)
def test_other_cells_take_the_generic_step(make, problem, monkeypatch):
    inputs, reset, _, d, n = problem
    torch.manual_seed(0)
    cell = make(d, n).double()
    taken = _counted(monkeypatch)
    grads, *_ = _online(cell, inputs[:6], reset[:6], _weights(problem, cell.state_shape)[:6])
    assert taken and not any(taken)
    assert grads[-1]  # and they still learn


def test_the_fused_step_declines_a_float32_carry_with_float64_inputs(problem):
    inputs, reset, _, d, n = problem
    cell = RTUCell(d, n)
    carry = RTRL().init_carry(cell, inputs.shape[1])
    params = dict(cell.named_parameters())
    sens, _ = carry.raw_sensitivities()
    keep = (~reset[:1]).double()
    assert fused_online_step(cell, params, inputs[:1], keep, carry.c, sens) is None
    assert fused_online_step(cell, params, inputs[:1].float(), keep.float(), carry.c, sens) is not None


@pytest.mark.parametrize("method", [RTRL(verify="off"), TBPTT()], ids=["rtrl", "tbptt"])
@pytest.mark.parametrize("nonlinear", [False, True], ids=["linear", "nonlinear"])
def test_step_is_unroll_of_one_step(method, nonlinear, problem):
    """Every method's step gives what a donated unroll of M = 1 gives (fused or not)."""
    inputs, reset, _, d, n = problem
    torch.manual_seed(0)
    cell = RTUCell(d, n, nonlinear=nonlinear).double()
    weights = _weights(problem, cell.state_shape)
    by_step = _online(cell, inputs, reset, weights, method, by_step=True)
    by_unroll = _online(cell, inputs, reset, weights, method)
    for got, ref in zip(by_step[0], by_unroll[0]):
        for name in ref:
            assert rel_err(got[name], ref[name]) <= 1e-12, name
    for got, ref in zip(by_step[1:3], by_unroll[1:3]):
        assert rel_err(got, ref) <= 1e-12


def test_step_gives_up_the_carry(problem):
    inputs, reset, _, d, n = problem
    cell, method = RTUCell(d, n).double(), RTRL()
    carry = method.init_carry(cell, inputs.shape[1])
    _, new = method.step(cell, inputs[0], reset[0], carry)
    with pytest.raises(RuntimeError, match="donate=True"):
        method.step(cell, inputs[1], reset[1], carry)
    _, newer = method.step(cell, inputs[1], reset[1], new)
    with pytest.raises(ValueError, match="input_size"):  # a wrong shape gets unroll's checks and messages
        method.step(cell, inputs[2][:, :2], reset[2], newer)


def test_step_names_a_segment_given_to_it(problem):
    inputs, reset, _, d, n = problem
    cell, method = RTUCell(d, n).double(), RTRL()
    carry = method.init_carry(cell, inputs.shape[1])
    with pytest.raises(ValueError, match=r"inputs \(B, D\); got \(23, 4, 3\).*call unroll"):
        method.step(cell, inputs, reset, carry)
    with pytest.raises(ValueError, match=r"reset of shape \(B,\)"):
        method.step(cell, inputs[0], reset[:1], carry)
    with pytest.raises(TypeError, match=r"bool tensor \(B,\), got torch.float64; use reset.bool\(\)"):
        method.step(cell, inputs[0], reset[0].double(), carry)
