"""Cells: their local derivatives, and the element-wise contract that lets RTRL train them (or refuse them)."""

from __future__ import annotations

import pytest
import torch

from onlinerec import RTRL, TBPTT, ElementwiseCell, ELSTMCell, FELSTMCell, NotElementwiseError, SnAP, check_gradients
from onlinerec.gradients.check import bptt_gradients, method_gradients
from onlinerec.gradients.derivatives import local_derivatives
from tests.helpers import rel_err


def make(cls, d, n, seed=0):
    torch.manual_seed(seed)
    return cls(d, n).double()


def test_elstm_local_derivatives_match_hand_derived_formulas():
    """j = f + w_z*zhat + w_f*fhat (the full form derived in docs/rtrl.md, not the paper's eq. 8 typo)."""
    cell = make(ELSTMCell, 3, 6)
    gen = torch.Generator().manual_seed(3)
    gates = torch.randn(4, 2, 6, generator=gen, dtype=torch.float64)
    c_prev = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    local = local_derivatives(cell, "recurrence", {"recurrent_weight": cell.recurrent_weight}, gates, c_prev)
    wz, wf = cell.recurrent_weight.detach()
    z = torch.tanh(gates[:, 0] + wz * c_prev)
    f = torch.sigmoid(gates[:, 1] + wf * c_prev)
    zhat, fhat = (1 - f) * (1 - z**2), (c_prev - z) * f * (1 - f)
    torch.testing.assert_close(local.d_state, f + wz * zhat + wf * fhat)
    torch.testing.assert_close(local.d_gates, torch.stack([zhat, fhat], 1))
    torch.testing.assert_close(local.d_params["recurrent_weight"], torch.stack([zhat * c_prev, fhat * c_prev], 1))


def test_user_cell_written_in_a_test_gets_exact_rtrl():
    """A new architecture: only the forward recurrence is written, never a derivative."""

    class LeakyGRUish(ElementwiseCell):
        num_gates = 3

        def __init__(self, input_size, hidden_size):
            super().__init__(input_size, hidden_size)
            self.leak = torch.nn.Parameter(torch.rand(hidden_size))
            self.mix = torch.nn.Parameter(torch.randn(3, hidden_size) * 0.3)

        def recurrence(self, gates, c_prev):
            u = torch.sigmoid(gates[..., 0, :] + self.mix[0] * c_prev)
            r = torch.sigmoid(gates[..., 1, :] + self.mix[1] * c_prev)
            cand = torch.tanh(gates[..., 2, :] + r * self.mix[2] * c_prev)
            return self.leak.sigmoid() * (u * c_prev + (1 - u) * cand)

    gen = torch.Generator().manual_seed(7)
    t, b, d, n = 19, 3, 4, 6
    inputs = torch.randn(t, b, d, generator=gen, dtype=torch.float64)
    reset = torch.zeros(t, b, dtype=torch.bool)
    reset[0], reset[8, 2] = True, True
    weights = torch.randn(t, b, n, generator=gen, dtype=torch.float64)
    cell = make(LeakyGRUish, d, n)
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    got, _, _ = method_gradients(RTRL(), cell, inputs, reset, weights, 5)
    assert set(got) == {"input_proj.weight", "input_proj.bias", "leak", "mix"}
    for name in expected:
        assert rel_err(got[name], expected[name]) <= 1e-10, name


class _MixesUnits(ELSTMCell):
    def recurrence(self, gates, c_prev):
        return super().recurrence(gates, c_prev.roll(1, dims=-1))


class _MixesBatch(ELSTMCell):
    def recurrence(self, gates, c_prev):
        return super().recurrence(gates, c_prev - c_prev.mean(0, keepdim=True))


class _MatrixParameter(ELSTMCell):
    def __init__(self, input_size, hidden_size):
        super().__init__(input_size, hidden_size)
        self.square = torch.nn.Parameter(torch.zeros(hidden_size, hidden_size))

    def recurrence(self, gates, c_prev):
        return super().recurrence(gates, c_prev) + c_prev @ self.square


class _WrongShapeParameter(ELSTMCell):
    def __init__(self, input_size, hidden_size):
        super().__init__(input_size, hidden_size)
        self.scalar = torch.nn.Parameter(torch.ones(1))

    def recurrence(self, gates, c_prev):
        return super().recurrence(gates, c_prev) * self.scalar


@pytest.mark.parametrize("cls", [FELSTMCell, _MixesUnits, _MixesBatch, _MatrixParameter, _WrongShapeParameter])
def test_rtrl_refuses_cells_that_mix_units(cls):
    cell = cls(3, 5)
    with pytest.raises(NotElementwiseError) as err:
        RTRL().init_carry(cell, 2)
    message = str(err.value)
    assert cls.__name__ in message and "SnAP" in message and "TBPTT" in message
    with pytest.raises(NotElementwiseError):  # and at unroll, for a carry made elsewhere
        RTRL().unroll(cell, torch.zeros(2, 2, 3), torch.zeros(2, 2, dtype=torch.bool), TBPTT().init_carry(cell, 2))


def test_snap_refuses_mixing_cells_that_are_not_fully_recurrent():
    with pytest.raises(NotElementwiseError, match="_MixesUnits"):
        SnAP().init_carry(_MixesUnits(3, 5), 2)


# -- LRU, minGRU, minLSTM, IndRNN, LSTM, GRU ----------------------------------------------------------------------------
def test_every_builtin_cell_has_a_name():
    from onlinerec.cells import CELLS, GRUCell, IndRNNCell, LRUCell, LSTMCell, MinGRUCell, MinLSTMCell, make_cell

    expected = {"lru": LRUCell, "mingru": MinGRUCell, "minlstm": MinLSTMCell, "indrnn": IndRNNCell}
    expected |= {"lstm": LSTMCell, "gru": GRUCell}
    for name, cls in expected.items():
        assert CELLS[name] is cls and type(make_cell(name, 3, 4)) is cls


@pytest.mark.parametrize("name", ["elstm", "qrnn", "sru", "lru", "mingru", "minlstm", "indrnn"])
def test_check_gradients_passes_for_every_elementwise_builtin_cell(name, device):
    """RTRL against full BPTT in float64 (check_gradients runs on the cell's device)."""
    from onlinerec.cells import make_cell

    errors = check_gradients(make_cell(name, 3, 5).to(device))
    assert max(errors.values()) < 1e-10, errors


@pytest.mark.parametrize("name", ["lstm", "gru", "felstm"])
def test_check_gradients_of_fully_recurrent_cells_within_one_segment(name, device):
    """RTRL refuses them; SnAP-1 and TBPTT are exact backprop within a segment."""
    from onlinerec.cells import make_cell

    cell = make_cell(name, 3, 5).to(device)
    for method in (SnAP(), TBPTT()):
        errors = check_gradients(cell, method, steps=20, segment=20)
        assert max(errors.values()) < 1e-10, (method, errors)


def _copy_torch_weights(ours, theirs):
    with torch.no_grad():
        ours.input_proj.weight.copy_(theirs.weight_ih)
        ours.input_proj.bias.copy_(theirs.bias_ih)
        ours.recurrent_proj.weight.copy_(theirs.weight_hh)
        ours.recurrent_proj.bias.copy_(theirs.bias_hh)


def test_lstm_step_equals_torch_lstm_cell():
    from onlinerec.cells import LSTMCell

    torch.manual_seed(0)
    theirs, ours = torch.nn.LSTMCell(3, 6).double(), LSTMCell(3, 6).double()
    _copy_torch_weights(ours, theirs)
    x, h, c = torch.randn(4, 3).double(), torch.randn(4, 6).double(), torch.randn(4, 6).double()
    h_new, c_new = theirs(x, (h, c))
    state = ours(x, torch.stack([c, h], 1))  # (B, K = 2, N): (c, h)
    torch.testing.assert_close(state[:, 0], c_new, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(state[:, 1], h_new, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(ours.readout(state, x), h_new, rtol=0, atol=0)
    assert ours.num_components == 2 and ours.output_size == 6


def test_gru_step_equals_torch_gru_cell():
    from onlinerec.cells import GRUCell

    torch.manual_seed(0)
    theirs, ours = torch.nn.GRUCell(3, 6).double(), GRUCell(3, 6).double()
    _copy_torch_weights(ours, theirs)
    x, h = torch.randn(4, 3).double(), torch.randn(4, 6).double()
    torch.testing.assert_close(ours(x, h), theirs(x, h), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("cls_name", ["LSTMCell", "GRUCell"])
def test_lstm_and_gru_start_like_pytorch(cls_name):
    """Same tensors and shapes as torch.nn.LSTMCell / GRUCell, each uniform in [-1/sqrt(N), 1/sqrt(N)]."""
    import onlinerec.cells as cells

    n, d = 64, 40
    ours, theirs = getattr(cells, cls_name)(d, n), getattr(torch.nn, cls_name)(d, n)
    pairs = [
        (ours.input_proj.weight, theirs.weight_ih),
        (ours.recurrent_proj.weight, theirs.weight_hh),
        (ours.input_proj.bias, theirs.bias_ih),
        (ours.recurrent_proj.bias, theirs.bias_hh),
    ]
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    bound = n**-0.5
    for a, b in pairs:
        assert a.shape == b.shape
        assert a.abs().max() <= bound and a.std().item() == pytest.approx(bound / 3**0.5, rel=0.15)
    shifted = getattr(cells, cls_name)(
        d, n, **({"forget_bias": 1.0} if cls_name == "LSTMCell" else {"update_bias": 1.0})
    )
    assert shifted.input_proj.bias[n : 2 * n].min() >= 1 - bound  # the forget / update gate's bias, gate 1


def test_lru_is_the_complex_recurrence_of_the_paper():
    from onlinerec.cells import LRUCell

    torch.manual_seed(0)
    d, n = 3, 5
    cell = LRUCell(d, n).double()
    x = torch.randn(4, d, dtype=torch.float64)
    h = torch.randn(4, 2, n, dtype=torch.float64)
    lam = torch.exp(-torch.exp(cell.nu_log) + 1j * torch.exp(cell.theta_log))
    b_in = torch.complex(*cell.input_proj.weight.view(2, n, d))
    hc = torch.complex(h[:, 0], h[:, 1])
    expected = lam * hc + torch.exp(cell.gamma_log) * (x.to(b_in.dtype) @ b_in.T)
    new = cell(x, h)
    torch.testing.assert_close(torch.complex(new[:, 0], new[:, 1]), expected, rtol=1e-13, atol=1e-13)
    c_mat = torch.complex(cell.output_re, cell.output_im)
    y = (torch.complex(new[:, 0], new[:, 1]) @ c_mat.T).real + cell.skip * x
    torch.testing.assert_close(cell.readout(new, x), y, rtol=1e-13, atol=1e-13)
    assert cell.output_size == d and cell.input_proj.bias is None


def test_lru_ring_initialisation_and_normalisation():
    from onlinerec.cells import LRUCell

    torch.manual_seed(0)
    cell = LRUCell(4, 2000, r_min=0.9, r_max=0.99, max_phase=0.5)
    modulus = torch.exp(-torch.exp(cell.nu_log.detach()))
    phase = torch.exp(cell.theta_log.detach())
    assert modulus.min() >= 0.9 - 1e-6 and modulus.max() <= 0.99 + 1e-6 and modulus.max() > 0.985
    assert phase.min() >= 0 and phase.max() <= 0.5 and phase.max() > 0.49
    torch.testing.assert_close(torch.exp(cell.gamma_log.detach()), (1 - modulus**2).sqrt(), rtol=1e-5, atol=1e-6)
    # uniform in area on the ring: |lambda|^2 is uniform in [r_min^2, r_max^2]
    assert (modulus**2).mean().item() == pytest.approx((0.9**2 + 0.99**2) / 2, abs=0.005)
    fixed = LRUCell(4, 8, train_gamma=False)
    assert "gamma_log" not in dict(fixed.named_parameters())
    with pytest.raises(ValueError, match="r_min"):
        LRUCell(4, 8, r_min=0.9, r_max=0.5)


def test_lru_slow_units_come_from_a_second_ring():
    from onlinerec.cells import LRUCell

    torch.manual_seed(0)
    cell = LRUCell(4, 2000, slow_fraction=0.25)
    modulus = torch.exp(-torch.exp(cell.nu_log.detach()))
    phase = torch.exp(cell.theta_log.detach())
    fast, slow = slice(0, 1500), slice(1500, 2000)  # the last round(0.25 * N) units are slow
    assert modulus[slow].min() >= 0.95 - 1e-6 and phase[slow].max() <= 0.314
    assert modulus[fast].min() < 0.2 and phase[fast].max() > 6.0  # the default ring, as before
    torch.testing.assert_close(torch.exp(cell.gamma_log.detach()), (1 - modulus**2).sqrt(), rtol=1e-4, atol=1e-5)
    torch.manual_seed(0)
    plain = LRUCell(4, 16)
    torch.manual_seed(0)
    same = LRUCell(4, 16, slow_fraction=0.0)  # no slow units: the paper's single ring, value for value
    assert torch.equal(plain.nu_log, same.nu_log) and torch.equal(plain.theta_log, same.theta_log)
    for bad in (
        {"slow_fraction": 1.5},
        {"slow_fraction": 0.5, "slow_r_min": 1.0},
        {"slow_fraction": 0.5, "slow_max_phase": 0},
    ):
        with pytest.raises(ValueError, match="slow_fraction"):
            LRUCell(4, 8, **bad)


def test_min_gru_and_min_lstm_follow_the_paper():
    from onlinerec.cells import MinGRUCell, MinLSTMCell

    torch.manual_seed(0)
    gates, h = torch.randn(4, 3, 5), torch.randn(4, 5)
    gru = MinGRUCell(2, 5)
    z = torch.sigmoid(gates[:, 0])
    torch.testing.assert_close(gru.recurrence(gates[:, :2], h), (1 - z) * h + z * gates[:, 1])
    lstm = MinLSTMCell(2, 5)
    f, i = torch.sigmoid(gates[:, 0]), torch.sigmoid(gates[:, 1])
    expected = f / (f + i) * h + i / (f + i) * gates[:, 2]
    torch.testing.assert_close(lstm.recurrence(gates, h), expected)
    raw = MinLSTMCell(2, 5, normalize=False)
    torch.testing.assert_close(raw.recurrence(gates, h), f * h + i * gates[:, 2])
    torch.manual_seed(1)
    plain = MinGRUCell(2, 5).input_proj.bias[:5].clone()
    torch.manual_seed(1)
    torch.testing.assert_close(MinGRUCell(2, 5, update_bias=-3.0).input_proj.bias[:5], plain - 3.0)


def test_indrnn_recurrence_and_its_straight_through_clamp():
    from onlinerec.cells import IndRNNCell

    torch.manual_seed(0)
    cell = IndRNNCell(2, 4, recurrent_max=0.5)
    assert cell.recurrent_weight.abs().max() <= 0.5
    with torch.no_grad():
        cell.recurrent_weight.copy_(torch.tensor([0.2, -0.9, 0.7, 0.4]))
    gates, h = torch.randn(3, 1, 4), torch.rand(3, 4)
    u_eff = torch.tensor([0.2, -0.5, 0.5, 0.4])
    out = cell.recurrence(gates, h)
    torch.testing.assert_close(out, torch.relu(gates[:, 0] + u_eff * h))
    out.sum().backward()
    torch.testing.assert_close(cell.recurrent_weight.grad, ((gates[:, 0] + u_eff * h > 0) * h).sum(0))
    with pytest.raises(ValueError, match="nonlinearity"):
        IndRNNCell(2, 4, nonlinearity="sigmoid")


def test_default_readout_of_a_multi_component_cell_puts_the_components_side_by_side():
    from tests.gradients.rotation import Rotation3Cell

    cell = Rotation3Cell(2, 4)
    assert cell.state_shape == (3, 4) and cell.output_size == 12
    c = torch.randn(5, 3, 4)
    torch.testing.assert_close(cell.readout(c, torch.zeros(5, 2)), torch.cat([c[:, 0], c[:, 1], c[:, 2]], -1))


def test_a_layer_of_a_list_of_cells_can_have_its_own_width():
    from onlinerec.cells import make_cell

    stack = make_cell(["lru", "mingru"], 5, 4, residual=True, layer_kwargs=[{}, {"hidden_size": 5}])
    assert [layer.hidden_size for layer in stack.layers] == [4, 5] and stack.residual_layers == (0, 1)
    assert make_cell(["lru", "mingru"], 5, 4, residual=True).residual_layers == (0,)
