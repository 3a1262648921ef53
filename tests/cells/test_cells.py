"""Cells: their local derivatives, and the element-wise contract that lets RTRL train them (or refuse them)."""

from __future__ import annotations

import pytest
import torch

from onlinerec import RTRL, TBPTT, ElementwiseCell, ELSTMCell, FELSTMCell, NotElementwiseError, SnAP
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
