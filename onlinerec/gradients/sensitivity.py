"""What RTRL and SnAP share: carried sensitivities S = dc/dtheta, injected into autograd and propagated in a batch.

The gradient of a segment's loss is the within-segment backprop gradient plus sum_b lambda_0[b] . S_0[b], with
lambda_0 = dL/dc_0 and S_0 the carried sensitivities dc_0/dtheta. Starting the segment from a surrogate c_0 whose
value is the carried state and whose derivative is S_0 lets autograd produce that gradient, so optimizers,
clipping, AMP and DDP see an ordinary ``.grad``. The sensitivities are then carried to the segment end in one
batched matmul over time, S_M = P(0,M) S_0 + sum_tau P(tau,M) I_tau with P(tau,M) = prod_{s>tau} jh_s, instead of
M element-wise passes over a (B, G, N, D) tensor. The derivation is in docs/rtrl.md.

A :class:`SensitivityMethod` subclass supplies the Jacobian structure: which per-unit parameters it reads and which
cells it refuses (:meth:`~SensitivityMethod.unit_parameters`), which parameters carry a sensitivity
(:meth:`~SensitivityMethod.tracked`), the segment's states with their local derivatives
(:meth:`~SensitivityMethod.linearized_scan`) and whether the carry is exact (:meth:`~SensitivityMethod.exact_carry`).
The fully online step (M = 1) that updates a donated carry in place, lazily scaled, is in
:mod:`onlinerec.gradients.inplace`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from onlinerec.cells.base import ElementwiseCell
from onlinerec.cells.composite import CompositeCell
from onlinerec.gradients import inplace
from onlinerec.gradients.base import GradientMethod, project, window_features
from onlinerec.gradients.carry import Carry, blocks_in_place_
from onlinerec.gradients.derivatives import substituted
from onlinerec.gradients.fused import fused_online_step
from onlinerec.gradients.inplace import DeferredCarry, block_mul, carry_in_place, contract, online_step
from onlinerec.gradients.scan import SECOND_BACKWARD, Linearization, RecomputedBlocks


@dataclass(frozen=True)
class Tracked:
    """A cell parameter that carries a sensitivity, viewed as (P, N, F) (see :class:`Carry`)."""

    name: str
    kind: Literal["weight", "bias", "unit"]
    source: Literal["input", "state", ""] = ""  # what a dense weight multiplies: window inputs or c_prev
    via: Literal["gates", "mixed"] = "gates"  # dense weights and biases: the input gates, or R c_prev + b_R


class _InjectSensitivity(torch.autograd.Function):
    """Identity on c_0 whose backward adds sum_b grad[b, n] * S[b, p, n, f] (K > 1: sum_{b,k} grad[b, k, n] *
    S[b, k, p, n, f]) to each parameter's gradient; with a lazy ``scale`` a (B, N) (see :class:`Carry`), S = a * S~, or
    with K x K blocks A (B, K, K, N), S_k = sum_j A_kj S~_j."""

    @staticmethod
    def forward(ctx, c0: Tensor, n: int, scale: Tensor | None, after, *tensors: Tensor) -> Tensor:
        ctx.save_for_backward(*tensors[:n], *([] if scale is None else [scale]))
        ctx.n, ctx.shapes, ctx.after = n, [p.shape for p in tensors[n:]], after
        return c0.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        if ctx.after is not None and ctx.after.overwritten:
            raise RuntimeError(SECOND_BACKWARD)
        saved = ctx.saved_tensors  # raises if the sensitivities were updated in place since (the next step ran first)
        sens, scale = saved[: ctx.n], (saved[ctx.n] if len(saved) > ctx.n else None)
        needs = ctx.needs_input_grad[4 + ctx.n :]
        if scale is None:
            lam = grad
        elif scale.dim() == 4:  # K x K blocks A: sum_k grad_k (A S~)_k = sum_j (A^T grad)_j S~_j
            lam = (scale * grad.unsqueeze(2)).sum(1)
        else:
            lam = grad * scale
        grads = [contract(lam, s).reshape(shape) if need else None for s, shape, need in zip(sens, ctx.shapes, needs)]
        del saved, sens
        if ctx.after is not None:  # S_0 has been read: a deferred carry may now overwrite it
            ctx.after.old_sensitivities_read()
        return (grad, None, None, None, *([None] * ctx.n), *grads)


def _inject(
    c: Tensor,
    sensitivities: list[Tensor],
    params: list[Tensor],
    scale: Tensor | None = None,
    after: DeferredCarry | None = None,
) -> Tensor:
    """c itself, whose backward also adds sum_b dL/dc[b] . S[b] to the gradient of each matching parameter (and then
    tells ``after`` that S has been read)."""
    return _InjectSensitivity.apply(c, len(sensitivities), scale, after, *sensitivities, *params)


def _true_sensitivities(carry: Carry, donate: bool) -> dict[str, Tensor]:
    """dc/dtheta of a carry: its own tensors, folded in place if it is lazily scaled and donated, else computed."""
    if carry.scale is None or not donate:
        return carry.sensitivities
    return carry.fold_().sensitivities


def _exclusive_reverse_cumprod(jh: Tensor) -> tuple[Tensor, Tensor]:
    """P[t] = prod_{s>t} jh[s] (P[M-1] = 1) and prod_s jh[s], along dim 0.

    A loop of M small multiplies: torch.cumprod along a strided leading dimension is several times slower."""
    m = jh.shape[0]
    p = torch.empty_like(jh)
    p[m - 1] = 1
    for t in range(m - 1, 0, -1):
        torch.mul(p[t], jh[t], out=p[t - 1])
    return p, p[0] * jh[0]


class SensitivityMethod(GradientMethod):
    """A gradient method that carries c and sensitivities S = dc/dtheta across segment boundaries.

    The template: zero sensitivities in the :class:`Carry` layout, a surrogate c_0 that injects the carried ones,
    the subclass's :meth:`linearized_scan` over the segment, then the batched carry :meth:`propagate`. At M = 1
    with an exact carry the gradient is read off the new sensitivities instead (see :meth:`_unroll_one_step`).
    :meth:`propagate` takes each unit's Jacobian as a scalar (jh diagonal, K = 1) or, for units of K > 1 components,
    as a K x K block (docs/rtrl.md#multi-component-units).
    """

    supports_donation = True  # the fully online step updates a donated carry in place (see inplace.carry_in_place)

    # -- the Jacobian structure, supplied by subclasses -------------------------------------------
    @abstractmethod
    def unit_parameters(self, cell: ElementwiseCell) -> tuple[str, ...]:
        """Names of the per-unit parameters (shape (N,) or (K, N)) that the recurrence reads besides its dense
        projections. Raises NotElementwiseError, naming the cell and what to use instead, for a cell this method
        cannot train."""

    @abstractmethod
    def linearized_scan(
        self, cell: ElementwiseCell, params: dict[str, Tensor], gates: Tensor, c0: Tensor, keep: Tensor
    ) -> tuple[Tensor, Linearization]:
        """Run c_t = recurrence(gates_t, keep_t * c_{t-1}) from c0 over the segment: gates (M, B, G, N), keep (M, B).

        Returns the states (M, B, N), differentiable with respect to gates, c0 and the tensors in ``params``, and
        their detached local derivatives, with jh the diagonal along which the sensitivities decay (and
        ``c_prev`` filled in if a tracked weight has ``source="state"``). For units of K > 1 components c0 is
        (B, K, N), the states (M, B, K, N) and jh holds the per-unit K x K blocks."""

    def exact_carry(self, cell: ElementwiseCell) -> bool:
        """Whether the carried S is the true dc/dtheta for ``cell``; then M = 1 reads the gradient off it."""
        return False

    def tracked(self, cell: ElementwiseCell) -> list[Tracked]:
        """The parameters whose sensitivities are carried: the input projection and the per-unit parameters."""
        out = [Tracked("input_proj.weight", "weight", "input")]
        if cell.input_proj.bias is not None:
            out.append(Tracked("input_proj.bias", "bias"))
        return out + [Tracked(n, "unit") for n in self.unit_parameters(cell)]

    # -- the template -----------------------------------------------------------------------------
    def check_cell(self, cell: ElementwiseCell) -> None:
        super().check_cell(cell)  # for a stack: every layer
        if not isinstance(cell, CompositeCell):
            self.unit_parameters(cell)

    def sensitivity_names(self, cell: ElementwiseCell) -> tuple[str, ...]:
        if isinstance(cell, CompositeCell):  # named as in the stack's named_parameters ("layers.0.input_proj.weight")
            return tuple(
                f"layers.{i}.{k}" for i, layer in enumerate(cell.layers) for k in self.sensitivity_names(layer)
            )
        return tuple(tr.name for tr in self.tracked(cell))

    def _zero_sensitivities(self, cell, batch_size, device, dtype) -> dict[str, Tensor]:
        params = dict(cell.named_parameters())
        n = cell.hidden_size
        lead = (batch_size,) if cell.num_components == 1 else (batch_size, cell.num_components)
        out = {}
        for tr in self.tracked(cell):
            p = params[tr.name]
            shape = (*lead, cell.num_gates, n, p.shape[-1]) if tr.kind == "weight" else (*lead, p.numel() // n, n, 1)
            out[tr.name] = torch.zeros(shape, device=device, dtype=dtype)
        return out

    def _unroll(
        self, cell: ElementwiseCell, inputs: Tensor, reset: Tensor, carry: Carry, donate: bool = False
    ) -> tuple[Tensor, Carry]:
        tracked = self.tracked(cell)
        params = dict(cell.named_parameters())
        missing = [tr.name for tr in tracked if tr.name not in carry.sensitivity_names()]
        if missing:
            raise ValueError(
                f"the carry has no sensitivities for {missing}; it was not made by {type(self).__name__}.init_carry."
            )
        if inputs.shape[0] == 1 and self.exact_carry(cell):
            return self._unroll_one_step(cell, tracked, params, inputs, reset, carry, donate)
        sens0 = _true_sensitivities(carry, donate)
        deferred = DeferredCarry(self._carry, tracked, sens0) if donate and self._in_place_ok(sens0) else None
        c0 = _inject(carry.c, [sens0[tr.name] for tr in tracked], [params[tr.name] for tr in tracked], after=deferred)
        keep = (~reset).to(inputs.dtype)
        feats, window = window_features(cell, inputs, keep, carry.window)
        gates = project(cell, feats)
        states, lin = self.linearized_scan(cell, params, gates, c0, keep)
        del gates  # not needed any more; peak memory is reached in the carry below
        if deferred is None:
            with torch.no_grad():
                new_sens = self._carry(tracked, lin, feats, sens0)
            return states, Carry(c=states[-1].detach(), window=window, sensitivities=new_sens)
        deferred.prepare(lin, feats.detach())
        if not c0.requires_grad:  # no backward will read S_0 (no_grad, nothing to train): overwrite it now
            deferred.old_sensitivities_read()
            return states, Carry(c=states[-1].detach(), window=window, sensitivities=deferred.materialize())
        return states, Carry(c=states[-1].detach(), window=window, sensitivities=sens0, pending=deferred)

    def step(self, cell, inputs, reset, carry):
        """One donated step; for a cell with a fused step (:mod:`~onlinerec.gradients.fused`) and an exact, unscaled
        carry of its own, that step with only the checks it needs (it does not run the cell's recurrence, so there is
        nothing of the cell's to verify); otherwise :meth:`unroll`."""
        if (
            type(carry) is Carry
            and carry.window is None
            and self.exact_carry(cell)
            and isinstance(inputs, Tensor)
            and inputs.dim() == 2
            and inputs.shape[1] == cell.input_size
            and isinstance(reset, Tensor)
            and reset.dtype == torch.bool
            and tuple(reset.shape) == (inputs.shape[0],) == (carry.batch_size,)
        ):
            sens, scale = carry.raw_sensitivities()  # raises for a carry donated already
            if scale is None and self._in_place_ok(sens):
                keep = (~reset).to(inputs.dtype).unsqueeze(0)
                fused = fused_online_step(cell, dict(cell.named_parameters()), inputs.unsqueeze(0), keep, carry.c, sens)
                if fused is not None:
                    state, value, new_sens = fused
                    carry._give_up()
                    return state, Carry(c=value, sensitivities=new_sens)
        return super().step(cell, inputs, reset, carry)

    def _unroll_one_step(self, cell, tracked, params, inputs, reset, carry, donate=False) -> tuple[Tensor, Carry]:
        """M = 1 (fully online). With one step, the exact gradient of every tracked parameter is sum_b e_1[b] * S_1[b],
        e_1 = dL/dc_1 and S_1 the new carry, which already holds both the carried and the immediate part. So the
        step runs with the tracked parameters detached (the inputs still get their backprop gradient) and a
        read-out of S_1 adds the parameter gradients; the graph then does not keep the old sensitivities alive.
        With ``donate`` the old sensitivities become the new ones in place, lazily scaled on the CPU
        (:func:`~onlinerec.gradients.inplace.carry_in_place`; by a K x K block per unit for K > 1 components; on other
        devices decayed where they lie)."""
        keep = (~reset).to(inputs.dtype)
        feats, window = window_features(cell, inputs, keep, carry.window)
        if donate and self._online_ok(tracked, carry):  # a small carry: the lean step (inplace.online_step)
            sens = carry.raw_sensitivities()[0]
            check = self.step_check(cell, tracked, params, carry.c, keep)
            # a cell with a fused step (gradients/fused.py) takes it on the steps that are not verified
            fused = None if check is not None else fused_online_step(cell, params, feats, keep, carry.c, sens)
            if fused is None:
                names = tuple(tr.name for tr in tracked if tr.kind == "unit")
                fused = online_step(cell, tracked, names, params, feats, keep, carry.c, sens, check)
            state, value, new_sens = fused
            return state.unsqueeze(0), Carry(c=value, window=window, sensitivities=new_sens)
        frozen = {tr.name: params[tr.name].detach() for tr in tracked}
        with substituted(cell, frozen):
            gates = project(cell, feats)
            states, lin = self.linearized_scan(cell, {**params, **frozen}, gates, carry.c, keep)
        del gates
        scale = None
        with torch.no_grad():
            sens, old_scale = carry.raw_sensitivities()
            if donate and self._in_place_ok(sens, lin):
                new_sens, scale = carry_in_place(tracked, lin, feats, sens, old_scale)
            elif (
                donate and old_scale is None and self._in_place_ok(sens)
            ):  # fully recurrent: S_1 = J_1 S_0 + I_1 in place
                new_sens = self._carry(tracked, lin, feats, sens, in_place=True)
            else:
                new_sens = self._carry(tracked, lin, feats, _true_sensitivities(carry, donate))
        last = _inject(states[0], [new_sens[tr.name] for tr in tracked], [params[tr.name] for tr in tracked], scale)
        return last.unsqueeze(0), Carry(c=states[0].detach(), window=window, sensitivities=new_sens, scale=scale)

    def _online_ok(self, tracked: list[Tracked], carry: Carry) -> bool:
        """Whether a donated M = 1 step takes :func:`~onlinerec.gradients.inplace.online_step`: an unscaled carry of at
        most :data:`~onlinerec.gradients.inplace.SMALL_CARRY` numbers that can be updated in place, and no dense
        weight on the state."""
        sens, scale = carry.raw_sensitivities()
        return (
            scale is None
            and all(tr.source != "state" and tr.via == "gates" for tr in tracked)
            and sum(t.numel() for t in sens.values()) <= inplace.SMALL_CARRY
            and self._in_place_ok(sens)
        )

    def step_check(
        self, cell: ElementwiseCell, tracked: list[Tracked], params: dict[str, Tensor], c0: Tensor, keep: Tensor
    ) -> Callable[[Tensor, Tensor, Linearization], None] | None:
        """A check of this fully online step's linearisation (RTRL's sampled verification), or None."""
        return None

    def _in_place_ok(self, sens: dict[str, Tensor], lin: Linearization | None = None) -> bool:
        """Whether a donated carry can be updated in place: the batched :meth:`propagate` (a subclass with its own,
        e.g. the stepwise reference, keeps it), plain contiguous tensors of one dtype that autograd does not track,
        and, for the fully online step (given its ``lin``), no dense weight on the state (units of K > 1 components
        are then scaled by K x K blocks; a fully recurrent cell takes the in-place propagate)."""
        if type(self).propagate is not SensitivityMethod.propagate:
            return False
        if lin is not None and lin.jh.dim() == 5 and (lin.c_prev is not None or lin.d_mixed is not None):
            return False
        if len({s.dtype for s in sens.values()}) != 1:
            return False
        inference = torch.is_inference_mode_enabled()
        return all(
            s.is_contiguous() and not s.requires_grad and (inference or not s.is_inference()) for s in sens.values()
        )

    def _carry(
        self, tracked: list[Tracked], lin: Linearization, feats: Tensor, sens0: dict[str, Tensor], in_place=False
    ) -> dict[str, Tensor]:
        """The new sensitivities, in the dtype of the old ones (under autocast the derivatives may be bfloat16);
        ``in_place`` writes them over ``sens0`` (the batched :meth:`propagate` only)."""
        dtype = next(iter(sens0.values())).dtype
        with torch.autocast(feats.device.type, enabled=False):
            lin.cast_(dtype)
            extra = {"in_place": True} if in_place else {}
            return self.propagate(tracked, lin, feats.detach().to(dtype), sens0, **extra)

    def propagate(
        self,
        tracked: list[Tracked],
        lin: Linearization,
        feats: Tensor,
        sens0: dict[str, Tensor],
        in_place: bool = False,
    ) -> dict[str, Tensor]:
        """S_M = P(0,M) S_0 + sum_tau P(tau,M) I_tau, one batched matmul per dense weight.

        ``lin`` is released and each derivative dropped as soon as it has been used, so that peak memory stays low.
        Out of place, each new sensitivity is allocated once (the matmul output) and the decayed S_0 is added into it;
        ``in_place`` decays S_0 where it lies and accumulates the matmul into it (no sensitivity-sized allocation).
        ``feats`` (M, B, F) are the window inputs that ``source="input"`` weights multiply."""
        if isinstance(lin, RecomputedBlocks):
            return _propagate_recomputed(tracked, lin, feats, sens0, in_place)
        jh, d_gates, d_params, c_prev, d_mixed = lin.release()
        sources = {"input": feats, "state": c_prev}
        if jh.dim() == 5:  # units of K > 1 components
            return _propagate_blocks(tracked, jh, d_gates, d_params, d_mixed, sources, sens0, in_place)
        m, b, g, n = d_gates.shape
        p_rest, p_all = _exclusive_reverse_cumprod(jh)
        del jh
        scale = p_all[:, None, :, None]
        out = {}
        # small sensitivities first, so that their temporaries are gone before the big ones are allocated
        decay = _Decay(lambda new, s0: new.addcmul_(s0, scale), (lambda s0: s0.mul_(scale)) if in_place else None)
        for tr in tracked:
            if tr.kind == "unit":
                part = d_params[tr.name] if m == 1 else p_rest.unsqueeze(2) * d_params[tr.name]
                out[tr.name] = _plus_decayed(part.sum(0).unsqueeze(-1), sens0[tr.name], decay)
        del d_params
        weighted = {"gates": d_gates if m == 1 else p_rest.unsqueeze(2) * d_gates}  # (M, B, G, N)
        if d_mixed is not None:  # a fully recurrent cell whose R c_prev enters other than as gates + R c_prev
            weighted["mixed"] = d_mixed if m == 1 else p_rest.unsqueeze(2) * d_mixed
        del p_rest, d_gates, d_mixed
        for tr in tracked:
            if tr.kind == "bias":
                part = weighted.get(tr.via, weighted["gates"]).sum(0).unsqueeze(-1)
                out[tr.name] = _plus_decayed(part, sens0[tr.name], decay)
        weighted = {k: w.permute(1, 2, 3, 0).reshape(b, g * n, m) for k, w in weighted.items()}
        for tr in tracked:
            if tr.kind == "weight":
                x = sources[tr.source].transpose(0, 1)  # (B, M, F)
                w = weighted.get(tr.via, weighted["gates"])
                out[tr.name] = _plus_matmul(w, x, sens0[tr.name], decay)
        return {tr.name: out[tr.name] for tr in tracked}


@dataclass(frozen=True)
class _Decay:
    """S_0 -> P(0,M) S_0 for the carry: added into a new tensor (``add_into(new, s0)``, returns new), or applied where
    S_0 lies (``apply_(s0)``, returns s0; None when the carry is computed out of place)."""

    add_into: Callable[[Tensor, Tensor], Tensor]
    apply_: Callable[[Tensor], Tensor] | None


def _plus_decayed(part: Tensor, s0: Tensor, decay: _Decay) -> Tensor:
    """part + P(0,M) S_0: written into part, or (in place) into S_0."""
    return decay.add_into(part, s0) if decay.apply_ is None else decay.apply_(s0).add_(part)


def _plus_matmul(w: Tensor, x: Tensor, s0: Tensor, decay: _Decay) -> Tensor:
    """w @ x + P(0,M) S_0 for a dense weight: w (B, R, M), x (B, M, F) and S_0 viewed as (B, R, F). In place the
    product is accumulated into the decayed S_0 by the matmul itself (no product-sized temporary)."""
    b, r, m = w.shape
    if decay.apply_ is None:
        new = w * x if m == 1 else torch.bmm(w, x.contiguous())  # m == 1: an outer product (bmm is slow there)
        return decay.add_into(new.view(s0.shape), s0)
    flat = decay.apply_(s0).view(b, r, -1)
    if m == 1:
        flat.addcmul_(w, x)
    else:
        flat.baddbmm_(w, x.contiguous())
    return s0


# -- units of K > 1 components: K x K blocks per unit -----------------------------------------------------------------
def _block_products(jh: Tensor) -> tuple[Tensor, Tensor]:
    """P[t] = J[M-1] ... J[t+1] (P[M-1] = I) and P[0] J[0], per stream and unit: jh (M, B, K, K, N)."""
    m = jh.shape[0]
    p = torch.empty_like(jh)
    p[m - 1] = 0
    p[m - 1].diagonal(dim1=1, dim2=2).fill_(1)
    for t in range(m - 1, 0, -1):
        p[t - 1] = block_mul(p[t], jh[t])
    return p, block_mul(p[0], jh[0])


def _decay_into(new: Tensor, s0: Tensor, p_all: Tensor) -> Tensor:
    """new += P(0,M) S_0 per unit, in place: new and s0 (B, K, X, N, F), p_all (B, K, K, N). K^2 multiply-adds."""
    k = p_all.shape[1]
    for i in range(k):
        for j in range(k):
            new[:, i].addcmul_(s0[:, j], p_all[:, i, j, None, :, None])
    return new


def _weighted_blocks(p_rest: Tensor, d: Tensor, out: Tensor | None = None) -> Tensor:
    """sum_j P(tau,M)[k, j] d_tau[j] as a (B, K, X, N, M) view of an (M, B, K, X, N) tensor (``out`` if given): p_rest
    (M, B, K, K, N), d (M, B, K, X, N). K^2 multiply-adds of (M, B, X, N) each, with no temporary of the product's size.
    Written in d's own layout (5x faster than writing with M innermost); the matmul reads the view at the same speed."""
    m, b, k, x, n = d.shape
    if out is None:
        out = torch.empty(m, b, k, x, n, dtype=d.dtype, device=d.device)
    for i in range(k):
        torch.mul(d[:, :, 0], p_rest[:, :, i, 0, None, :], out=out[:, :, i])
        for j in range(1, k):
            out[:, :, i].addcmul_(d[:, :, j], p_rest[:, :, i, j, None, :])
    return out.permute(1, 2, 3, 4, 0)


def _propagate_blocks(
    tracked: list[Tracked],
    jh: Tensor,
    d_gates: Tensor,
    d_params: dict[str, Tensor],
    d_mixed: Tensor | None,
    sources: dict[str, Tensor | None],
    sens0: dict[str, Tensor],
    in_place: bool = False,
) -> dict[str, Tensor]:
    """:meth:`SensitivityMethod.propagate` for units of K > 1 components: S_M = P(0,M) S_0 + sum_tau P(tau,M) I_tau with
    P(tau,M) the product of the K x K blocks after tau, and still one batched matmul (B, K*G*N, M) x (B, M, F) per dense
    weight (docs/rtrl.md#multi-component-units)."""
    p_rest, p_all = _block_products(jh)
    del jh
    unit_parts = {
        tr.name: _weighted_blocks(p_rest, d_params.pop(tr.name)).sum(-1, keepdim=True)
        for tr in tracked
        if tr.kind == "unit"
    }
    weighted = {"gates": _weighted_blocks(p_rest, d_gates)}  # (B, K, G, N, M)
    del d_gates
    if d_mixed is not None:
        weighted["mixed"] = _weighted_blocks(p_rest, d_mixed)
    del p_rest, d_mixed
    return _blocks_carry(tracked, unit_parts, weighted, sources, sens0, p_all, in_place)


def _blocks_carry(
    tracked: list[Tracked],
    unit_parts: dict[str, Tensor],
    weighted: dict[str, Tensor],
    sources: dict[str, Tensor | None],
    sens0: dict[str, Tensor],
    p_all: Tensor,
    in_place: bool,
) -> dict[str, Tensor]:
    """S_M = P(0,M) S_0 + sum_tau P(tau,M) I_tau for units of K > 1 components, from the weighted derivatives: per-unit
    parameters' sums ``unit_parts`` (B, K, P, N, 1), ``weighted`` dc/dgates (and dc/d(mixed)) as (B, K, G, N, M) views,
    and P(0,M) = ``p_all`` (B, K, K, N); one batched matmul (B, K*G*N, M) x (B, M, F) per dense weight."""
    decay = _Decay(
        lambda new, s0: _decay_into(new, s0, p_all), (lambda s0: blocks_in_place_(s0, p_all)) if in_place else None
    )
    out = {name: _plus_decayed(part, sens0[name], decay) for name, part in unit_parts.items()}
    for tr in tracked:
        if tr.kind == "bias":
            part = weighted.get(tr.via, weighted["gates"]).sum(-1).unsqueeze(-1)
            out[tr.name] = _plus_decayed(part, sens0[tr.name], decay)
    b, k, g, n, m = weighted["gates"].shape
    flat = {key: w.reshape(b, k * g * n, m) for key, w in weighted.items()}  # still views
    for tr in tracked:
        if tr.kind == "weight":
            x = sources[tr.source].transpose(0, 1)  # (B, M, F)
            out[tr.name] = _plus_matmul(flat.get(tr.via, flat["gates"]), x, sens0[tr.name], decay)
    return {tr.name: out[tr.name] for tr in tracked}


def _propagate_recomputed(
    tracked: list[Tracked], blocks: RecomputedBlocks, feats: Tensor, sens0: dict[str, Tensor], in_place: bool
) -> dict[str, Tensor]:
    """:func:`_propagate_blocks` from derivatives recomputed a chunk of steps at a time (last chunk first), so that no
    (M, ...) tensor of them is ever whole: the products P(tau,M) come from a running (B, K, K, N) product, and the only
    segment-sized tensor is the weighted dc/dgates (M, B, K, G, N) that the one matmul per dense weight reads. Same
    result as :func:`_propagate_blocks`; in place, the gates and states are let go of before the matmul."""
    m = blocks.steps
    b, k, n = blocks.c0.shape
    g = blocks.gates.shape[2]
    dtype = next(iter(sens0.values())).dtype
    running = torch.zeros(b, k, k, n, dtype=dtype, device=feats.device)  # P(t1 - 1, M): I at the last step
    running.diagonal(dim1=1, dim2=2).fill_(1)
    weighted = torch.empty(m, b, k, g, n, dtype=dtype, device=feats.device)
    unit_parts: dict[str, Tensor] = {}
    for t0, t1, d in blocks.chunks(reverse=True):
        p_rest = torch.empty_like(d.jh)
        for t in range(t1 - t0 - 1, -1, -1):
            p_rest[t] = running
            running = block_mul(running, d.jh[t])
        for tr in tracked:
            if tr.kind == "unit":
                part = _weighted_blocks(p_rest, d.d_params[tr.name]).sum(-1, keepdim=True)  # (B, K, P, N, 1)
                unit_parts[tr.name] = part if tr.name not in unit_parts else unit_parts[tr.name].add_(part)
        _weighted_blocks(p_rest, d.d_gates, out=weighted[t0:t1])
        del d, p_rest
    if in_place:  # S_0 is overwritten, so no backward can run through this segment any more
        blocks.discard()
    view = weighted.permute(1, 2, 3, 4, 0)  # (B, K, G, N, M)
    return _blocks_carry(tracked, unit_parts, {"gates": view}, {"input": feats}, sens0, running, in_place)
