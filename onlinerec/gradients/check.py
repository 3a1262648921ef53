"""Check a gradient method against the slow, obviously right references, public for users' own cells.

The references: the cell's own single-step ``forward`` unrolled one step at a time with full-sequence autograd
BPTT (:func:`bptt_gradients`), the same cut at segment starts (:func:`truncated_gradients`), and the textbook
sensitivity recursion S_t = jh_t * S_{t-1} + I_t, one step at a time (:func:`stepwise`). A :class:`~onlinerec.cells.
Stack` is run one step at a time too, every layer at step t before any layer at step t + 1.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from torch import Tensor

from onlinerec.cells.base import ElementwiseCell, call_checked
from onlinerec.cells.composite import CompositeCell
from onlinerec.cells.parallel import Parallel
from onlinerec.cells.stack import Stack
from onlinerec.gradients.base import GradientMethod
from onlinerec.gradients.rtrl import RTRL
from onlinerec.gradients.scan import Linearization
from onlinerec.gradients.sensitivity import SensitivityMethod, Tracked


def reference_states(
    cell: ElementwiseCell, inputs: Tensor, reset: Tensor, c0: Tensor | None = None, window: list[Tensor] | None = None
) -> Tensor:
    """Unroll with the cell's own single-step ``forward``, one step at a time; no onlinerec time loop involved.
    For a :class:`~onlinerec.cells.Stack`: its outputs, every layer stepped by its own ``forward``."""
    if isinstance(cell, CompositeCell):
        if c0 is not None or window is not None:
            raise ValueError(
                f"reference_states starts a {type(cell).__name__} from zero; use reference_run for a given state."
            )
        return reference_run(cell, inputs, reset)[0]
    return reference_run(cell, inputs, reset, None if c0 is None and window is None else (c0, window))[0]


def reference_run(cell: ElementwiseCell, inputs: Tensor, reset: Tensor, state: Any = None) -> tuple[Tensor, Any]:
    """:func:`reference_states` from a given state, also returning the final one: ``(c, past inputs)`` for a cell
    (``past`` newest first, not yet masked by the next step's reset), one such state per layer for a stack; None
    starts from zero (as do None entries)."""
    m, b, d = inputs.shape
    if isinstance(cell, Stack):
        layers = list(state) if state is not None else [None] * cell.num_layers
        outputs = []
        for t in range(m):
            u = inputs[t : t + 1]
            for i, layer in enumerate(cell.layers):
                v = cell.layer_input(i, u)
                states, layers[i] = reference_run(layer, v, reset[t : t + 1], layers[i])
                u = cell.layer_output(i, u, layer.readout(states, v))
            outputs.append(u[0])
        return torch.stack(outputs), layers
    if isinstance(cell, Parallel):  # every branch on its own slice (or all of it), side by side
        branches = list(state) if state is not None else [None] * cell.num_layers
        outs = []
        for i, branch in enumerate(cell.layers):
            x = cell.branch_input(i, inputs)
            states, branches[i] = reference_run(branch, x, reset, branches[i])
            outs.append(branch.readout(states, x))
        return torch.cat(outs, dim=-1), branches
    c, past = (None, None) if state is None else state
    c = torch.zeros(b, *cell.state_shape, dtype=inputs.dtype, device=inputs.device) if c is None else c
    past = (
        [torch.zeros(b, d, dtype=inputs.dtype, device=inputs.device) for _ in range(cell.window - 1)]
        if past is None
        else past
    )
    states = []
    for t in range(m):
        keep = (~reset[t]).to(inputs.dtype).reshape(b, *([1] * (c.dim() - 1)))
        past = [p * keep.reshape(b, 1) for p in past]
        c = cell(torch.cat([inputs[t], *past], dim=-1), c * keep)
        states.append(c)
        past = ([inputs[t]] + past)[: cell.window - 1]
    return torch.stack(states), (c, past)


def _detached(state: Any) -> Any:
    if isinstance(state, Tensor):
        return state.detach()
    if isinstance(state, (list, tuple)):
        return type(state)(_detached(s) for s in state)
    return state


def bptt_gradients(
    cell: ElementwiseCell, inputs: Tensor, reset: Tensor, weights: Tensor
) -> tuple[dict[str, Tensor], Tensor]:
    """Gradients (parameters, inputs) of sum(weights * states) by full-sequence autograd BPTT."""
    cell.zero_grad()
    x = inputs.detach().requires_grad_(True)
    (reference_states(cell, x, reset) * weights).sum().backward()
    return {k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None}, x.grad.clone()


def truncated_gradients(
    cell: ElementwiseCell, inputs: Tensor, reset: Tensor, weights: Tensor, seg_len: int
) -> dict[str, Tensor]:
    """Gradients of sum(weights * states) with backprop cut at every segment start (the TBPTT reference),
    using the cell's own single-step ``forward`` from a detached carried state (every layer's, for a stack)."""
    cell.zero_grad()
    state = None
    for s in range(0, inputs.shape[0], seg_len):
        x, r = inputs[s : s + seg_len], reset[s : s + seg_len]
        states, state = reference_run(cell, x, r, state)
        (states * weights[s : s + seg_len]).sum().backward()
        state = _detached(state)
    return {k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None}


def method_gradients(
    method: GradientMethod, cell: ElementwiseCell, inputs: Tensor, reset: Tensor, weights: Tensor, seg_len: int
):
    """The same loss, accumulated over consecutive segments of ``seg_len`` steps with ``method``."""
    cell.zero_grad()
    x = inputs.detach().requires_grad_(True)
    carry = method.init_carry(cell, inputs.shape[1])
    for s in range(0, inputs.shape[0], seg_len):
        states, carry = method.unroll(cell, x[s : s + seg_len], reset[s : s + seg_len], carry)
        (states * weights[s : s + seg_len]).sum().backward()
    return {k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None}, x.grad.clone(), carry


def check_gradients(
    cell: ElementwiseCell,
    method: GradientMethod | None = None,
    *,
    steps: int = 30,
    batch_size: int = 3,
    segment: int = 7,
    seed: int = 0,
) -> dict[str, float]:
    """Relative error of ``method``'s gradient (default: exact RTRL) against full BPTT, per parameter.

    Runs on a float64 copy of ``cell``, on the cell's device, over ``steps`` random steps cut into segments of
    ``segment`` steps, with resets in the middle of some streams (drawn on the CPU, so every device checks the same
    problem). For RTRL on an element-wise cell every error should be below ~1e-10.
    For a :class:`~onlinerec.cells.Stack` the gradient is exact only within a segment (``segment=steps``); across
    segments the errors measure the terms a stack drops (docs/concepts.md#stacked-layers).
    """
    method = RTRL() if method is None else method
    cell = copy.deepcopy(cell).double()
    check_contract(cell)  # a broken cell is named, with its fix, before any reference runs it
    method.check_cell(cell)
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(steps, batch_size, cell.input_size, generator=gen, dtype=torch.float64)
    reset = torch.rand(steps, batch_size, generator=gen) < 0.08
    reset[0] = True
    weights = torch.randn(steps, batch_size, *cell.state_shape, generator=gen, dtype=torch.float64)
    device = next((p.device for p in cell.parameters()), torch.device("cpu"))
    inputs, reset, weights = inputs.to(device), reset.to(device), weights.to(device)
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    got, _, _ = method_gradients(method, cell, inputs, reset, weights, segment)
    return {k: ((got[k] - v).norm() / v.norm().clamp_min(1e-300)).item() for k, v in expected.items()}


def check_contract(cell: ElementwiseCell) -> None:
    """One step of ``cell`` (every layer of a stack) on random inputs, with the errors of
    :func:`~onlinerec.cells.base.call_checked`: a forgotten ``num_gates``, an input changed in place, a new state of
    the wrong shape."""
    if isinstance(cell, CompositeCell):
        for layer in cell.layers:
            check_contract(layer)
        return
    ref = cell.input_proj.weight
    gen = torch.Generator().manual_seed(0)
    gates = torch.randn(3, cell.num_gates, cell.hidden_size, generator=gen, dtype=torch.float64)
    c_prev = torch.randn(3, *cell.state_shape, generator=gen, dtype=torch.float64)
    call_checked(cell, gates.to(ref), c_prev.to(ref))


class StepwiseCarry(SensitivityMethod):
    """Mixin before a concrete :class:`SensitivityMethod`: carry the sensitivities with the textbook recursion
    S_t = jh_t * S_{t-1} + I_t (units of K > 1 components: S_t = J_t S_{t-1} + I_t with each unit's K x K block
    J_t), one step at a time, instead of the batched propagation it is checked against."""

    def propagate(
        self, tracked: list[Tracked], lin: Linearization, feats: Tensor, sens0: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        jh, d_gates, d_params, c_prev, d_mixed = lin.release()
        sources = {"input": feats, "state": c_prev}
        derivatives = {"gates": d_gates, "mixed": d_gates if d_mixed is None else d_mixed}
        blocks = jh.dim() == 5  # (M, B, K, K, N)
        out = dict(sens0)
        for t in range(jh.shape[0]):
            for tr in tracked:
                d = derivatives[tr.via][t]
                if tr.kind == "weight":
                    x = sources[tr.source][t]
                    immediate = d.unsqueeze(-1) * x.reshape(x.shape[0], *([1] * (d.dim() - 1)), x.shape[1])
                elif tr.kind == "bias":
                    immediate = d.unsqueeze(-1)
                else:
                    immediate = d_params[tr.name][t].unsqueeze(-1)
                if blocks:  # sum_j J_t[k, j] S[j]
                    decayed = (jh[t][:, :, :, None, :, None] * out[tr.name][:, None]).sum(2)
                else:
                    decayed = jh[t][:, None, :, None] * out[tr.name]
                out[tr.name] = decayed + immediate
        return out


@functools.cache
def _stepwise_class(cls: type[SensitivityMethod]) -> type[SensitivityMethod]:
    namespace = {"__module__": __name__, "__doc__": f"{cls.__name__} with the step-by-step carry."}
    return type(f"Stepwise{cls.__name__}", (StepwiseCarry, cls), namespace)


def stepwise(method: SensitivityMethod) -> SensitivityMethod:
    """A copy of ``method`` (RTRL, SnAP, ...) whose carry runs the step-by-step recursion: the same gradients and
    sensitivities by the slow, obviously right route, for tests and benchmarks."""
    if not isinstance(method, SensitivityMethod):
        raise TypeError(
            f"stepwise() takes a method that carries sensitivities (RTRL, SnAP), got {type(method).__name__}."
        )
    twin = copy.copy(method)
    twin.__class__ = _stepwise_class(type(method))
    return twin
