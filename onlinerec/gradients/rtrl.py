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
from onlinerec.gradients.derivatives import (
    NotElementwiseError,
    _substituted,
    gate_weight_map,
    local_derivatives,
    recurrence_parameters,
)


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
        grads = [_contract(grad, s).reshape(shape) if need else None for s, shape, need in zip(sens, ctx.shapes, needs)]
        return (grad, None, *([None] * len(sens)), *grads)


def _contract(lam: Tensor, s: Tensor) -> Tensor:
    """sum_b lam[b, n] * s[b, k, n, f] -> (K, N, F).

    On CPU a loop of in-place multiply-adds over b reads s once and keeps the (K, N, F) accumulator in
    cache; it is about 5x faster there than torch.einsum, which permutes s into a batched matmul."""
    b, k, n, f = s.shape
    lam = lam.to(s.dtype)  # e.g. bfloat16 states under autocast, float32 sensitivities
    if s.device.type != "cpu" or f == 1 or b == 1:
        return torch.einsum("bn,bknf->knf", lam, s)
    out = s[0] * lam[0, :, None]
    for i in range(1, b):
        out.addcmul_(s[i], lam[i, :, None])
    return out


_CHUNK_MIN_ELEMENTS = 1 << 13
"""Backward handles the steps in up to 4 chunks (last first) when M*B*G*N reaches this, to bound temporaries."""


class _DiagonalScan(torch.autograd.Function):
    """The time loop of an element-wise cell, differentiated through its diagonal Jacobians.

    ``run(gates, c0)`` (called without grad) returns the states (M, B, N) and ``derivs(t0, t1)``, which
    gives, for steps t0..t1-1, the local derivatives that RTRL needs for its carry anyway: jh = keep *
    dc_t/dc_{t-1} (T, B, N), dc/dgates (T, B, G, N) and ``param_grad(i, lam)``, the contraction
    sum_{t,b} lam * dc/dp_i over those steps (K, N) for the i-th unit parameter.
    Backward runs the adjoint recursion lambda_{t-1} = e_{t-1} + jh_t * lambda_t, one fused multiply-add
    per step, and reads every input gradient off lambda. This is exactly backprop through the recurrence
    (the Jacobians are diagonal, which the cell check established) without recording M steps of graph.
    What ``derivs`` keeps alive until backward is chosen by :meth:`RTRL._diagonal_scan` for memory.
    """

    @staticmethod
    def forward(ctx, run, gates: Tensor, c0: Tensor, *unit_params: Tensor) -> Tensor:
        states, ctx.derivs = run(gates, c0)
        ctx.gates_shape = gates.shape
        ctx.shapes = [p.shape for p in unit_params]
        return states

    @staticmethod
    def backward(ctx, grad: Tensor):
        needs = ctx.needs_input_grad
        lam = grad.contiguous().clone()
        m = lam.shape[0]
        size = -(-m // 4) if lam.numel() * ctx.gates_shape[2] >= _CHUNK_MIN_ELEMENTS else m
        g_gates = torch.empty(ctx.gates_shape, dtype=lam.dtype, device=lam.device) if needs[1] else None
        g_c0, g_params = None, [None] * len(ctx.shapes)
        for t0 in reversed(range(0, m, size)):
            t1 = min(t0 + size, m)
            jh, d_gates, param_grad = ctx.derivs(t0, t1)
            part = lam[t0:t1]
            for t in range(t1 - t0 - 1, 0, -1):
                part[t - 1].addcmul_(jh[t], part[t])
            if t0 > 0:
                lam[t0 - 1].addcmul_(jh[0], part[0])
            if g_gates is not None:
                torch.mul(part.unsqueeze(-2), d_gates, out=g_gates[t0:t1])
            for i, need in enumerate(needs[3:]):
                if need:
                    acc = param_grad(i, part)
                    g_params[i] = acc if g_params[i] is None else g_params[i].add_(acc)
            if t0 == 0 and needs[2]:
                g_c0 = jh[0] * part[0]
            del jh, d_gates, param_grad
        g_params = [None if g is None else g.reshape(shape) for g, shape in zip(g_params, ctx.shapes)]
        return (None, g_gates, g_c0, *g_params)


def _contract_params(d_params: list[Tensor]):
    """param_grad for explicit dc/dp tensors (T, B, K, N)."""
    return lambda i, lam: (d_params[i] * lam.unsqueeze(-2)).sum((0, 1))


def _contract_gate_weights(d_gates: Tensor, c_prev: Tensor, rows: list[tuple[int, ...]]):
    """param_grad for diagonal recurrent weights on gates: sum_{t,b} lam * c_prev * dc/dgates[g_k], row by row."""

    def grad(i: int, lam: Tensor) -> Tensor:
        lc = lam * c_prev
        return torch.stack([(d_gates[:, :, g] * lc).sum((0, 1)) for g in rows[i]])

    return grad


def _gate_weight_derivative(d_gates: Tensor, c_prev: Tensor, rows: tuple[int, ...]) -> Tensor:
    """dc/dp for a diagonal recurrent weight on gates (see :func:`gate_weight_map`): (T, B, K, N)."""
    if rows == tuple(range(d_gates.shape[2])):
        sel = d_gates
    elif len(rows) == 1:
        sel = d_gates[:, :, rows[0] : rows[0] + 1]
    else:
        sel = d_gates[:, :, list(rows)]
    return sel * c_prev.unsqueeze(2)


def _exclusive_reverse_cumprod(jh: Tensor) -> tuple[Tensor, Tensor]:
    """P[t] = prod_{s>t} jh[s] (P[M-1] = 1) and prod_s jh[s], along dim 0.

    A loop of M small multiplies: torch.cumprod along a strided leading dimension is several times slower."""
    m = jh.shape[0]
    p = torch.empty_like(jh)
    p[m - 1] = 1
    for t in range(m - 1, 0, -1):
        torch.mul(p[t], jh[t], out=p[t - 1])
    return p, p[0] * jh[0]


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
        if inputs.shape[0] == 1 and not isinstance(cell, FullyRecurrentCell):
            return self._unroll_one_step(cell, tracked, params, inputs, reset, carry)
        sens = [carry.sensitivities[tr.name] for tr in tracked]
        c0 = _InjectSensitivity.apply(carry.c, len(sens), *sens, *[params[tr.name] for tr in tracked])

        keep = (~reset).to(inputs.dtype)
        feats, window = window_features(cell, inputs, keep, carry.window)
        gates = project(cell, feats)
        if isinstance(cell, FullyRecurrentCell):  # SnAP on a dense recurrence: autograd through the loop
            states = scan(cell, gates, c0, keep)
            with torch.no_grad():
                c_prev = torch.cat([carry.c.unsqueeze(0), states[:-1].detach()]) * keep.unsqueeze(-1)
                j, d_gates, d_params = self._linearize(cell, params, gates.detach(), c_prev)
                local = [j * keep.unsqueeze(-1), d_gates, d_params]
                del j, d_gates, d_params
        else:
            states, local, c_prev = self._diagonal_scan(cell, params, gates, c0, keep)
        del gates  # not needed any more; peak memory is reached in the carry below
        with torch.no_grad():
            sources = {"input": feats.detach(), "state": c_prev}
            new_sens = self._carry(tracked, local, sources, carry.sensitivities)
        return states, Carry(c=states[-1].detach(), window=window, sensitivities=new_sens)

    def _unroll_one_step(self, cell, tracked, params, inputs, reset, carry) -> tuple[Tensor, Carry]:
        """M = 1 (fully online). With one step, the exact gradient of every tracked parameter is
        sum_b e_1[b] * S_1[b] (the paper's formula, spec §2.3), e_1 = dL/dc_1 and S_1 the new carry, which
        already holds both the carried and the immediate part. So the step runs with the tracked
        parameters detached (the inputs still get their backprop gradient) and a read-out of S_1 adds the
        parameter gradients. Backward then reads the sensitivities just written, and the graph does not
        keep the old ones alive."""
        keep = (~reset).to(inputs.dtype)
        feats, window = window_features(cell, inputs, keep, carry.window)
        frozen = {tr.name: params[tr.name].detach() for tr in tracked}
        with _substituted(cell, frozen):
            gates = project(cell, feats)
            states, local, c_prev = self._diagonal_scan(cell, {**params, **frozen}, gates, carry.c, keep)
        del gates
        with torch.no_grad():
            new_sens = self._carry(tracked, local, {"input": feats.detach(), "state": c_prev}, carry.sensitivities)
        sens = [new_sens[tr.name] for tr in tracked]
        last = _InjectSensitivity.apply(states[0], len(sens), *sens, *[params[tr.name] for tr in tracked])
        return last.unsqueeze(0), Carry(c=states[0].detach(), window=window, sensitivities=new_sens)

    def _diagonal_scan(self, cell: ElementwiseCell, params: dict[str, Tensor], gates: Tensor, c0: Tensor, keep: Tensor):
        """States (differentiable, via :class:`_DiagonalScan`), the detached local derivatives as a list
        [jh, d_gates, d_params] (for :meth:`_carry`, which empties it) and c_prev (None unless a tracked
        weight multiplies the state).

        What backward keeps, for M > 1 (in state-sized tensors per step; TBPTT's graph keeps 4 for the eLSTM):
        - cells whose per-unit parameters are diagonal recurrent weights on gates (eLSTM, SRU, and any cell
          without per-unit parameters, see :func:`gate_weight_map`): jh, dc/dgates and c_prev (G + 2), since
          dc/dp = dc/dgates * c_prev is rebuilt cheaply;
        - other cells: the gates and c_prev (G + 1), and backward recomputes the derivatives."""
        names = self._unit_parameters(cell)
        gmap = gate_weight_map(cell, "recurrence")
        unit = {} if gmap is not None else {k: params[k].detach().clone() for k in names}  # values used now
        keep_c_prev = any(tr.source == "state" for tr in self.tracked(cell))  # else freed early (memory)
        mask = keep.unsqueeze(-1)
        out = {}

        def linearize(g: Tensor, c_prev: Tensor, t0: int, t1: int):
            m, b, ng, n = g.shape
            local = local_derivatives(cell, "recurrence", unit, g.reshape(m * b, ng, n), c_prev.reshape(m * b, n))
            jh = local.d_state.reshape(m, b, n) * mask[t0:t1]
            d_gates = local.d_gates.reshape(m, b, ng, n)
            if gmap is not None:
                d_params = [_gate_weight_derivative(d_gates, c_prev, gmap[k]) for k in names]
            else:
                d_params = [local.d_params[k].reshape(m, b, -1, n) for k in names]
            return jh, d_gates, d_params, local.value

        def run(g: Tensor, c: Tensor):
            m, b, ng, n = g.shape
            if m == 1:
                c_prev = (c * mask[0]).unsqueeze(0)
            else:
                c_prev, steps = torch.empty(m, b, n, dtype=c.dtype, device=c.device), []
                for t in range(m):
                    torch.mul(c, mask[t], out=c_prev[t])
                    c = cell.recurrence(g[t], c_prev[t])
                    steps.append(c)
            jh, d_gates, d_params, value = linearize(g, c_prev, 0, m)
            if m == 1:
                states = (value if value is not None else cell.recurrence(g[0], c_prev[0])).reshape(1, b, n)
                saved = (jh, d_gates, _contract_params(d_params))
                derivs = lambda t0, t1: saved  # noqa: E731
            else:
                states = torch.stack(steps)
                if gmap is not None:
                    rows = [gmap[k] for k in names]
                    derivs = lambda t0, t1: (  # noqa: E731
                        jh[t0:t1],
                        d_gates[t0:t1],
                        _contract_gate_weights(d_gates[t0:t1], c_prev[t0:t1], rows),
                    )
                else:
                    gd = g.detach()

                    def derivs(t0: int, t1: int):
                        jh_, d_gates_, d_params_, _ = linearize(gd[t0:t1], c_prev[t0:t1], t0, t1)
                        return jh_, d_gates_, _contract_params(d_params_)
            out["local"] = [jh, d_gates, dict(zip(names, d_params))]
            out["c_prev"] = c_prev if keep_c_prev else None
            return states, derivs

        states = _DiagonalScan.apply(run, gates, c0, *[params[k] for k in names])
        return states, out.pop("local"), out.pop("c_prev")

    def _linearize(self, cell: ElementwiseCell, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor):
        """Per-step diagonal Jacobian j (M, B, N), dc/dgates (M, B, G, N) and dc/dp (M, B, K, N)."""
        m, b, g, n = gates.shape
        names = self._unit_parameters(cell)
        local = local_derivatives(cell, "recurrence", {k: params[k] for k in names}, gates.reshape(m * b, g, n), c_prev.reshape(m * b, n))
        unfold = lambda x: x.reshape(m, b, *x.shape[1:])  # noqa: E731
        return unfold(local.d_state), unfold(local.d_gates), {k: unfold(v) for k, v in local.d_params.items()}

    def _propagate(self, cell, tracked, params, feats, gates, c_prev, keep, sens0):
        """Sensitivities at the segment end from those at its start (linearises, then :meth:`_carry`)."""
        j, d_gates, d_params = self._linearize(cell, params, gates, c_prev)
        jh = j * keep.unsqueeze(-1)  # a reset zeroes the carried sensitivities before its step
        return self._carry(tracked, [jh, d_gates, d_params], {"input": feats, "state": c_prev}, sens0)

    def _carry(self, tracked, local: list, sources, sens0) -> dict[str, Tensor]:
        """S_M = P(0,M) S_0 + sum_tau P(tau,M) I_tau (design §4.1), one batched matmul per dense weight.

        ``local`` = [jh, d_gates, d_params] is emptied, and each derivative is dropped as soon as it has been
        used, so that peak memory stays low; each new sensitivity is allocated once (the matmul output)
        and the decayed S_0 is added into it in place."""
        # the sensitivities keep their own dtype (under autocast the local derivatives may be bfloat16)
        dtype = next(iter(sens0.values())).dtype
        with torch.autocast(local[0].device.type, enabled=False):
            local[0], local[1] = local[0].to(dtype), local[1].to(dtype)
            local[2] = {k: v.to(dtype) for k, v in local[2].items()}
            sources = {k: None if v is None else v.to(dtype) for k, v in sources.items()}
            return self._carry_in_dtype(tracked, local, sources, sens0)

    def _carry_in_dtype(self, tracked, local: list, sources, sens0) -> dict[str, Tensor]:
        jh, d_gates, d_params = local
        local.clear()
        if self.carry_mode == "stepwise":
            return _stepwise(tracked, jh, d_gates, d_params, sources, sens0)
        m, b, g, n = d_gates.shape
        p_rest, p_all = _exclusive_reverse_cumprod(jh)
        del jh
        scale = p_all[:, None, :, None]
        out = {}
        # small sensitivities first, so that their temporaries are gone before the big ones are allocated
        for tr in tracked:
            if tr.kind == "unit":
                part = d_params[tr.name] if m == 1 else p_rest.unsqueeze(2) * d_params[tr.name]
                out[tr.name] = part.sum(0).unsqueeze(-1).addcmul_(sens0[tr.name], scale)
        del d_params
        weighted = d_gates if m == 1 else p_rest.unsqueeze(2) * d_gates  # (M, B, G, N)
        del p_rest, d_gates
        for tr in tracked:
            if tr.kind == "bias":
                out[tr.name] = weighted.sum(0).unsqueeze(-1).addcmul_(sens0[tr.name], scale)
        if m > 1:  # the matmul operand (B, G*N, M); a contiguous copy beats a strided operand or output
            weighted = weighted.permute(1, 2, 3, 0).reshape(b, g * n, m)
        for tr in tracked:
            if tr.kind == "weight":
                s0 = sens0[tr.name]
                x = sources[tr.source].transpose(0, 1)  # (B, M, F)
                if m == 1:  # an outer product; bmm with an inner size of 1 is slow
                    new = weighted[0].reshape(b, g * n, 1) * x
                else:
                    new = torch.bmm(weighted, x.contiguous())
                out[tr.name] = new.view(s0.shape).addcmul_(s0, scale)
        return {tr.name: out[tr.name] for tr in tracked}


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
