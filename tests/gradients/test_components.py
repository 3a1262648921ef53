"""Units of K > 1 components and the cells of today against autograd references in float64: RTRL equals full BPTT for
every built-in cell and for K in {1, 2, 3}, the batched block carry equals the step-by-step recursion, the carried
sensitivities are the true derivatives, and SnAP-1 on LSTM / GRU equals hand-derived references."""

from __future__ import annotations

import pytest
import torch

from onlinerec import RTRL, TBPTT, ELSTMCell, FELSTMCell, NotElementwiseError, QRNNCell, SnAP, SRUCell
from onlinerec.cells import GRUCell, IndRNNCell, LRUCell, LSTMCell, MinGRUCell, MinLSTMCell
from onlinerec.gradients.check import bptt_gradients, method_gradients, reference_states, stepwise, truncated_gradients
from tests.gradients.rotation import Rotation1Cell, Rotation2Cell, Rotation3Cell, Rotation3MixesUnits
from tests.helpers import rel_err

FACTORIES = {
    "elstm": ELSTMCell,
    "qrnn": QRNNCell,
    "sru": SRUCell,
    "lru": LRUCell,
    "lru-fixed-gamma": lambda d, n: LRUCell(d, n, r_min=0.5, r_max=0.99, train_gamma=False),
    "mingru": MinGRUCell,
    "minlstm": MinLSTMCell,
    "minlstm-unnormalized": lambda d, n: MinLSTMCell(d, n, normalize=False),
    "indrnn": lambda d, n: IndRNNCell(d, n, nonlinearity="tanh"),
    "indrnn-relu-clamped": lambda d, n: IndRNNCell(d, n, recurrent_max=0.6),
    "rotation-k1": Rotation1Cell,
    "rotation-k2": Rotation2Cell,
    "rotation-k3": Rotation3Cell,
}
BLOCKS = ["lru", "rotation-k2", "rotation-k3"]  # K > 1
FULLY = {"lstm": LSTMCell, "gru": GRUCell}


def make(factory, d, n, seed=0):
    torch.manual_seed(seed)
    return factory(d, n).double()


def weights_for(cell, inputs, seed=5):
    """Loss weights with the shape of the cell's states (M, B, N) or (M, B, K, N)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*inputs.shape[:2], *cell.state_shape, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("seg_len", [1, 4, 7])
@pytest.mark.parametrize("name", FACTORIES)
def test_rtrl_equals_full_bptt_for_every_cell_and_every_k(name, seg_len, problem):
    """Several segments, resets in the middle of segments, M = 1 included: relative error <= 1e-10."""
    inputs, reset, _, d, n = problem
    cell = make(FACTORIES[name], d, n)
    weights = weights_for(cell, inputs)
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    got, _, carry = method_gradients(RTRL(), cell, inputs, reset, weights, seg_len)
    assert expected.keys() == got.keys()
    for key in expected:
        assert rel_err(got[key], expected[key]) <= 1e-10, key
    assert tuple(carry.c.shape) == (inputs.shape[1], *cell.state_shape)


@pytest.mark.parametrize("method", [RTRL(), SnAP()], ids=["rtrl", "snap"])
@pytest.mark.parametrize("name", [*BLOCKS, "mingru", "indrnn-relu-clamped"])
def test_batched_block_carry_equals_stepwise_recursion(name, method, problem):
    inputs, reset, _, d, n = problem
    cell = make(FACTORIES[name], d, n)
    weights = weights_for(cell, inputs)
    _, _, fast = method_gradients(method, cell, inputs, reset, weights, 7)
    _, _, slow = method_gradients(stepwise(method), cell, inputs, reset, weights, 7)
    assert fast.sensitivities.keys() == slow.sensitivities.keys()
    for key in fast.sensitivities:
        assert rel_err(fast.sensitivities[key], slow.sensitivities[key]) <= 1e-12, key
    torch.testing.assert_close(fast.c, slow.c, rtol=0, atol=0)


@pytest.mark.parametrize("name", BLOCKS)
def test_block_sensitivities_are_the_true_derivatives_of_the_carried_state(name, problem):
    """S[b, k, p, n, f] = dc_T[b, k, n] / dtheta[p, n, f], compared with autograd's Jacobian of the final state."""
    inputs, reset, _, d, n = problem
    cell = make(FACTORIES[name], d, n)
    k = cell.num_components
    carry = RTRL().init_carry(cell, inputs.shape[1])
    for s in range(0, inputs.shape[0], 6):
        _, carry = RTRL().unroll(cell, inputs[s : s + 6], reset[s : s + 6], carry)
    final = reference_states(cell, inputs, reset)[-1]  # (B, K, N)
    params = dict(cell.named_parameters())
    for key, sens in carry.sensitivities.items():
        assert sens.dim() == 5 and sens.shape[:2] == (inputs.shape[1], k), key
        for b in range(final.shape[0]):
            for comp in range(k):
                # summing over units is exact: column n of a parameter reaches only unit n
                jac = torch.autograd.grad(final[b, comp].sum(), params[key], retain_graph=True)[0]
                torch.testing.assert_close(sens[b, comp], jac.reshape(sens.shape[2:]), rtol=1e-10, atol=1e-12)


def test_block_layouts_and_sensitivity_bytes():
    """LRU (K = 2, G = 2, no input bias): states (M, B, 2, N); S of B_in is (B, K, G, N, D); bytes = K x parameters."""
    b, d, n = 3, 4, 6
    cell = LRUCell(d, n)
    carry = RTRL().init_carry(cell, b)
    assert carry.c.shape == (b, 2, n)
    shapes = {k: tuple(v.shape) for k, v in carry.sensitivities.items()}
    assert shapes == {
        "input_proj.weight": (b, 2, 2, n, d),
        "nu_log": (b, 2, 1, n, 1),
        "theta_log": (b, 2, 1, n, 1),
        "gamma_log": (b, 2, 1, n, 1),
    }
    tracked = 2 * n * d + 3 * n  # the recurrence's parameters: B_re, B_im, nu_log, theta_log, gamma_log
    assert sum(s.numel() for s in carry.sensitivities.values()) == b * cell.num_components * tracked
    assert carry.nbytes() == 4 * (b * 2 * n + b * 2 * tracked)
    states, carry = RTRL().unroll(cell, torch.randn(5, b, d), torch.zeros(5, b, dtype=torch.bool), carry)
    assert states.shape == (5, b, 2, n) and cell.readout(states, torch.randn(5, b, d)).shape == (5, b, d)


@pytest.mark.parametrize("name", [*BLOCKS, "mingru", "minlstm", "indrnn", *FULLY])
def test_tbptt_equals_truncated_backprop(name, problem):
    inputs, reset, _, d, n = problem
    cell = make({**FACTORIES, **FULLY}[name], d, n)
    weights = weights_for(cell, inputs)
    expected = truncated_gradients(cell, inputs, reset, weights, 4)
    got, _, carry = method_gradients(TBPTT(), cell, inputs, reset, weights, 4)
    for key in expected:
        assert rel_err(got[key], expected[key]) <= 1e-12, key
    assert not carry.sensitivities and tuple(carry.c.shape[1:]) == cell.state_shape


@pytest.mark.parametrize("name", BLOCKS)
def test_snap_equals_rtrl_on_block_cells(name, problem):
    inputs, reset, _, d, n = problem
    cell = make(FACTORIES[name], d, n)
    weights = weights_for(cell, inputs)
    rtrl, _, _ = method_gradients(RTRL(), cell, inputs, reset, weights, 5)
    snap, _, _ = method_gradients(SnAP(), cell, inputs, reset, weights, 5)
    for key in rtrl:
        assert rel_err(snap[key], rtrl[key]) <= 1e-12, key


@pytest.mark.parametrize("name", BLOCKS)
def test_inputs_get_within_segment_backprop(name, problem):
    inputs, reset, _, d, n = problem
    cell = make(FACTORIES[name], d, n)
    weights = weights_for(cell, inputs)
    _, x_rtrl, _ = method_gradients(RTRL(), cell, inputs, reset, weights, 5)
    _, x_tbptt, _ = method_gradients(TBPTT(), cell, inputs, reset, weights, 5)
    torch.testing.assert_close(x_rtrl, x_tbptt, rtol=1e-12, atol=1e-12)


def test_float32_lru_rtrl_is_close_to_bptt(problem):
    inputs, reset, _, d, n = problem
    torch.manual_seed(0)
    cell = LRUCell(d, n)
    weights = weights_for(cell, inputs).float()
    expected, _ = bptt_gradients(cell, inputs.float(), reset, weights)
    got, _, _ = method_gradients(RTRL(), cell, inputs.float(), reset, weights, 5)
    for key in expected:
        assert rel_err(got[key], expected[key]) <= 1e-5, key


# -- refusals -----------------------------------------------------------------------------------------------------
def test_rtrl_refuses_a_k3_cell_that_reads_another_unit():
    """Mixing the K components of one unit is allowed (Rotation3Cell); reading unit n' != n is refused."""
    RTRL().init_carry(Rotation3Cell(3, 5), 2)
    with pytest.raises(NotElementwiseError) as err:
        RTRL().init_carry(Rotation3MixesUnits(3, 5), 2)
    message = str(err.value)
    assert "Rotation3MixesUnits" in message and "SnAP" in message and "TBPTT" in message


@pytest.mark.parametrize("name", FULLY)
def test_rtrl_refuses_lstm_and_gru_with_its_clear_error(name):
    with pytest.raises(NotElementwiseError, match=FULLY[name].__name__ + ".*SnAPStrategy"):
        RTRL().init_carry(FULLY[name](3, 5), 2)


def test_a_carry_with_the_wrong_state_shape_is_refused():
    carry = RTRL().init_carry(ELSTMCell(3, 5), 2)  # (B, N) where LRU needs (B, 2, N)
    with pytest.raises(ValueError, match=r"state has shape \(5,\).*\(2, 5\)"):
        TBPTT().unroll(LRUCell(3, 5), torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.bool), carry)


# -- SnAP-1 on the classic LSTM and GRU -------------------------------------------------------------------------------
def _outer(v, u):
    """v (B, ..., N) times u (B, F) -> (B, ..., N, F)."""
    return v.unsqueeze(-1) * u.reshape(u.shape[0], *([1] * (v.dim() - 1)), u.shape[1])


def _snap1_reference(cell, inputs, reset, weights, seg_len, step):
    """SnAP-1 with hand-derived local derivatives, step by step: per segment the within-segment autograd gradient from
    a detached start plus lambda_0 . S_0, with S[b, (k,) g, n, .] for row (g, n) of W_ih, W_hh, b_ih, b_hh propagated by
    each unit's own (block of the) Jacobian. ``step(c_prev, x)`` returns (new state, D = dc/da, J) with D (B, [K,] G, N)
    and J (B, N) or (B, K, K, N)."""
    m, b, _ = inputs.shape
    k = cell.num_components
    lead = (b,) if k == 1 else (b, k)
    g, n = cell.num_gates, cell.hidden_size
    names = ["input_proj.weight", "recurrent_proj.weight", "input_proj.bias", "recurrent_proj.bias"]
    params = dict(cell.named_parameters())
    sens = {
        key: torch.zeros(*lead, g, n, *params[key].shape[1:], dtype=inputs.dtype) for key in names
    }  # weights (.., G, N, F), biases (.., G, N)
    c = torch.zeros(*lead, n, dtype=inputs.dtype)
    grads = {key: torch.zeros_like(p) for key, p in params.items()}
    for s in range(0, m, seg_len):
        cell.zero_grad()
        c0 = c.clone().requires_grad_(True)
        states = reference_states(cell, inputs[s : s + seg_len], reset[s : s + seg_len], c0=c0)
        (states * weights[s : s + seg_len]).sum().backward()
        lam = c0.grad  # (B, [K,] N)
        for key, p in params.items():
            if p.grad is not None:
                grads[key] += p.grad
        for key in names:
            lam_b = lam.unsqueeze(-2)  # against the gate axis
            if sens[key].dim() == len(lead) + 3:  # a weight: (.., G, N, F)
                contrib = (lam_b.unsqueeze(-1) * sens[key]).sum(tuple(range(len(lead))))
            else:
                contrib = (lam_b * sens[key]).sum(tuple(range(len(lead))))
            grads[key] += contrib.reshape(params[key].shape)
        with torch.no_grad():
            for t in range(s, min(s + seg_len, m)):
                keep = (~reset[t]).to(inputs.dtype).reshape(b, *([1] * len(c.shape[1:])))
                cp = c * keep
                h_prev = cp if k == 1 else cp[:, -1]
                c, d_a, jac = step(cp, inputs[t])
                jac = jac * keep.reshape(b, *([1] * (jac.dim() - 1)))
                immediate = {
                    "input_proj.weight": _outer(d_a, inputs[t]),
                    "recurrent_proj.weight": _outer(d_a, h_prev),
                    "input_proj.bias": d_a,
                    "recurrent_proj.bias": d_a,
                }
                for key in names:
                    old = sens[key]
                    if k == 1:
                        decayed = jac.reshape(b, 1, n, *([1] * (old.dim() - 3))) * old
                    else:  # sum_j J[k, j] S[j]
                        jb = jac.reshape(b, k, k, 1, n, *([1] * (old.dim() - 4)))
                        decayed = (jb * old.unsqueeze(1)).sum(2)
                    sens[key] = decayed + immediate[key]
    return grads


def _lstm_step(cell):
    w, bias = cell.input_proj.weight.detach(), cell.input_proj.bias.detach()
    u, u_bias = cell.recurrent_proj.weight.detach(), cell.recurrent_proj.bias.detach()
    n = cell.hidden_size
    u_diag = u.view(4, n, n).diagonal(dim1=-2, dim2=-1)  # (4, N): U_x[n, n]

    def step(state, x):
        c_prev, h_prev = state[:, 0], state[:, 1]
        a = (x @ w.T + bias + h_prev @ u.T + u_bias).view(-1, 4, n)
        i, f, g, o = torch.sigmoid(a[:, 0]), torch.sigmoid(a[:, 1]), torch.tanh(a[:, 2]), torch.sigmoid(a[:, 3])
        c = f * c_prev + i * g
        tc = torch.tanh(c)
        dc = torch.stack([g * i * (1 - i), c_prev * f * (1 - f), i * (1 - g**2), torch.zeros_like(c)], 1)
        dh = o[:, None] * (1 - tc[:, None] ** 2) * dc
        dh[:, 3] = tc * o * (1 - o)
        jac = torch.stack(
            [
                torch.stack([f, (dc * u_diag).sum(1)], 1),  # dc/dc_prev, dc/dh_prev (through U's diagonal)
                torch.stack([o * (1 - tc**2) * f, (dh * u_diag).sum(1)], 1),
            ],
            1,
        )  # (B, 2, 2, N)
        return torch.stack([c, o * tc], 1), torch.stack([dc, dh], 1), jac

    return step


@pytest.mark.parametrize("seg_len", [1, 4])
def test_snap_on_lstm_matches_hand_derived_reference(seg_len, problem):
    inputs, reset, _, d, n = problem
    cell = make(LSTMCell, d, n)
    weights = weights_for(cell, inputs)
    expected = _snap1_reference(cell, inputs, reset, weights, seg_len, _lstm_step(cell))
    got, _, _ = method_gradients(SnAP(), cell, inputs, reset, weights, seg_len)
    assert set(got) == set(expected)
    for key in got:
        assert rel_err(got[key], expected[key]) <= 1e-10, key


def _gru_snap1_reference(cell, inputs, reset, weights, seg_len):
    """SnAP-1 for the GRU with hand-derived formulas: input weights and biases use dh/d(input gates), recurrent ones
    dh/d(U h + b_h), which differ for the candidate (r multiplies its recurrent part)."""
    m, b, _ = inputs.shape
    n = cell.hidden_size
    w, bias = cell.input_proj.weight.detach(), cell.input_proj.bias.detach()
    u, u_bias = cell.recurrent_proj.weight.detach(), cell.recurrent_proj.bias.detach()
    u_diag = u.view(3, n, n).diagonal(dim1=-2, dim2=-1)
    params = dict(cell.named_parameters())
    zeros = lambda *s: torch.zeros(b, 3, n, *s, dtype=inputs.dtype)  # noqa: E731
    sens = {
        "input_proj.weight": zeros(inputs.shape[-1]),
        "recurrent_proj.weight": zeros(n),
        "input_proj.bias": zeros(),
        "recurrent_proj.bias": zeros(),
    }
    h = torch.zeros(b, n, dtype=inputs.dtype)
    grads = {key: torch.zeros_like(p) for key, p in params.items()}
    for s in range(0, m, seg_len):
        cell.zero_grad()
        h0 = h.clone().requires_grad_(True)
        states = reference_states(cell, inputs[s : s + seg_len], reset[s : s + seg_len], c0=h0)
        (states * weights[s : s + seg_len]).sum().backward()
        lam = h0.grad
        for key, p in params.items():
            grads[key] += p.grad
        for key, sv in sens.items():
            contrib = (lam[:, None, :, None] * sv).sum(0) if sv.dim() == 4 else (lam[:, None, :] * sv).sum(0)
            grads[key] += contrib.reshape(params[key].shape)
        with torch.no_grad():
            for t in range(s, min(s + seg_len, m)):
                keep = (~reset[t]).to(inputs.dtype).unsqueeze(-1)
                hp = h * keep
                ax = (inputs[t] @ w.T + bias).view(b, 3, n)
                ah = (hp @ u.T + u_bias).view(b, 3, n)
                r, z = torch.sigmoid(ax[:, 0] + ah[:, 0]), torch.sigmoid(ax[:, 1] + ah[:, 1])
                cand = torch.tanh(ax[:, 2] + r * ah[:, 2])
                dr = (1 - z) * (1 - cand**2) * ah[:, 2] * r * (1 - r)
                dz = (hp - cand) * z * (1 - z)
                dn = (1 - z) * (1 - cand**2)
                d_in = torch.stack([dr, dz, dn], 1)  # dh / d(input gates)
                d_rec = torch.stack([dr, dz, dn * r], 1)  # dh / d(U h + b_h)
                jac = (z + (d_rec * u_diag).sum(1)) * keep
                immediate = {
                    "input_proj.weight": d_in.unsqueeze(-1) * inputs[t][:, None, None, :],
                    "recurrent_proj.weight": d_rec.unsqueeze(-1) * hp[:, None, None, :],
                    "input_proj.bias": d_in,
                    "recurrent_proj.bias": d_rec,
                }
                for key, sv in sens.items():
                    decay = jac[:, None, :, None] if sv.dim() == 4 else jac[:, None, :]
                    sens[key] = decay * sv + immediate[key]
                h = (1 - z) * cand + z * hp
    return grads


@pytest.mark.parametrize("seg_len", [1, 4])
def test_snap_on_gru_matches_hand_derived_reference(seg_len, problem):
    inputs, reset, weights, d, n = problem
    cell = make(GRUCell, d, n)
    expected = _gru_snap1_reference(cell, inputs, reset, weights, seg_len)
    got, _, _ = method_gradients(SnAP(), cell, inputs, reset, weights, seg_len)
    assert set(got) == set(expected)
    for key in got:
        assert rel_err(got[key], expected[key]) <= 1e-10, key


@pytest.mark.parametrize("name", [*FULLY, "felstm"])
def test_snap_on_fully_recurrent_cells_is_bptt_on_one_step_sequences_and_within_one_segment(name, problem):
    inputs, reset, _, d, n = problem
    cell = make({**FULLY, "felstm": FELSTMCell}[name], d, n)
    weights = weights_for(cell, inputs)
    every = torch.ones_like(reset)  # every step starts a new one-step sequence
    expected, _ = bptt_gradients(cell, inputs, every, weights)
    got, _, _ = method_gradients(SnAP(), cell, inputs, every, weights, 1)
    for key in expected:
        assert rel_err(got[key], expected[key]) <= 1e-10, key
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    got, _, _ = method_gradients(SnAP(), cell, inputs, reset, weights, inputs.shape[0])  # one segment: exact
    for key in expected:
        assert rel_err(got[key], expected[key]) <= 1e-10, key
    got, _, _ = method_gradients(SnAP(), cell, inputs, reset, weights, 1)  # across segments: an approximation
    assert rel_err(got["recurrent_proj.weight"], expected["recurrent_proj.weight"]) > 1e-3
