"""The time loop of an element-wise cell as one autograd node, differentiated through its diagonal Jacobians.

Forward runs c_t = recurrence(gates_t, keep_t * c_{t-1}) without recording a graph, then linearises all M steps
in one batched call (RTRL's carry needs these local derivatives anyway). Backward is the adjoint recursion
lambda_{t-1} = e_{t-1} + jh_t * lambda_t, one fused multiply-add per step, and reads every input gradient off
lambda. The cell check established that the Jacobians are diagonal, so this is exactly backprop through the
recurrence, without M steps of autograd graph (derivation: docs/rtrl.md).

What backward keeps alive for M > 1, in state-sized tensors per step (TBPTT's graph keeps 4 for the eLSTM):

- cells whose per-unit parameters are diagonal recurrent weights on gates (eLSTM, SRU, and any cell without
  per-unit parameters, see :func:`~onlinerec.gradients.derivatives.gate_weight_map`): jh, dc/dgates and c_prev
  (G + 2), since dc/dp = dc/dgates * c_prev is rebuilt cheaply;
- other cells: the gates and c_prev (G + 1), and backward recomputes the derivatives chunk by chunk.

Units of K > 1 components (:func:`block_scan`) take the same route with a K x K Jacobian block per unit: backward is
lambda_{t-1} = e_{t-1} + J_t^T lambda_t per unit. Cells whose derivatives have a checked closed form (the LRU) keep only
the gates and c_prev (G + K per step) and recompute the derivatives a chunk of steps at a time, in backward and once
more in the carry (:class:`RecomputedBlocks`); other cells keep the blocks, dc/dgates and dc/dp of every step
(K^2 + K*G + K*P state-sized tensors per step).

Backward cannot itself be differentiated (no double backward); ``retain_graph=True`` works.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from onlinerec.cells.base import ElementwiseCell
from onlinerec.gradients.derivatives import gate_weight_map, local_derivatives

SECOND_BACKWARD = (
    "backward ran a second time through a segment unrolled with donate=True: the first backward already wrote the new "
    "sensitivities over the old ones that this gradient needs. Unroll without donate=True to backpropagate through the "
    "same segment more than once (retain_graph=True)."
)

CHUNK_MIN_ELEMENTS = 1 << 13
"""Backward handles the steps in up to 4 chunks (last first) once M*B*G*N reaches this, to bound temporaries."""


@dataclass
class Linearization:
    """Detached local derivatives of T consecutive steps of a recurrence.

    Attributes:
        jh: (T, B, N) the diagonal of dc_t/dc_{t-1} times keep_t (zero where a reset cuts the stream).
        d_gates: (T, B, G, N) dc_t/dgates_t.
        d_params: per-unit parameter name -> dc_t/dp (T, B, P, N), the parameter viewed as (P, N).
        c_prev: (T, B, N) what a dense weight on the state multiplies (the previous states after the reset mask, or
            the part of them that a fully recurrent cell's R reads), where a caller needs it, else None.
        d_mixed: fully recurrent cells whose recurrent projection does not simply add to the gates (the GRU):
            (T, B, G, N) dc_t/d(R c_{t-1} + b_R); None means that it equals ``d_gates``.

    With K > 1 components per unit: jh is the per-unit block (T, B, K, K, N), jh[t, b, k, j, n] =
    dc_{t,k,n}/dc_{t-1,j,n}, and d_gates (T, B, K, G, N), d_params (T, B, K, P, N), d_mixed gain the axis k of dc_k.
    """

    jh: Tensor
    d_gates: Tensor
    d_params: dict[str, Tensor]
    c_prev: Tensor | None = None
    d_mixed: Tensor | None = None

    def __getitem__(self, steps: slice) -> Linearization:
        return Linearization(
            self.jh[steps],
            self.d_gates[steps],
            {k: v[steps] for k, v in self.d_params.items()},
            None if self.c_prev is None else self.c_prev[steps],
            None if self.d_mixed is None else self.d_mixed[steps],
        )

    def param_grad(self, name: str, lam: Tensor) -> Tensor:
        """sum_{t,b} lam * dc/dp over these steps, (K, N), for adjoints lam (T, B, N)."""
        return (self.d_params[name] * lam.unsqueeze(-2)).sum((0, 1))

    def cast_(self, dtype: torch.dtype) -> None:
        """Convert every tensor to ``dtype`` in place of the old ones (no copy where it already matches)."""
        self.jh, self.d_gates = self.jh.to(dtype), self.d_gates.to(dtype)
        self.d_params = {k: v.to(dtype) for k, v in self.d_params.items()}
        self.c_prev = None if self.c_prev is None else self.c_prev.to(dtype)
        self.d_mixed = None if self.d_mixed is None else self.d_mixed.to(dtype)

    def release(self) -> tuple[Tensor, Tensor, dict[str, Tensor], Tensor | None, Tensor | None]:
        """The tensors (jh, d_gates, d_params, c_prev, d_mixed), handed over: this object lets go of them, so a
        consumer can free each one once used."""
        out = (self.jh, self.d_gates, self.d_params, self.c_prev, self.d_mixed)
        self.jh = self.d_gates = self.c_prev = self.d_mixed = None  # type: ignore[assignment]
        self.d_params = {}
        return out


@dataclass
class _GateWeightSteps:
    """Backward's view of a cell whose per-unit parameters are diagonal recurrent weights on gates: dc/dp is
    rebuilt from dc/dgates and c_prev instead of being kept (``rows``: the gate of each parameter row)."""

    jh: Tensor
    d_gates: Tensor
    c_prev: Tensor
    rows: dict[str, tuple[int, ...]]

    def __getitem__(self, steps: slice) -> _GateWeightSteps:
        return replace(self, jh=self.jh[steps], d_gates=self.d_gates[steps], c_prev=self.c_prev[steps])

    def param_grad(self, name: str, lam: Tensor) -> Tensor:
        lc = lam * self.c_prev
        return torch.stack([(self.d_gates[:, :, g] * lc).sum((0, 1)) for g in self.rows[name]])


class Linearizer:
    """``cell.recurrence`` linearised at given points, for the steps t0, t0 + 1, ... of one segment."""

    def __init__(self, cell: ElementwiseCell, names: tuple[str, ...], params: dict[str, Tensor], keep: Tensor) -> None:
        self.cell, self.names = cell, names
        self.mask = keep.unsqueeze(-1)
        self.gate_rows = gate_weight_map(cell, "recurrence")
        # the values in use now, in case the parameters change in place before a recomputing backward
        self.unit = {} if self.gate_rows is not None else {k: params[k].detach().clone() for k in names}

    def __call__(self, gates: Tensor, c_prev: Tensor, t0: int = 0) -> tuple[Linearization, Tensor | None]:
        """Derivatives of steps t0.. from their gates (T, B, G, N) and c_prev (T, B, N); also the new states
        (T*B, N) where the derivative pass yields them for free, else None."""
        t, b, g, n = gates.shape
        local = local_derivatives(
            self.cell, "recurrence", self.unit, gates.reshape(t * b, g, n), c_prev.reshape(t * b, n)
        )
        jh = local.d_state.reshape(t, b, n) * self.mask[t0 : t0 + t]
        d_gates = local.d_gates.reshape(t, b, g, n)
        if self.gate_rows is not None:
            d_params = {k: _gate_weight_derivative(d_gates, c_prev, self.gate_rows[k]) for k in self.names}
        else:
            d_params = {k: local.d_params[k].reshape(t, b, -1, n) for k in self.names}
        return Linearization(jh, d_gates, d_params), local.value


@dataclass
class _Recomputed:
    """Backward's view of any other cell: it keeps the gates and c_prev and linearises again, chunk by chunk."""

    linearize: Linearizer
    gates: Tensor
    c_prev: Tensor

    def __getitem__(self, steps: slice) -> Linearization:
        return self.linearize(self.gates[steps], self.c_prev[steps], steps.start)[0]


def _gate_weight_derivative(d_gates: Tensor, c_prev: Tensor, rows: tuple[int, ...]) -> Tensor:
    """dc/dp for a diagonal recurrent weight on gates (see :func:`gate_weight_map`): (T, B, K, N)."""
    if rows == tuple(range(d_gates.shape[2])):
        sel = d_gates
    elif len(rows) == 1:
        sel = d_gates[:, :, rows[0] : rows[0] + 1]
    else:
        sel = d_gates[:, :, list(rows)]
    return sel * c_prev.unsqueeze(2)


def _run(linearize: Linearizer, gates: Tensor, c0: Tensor):
    """Forward without a graph: the states (M, B, N), the linearisation of all steps, and what backward keeps."""
    m, b, _, n = gates.shape
    cell, mask = linearize.cell, linearize.mask
    if m == 1:  # one batched derivative pass also gives the new state (when it takes the one-pass path)
        c_prev = (c0 * mask[0]).unsqueeze(0)
        lin, value = linearize(gates, c_prev)
        states = (value if value is not None else cell.recurrence(gates[0], c_prev[0])).reshape(1, b, n)
        return states, lin, lin
    c, steps = c0, []
    c_prev = torch.empty(m, b, n, dtype=c0.dtype, device=c0.device)
    for t in range(m):
        torch.mul(c, mask[t], out=c_prev[t])
        c = cell.recurrence(gates[t], c_prev[t])
        steps.append(c)
    lin, _ = linearize(gates, c_prev)
    if linearize.gate_rows is not None:
        saved = _GateWeightSteps(lin.jh, lin.d_gates, c_prev, {k: linearize.gate_rows[k] for k in linearize.names})
    else:
        saved = _Recomputed(linearize, gates.detach(), c_prev)
    return torch.stack(steps), lin, saved


class _DiagonalScan(torch.autograd.Function):
    """States (differentiable) and, as non-differentiable extra outputs, jh, dc/dgates and each dc/dp."""

    @staticmethod
    def forward(ctx, linearize: Linearizer, gates: Tensor, c0: Tensor, *unit_params: Tensor):
        states, lin, ctx.saved = _run(linearize, gates, c0)
        ctx.names, ctx.gates_shape = linearize.names, gates.shape
        ctx.param_shapes = [p.shape for p in unit_params]
        derivatives = (lin.jh, lin.d_gates, *(lin.d_params[k] for k in linearize.names))
        ctx.mark_non_differentiable(*derivatives)
        ctx.set_materialize_grads(False)  # no zero-filled gradients for the derivative outputs
        return states, *derivatives

    @staticmethod
    def backward(ctx, grad: Tensor | None, *_):
        needs = ctx.needs_input_grad  # (linearize, gates, c0, *unit_params)
        if grad is None:
            return (None,) * len(needs)
        lam = grad.contiguous().clone()  # the adjoints, built in place from the last step back
        m = lam.shape[0]
        size = -(-m // 4) if lam.numel() * ctx.gates_shape[2] >= CHUNK_MIN_ELEMENTS else m
        g_gates = torch.empty(ctx.gates_shape, dtype=lam.dtype, device=lam.device) if needs[1] else None
        g_c0, g_params = None, [None] * len(ctx.names)
        for t0 in reversed(range(0, m, size)):
            t1 = min(t0 + size, m)
            d = ctx.saved[t0:t1]
            part = lam[t0:t1]
            for t in range(t1 - t0 - 1, 0, -1):
                part[t - 1].addcmul_(d.jh[t], part[t])
            if t0 > 0:
                lam[t0 - 1].addcmul_(d.jh[0], part[0])
            if g_gates is not None:
                torch.mul(part.unsqueeze(-2), d.d_gates, out=g_gates[t0:t1])
            for i, name in enumerate(ctx.names):
                if needs[3 + i]:
                    acc = d.param_grad(name, part)
                    g_params[i] = acc if g_params[i] is None else g_params[i].add_(acc)
            if t0 == 0 and needs[2]:
                g_c0 = d.jh[0] * part[0]
            del d  # a recomputed chunk's derivatives are freed before the next chunk is built
        g_params = [None if g is None else g.reshape(shape) for g, shape in zip(g_params, ctx.param_shapes)]
        return (None, g_gates, g_c0, *g_params)


def diagonal_scan(
    cell: ElementwiseCell, names: tuple[str, ...], params: dict[str, Tensor], gates: Tensor, c0: Tensor, keep: Tensor
) -> tuple[Tensor, Linearization]:
    """Run an element-wise cell over a segment: c_t = recurrence(gates_t, keep_t * c_{t-1}) from c0.

    Args:
        names: the per-unit parameters that ``cell.recurrence`` reads (checked element-wise beforehand).
        params: name -> tensor for at least ``names``; gradients flow to these tensors.
        gates: (M, B, G, N) pre-activations; c0 (B, N); keep (M, B), 0 where a reset precedes the step.

    Returns:
        The states (M, B, N), differentiable with respect to gates, c0 and ``params[names]``, and the detached
        linearisation of all M steps (no ``c_prev``).
    """
    linearize = Linearizer(cell, names, params, keep)
    states, jh, d_gates, *d_params = _DiagonalScan.apply(linearize, gates, c0, *[params[k] for k in names])
    return states, Linearization(jh, d_gates, dict(zip(names, d_params)))


# -- units of K > 1 components: a K x K Jacobian block per unit ----------------------------------------------------
class RecomputedBlocks:
    """The linearisation of a segment of K > 1 units, recomputed chunk by chunk from its gates and states instead of kept.

        For cells whose local derivatives have a checked closed form (``recurrence_derivatives``, e.g. the LRU), computing
        them costs about as much as the recurrence itself, while keeping them costs K^2 + K*G + K*P state-sized tensors per
        step (12 for the LRU). So the segment keeps only its gates (G per step; its states are its output, which the loss's
    graph keeps anyway, and c_prev is rebuilt from them), backward recomputes the
        derivatives of one chunk of steps at a time (in place of the forward pass, which no longer computes them), and the
        carry recomputes them once more. ``[t0:t1]`` gives the :class:`Linearization` of those steps (jh masked by keep).
    """

    def __init__(self, cell: ElementwiseCell, names: tuple[str, ...], unit: dict[str, Tensor], keep: Tensor) -> None:
        self.cell, self.names, self.unit = cell, names, unit
        self.mask = keep[:, :, None, None, None]  # (M, B, 1, 1, 1): jh is zero where a reset cuts the stream
        self.gates: Tensor | None = None  # (M, B, G, N), set by the forward pass
        self.states: Tensor | None = None  # (M, B, K, N), the segment's own output: c_prev is rebuilt from it
        self.c0: Tensor | None = None  # (B, K, N)
        self.dtype: torch.dtype | None = None

    @property
    def steps(self) -> int:
        return self.mask.shape[0]

    @property
    def chunk_size(self) -> int:
        """Steps per recomputed chunk: an eighth of the segment once it is large enough to matter."""
        m, b, g, n = self.gates.shape
        return -(-m // 8) if m * b * g * n >= CHUNK_MIN_ELEMENTS else m

    def __getitem__(self, steps: slice) -> Linearization:
        t0, t1, _ = steps.indices(self.steps)
        t = t1 - t0
        local = local_derivatives(
            self.cell, "recurrence", self.unit, self.gates[t0:t1].flatten(0, 1), self.c_prev_of(t0, t1).flatten(0, 1)
        )
        unfold = lambda x: x.reshape(t, -1, *x.shape[1:])  # noqa: E731
        lin = Linearization(
            unfold(local.d_state) * self.mask[t0:t1],
            unfold(local.d_gates),
            {k: unfold(local.d_params[k]) for k in self.names},
        )
        if self.dtype is not None:
            lin.cast_(self.dtype)
        return lin

    def c_prev_of(self, t0: int, t1: int) -> Tensor:
        """c_prev of steps t0..t1-1 (T, B, K, N): the states before them, zeroed where a reset precedes the step."""
        before = self.states[t0 - 1 : t1 - 1] if t0 > 0 else torch.cat([self.c0.unsqueeze(0), self.states[: t1 - 1]])
        return before * self.mask[t0:t1, ..., 0]

    def chunks(self, reverse: bool = False):
        """(t0, t1, the Linearization of steps t0..t1-1) for consecutive chunks covering the segment."""
        size, m = self.chunk_size, self.steps
        starts = range(0, m, size)
        for t0 in reversed(starts) if reverse else starts:
            yield t0, min(t0 + size, m), self[t0 : t0 + size]

    # -- the Linearization interface, for readers that want every step at once ---------------------------------------
    def cast_(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def materialize(self) -> Linearization:
        return self[0 : self.steps]

    @property
    def jh(self) -> Tensor:
        return self.materialize().jh

    @property
    def d_gates(self) -> Tensor:
        return self.materialize().d_gates

    @property
    def d_params(self) -> dict[str, Tensor]:
        return self.materialize().d_params

    c_prev = d_mixed = None  # (Linearization's fields) K > 1 cells have no dense weight on the state

    def release(self) -> tuple[Tensor, Tensor, dict[str, Tensor], Tensor | None, Tensor | None]:
        """Every step's derivatives at once (:meth:`Linearization.release`); the gates and c_prev stay (a backward
        still to come recomputes from them)."""
        return self.materialize().release()

    def discard(self) -> None:
        """Let go of the gates and c_prev (once no backward or carry needs them)."""
        self.gates = self.states = self.c0 = None


class _BlockScan(torch.autograd.Function):
    """:class:`_DiagonalScan` for units of K > 1 components: states (M, B, K, N) and the per-unit blocks (or, with
    ``blocks`` (:class:`RecomputedBlocks`) and M > 1, nothing more: backward and the carry recompute them)."""

    @staticmethod
    def forward(ctx, cell: ElementwiseCell, names: tuple[str, ...], unit: dict, keep: Tensor, blocks, gates, c0, *ps):
        m, b, g, n = gates.shape
        mask = keep[:, :, None, None]
        states = torch.empty(m, *c0.shape, dtype=c0.dtype, device=c0.device)
        ctx.param_shapes, ctx.gates_g = [p.shape for p in ps], g
        ctx.set_materialize_grads(False)
        if blocks is not None and m > 1:  # keep only what the derivatives are recomputed from
            c = c0
            for t in range(m):
                c = states[t] = cell.recurrence(gates[t], c * mask[t])
            blocks.gates, blocks.states, blocks.c0 = gates.detach(), states.detach(), c0.detach()
            ctx.blocks = blocks
            return (states,)
        c_prev = torch.empty_like(states)
        c = c0
        for t in range(m):
            torch.mul(c, mask[t], out=c_prev[t])
            if m > 1:  # with one step the derivative pass below gives the new state
                c = states[t] = cell.recurrence(gates[t], c_prev[t])
        # the derivatives, written chunk by chunk into their (M, ...) tensors: the autodiff temporaries of one chunk
        # at a time (an eighth of the segment) instead of all M steps'
        k = c0.shape[1]
        jh = torch.empty(m, b, k, k, n, dtype=c0.dtype, device=c0.device)  # zero where a reset cuts the stream
        d_gates = torch.empty(m, b, k, g, n, dtype=c0.dtype, device=c0.device)
        d_params = [
            torch.empty(m, b, k, unit[name].numel() // n, n, dtype=c0.dtype, device=c0.device) for name in names
        ]
        size = -(-m // 8) if m * b * g * n >= CHUNK_MIN_ELEMENTS else m
        for t0 in range(0, m, size):
            t1 = min(t0 + size, m)
            local = local_derivatives(cell, "recurrence", unit, gates[t0:t1].flatten(0, 1), c_prev[t0:t1].flatten(0, 1))
            unfold = lambda x: x.reshape(t1 - t0, b, *x.shape[1:])  # noqa: E731, B023
            torch.mul(unfold(local.d_state), mask[t0:t1].unsqueeze(-1), out=jh[t0:t1])
            d_gates[t0:t1] = unfold(local.d_gates)
            for name, d in zip(names, d_params):
                d[t0:t1] = unfold(local.d_params[name])
            if m == 1:
                states[0] = local.value if local.value is not None else cell.recurrence(gates[0], c_prev[0])
            del local
        ctx.save_for_backward(jh, d_gates, *d_params)
        ctx.blocks, ctx.names = None, names
        derivatives = (jh, d_gates, *d_params)
        ctx.mark_non_differentiable(*derivatives)
        return states, *derivatives

    @staticmethod
    def backward(ctx, grad: Tensor | None, *_):
        needs = ctx.needs_input_grad  # (cell, names, unit, keep, blocks, gates, c0, *params)
        if grad is None:
            return (None,) * len(needs)
        if ctx.blocks is not None:
            if ctx.blocks.gates is None:  # let go of by the in-place carry, which ran after the first backward
                raise RuntimeError(SECOND_BACKWARD)
            source, names = ctx.blocks, ctx.blocks.names
            chunks = source.chunks(reverse=True)
        else:
            jh, d_gates, *d_params = ctx.saved_tensors
            names = ctx.names
            whole = Linearization(jh, d_gates, dict(zip(names, d_params)))
            chunks = iter([(0, jh.shape[0], whole)])
        lam = grad.contiguous().clone()  # (M, B, K, N): adjoints, built in place from the last step back
        k = lam.shape[2]
        shape = (*lam.shape[:2], ctx.gates_g, lam.shape[3])
        g_gates = torch.empty(shape, dtype=lam.dtype, device=lam.device) if needs[5] else None
        g_c0, g_params = None, [None] * len(names)
        for t0, t1, d in chunks:  # last chunk first
            part = lam[t0:t1]
            for t in range(t1 - t0 - 1, 0, -1):  # lambda_{t-1} += J_t^T lambda_t, per unit
                part[t - 1].add_((d.jh[t] * part[t].unsqueeze(2)).sum(1))
            if t0 > 0:
                lam[t0 - 1].add_((d.jh[0] * part[0].unsqueeze(2)).sum(1))
            per_component = lambda x: (part[:, :, i, None, :] * x[:, :, i] for i in range(k))  # noqa: E731, B023
            if g_gates is not None:  # sum_k lam_k dc_k/dgates, accumulated without a K-fold temporary
                g_gates[t0:t1] = _sum_into(per_component(d.d_gates))
            for i, (name, need) in enumerate(zip(names, needs[7:])):
                if need:
                    acc = sum(p.sum((0, 1)) for p in per_component(d.d_params[name]))
                    g_params[i] = acc if g_params[i] is None else g_params[i].add_(acc)
            if t0 == 0 and needs[6]:
                g_c0 = (d.jh[0] * part[0].unsqueeze(2)).sum(1)
            del d  # a recomputed chunk's derivatives are freed before the next chunk is built
        g_params = [None if g is None else g.reshape(shape) for g, shape in zip(g_params, ctx.param_shapes)]
        return (None, None, None, None, None, g_gates, g_c0, *g_params)


def _sum_into(parts) -> Tensor:
    """The sum of the tensors an iterator yields, accumulated into the first (one temporary at a time)."""
    total = next(parts)
    for part in parts:
        total.add_(part)
    return total


def block_scan(
    cell: ElementwiseCell,
    names: tuple[str, ...],
    params: dict[str, Tensor],
    gates: Tensor,
    c0: Tensor,
    keep: Tensor,
    recompute: bool = False,
) -> tuple[Tensor, Linearization | RecomputedBlocks]:
    """:func:`diagonal_scan` for units of K > 1 components: c0 (B, K, N) -> states (M, B, K, N), differentiable with
    respect to gates, c0 and ``params[names]``, and the detached linearisation with per-unit K x K blocks jh.

    ``recompute`` (for M > 1): keep only the gates and c_prev and return a :class:`RecomputedBlocks` that recomputes the
    derivatives on demand, for cells whose derivatives are cheap (a checked closed form)."""
    unit = {k: params[k].detach() for k in names}
    blocks = RecomputedBlocks(cell, names, unit, keep) if recompute and gates.shape[0] > 1 else None
    out = _BlockScan.apply(cell, names, unit, keep, blocks, gates, c0, *[params[k] for k in names])
    if blocks is not None:
        return out[0], blocks
    states, jh, d_gates, *d_params = out
    return states, Linearization(jh, d_gates, dict(zip(names, d_params)))
