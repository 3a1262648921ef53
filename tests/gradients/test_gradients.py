"""Every method on every cell against autograd references in float64, on every device (cell-specific checks:
tests/cells)."""

from __future__ import annotations

import pytest
import torch

from onlinerec import RTRL, TBPTT, ELSTMCell, FELSTMCell, QRNNCell, SnAP, SRUCell
from onlinerec.gradients.check import bptt_gradients, method_gradients, reference_states, stepwise, truncated_gradients
from tests.helpers import on, rel_err

ELEMENTWISE = [ELSTMCell, QRNNCell, SRUCell]
ALL_CELLS = [*ELEMENTWISE, FELSTMCell]
SEGMENT_LENGTHS = [1, 4, 7]  # 7 does not divide T = 23


def make(cls, d, n, seed=0, device="cpu"):
    torch.manual_seed(seed)
    return cls(d, n).double().to(device)


@pytest.mark.parametrize("carry", ["batched", "stepwise"])
@pytest.mark.parametrize("seg_len", SEGMENT_LENGTHS)
@pytest.mark.parametrize("cls", ELEMENTWISE)
def test_rtrl_equals_full_bptt(cls, seg_len, carry, problem, device):
    inputs, reset, weights, d, n = problem
    inputs, reset, weights = on(device, inputs, reset, weights)
    cell = make(cls, d, n, device=device)
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    method = RTRL() if carry == "batched" else stepwise(RTRL())
    got, _, _ = method_gradients(method, cell, inputs, reset, weights, seg_len)
    assert expected.keys() == got.keys()
    for name in expected:
        assert rel_err(got[name], expected[name]) <= 1e-10, name


@pytest.mark.parametrize("cls", ALL_CELLS)
def test_tbptt_equals_truncated_backprop(cls, problem, device):
    inputs, reset, weights, d, n = problem
    inputs, reset, weights = on(device, inputs, reset, weights)
    cell = make(cls, d, n, device=device)
    seg = 4
    expected = truncated_gradients(cell, inputs, reset, weights, seg)
    got, _, _ = method_gradients(TBPTT(), cell, inputs, reset, weights, seg)
    for name in expected:
        assert rel_err(got[name], expected[name]) <= 1e-12, name
    full, _ = bptt_gradients(cell, inputs, reset, weights)
    assert rel_err(got["input_proj.weight"], full["input_proj.weight"]) > 1e-3  # truncation must show


@pytest.mark.parametrize("cls", ELEMENTWISE)
def test_snap_equals_rtrl_on_elementwise_cells(cls, problem, device):
    inputs, reset, weights, d, n = problem
    inputs, reset, weights = on(device, inputs, reset, weights)
    cell = make(cls, d, n, device=device)
    rtrl, _, _ = method_gradients(RTRL(), cell, inputs, reset, weights, 5)
    snap, _, _ = method_gradients(SnAP(), cell, inputs, reset, weights, 5)
    for name in rtrl:
        assert rel_err(snap[name], rtrl[name]) <= 1e-12, name


@pytest.mark.parametrize("cls", ALL_CELLS)
def test_snap_equals_bptt_on_one_step_sequences(cls, problem, device):
    inputs, _, weights, d, n = problem
    inputs, weights = on(device, inputs, weights)
    cell = make(cls, d, n, device=device)
    reset = torch.ones(inputs.shape[:2], dtype=torch.bool, device=device)  # every step starts a one-step sequence
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    got, _, _ = method_gradients(SnAP(), cell, inputs, reset, weights, 1)
    for name in expected:
        assert rel_err(got[name], expected[name]) <= 1e-10, name


def test_snap_differs_from_bptt_on_felstm_over_longer_sequences(problem):
    inputs, reset, weights, d, n = problem
    cell = make(FELSTMCell, d, n)
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    got, _, _ = method_gradients(SnAP(), cell, inputs, reset, weights, 1)
    assert rel_err(got["recurrent_proj.weight"], expected["recurrent_proj.weight"]) > 1e-3
    assert rel_err(got["input_proj.weight"], expected["input_proj.weight"]) > 1e-3
    tbptt, _, _ = method_gradients(TBPTT(), cell, inputs, reset, weights, 1)
    # SnAP-1 keeps part of the long-range signal that M = 1 truncation drops entirely.
    assert rel_err(got["input_proj.weight"], expected["input_proj.weight"]) < rel_err(
        tbptt["input_proj.weight"], expected["input_proj.weight"]
    )


def _felstm_snap1_reference(cell, inputs, reset, weights, seg_len):
    """SnAP-1 for FELSTM with hand-derived formulas (docs/rtrl.md), step by step, no autodiff for the carry.

    Gradient of a segment = within-segment autograd from a detached start + lambda_0 . S_0, with the sensitivities
    S[i, .] for row i of Z, F, R_z, R_f, b_z, b_f propagated with the diagonal J_ii only.
    """
    m, b, d = inputs.shape
    n = cell.hidden_size
    w, bias = cell.input_proj.weight.detach(), cell.input_proj.bias.detach()
    r = cell.recurrent_proj.weight.detach()
    r_diag = torch.stack([r[:n].diagonal(), r[n:].diagonal()])  # (2, N): R_z[i,i], R_f[i,i]
    zeros = lambda *s: torch.zeros(b, *s, dtype=inputs.dtype)  # noqa: E731
    sens = {"Z": zeros(n, d), "F": zeros(n, d), "Rz": zeros(n, n), "Rf": zeros(n, n), "bz": zeros(n), "bf": zeros(n)}
    c = zeros(n)
    grads = {k: torch.zeros_like(p) for k, p in cell.named_parameters()}
    for s in range(0, m, seg_len):
        cell.zero_grad()
        c0 = c.clone().requires_grad_(True)
        states = reference_states(cell, inputs[s : s + seg_len], reset[s : s + seg_len], c0=c0)
        (states * weights[s : s + seg_len]).sum().backward()
        lam = c0.grad
        for k, p in cell.named_parameters():
            if p.grad is not None:
                grads[k] += p.grad
        grads["input_proj.weight"] += torch.cat(
            [torch.einsum("bn,bnd->nd", lam, sens["Z"]), torch.einsum("bn,bnd->nd", lam, sens["F"])]
        )
        grads["input_proj.bias"] += torch.cat([(lam * sens["bz"]).sum(0), (lam * sens["bf"]).sum(0)])
        grads["recurrent_proj.weight"] += torch.cat(
            [torch.einsum("bn,bnm->nm", lam, sens["Rz"]), torch.einsum("bn,bnm->nm", lam, sens["Rf"])]
        )
        with torch.no_grad():
            for t in range(s, min(s + seg_len, m)):
                keep = (~reset[t]).to(inputs.dtype).unsqueeze(-1)
                cp = c * keep
                a = inputs[t] @ w.T + bias + cp @ r.T
                z, f = torch.tanh(a[:, :n]), torch.sigmoid(a[:, n:])
                zhat = (1 - f) * (1 - z**2)
                fhat = (cp - z) * f * (1 - f)
                j = (f + zhat * r_diag[0] + fhat * r_diag[1]) * keep
                outer = lambda v, u: v[:, :, None] * u[:, None, :]  # noqa: E731
                sens["Z"] = j[:, :, None] * sens["Z"] + outer(zhat, inputs[t])
                sens["F"] = j[:, :, None] * sens["F"] + outer(fhat, inputs[t])
                sens["Rz"] = j[:, :, None] * sens["Rz"] + outer(zhat, cp)
                sens["Rf"] = j[:, :, None] * sens["Rf"] + outer(fhat, cp)
                sens["bz"] = j * sens["bz"] + zhat
                sens["bf"] = j * sens["bf"] + fhat
                c = f * cp + (1 - f) * z
    return grads


@pytest.mark.parametrize("seg_len", [1, 4])
def test_snap_on_felstm_matches_hand_derived_reference(seg_len, problem):
    inputs, reset, weights, d, n = problem
    cell = make(FELSTMCell, d, n)
    expected = _felstm_snap1_reference(cell, inputs, reset, weights, seg_len)
    got, _, _ = method_gradients(SnAP(), cell, inputs, reset, weights, seg_len)
    assert set(got) == {"input_proj.weight", "input_proj.bias", "recurrent_proj.weight"}
    for name in got:
        assert rel_err(got[name], expected[name]) <= 1e-10, name


@pytest.mark.parametrize("method", [RTRL(), SnAP()], ids=["rtrl", "snap"])
@pytest.mark.parametrize("cls", ELEMENTWISE)
def test_batched_carry_equals_stepwise_recursion(cls, method, problem, device):
    inputs, reset, weights, d, n = problem
    inputs, reset, weights = on(device, inputs, reset, weights)
    cell = make(cls, d, n, device=device)
    _, _, fast = method_gradients(method, cell, inputs, reset, weights, 7)
    _, _, slow = method_gradients(stepwise(method), cell, inputs, reset, weights, 7)
    assert fast.sensitivities.keys() == slow.sensitivities.keys()
    for name in fast.sensitivities:
        assert rel_err(fast.sensitivities[name], slow.sensitivities[name]) <= 1e-12, name
    torch.testing.assert_close(fast.c, slow.c, rtol=0, atol=0)


def test_batched_carry_equals_stepwise_for_snap_on_felstm(problem):
    inputs, reset, weights, d, n = problem
    cell = make(FELSTMCell, d, n)
    _, _, fast = method_gradients(SnAP(), cell, inputs, reset, weights, 6)
    _, _, slow = method_gradients(stepwise(SnAP()), cell, inputs, reset, weights, 6)
    for name in fast.sensitivities:
        assert rel_err(fast.sensitivities[name], slow.sensitivities[name]) <= 1e-12, name


@pytest.mark.parametrize("cls", ELEMENTWISE)
def test_rtrl_sensitivities_are_the_true_derivatives_of_the_carried_state(cls, problem):
    """S = dc_T/dtheta, compared with autograd's Jacobian of the final state (per stream)."""
    inputs, reset, _, d, n = problem
    cell = make(cls, d, n)
    carry = RTRL().init_carry(cell, inputs.shape[1])
    for s in range(0, inputs.shape[0], 6):
        _, carry = RTRL().unroll(cell, inputs[s : s + 6], reset[s : s + 6], carry)
    final = reference_states(cell, inputs, reset)[-1]  # (B, N)
    params = dict(cell.named_parameters())
    for name, sens in carry.sensitivities.items():
        p = params[name]
        jac = torch.stack(
            [torch.autograd.grad(final[bb].sum(), p, retain_graph=True)[0] for bb in range(final.shape[0])]
        )
        # Summing over units is exact here because each parameter column n only reaches unit n.
        k = sens.shape[1]
        torch.testing.assert_close(
            sens.sum(-1) if sens.shape[-1] == 1 else sens,
            jac.reshape(sens.shape[0], k, n, -1).squeeze(-1) if sens.shape[-1] == 1 else jac.reshape(sens.shape),
            rtol=1e-10,
            atol=1e-12,
        )


@pytest.mark.parametrize("method", [RTRL(), TBPTT(), SnAP()], ids=["rtrl", "tbptt", "snap"])
def test_inputs_get_within_segment_backprop(method, problem):
    """What sits below the cell (a stem) is trained by backprop within the segment, for every method."""
    inputs, reset, weights, d, n = problem
    cell = make(ELSTMCell, d, n)
    _, x_grad, _ = method_gradients(method, cell, inputs, reset, weights, 5)
    _, x_tbptt, _ = method_gradients(TBPTT(), cell, inputs, reset, weights, 5)
    torch.testing.assert_close(x_grad, x_tbptt, rtol=1e-12, atol=1e-12)


def test_snap_n_other_than_one_is_refused():
    with pytest.raises(ValueError, match="n = 1"):
        SnAP(n=2)


@pytest.mark.parametrize("method", [RTRL(), TBPTT(), SnAP()], ids=["rtrl", "tbptt", "snap"])
def test_bad_segments_get_clear_errors(method):
    cell = ELSTMCell(3, 5)
    carry = method.init_carry(cell, 2)
    ok_x, ok_r = torch.zeros(4, 2, 3), torch.zeros(4, 2, dtype=torch.bool)
    cases = [
        ((torch.zeros(4, 2, 7), ok_r), "input_size = 3"),
        ((torch.zeros(4, 2, 3, dtype=torch.float64), ok_r), "cast"),
        ((torch.zeros(2, 3), ok_r), r"\(M, B, D\)"),
        ((ok_x, torch.zeros(4, 2)), "bool"),
        ((ok_x, torch.zeros(4, 3, dtype=torch.bool)), "reset has shape"),
        ((torch.zeros(4, 5, 3), torch.zeros(4, 5, dtype=torch.bool)), "init_carry"),
    ]
    for (x, r), match in cases:
        with pytest.raises((ValueError, TypeError), match=match):
            method.unroll(cell, x, r, carry)


def test_float32_rtrl_is_close_to_bptt(problem):
    """The default dtype works too (looser tolerance only because of float32 rounding)."""
    inputs, reset, weights, d, n = problem
    torch.manual_seed(0)
    cell = ELSTMCell(d, n)
    expected, _ = bptt_gradients(cell, inputs.float(), reset, weights.float())
    got, _, _ = method_gradients(RTRL(), cell, inputs.float(), reset, weights.float(), 5)
    for name in expected:
        assert rel_err(got[name], expected[name]) <= 1e-5, name
