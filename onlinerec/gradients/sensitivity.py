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
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from onlinerec.cells.base import ElementwiseCell
from onlinerec.cells.stack import Stack
from onlinerec.gradients.base import GradientMethod, project, window_features
from onlinerec.gradients.carry import Carry
from onlinerec.gradients.derivatives import substituted
from onlinerec.gradients.scan import Linearization


@dataclass(frozen=True)
class Tracked:
    """A cell parameter that carries a sensitivity, viewed as (P, N, F) (see :class:`Carry`)."""

    name: str
    kind: Literal["weight", "bias", "unit"]
    source: Literal["input", "state", ""] = ""  # what a dense weight multiplies: window inputs or c_prev
    via: Literal["gates", "mixed"] = "gates"  # dense weights and biases: the input gates, or R c_prev + b_R


class _InjectSensitivity(torch.autograd.Function):
    """Identity on c_0 whose backward adds sum_b grad[b, n] * S[b, p, n, f] (K > 1: sum_{b,k} grad[b, k, n] *
    S[b, k, p, n, f]) to each parameter's gradient."""

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


def _inject(c: Tensor, sensitivities: list[Tensor], params: list[Tensor]) -> Tensor:
    """c itself, whose backward also adds sum_b dL/dc[b] . S[b] to the gradient of each matching parameter."""
    return _InjectSensitivity.apply(c, len(sensitivities), *sensitivities, *params)


def _contract(lam: Tensor, s: Tensor) -> Tensor:
    """sum_b lam[b, n] * s[b, p, n, f] -> (P, N, F); for K > 1 components sum_{b,k} lam[b, k, n] * s[b, k, p, n, f].

    On CPU a loop of in-place multiply-adds over b reads s once and keeps the (P, N, F) accumulator in cache; it is
    about 5x faster there than torch.einsum, which permutes s into a batched matmul."""
    lam = lam.to(s.dtype)  # e.g. bfloat16 states under autocast, float32 sensitivities
    if s.dim() == 5:  # K > 1 components: the same contraction over the rows (b, k)
        return _contract(lam.flatten(0, 1), s.flatten(0, 1))
    b, k, n, f = s.shape
    if s.device.type != "cpu" or f == 1 or b == 1:
        return torch.einsum("bn,bknf->knf", lam, s)
    out = s[0] * lam[0, :, None]
    for i in range(1, b):
        out.addcmul_(s[i], lam[i, :, None])
    return out


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
        if not isinstance(cell, Stack):
            self.unit_parameters(cell)

    def sensitivity_names(self, cell: ElementwiseCell) -> tuple[str, ...]:
        if isinstance(cell, Stack):  # named as in the stack's named_parameters ("layers.0.input_proj.weight")
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

    def _unroll(self, cell: ElementwiseCell, inputs: Tensor, reset: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        tracked = self.tracked(cell)
        params = dict(cell.named_parameters())
        missing = [tr.name for tr in tracked if tr.name not in carry.sensitivities]
        if missing:
            raise ValueError(
                f"the carry has no sensitivities for {missing}; it was not made by {type(self).__name__}.init_carry."
            )
        if inputs.shape[0] == 1 and self.exact_carry(cell):
            return self._unroll_one_step(cell, tracked, params, inputs, reset, carry)
        c0 = _inject(carry.c, [carry.sensitivities[tr.name] for tr in tracked], [params[tr.name] for tr in tracked])
        keep = (~reset).to(inputs.dtype)
        feats, window = window_features(cell, inputs, keep, carry.window)
        gates = project(cell, feats)
        states, lin = self.linearized_scan(cell, params, gates, c0, keep)
        del gates  # not needed any more; peak memory is reached in the carry below
        with torch.no_grad():
            new_sens = self._carry(tracked, lin, feats, carry.sensitivities)
        return states, Carry(c=states[-1].detach(), window=window, sensitivities=new_sens)

    def _unroll_one_step(self, cell, tracked, params, inputs, reset, carry) -> tuple[Tensor, Carry]:
        """M = 1 (fully online). With one step, the exact gradient of every tracked parameter is sum_b e_1[b] * S_1[b],
        e_1 = dL/dc_1 and S_1 the new carry, which already holds both the carried and the immediate part. So the
        step runs with the tracked parameters detached (the inputs still get their backprop gradient) and a
        read-out of S_1 adds the parameter gradients; the graph then does not keep the old sensitivities alive."""
        keep = (~reset).to(inputs.dtype)
        feats, window = window_features(cell, inputs, keep, carry.window)
        frozen = {tr.name: params[tr.name].detach() for tr in tracked}
        with substituted(cell, frozen):
            gates = project(cell, feats)
            states, lin = self.linearized_scan(cell, {**params, **frozen}, gates, carry.c, keep)
        del gates
        with torch.no_grad():
            new_sens = self._carry(tracked, lin, feats, carry.sensitivities)
        last = _inject(states[0], [new_sens[tr.name] for tr in tracked], [params[tr.name] for tr in tracked])
        return last.unsqueeze(0), Carry(c=states[0].detach(), window=window, sensitivities=new_sens)

    def _carry(
        self, tracked: list[Tracked], lin: Linearization, feats: Tensor, sens0: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """The new sensitivities, in the dtype of the old ones (under autocast the derivatives may be bfloat16)."""
        dtype = next(iter(sens0.values())).dtype
        with torch.autocast(lin.jh.device.type, enabled=False):
            lin.cast_(dtype)
            return self.propagate(tracked, lin, feats.detach().to(dtype), sens0)

    def propagate(
        self, tracked: list[Tracked], lin: Linearization, feats: Tensor, sens0: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """S_M = P(0,M) S_0 + sum_tau P(tau,M) I_tau, one batched matmul per dense weight.

        ``lin`` is released and each derivative dropped as soon as it has been used, so that peak memory stays low;
        each new sensitivity is allocated once (the matmul output) and the decayed S_0 is added into it in place.
        ``feats`` (M, B, F) are the window inputs that ``source="input"`` weights multiply."""
        jh, d_gates, d_params, c_prev, d_mixed = lin.release()
        sources = {"input": feats, "state": c_prev}
        if jh.dim() == 5:  # units of K > 1 components
            return _propagate_blocks(tracked, jh, d_gates, d_params, d_mixed, sources, sens0)
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
        weighted = {"gates": d_gates if m == 1 else p_rest.unsqueeze(2) * d_gates}  # (M, B, G, N)
        if d_mixed is not None:  # a fully recurrent cell whose R c_prev enters other than as gates + R c_prev
            weighted["mixed"] = d_mixed if m == 1 else p_rest.unsqueeze(2) * d_mixed
        del p_rest, d_gates, d_mixed
        for tr in tracked:
            if tr.kind == "bias":
                out[tr.name] = (
                    weighted.get(tr.via, weighted["gates"]).sum(0).unsqueeze(-1).addcmul_(sens0[tr.name], scale)
                )
        if m > 1:  # the matmul operand (B, G*N, M); a contiguous copy beats a strided operand or output
            weighted = {k: w.permute(1, 2, 3, 0).reshape(b, g * n, m) for k, w in weighted.items()}
        for tr in tracked:
            if tr.kind == "weight":
                s0 = sens0[tr.name]
                x = sources[tr.source].transpose(0, 1)  # (B, M, F)
                w = weighted.get(tr.via, weighted["gates"])
                if m == 1:  # an outer product; bmm with an inner size of 1 is slow
                    new = w[0].reshape(b, g * n, 1) * x
                else:
                    new = torch.bmm(w, x.contiguous())
                out[tr.name] = new.view(s0.shape).addcmul_(s0, scale)
        return {tr.name: out[tr.name] for tr in tracked}


# -- units of K > 1 components: K x K blocks per unit -----------------------------------------------------------------
def block_mul(a: Tensor, b: Tensor) -> Tensor:
    """Per-unit matrix products: a (..., K, K, N) times b (..., K, X, N) -> (..., K, X, N), sum_j a[k, j] b[j, x]."""
    return (a.unsqueeze(-2) * b.unsqueeze(-4)).sum(-3)


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


def _propagate_blocks(
    tracked: list[Tracked],
    jh: Tensor,
    d_gates: Tensor,
    d_params: dict[str, Tensor],
    d_mixed: Tensor | None,
    sources: dict[str, Tensor | None],
    sens0: dict[str, Tensor],
) -> dict[str, Tensor]:
    """:meth:`SensitivityMethod.propagate` for units of K > 1 components: S_M = P(0,M) S_0 + sum_tau P(tau,M) I_tau with
    P(tau,M) the product of the K x K blocks after tau, and still one batched matmul (B, K*G*N, M) x (B, M, F) per dense
    weight (docs/rtrl.md#multi-component-units)."""
    m, b, k, g, n = d_gates.shape
    p_rest, p_all = _block_products(jh)
    del jh
    out = {}
    for tr in tracked:
        if tr.kind == "unit":
            part = block_mul(p_rest, d_params[tr.name]).sum(0).unsqueeze(-1)  # (B, K, P, N, 1)
            out[tr.name] = _decay_into(part, sens0[tr.name], p_all)
    del d_params
    weighted = {"gates": block_mul(p_rest, d_gates)}  # (M, B, K, G, N)
    if d_mixed is not None:
        weighted["mixed"] = block_mul(p_rest, d_mixed)
    del p_rest, d_gates, d_mixed
    for tr in tracked:
        if tr.kind == "bias":
            part = weighted.get(tr.via, weighted["gates"]).sum(0).unsqueeze(-1)
            out[tr.name] = _decay_into(part, sens0[tr.name], p_all)
    weighted = {key: w.permute(1, 2, 3, 4, 0).reshape(b, k * g * n, m) for key, w in weighted.items()}
    for tr in tracked:
        if tr.kind == "weight":
            s0 = sens0[tr.name]
            x = sources[tr.source].transpose(0, 1)  # (B, M, F)
            w = weighted.get(tr.via, weighted["gates"])
            new = w * x if m == 1 else torch.bmm(w, x.contiguous())  # m == 1: an outer product
            out[tr.name] = _decay_into(new.view(s0.shape), s0, p_all)
    return {tr.name: out[tr.name] for tr in tracked}
