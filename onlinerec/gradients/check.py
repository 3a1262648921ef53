"""Check a gradient method against the slow, obviously right references, public for users' own cells.

The references: the cell's own single-step ``forward`` unrolled one step at a time with full-sequence autograd
BPTT (:func:`bptt_gradients`), the same cut at segment starts (:func:`truncated_gradients`), and the textbook
sensitivity recursion S_t = jh_t * S_{t-1} + I_t, one step at a time (:func:`stepwise`).
"""

from __future__ import annotations

import copy
import functools

import torch
from torch import Tensor

from onlinerec.cells.base import ElementwiseCell
from onlinerec.gradients.base import GradientMethod
from onlinerec.gradients.rtrl import RTRL
from onlinerec.gradients.scan import Linearization
from onlinerec.gradients.sensitivity import SensitivityMethod, Tracked


def reference_states(
    cell: ElementwiseCell, inputs: Tensor, reset: Tensor, c0: Tensor | None = None, window: list[Tensor] | None = None
) -> Tensor:
    """Unroll with the cell's own single-step ``forward``, one step at a time; no onlinerec time loop involved."""
    m, b, d = inputs.shape
    c = torch.zeros(b, cell.hidden_size, dtype=inputs.dtype) if c0 is None else c0
    past = [torch.zeros(b, d, dtype=inputs.dtype) for _ in range(cell.window - 1)] if window is None else window
    states = []
    for t in range(m):
        keep = (~reset[t]).to(inputs.dtype).unsqueeze(-1)
        past = [p * keep for p in past]
        c = cell(torch.cat([inputs[t], *past], dim=-1), c * keep)
        states.append(c)
        past = ([inputs[t]] + past)[: cell.window - 1]
    return torch.stack(states)


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
    using the cell's own single-step ``forward`` from a detached carried state."""
    cell.zero_grad()
    c, past = None, None
    for s in range(0, inputs.shape[0], seg_len):
        x, r = inputs[s : s + seg_len], reset[s : s + seg_len]
        states = reference_states(cell, x, r, c0=c, window=past)
        (states * weights[s : s + seg_len]).sum().backward()
        c = states[-1].detach()
        if cell.window > 1:  # the last window-1 inputs, zeroed across resets, newest first
            past = []
            for t in range(s + x.shape[0]):
                keep = (~reset[t]).to(inputs.dtype).unsqueeze(-1)
                past = ([inputs[t]] + [p * keep for p in past])[: cell.window - 1]
            past += [torch.zeros_like(inputs[0])] * (cell.window - 1 - len(past))
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

    Runs on a float64 copy of ``cell`` over ``steps`` random steps cut into segments of ``segment`` steps, with
    resets in the middle of some streams. For RTRL on an element-wise cell every error should be below ~1e-10.
    """
    method = RTRL() if method is None else method
    cell = copy.deepcopy(cell).double()
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(steps, batch_size, cell.input_size, generator=gen, dtype=torch.float64)
    reset = torch.rand(steps, batch_size, generator=gen) < 0.08
    reset[0] = True
    weights = torch.randn(steps, batch_size, cell.hidden_size, generator=gen, dtype=torch.float64)
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    got, _, _ = method_gradients(method, cell, inputs, reset, weights, segment)
    return {k: ((got[k] - v).norm() / v.norm().clamp_min(1e-300)).item() for k, v in expected.items()}


class StepwiseCarry(SensitivityMethod):
    """Mixin before a concrete :class:`SensitivityMethod`: carry the sensitivities with the textbook recursion
    S_t = jh_t * S_{t-1} + I_t, one step at a time, instead of the batched propagation it is checked against."""

    def propagate(
        self, tracked: list[Tracked], lin: Linearization, feats: Tensor, sens0: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        jh, d_gates, d_params, c_prev = lin.release()
        sources = {"input": feats, "state": c_prev}
        out = dict(sens0)
        for t in range(jh.shape[0]):
            decay = jh[t][:, None, :, None]
            for tr in tracked:
                if tr.kind == "weight":
                    immediate = d_gates[t].unsqueeze(-1) * sources[tr.source][t][:, None, None, :]
                elif tr.kind == "bias":
                    immediate = d_gates[t].unsqueeze(-1)
                else:
                    immediate = d_params[tr.name][t].unsqueeze(-1)
                out[tr.name] = decay * out[tr.name] + immediate
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
