"""A donated carry updated in place (``unroll(..., donate=True)``): no second sensitivity-sized tensor is made.

- The fully online step (M = 1), :func:`carry_in_place`: S_1 = J_1 S_0 + I_1 rewrites the donated sensitivities in one
  pass. The carry keeps S = a * S~ with a per-stream, per-unit factor a (B, N), or for units of K > 1 components a
  K x K block A (B, K, K, N) per unit (see :class:`~onlinerec.gradients.carry.Carry`), so the decay J_1 multiplies a,
  not S~. Units whose scale leaves the dtype's range, or whose block is singular or ill-conditioned, are folded into
  S~ first. docs/performance.md#the-m--1-online-step measures the step. These checks read the scale on the host, so
  the lazy scale is kept on the CPU only (:func:`scales_lazily`); on other devices the step decays the sensitivities
  where they lie, with no host synchronisation.
- The fully online step of a small carry (:data:`SMALL_CARRY` numbers at most), :func:`online_step`: the state and
  its exact gradient in one autograd node, the sensitivities decayed where they lie; for a few streams and units the
  general path's bookkeeping costs more than the arithmetic.
- A segment of M > 1 steps, :class:`DeferredCarry`: the batched carry
  (:meth:`~onlinerec.gradients.sensitivity.SensitivityMethod.propagate`) writes S_M over S_0 once backward has read S_0.

:func:`block_mul`, the per-unit K x K product, serves these and the batched carry alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from onlinerec.cells.base import ElementwiseCell
from onlinerec.gradients.carry import blocks_in_place_, fold_scale_
from onlinerec.gradients.derivatives import local_derivatives, substituted
from onlinerec.gradients.scan import Linearization, Linearizer

if TYPE_CHECKING:
    from onlinerec.gradients.sensitivity import Tracked


def block_mul(a: Tensor, b: Tensor) -> Tensor:
    """Per-unit matrix products: a (..., K, K, N) times b (..., K, X, N) -> (..., K, X, N), sum_j a[k, j] b[j, x]."""
    return (a.unsqueeze(-2) * b.unsqueeze(-4)).sum(-3)


def _scale_bounds(dtype: torch.dtype) -> tuple[float, float]:
    """The range [max^(-1/2), max^(1/2)] of the dtype within which a lazy scale a is kept (2^-64 to 2^64 for float32 and
    bfloat16, 2^-512 to 2^512 for float64): S~ = S / a overflows only where |S| exceeds max^(1/2) (1.8e19 in float32),
    and becomes subnormal only where |S| is below tiny * max^(1/2) (2e-19), far beyond any gradient's resolution."""
    low = torch.finfo(dtype).max ** -0.5
    return low, 1 / low


_GATHER_FOLD_MAX = 1 / 16
"""Above this share of (stream, unit) rows a fold multiplies the whole sensitivity tensor (measured at the Atari shape,
2-core CPU: a gather-scale-scatter of 10 % of the rows costs about as much as one pass over all of them, of 50 % 2-6x
more)."""


def _fold_out_of_range_(sens: dict[str, Tensor], a: Tensor) -> Tensor:
    """Fold the factor of every unit whose a left :func:`_scale_bounds` (or is 0 after a reset) into S~ in place and
    return a with 1 there: small tensors by one multiply, the big ones by a zero fill of the streams that a reset cut
    and, for the other rows, an index pass over them (a few) or one multiply of the whole tensor (many)."""
    low, high = _scale_bounds(a.dtype)
    magnitude = a.abs()
    smallest, largest = (v.item() for v in torch.aminmax(magnitude))
    if smallest >= low and largest <= high:  # false for 0 (a reset), inf and nan
        return a
    # fold every unit past the middle of the range, not only those past its end, so that folds come in fewer,
    # larger batches (each costs a dozen small ops besides the rows it touches)
    off = ~((magnitude >= low**0.5) & (magnitude <= high**0.5))
    big = [s for s in sens.values() if s.shape[-1] > 1]
    factor = torch.where(off, a, 1.0)
    for s in sens.values():
        if s.shape[-1] == 1:
            s.mul_(factor[:, None, :, None])
    if big:
        dead = (a == 0).all(1)  # streams cut by a reset: their sensitivities restart from zero (a write)
        rest = off
        if bool(dead.any()):
            streams = dead.nonzero().squeeze(1).tolist()
            for s in big:
                for b in streams:  # a reset or two per step; faster than index_fill_
                    s[b].zero_()
            rest = off & ~dead[:, None]
        share = rest.float().mean().item()
        if share > _GATHER_FOLD_MAX:  # many rows: one streaming multiply of the whole tensor beats gathering them
            factor = torch.where(rest, a, 1.0)[:, None, :, None]
            for s in big:
                s.mul_(factor)
        elif share > 0:
            _scale_rows_(big, rest, a)
    return a.masked_fill(off, 1)


def _scale_rows_(tensors: list[Tensor], rows: Tensor, factor: Tensor) -> None:
    """Multiply the rows (b, :, n, :) of each tensor (B, P, N, F) where ``rows`` (B, N) is true by ``factor[b, n]``, in
    place: an index_select, a multiply and an index_copy_ of those rows only."""
    b_idx, n_idx = rows.nonzero(as_tuple=True)
    f = factor[b_idx, n_idx]
    for s in tensors:
        _, p, n, width = s.shape
        flat = ((b_idx[:, None] * p + torch.arange(p, device=s.device)) * n + n_idx[:, None]).reshape(-1)
        view = s.view(-1, width)
        view.index_copy_(0, flat, view.index_select(0, flat).mul_(f.repeat_interleave(p)[:, None]))


def contract(lam: Tensor, s: Tensor) -> Tensor:
    """sum_b lam[b, n] * s[b, p, n, f] -> (P, N, F); for K > 1 components sum_{b,k} lam[b, k, n] * s[b, k, p, n, f].

    One batched matrix product over the (p, n) rows, (1 x B) times (B x F), reading s in place through a permuted view
    (no copy of s): one pass over s in a single parallel call, about 1.5x faster than a per-stream loop of in-place
    multiply-adds with one thread, and far faster with two on a busy machine (one parallel region instead of B)."""
    lam = lam.to(s.dtype)  # e.g. bfloat16 states under autocast, float32 sensitivities
    if s.dim() == 5:  # K > 1 components: the same contraction over the rows (b, k)
        return contract(lam.flatten(0, 1), s.flatten(0, 1))
    b, k, n, f = s.shape
    if f == 1 or b == 1:  # small: a broadcast multiply and a sum beat einsum's setup
        return (s * lam[:, None, :, None]).sum(0)
    rows = lam.t().unsqueeze(1).expand(n, k, b).transpose(0, 1).reshape(k * n, 1, b)  # (P*N, 1, B)
    return torch.bmm(rows, s.permute(1, 2, 0, 3).reshape(k * n, b, f)).view(k, n, f)


SMALL_CARRY = 1 << 16
"""Sensitivities of at most this many numbers in all are decayed where they lie, without a lazy scale: for a few
streams and units the scale's bookkeeping (its range checks, a block inverse per unit) costs more than the pass over
the tensors it saves (measured at B = 1, N = 64, D = 128: benchmarks/streaming.py)."""


def scales_lazily(device: torch.device) -> bool:
    """Whether the fully online step keeps a lazy scale on ``device``: on the CPU only.

    The scale saves one pass over the sensitivities per step, but its range checks and folds decide on the host which
    rows to fold, at every step. On a GPU that decision would wait for the device at every step (a host
    synchronisation, which stalls the queue of kernels), so there the step decays the sensitivities where they lie
    instead: two passes over them, and nothing read back to the host."""
    return device.type == "cpu"


def carry_in_place(
    tracked: list[Tracked],
    lin: Linearization,
    feats: Tensor,
    sens: dict[str, Tensor],
    scale: Tensor | None,
) -> tuple[dict[str, Tensor], Tensor | None]:
    """One step S_1 = jh * S_0 + I_1 written into the donated tensors (M = 1).

    Large carries are kept lazily scaled (:class:`~onlinerec.gradients.carry.Carry`): S = a * S~ with a per-stream,
    per-unit factor a (B, N). The decay is then a = jh * a, a multiply of (B, N) numbers, and the update one in-place
    multiply-add over S~, S~ += (I_1 / a): one read and one write of the sensitivities instead of two of each (decay,
    then outer product). Rows whose factor leaves [max^(-1/2), max^(1/2)] of the dtype (:func:`_scale_bounds`; a reset
    makes it 0) are folded into S~ first (an index pass over those rows only). Returns S~ and a. Units of K > 1
    components keep a K x K block per unit instead of a (:func:`_carry_blocks_in_place`). Carries of at most
    :data:`SMALL_CARRY` numbers that are not scaled already are decayed directly and stay unscaled (returns S and
    None). Off the CPU (:func:`scales_lazily`) every carry is decayed directly, a scaled one (from a CPU checkpoint)
    after its scale is folded in once."""
    dtype = next(iter(sens.values())).dtype
    if not scales_lazily(lin.jh.device):
        if scale is not None:
            fold_scale_(sens.values(), scale)
        return _carry_directly(tracked, lin, feats, sens, dtype, few_kernels=True), None
    if scale is None and sum(t.numel() for t in sens.values()) <= SMALL_CARRY:
        return _carry_directly(tracked, lin, feats, sens, dtype), None
    if lin.jh.dim() == 5:
        return _carry_blocks_in_place(tracked, lin, feats, sens, scale, dtype)
    with torch.autocast(lin.jh.device.type, enabled=False):
        lin.cast_(dtype)
        jh, d_gates, d_params, c_prev, d_mixed = lin.release()
        a = jh[0] if scale is None else jh[0] * scale.to(dtype)  # (B, N)
        a = _fold_out_of_range_(sens, a)
        inv = a.reciprocal()[:, None, :]  # (B, 1, N)
        _add_immediate(tracked, sens, feats, dtype, d_gates[0], d_params, c_prev, d_mixed, inv)
    return {tr.name: sens[tr.name] for tr in tracked}, a


class _OnlineState(torch.autograd.Function):
    """The new state c_1 (B, N), or (B, K, N), whose backward sends the gradient through dc/dgates into the gates and
    through the new sensitivities into the tracked parameters (sum_b dL/dc_1[b] . S_1[b])."""

    @staticmethod
    def forward(ctx, gates: Tensor, value: Tensor, d_gates: Tensor, n: int, *tensors: Tensor) -> Tensor:
        ctx.save_for_backward(d_gates, *tensors[:n])
        ctx.shapes = [p.shape for p in tensors[n:]]
        return value.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        d_gates, *sens = ctx.saved_tensors
        needs = ctx.needs_input_grad
        g_gates = None
        if needs[0]:  # (B, G, N): sum_k dL/dc_k dc_k/dgates
            g_gates = (grad.unsqueeze(2) * d_gates).sum(1) if d_gates.dim() == 4 else grad.unsqueeze(1) * d_gates
        needs_params = needs[4 + len(sens) :]
        grads = [
            contract(grad, s).reshape(shape) if need else None for s, shape, need in zip(sens, ctx.shapes, needs_params)
        ]
        return (g_gates, None, None, None, *([None] * len(sens)), *grads)


def online_step(
    cell: ElementwiseCell,
    tracked: list[Tracked],
    names: tuple[str, ...],
    params: dict[str, Tensor],
    feats: Tensor,
    keep: Tensor,
    c0: Tensor,
    sens: dict[str, Tensor],
    verify: Callable[[Tensor, Tensor, Linearization], None] | None = None,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """One fully online step (M = 1) of an element-wise cell with a small, unscaled, donated carry: features feats
    (1, B, F) (differentiable), keep (1, B), the carried state c0 and sensitivities ``sens`` (updated in place).
    Returns the new state (B, ...) whose backward gives every tracked parameter its exact RTRL gradient, the state's
    value, and the new sensitivities. ``verify(gates, value, lin)`` (RTRL's sampled check) sees the step's
    linearisation before the carry consumes it."""
    frozen = {tr.name: params[tr.name].detach() for tr in tracked}
    # the input projection with its parameters frozen: a graph to the features only
    weight, bias = frozen["input_proj.weight"], frozen.get("input_proj.bias")
    gates = F.linear(feats[0], weight, bias).unflatten(-1, (cell.num_gates, cell.hidden_size))  # (B, G, N)
    with torch.no_grad():
        g = gates.detach()
        if cell.num_components == 1:
            lin, value = Linearizer(cell, names, frozen, keep)(g.unsqueeze(0), (c0 * keep[0, :, None]).unsqueeze(0))
            value = None if value is None else value.reshape(c0.shape)
        else:
            c_prev = c0 * keep[0, :, None, None]
            local = local_derivatives(cell, "recurrence", {k: frozen[k] for k in names}, g, c_prev)
            jh = local.d_state * keep[0, :, None, None, None]
            lin = Linearization(jh[None], local.d_gates[None], {k: local.d_params[k][None] for k in names})
            value = local.value
        if value is None:
            with substituted(cell, frozen):
                value = cell.recurrence(g, c0 * keep[0].reshape(-1, *([1] * (c0.dim() - 1))))
        if verify is not None:
            verify(gates.unsqueeze(0), value, lin)
        d_gates = lin.d_gates[0]
        new_sens = _carry_directly(tracked, lin, feats, sens, next(iter(sens.values())).dtype)
    state = _OnlineState.apply(
        gates,
        value,
        d_gates,
        len(tracked),
        *[new_sens[tr.name] for tr in tracked],
        *[params[tr.name] for tr in tracked],
    )
    return state, value, new_sens


def _carry_directly(
    tracked: list[Tracked],
    lin: Linearization,
    feats: Tensor,
    sens: dict[str, Tensor],
    dtype: torch.dtype,
    few_kernels: bool = False,
) -> dict[str, Tensor]:
    """S_1 = J_1 S_0 + I_1 in place, unscaled: each sensitivity decayed by jh (a K x K block per unit for K > 1
    components), then the immediate part added. ``few_kernels`` (a large carry off the CPU): K x K blocks are applied
    by :func:`~onlinerec.gradients.carry.blocks_in_place_` in one group of streams, a few element-wise kernels with
    K - 1 components as the only temporary, instead of a batched matmul and its copies of the whole tensor."""
    with torch.autocast(lin.jh.device.type, enabled=False):
        lin.cast_(dtype)
        jh, d_gates, d_params, c_prev, d_mixed = lin.release()
        if jh.dim() == 5 and few_kernels:
            for tr in tracked:
                blocks_in_place_(sens[tr.name], jh[0], groups=1)
        elif jh.dim() == 5:  # (1, B, K, K, N): S_k <- sum_j J_kj S_j per unit, one batched matmul per tensor
            blocks = jh[0].permute(0, 3, 1, 2)  # (B, N, K, K)
            for tr in tracked:
                s = sens[tr.name]
                b, k, p, n, f = s.shape
                rows = s.permute(0, 3, 1, 2, 4).reshape(b, n, k, p * f)  # (B, N, K, P F)
                s.copy_(torch.matmul(blocks, rows).view(b, n, k, p, f).permute(0, 2, 3, 1, 4))
        else:
            decay = jh[0][:, None, :, None]  # (B, 1, N, 1)
            for tr in tracked:
                sens[tr.name].mul_(decay)
        _add_immediate(tracked, sens, feats, dtype, d_gates[0], d_params, c_prev, d_mixed, None)
    return {tr.name: sens[tr.name] for tr in tracked}


def _add_immediate(
    tracked: list[Tracked],
    sens: dict[str, Tensor],
    feats: Tensor,
    dtype: torch.dtype,
    d_gates: Tensor,
    d_params: dict[str, Tensor],
    c_prev: Tensor | None,
    d_mixed: Tensor | None,
    inv: Tensor | None,
) -> None:
    """S += I_1 / a in place: the step's own derivatives (dc/dgates x its inputs for a dense weight), divided by a lazy
    scale ``inv`` = 1 / a (B, 1, N), or undivided (None). K > 1 components: dc_k/dgates (B, K, G, N) on the same
    layout."""
    sources = {"input": feats.detach().to(dtype)[0], "state": None if c_prev is None else c_prev[0]}
    derivatives = {"gates": d_gates, "mixed": d_gates if d_mixed is None else d_mixed[0]}
    for tr in tracked:
        s = sens[tr.name]
        if tr.kind == "unit":
            d = d_params[tr.name][0].unsqueeze(-1)
            s.add_(d) if inv is None else s.addcmul_(d, inv.unsqueeze(-1))
        elif tr.kind == "bias":
            d = derivatives[tr.via].unsqueeze(-1)
            s.add_(d) if inv is None else s.addcmul_(d, inv.unsqueeze(-1))
        else:  # the outer product (dc/dgates / a) x u_1, added in place: the one pass over the big tensor
            x = sources[tr.source]  # (B, F)
            d = derivatives[tr.via] if inv is None else derivatives[tr.via] * inv
            s.addcmul_(d.unsqueeze(-1), x.reshape(x.shape[0], *([1] * (d.dim() - 1)), x.shape[-1]))


_BLOCK_CONDITION_MAX = 16.0
"""A unit's lazy K x K scale A is folded into S~ once ||A|| ||A^-1|| (Frobenius) exceeds this (K for a scaled
rotation such as the LRU's, which never folds for conditioning): S~ += A^-1 I loses about that factor of precision."""


def _block_inverse(a: Tensor) -> Tensor:
    """Per-unit inverses of blocks a (B, K, K, N); inf or nan where a block is singular (no error)."""
    if a.shape[1] == 2:
        p, q, r, s = a[:, 0, 0], a[:, 0, 1], a[:, 1, 0], a[:, 1, 1]
        det = p * s - q * r
        return torch.stack([torch.stack([s, -q], 1), torch.stack([-r, p], 1)], 1) / det[:, None, None]
    inv, info = torch.linalg.inv_ex(a.permute(0, 3, 1, 2))
    return inv.masked_fill((info != 0)[..., None, None], float("nan")).permute(0, 2, 3, 1)


def _fold_blocks_out_of_range_(sens: dict[str, Tensor], a: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_fold_out_of_range_` for K x K scales a (B, K, K, N): the units whose block has left the dtype's range
    (:func:`_scale_bounds`, by its Frobenius norm), is singular (a reset zeroes it) or is ill-conditioned
    (:data:`_BLOCK_CONDITION_MAX`) are folded into S~ (S~ <- a S~ on those rows) and get the identity. Returns the new
    scale and its inverse."""
    inv = _block_inverse(a)
    low, high = _scale_bounds(a.dtype)
    norm, inv_norm = a.square().sum((1, 2)).sqrt(), inv.square().sum((1, 2)).sqrt()  # (B, N)
    fine = (norm >= low) & (norm <= high) & (norm * inv_norm <= _BLOCK_CONDITION_MAX)  # false for nan and inf
    if bool(fine.all()):
        return a, inv
    # as for one component: fold past the middle of the range, so that folds come in fewer, larger batches
    off = ~((norm >= low**0.5) & (norm <= high**0.5) & (norm * inv_norm <= _BLOCK_CONDITION_MAX))
    dead = (a == 0).flatten(1).all(1)  # streams cut by a reset: their sensitivities restart from zero
    for b in dead.nonzero().squeeze(1).tolist():
        for s in sens.values():
            s[b].zero_()
    rest = off & ~dead[:, None]
    if bool(rest.any()):
        b_idx, n_idx = rest.nonzero(as_tuple=True)
        blocks = a[b_idx, :, :, n_idx]  # (R, K, K)
        for s in sens.values():
            rows = s[b_idx, :, :, n_idx]  # (R, K, P, F): the units' components, gathered
            s[b_idx, :, :, n_idx] = torch.einsum("rkj,rjpf->rkpf", blocks, rows)
    eye = torch.eye(a.shape[1], dtype=a.dtype, device=a.device)[None, :, :, None]
    mask = off[:, None, None, :]
    return torch.where(mask, eye, a), torch.where(mask, eye, inv)


def _carry_blocks_in_place(
    tracked: list[Tracked],
    lin: Linearization,
    feats: Tensor,
    sens: dict[str, Tensor],
    scale: Tensor | None,
    dtype: torch.dtype,
) -> tuple[dict[str, Tensor], Tensor]:
    """The fully online step for units of K > 1 components, lazily scaled by a K x K block per unit: S = A S~ (see
    :class:`~onlinerec.gradients.carry.Carry`). S_1 = J_1 S_0 + I_1 = A_1 (S~_0 + A_1^-1 I_1) with A_1 = J_1 A_0, so
    the decay is a product of (B, K, K, N) blocks and the update one in-place multiply-add over S~ of
    (A_1^-1 dc/dgates) x u_1: one read and one write of the sensitivities, and no copy of them (the out-of-place decay
    needs an eighth of them as a buffer)."""
    with torch.autocast(feats.device.type, enabled=False):
        lin.cast_(dtype)
        jh, d_gates, d_params, _, _ = lin.release()
        a = jh[0] if scale is None else block_mul(jh[0], scale.to(dtype))  # (B, K, K, N)
        a, inv = _fold_blocks_out_of_range_(sens, a)
        x = feats.detach().to(dtype)[0]  # (B, F)
        weighted = block_mul(inv, d_gates[0])  # (B, K, G, N): A^-1 dc/dgates
        for tr in tracked:
            s = sens[tr.name]
            if tr.kind == "unit":
                s.add_(block_mul(inv, d_params[tr.name][0]).unsqueeze(-1))
            elif tr.kind == "bias":
                s.add_(weighted.unsqueeze(-1))
            else:  # the outer product, added in place: the one pass over the big tensor
                s.view(*weighted.shape[:2], -1, s.shape[-1]).addcmul_(
                    weighted.flatten(2).unsqueeze(-1), x[:, None, None, :]
                )
    return {tr.name: sens[tr.name] for tr in tracked}, a


class DeferredCarry:
    """The new sensitivities of a donated segment (M > 1), computed once the old ones are no longer needed.

    The gradient of the segment reads S_0 in backward, so computing S_M during the forward pass keeps both alive (two
    sensitivity-sized tensors at the peak). Instead, the segment's local derivatives are kept (backward keeps them
    anyway) and S_M is written over S_0 in place right after backward has read S_0: one sensitivity-sized tensor at
    every moment. If the carry is read before that backward (``Carry.sensitivities``, a checkpoint, the next segment),
    S_M is computed out of place as usual and the later backward still finds S_0 intact. Either way the result is the
    same S_M = P(0,M) S_0 + sum_tau P(tau,M) I_tau, from ``batched_carry(tracked, lin, feats, sens0, in_place=...)``
    (the method's carry)."""

    def __init__(
        self, batched_carry: Callable[..., dict[str, Tensor]], tracked: list[Tracked], sens0: dict[str, Tensor]
    ) -> None:
        self.batched_carry, self.tracked, self.sens0 = batched_carry, tracked, sens0
        self.lin: Linearization | None = None
        self.feats: Tensor | None = None
        self.result: dict[str, Tensor] | None = None
        self.overwritten = False  # S_0 now holds S_M

    @property
    def done(self) -> bool:
        return self.result is not None

    def prepare(self, lin: Linearization, feats: Tensor) -> None:
        self.lin, self.feats = lin, feats

    def _compute(self, in_place: bool) -> dict[str, Tensor]:
        if self.result is None:
            with torch.no_grad():
                self.result = self.batched_carry(self.tracked, self.lin, self.feats, self.sens0, in_place=in_place)
            self.lin = self.feats = None
        return self.result

    def old_sensitivities_read(self) -> None:
        """Backward has used S_0: overwrite it with S_M (unless the carry was already read and computed)."""
        if self.lin is not None:
            self._compute(in_place=True)
            self.overwritten = True

    def materialize(self) -> dict[str, Tensor]:
        """S_M for a reader of the carry: out of place if backward has not read S_0 yet."""
        return self._compute(in_place=False)
