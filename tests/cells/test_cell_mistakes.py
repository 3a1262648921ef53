"""Mistakes in a custom cell produce errors that name the cell and the fix.

Unchecked, a forgotten ``num_gates`` gives ``IndexError: index 1 is out of bounds``, a 0-d per-unit parameter
``IndexError: tuple index out of range`` from the probe, a wrong output shape in ``check_gradients`` a raw size
mismatch (or a time loop that broadcasts the state into ever larger tensors until memory runs out), an in-place op on
``c_prev`` a raw autograd error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from onlinerec import RTRL, TBPTT, ElementwiseCell, NotElementwiseError, check_gradients


class ForgotNumGates(ElementwiseCell):
    """Reads two gates but keeps ElementwiseCell's num_gates = 1."""

    def recurrence(self, gates, c_prev):
        return torch.sigmoid(gates[..., 1, :]) * c_prev + torch.tanh(gates[..., 0, :])


class ScalarParameter(ElementwiseCell):
    def __init__(self, input_size, hidden_size):
        super().__init__(input_size, hidden_size)
        self.decay = nn.Parameter(torch.tensor(0.5))  # 0-d: one number for all units

    def recurrence(self, gates, c_prev):
        return self.decay * c_prev + torch.tanh(gates[..., 0, :])


class WrongShape(ElementwiseCell):
    """Returns one unit too few."""

    def recurrence(self, gates, c_prev):
        return (0.5 * c_prev + gates[..., 0, :])[..., :-1]


class ExtraAxis(ElementwiseCell):
    """Returns (B, 1, N) for c_prev (B, N): a time loop would broadcast the state into ever larger tensors."""

    def recurrence(self, gates, c_prev):
        return (0.5 * c_prev + gates[..., 0, :]).unsqueeze(-2)


class InPlace(ElementwiseCell):
    def recurrence(self, gates, c_prev):
        c_prev.mul_(0.5)
        return c_prev + torch.tanh(gates[..., 0, :])


NUM_GATES = (
    "ForgotNumGates.recurrence reads more gates than the cell declares: it fails on gates of shape (..., 1, N) "
    "(index 1 is out of bounds for dimension 1 with size 1) but runs on (..., 2, N). Set the class attribute "
    "`num_gates = 2` on ForgotNumGates (it is 1 now, ElementwiseCell's default is 1): the input projection then makes 2 "
    "gate pre-activations per unit, gates[..., 0, :] to gates[..., 1, :]."
)
SCALAR = (
    "ScalarParameter.recurrence reads the parameter 'decay' of shape () (one number shared by all units). A parameter "
    "that the recurrence reads must be per unit, of shape (N,) or (P, N) with N = hidden_size = 5, because RTRL carries "
    "its sensitivity per unit: give every unit its own copy, nn.Parameter(torch.full((5,), value)); keep a number that "
    "is not trained as a Python float or a buffer (register_buffer); or train this cell with TBPTTStrategy."
)
IN_PLACE = (
    "InPlace.recurrence modifies its argument c_prev in place (e.g. c_prev.mul_(f), c_prev += x or c_prev[...] = x). "
    "The gradient methods use its inputs again after the call and differentiate through them, so a recurrence must "
    "leave them unchanged: compute a new tensor instead (c = c_prev * f, c = c_prev + x, torch.where(...))."
)


def wrong_shape(cls: str, shape: tuple[int, ...]) -> str:
    return (
        f"{cls}.recurrence returned {shape} for c_prev of shape (3, 5) (gates (3, 1, 5)): it must return the new state, "
        "with c_prev's shape (..., N) and N = hidden_size = 5. Pick the gates you need (gates[..., g, :]) and combine "
        "them element-wise with c_prev; if each unit holds several numbers, set num_components = K and return "
        "(..., K, N)."
    )


def test_a_forgotten_num_gates_is_named_with_the_value_to_set():
    with pytest.raises(IndexError) as err:
        RTRL().init_carry(ForgotNumGates(3, 5), 2)
    assert str(err.value) == NUM_GATES
    with pytest.raises(IndexError) as err:  # check_gradients, before any reference runs
        check_gradients(ForgotNumGates(3, 5))
    assert str(err.value) == NUM_GATES


def test_a_forgotten_num_gates_is_named_under_tbptt_too():
    """TBPTT never probes the cell: the recurrence itself explains the failure."""
    cell = ForgotNumGates(3, 5)
    with pytest.raises(IndexError) as err:
        TBPTT().unroll(cell, torch.randn(4, 2, 3), torch.zeros(4, 2, dtype=torch.bool), TBPTT().init_carry(cell, 2))
    assert str(err.value) == NUM_GATES


def test_a_0d_parameter_is_named_with_the_per_unit_shape_to_use():
    with pytest.raises(NotElementwiseError) as err:
        RTRL().init_carry(ScalarParameter(3, 5), 2)
    assert str(err.value) == SCALAR


@pytest.mark.parametrize(("cls", "shape"), [(WrongShape, (3, 4)), (ExtraAxis, (3, 1, 5))])
def test_a_wrong_output_shape_is_named_in_check_gradients(cls, shape):
    with pytest.raises(ValueError) as err:
        check_gradients(cls(3, 5))
    assert str(err.value) == wrong_shape(cls.__name__, shape)


def test_a_wrong_output_shape_stops_a_tbptt_time_loop_at_its_first_step():
    cell = ExtraAxis(3, 5)
    with pytest.raises(ValueError, match=r"ExtraAxis.recurrence returned \(2, 1, 5\) for c_prev of shape \(2, 5\)"):
        TBPTT().unroll(cell, torch.randn(30, 2, 3), torch.zeros(30, 2, dtype=torch.bool), TBPTT().init_carry(cell, 2))


def test_an_in_place_change_of_c_prev_is_named():
    with pytest.raises(ValueError) as err:
        check_gradients(InPlace(3, 5))
    assert str(err.value) == IN_PLACE
    with pytest.raises(ValueError) as err:
        RTRL().init_carry(InPlace(3, 5), 2)
    assert str(err.value) == IN_PLACE


def test_an_in_place_change_under_autograd_is_named():
    """Where autograd catches it first (a leaf that requires grad), the error still names the cell and the fix."""
    cell = InPlace(3, 5)
    c_prev = torch.randn(2, 5, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^InPlace.recurrence modifies its argument c_prev or gates in place"):
        cell.recurrence(torch.randn(2, 1, 5), c_prev)


def test_layer_kwargs_without_a_list_of_cells_is_named():
    from onlinerec.cells import make_cell

    with pytest.raises(ValueError, match="goes with a list of cells"):
        make_cell("lru", 4, 4, layer_kwargs=[{}])
    with pytest.raises(ValueError, match="at least one cell"):
        make_cell([], 4, 4)
