"""Real-time recurrent learning for element-wise cells, exact and O(N*D) per step.

The gradient of a segment's loss is the within-segment backprop gradient plus sum_b lambda_0[b] . S_0[b],
with lambda_0 = dL/dc_0 and S_0 the carried sensitivities dc_0/dtheta (design §4.1). Starting the
segment from a surrogate c_0 whose value is the carried state and whose derivative is S_0 lets autograd
produce that gradient, so optimizers, clipping, AMP and DDP see an ordinary ``.grad``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from onlinerec.cells.base import ElementwiseCell, FullyRecurrentCell
from onlinerec.gradients.base import GradientMethod, project, scan, window_features
from onlinerec.gradients.carry import Carry
from onlinerec.gradients.derivatives import NotElementwiseError, local_derivatives, recurrence_parameters


@dataclass(frozen=True)
class Tracked:
    """A cell parameter that carries a sensitivity, viewed as (K, N, F) (see :class:`Carry`)."""

    name: str
    kind: Literal["weight", "bias", "unit"]
    source: Literal["input", "state", ""] = ""  # what a dense weight multiplies: window inputs or c_prev


class _InjectSensitivity(torch.autograd.Function):
    """Identity on c_0 whose backward adds sum_b grad[b, n] * S[b, k, n, f] to each parameter's gradient."""

    @staticmethod
    def forward(ctx, c0: Tensor, n: int, *tensors: Tensor) -> Tensor:
        ctx.save_for_backward(*tensors[:n])
        ctx.shapes = [p.shape for p in tensors[n:]]
        return c0.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        sens = ctx.saved_tensors
        needs = ctx.needs_input_grad[2 + len(sens) :]
        grads = [
            torch.einsum("bn,bknf->knf", grad, s).reshape(shape) if need else None
            for s, shape, need in zip(sens, ctx.shapes, needs)
        ]
        return (grad, None, *([None] * len(sens)), *grads)


def _exclusive_reverse_cumprod(jh: Tensor) -> tuple[Tensor, Tensor]:
    """P[t] = prod_{s>t} jh[s] (P[M-1] = 1) and prod_s jh[s], along dim 0."""
    rc = jh.flip(0).cumprod(0).flip(0)
    return torch.cat([rc[1:], torch.ones_like(rc[:1])]), rc[0]


class RTRL(GradientMethod):
    """Exact real-time recurrent learning for any element-wise cell.

    Carries c and S = dc/dtheta for the input projection and every per-unit parameter the recurrence
    reads; the gradient equals full BPTT over each stream's whole history (for fixed parameters).
    The diagonal Jacobians and immediate derivatives come from ``cell.recurrence`` by autodiff; a cell whose
    recurrence mixes hidden units is refused with :class:`NotElementwiseError`.

    Args:
        carry: "batched" propagates the sensitivities to the segment end in one batched matmul over
            time; "stepwise" runs the textbook recursion S_t = j_t * S_{t-1} + I_t (spec §2.2) step by
            step. Both give the same carry; the stepwise one is the reference for tests and benchmarks.
    """

    name = "rtrl"

    def __init__(self, carry: Literal["batched", "stepwise"] = "batched") -> None:
        if carry not in ("batched", "stepwise"):
            raise ValueError(f"carry must be 'batched' or 'stepwise', got {carry!r}.")
        self.carry_mode = carry

    def __repr__(self) -> str:
        return f"{type(self).__name__}(carry={self.carry_mode!r})"

    # -- which parameters carry sensitivities -------------------------------------------------
    def check_cell(self, cell: ElementwiseCell) -> None:
        super().check_cell(cell)
        if isinstance(cell, FullyRecurrentCell):
            raise NotElementwiseError(
                f"{type(cell).__name__} is fully recurrent (its gates read all of c_prev through recurrent_proj), so "
                "exact RTRL would cost O(N^4) per step and onlinerec's RTRL refuses it. Use SnAPStrategy (SnAP-1, "
                "a diagonal approximation) or TBPTTStrategy for this cell."
            )
        self._unit_parameters(cell)

    def _unit_parameters(self, cell: ElementwiseCell) -> tuple[str, ...]:
        return recurrence_parameters(cell, "recurrence", ("input_proj.",), cell.num_gates, cell.hidden_size)

    def tracked(self, cell: ElementwiseCell) -> list[Tracked]:
        out = [Tracked("input_proj.weight", "weight", "input")]
        if cell.input_proj.bias is not None:
            out.append(Tracked("input_proj.bias", "bias"))
        return out + [Tracked(n, "unit") for n in self._unit_parameters(cell)]

    def sensitivity_names(self, cell: ElementwiseCell) -> tuple[str, ...]:
        return tuple(tr.name for tr in self.tracked(cell))

    def _zero_sensitivities(self, cell, batch_size, device, dtype) -> dict[str, Tensor]:
        params = dict(cell.named_parameters())
        n = cell.hidden_size
        out = {}
        for tr in self.tracked(cell):
            p = params[tr.name]
            shape = (batch_size, cell.num_gates, n, p.shape[-1]) if tr.kind == "weight" else (batch_size, p.numel() // n, n, 1)
            out[tr.name] = torch.zeros(shape, device=device, dtype=dtype)
        return out

    # -- one segment ------------------------------------------------------------------------
    def _unroll(self, cell: ElementwiseCell, inputs: Tensor, reset: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        tracked = self.tracked(cell)
        params = dict(cell.named_parameters())
        missing = [tr.name for tr in tracked if tr.name not in carry.sensitivities]
        if missing:
            raise ValueError(f"the carry has no sensitivities for {missing}; it was not made by {type(self).__name__}.init_carry.")
        sens = [carry.sensitivities[tr.name] for tr in tracked]
        c0 = _InjectSensitivity.apply(carry.c, len(sens), *sens, *[params[tr.name] for tr in tracked])

        keep = (~reset).to(inputs.dtype)
        feats, window = window_features(cell, inputs, keep, carry.window)
        gates = project(cell, feats)
        states = scan(cell, gates, c0, keep)
        with torch.no_grad():
            c_prev = torch.cat([carry.c.unsqueeze(0), states[:-1].detach()]) * keep.unsqueeze(-1)
            new_sens = self._propagate(cell, tracked, params, feats.detach(), gates.detach(), c_prev, keep, carry.sensitivities)
        return states, Carry(c=states[-1].detach(), window=window, sensitivities=new_sens)

    def _linearize(self, cell: ElementwiseCell, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor):
        """Per-step diagonal Jacobian j (M, B, N), dc/dgates (M, B, G, N) and dc/dp (M, B, K, N)."""
        m, b, g, n = gates.shape
        names = self._unit_parameters(cell)
        local = local_derivatives(cell, "recurrence", {k: params[k] for k in names}, gates.reshape(m * b, g, n), c_prev.reshape(m * b, n))
        unfold = lambda x: x.reshape(m, b, *x.shape[1:])  # noqa: E731
        return unfold(local.d_state), unfold(local.d_gates), {k: unfold(v) for k, v in local.d_params.items()}

    def _propagate(self, cell, tracked, params, feats, gates, c_prev, keep, sens0):
        j, d_gates, d_params = self._linearize(cell, params, gates, c_prev)
        jh = j * keep.unsqueeze(-1)  # a reset zeroes the carried sensitivities before its step
        sources = {"input": feats, "state": c_prev}
        if self.carry_mode == "stepwise":
            return _stepwise(tracked, jh, d_gates, d_params, sources, sens0)
        p_rest, p_all = _exclusive_reverse_cumprod(jh)
        scale = p_all[:, None, :, None]
        out = {}
        for tr in tracked:
            s0 = sens0[tr.name]
            if tr.kind == "weight":
                m, b, g, n = d_gates.shape
                a = (p_rest.unsqueeze(2) * d_gates).permute(1, 2, 3, 0).reshape(b, g * n, m)
                x = sources[tr.source].transpose(0, 1)  # (B, M, F)
                out[tr.name] = torch.baddbmm((s0 * scale).reshape(b, g * n, -1), a, x).reshape(s0.shape)
            else:
                local = d_gates if tr.kind == "bias" else d_params[tr.name]
                out[tr.name] = s0 * scale + (p_rest.unsqueeze(2) * local).sum(0).unsqueeze(-1)
        return out


def _stepwise(tracked, jh, d_gates, d_params, sources, sens0) -> dict[str, Tensor]:
    """Reference: S_t = jh_t * S_{t-1} + I_t, one step at a time (spec §2.2)."""
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
