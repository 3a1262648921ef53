"""Local derivatives of a cell's element-wise recurrence, by automatic differentiation.

For an element-wise recurrence c = r(gates, c_prev; p), unit n of c reads only unit n of its inputs, so:
- one reverse-mode pass with a cotangent of ones yields dc/dc_prev (the diagonal Jacobian) and dc/dgates;
- one forward-mode pass per row k of a per-unit parameter p viewed as (K, N) yields dc/dp[k] per batch row.
:func:`check_elementwise` verifies that premise numerically before any of this is trusted.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp, vmap


class NotElementwiseError(TypeError):
    """A cell's recurrence mixes hidden units (or batch rows), so exact cheap RTRL does not apply."""


class _Bound(nn.Module):
    """Exposes one method of a cell as ``forward`` so that torch.func can swap its parameters."""

    def __init__(self, cell: nn.Module, method: str) -> None:
        super().__init__()
        self.cell = cell
        self.method = method

    def forward(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        return getattr(self.cell, self.method)(gates, c_prev)


@dataclass
class LocalDerivatives:
    """Derivatives of one element-wise update, for R rows (R = M*B when time is folded into the batch)."""

    d_state: Tensor  # (R, N): dc_n/dc_prev_n
    d_gates: Tensor  # (R, G, N): dc_n/dgates_{g,n}
    d_params: dict[str, Tensor]  # name -> (R, K, N): dc_n/dp_{k,n}


def _rows(p: Tensor, n: int) -> int:
    return p.numel() // n


def local_derivatives(
    cell: nn.Module, method: str, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor
) -> LocalDerivatives:
    """Derivatives of ``cell.<method>(gates, c_prev)`` at the given point; ``params`` are the per-unit
    parameters (name -> tensor, any shape ending in N) to differentiate. Inputs are treated as constants."""
    bound = _Bound(cell, method)
    n = c_prev.shape[-1]
    params = {k: v.detach() for k, v in params.items()}
    with torch.enable_grad():
        g = gates.detach().requires_grad_(True)
        c = c_prev.detach().requires_grad_(True)
        out = functional_call(bound, {f"cell.{k}": v for k, v in params.items()}, (g, c))
        d_gates, d_state = torch.autograd.grad(out, (g, c), torch.ones_like(out), allow_unused=True)
    d_gates = torch.zeros_like(gates) if d_gates is None else d_gates
    d_state = torch.zeros_like(c_prev) if d_state is None else d_state

    g0, c0 = gates.detach(), c_prev.detach()
    d_params = {}
    for name, p in params.items():
        k = _rows(p, n)
        tangents = torch.eye(k, dtype=p.dtype, device=p.device)[:, :, None].expand(k, k, n).reshape(k, *p.shape)

        def along(t: Tensor, name: str = name, p: Tensor = p) -> Tensor:
            call = lambda q: functional_call(bound, {f"cell.{name}": q}, (g0, c0))  # noqa: E731
            return jvp(call, (p,), (t,))[1]

        d_params[name] = vmap(along)(tangents).movedim(0, -2)  # (R, K, N)
    return LocalDerivatives(d_state, d_gates, d_params)


_CHECKED: weakref.WeakKeyDictionary[nn.Module, dict[str, tuple[str, ...]]] = weakref.WeakKeyDictionary()


def recurrence_parameters(cell: nn.Module, method: str, exclude: tuple[str, ...], num_gates: int, n: int) -> tuple[str, ...]:
    """Names of the parameters that ``cell.<method>`` reads, after checking (once per cell) that the
    method is element-wise in its state, its gates and each of those parameters.

    Raises:
        NotElementwiseError: naming the cell class and what mixes units.
    """
    cache = _CHECKED.setdefault(cell, {})
    if method in cache:
        return cache[method]
    names = check_elementwise(cell, method, exclude, num_gates, n)
    cache[method] = names
    return names


def check_elementwise(cell: nn.Module, method: str, exclude: tuple[str, ...], num_gates: int, n: int) -> tuple[str, ...]:
    """Probe ``cell.<method>`` at a random float64 point: for an element-wise map, a Jacobian-vector
    product with a random tangent equals the diagonal derivative times that tangent. Any map that mixes
    units or batch rows fails this with probability one."""
    cls = type(cell).__name__
    probe = copy.deepcopy(cell).double()
    bound = _Bound(probe, method)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # structure, not current values: a zero-initialised mixing matrix must not hide
        for p in probe.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    gates = torch.randn(3, num_gates, n, generator=gen, dtype=torch.float64)
    c_prev = torch.randn(3, n, generator=gen, dtype=torch.float64)
    candidates = {k: p for k, p in probe.named_parameters() if not k.startswith(exclude)}
    with torch.enable_grad():
        out = bound(gates.requires_grad_(True), c_prev)  # a gradient path even if no parameter is read
        if out.shape != c_prev.shape:
            raise ValueError(f"{cls}.{method} returned shape {tuple(out.shape)} for c_prev of shape {tuple(c_prev.shape)}; it must return the new state with c_prev's shape.")
        used = torch.autograd.grad(out.sum(), list(candidates.values()), allow_unused=True) if candidates else []
    names = tuple(k for (k, _), gr in zip(candidates.items(), used) if gr is not None)
    for k in names:
        if candidates[k].shape[-1] != n:
            raise NotElementwiseError(
                f"{cls}.{method} uses parameter {k!r} of shape {tuple(candidates[k].shape)}, but a per-unit parameter "
                f"must have shape (N,) or (K, N) with N = hidden_size = {n}. If it mixes hidden units, exact RTRL "
                "does not apply: train this cell with SnAPStrategy or TBPTTStrategy."
            )
    params = {k: candidates[k] for k in names}
    gates = gates.detach()
    local = local_derivatives(probe, method, params, gates, c_prev)

    def mismatch(what: str, expected: Tensor, actual: Tensor) -> None:
        if not torch.allclose(actual, expected, rtol=1e-9, atol=1e-9 * (1 + expected.abs().max().item())):
            raise NotElementwiseError(
                f"{cls}.{method} is not element-wise in {what}: unit n of the new state depends on other hidden "
                "units (or other batch rows). Exact RTRL needs a diagonal recurrent Jacobian; for a cell like this "
                "use SnAPStrategy (a diagonal approximation, for FullyRecurrentCell subclasses) or TBPTTStrategy."
            )

    frozen = {f"cell.{k}": v.detach() for k, v in params.items()}
    v = torch.randn(c_prev.shape, generator=gen, dtype=torch.float64)
    call_c = lambda c: functional_call(bound, frozen, (gates, c))  # noqa: E731
    mismatch("its previous state c_prev", local.d_state * v, jvp(call_c, (c_prev,), (v,))[1])
    vg = torch.randn(gates.shape, generator=gen, dtype=torch.float64)
    call_g = lambda g: functional_call(bound, frozen, (g, c_prev))  # noqa: E731
    mismatch("its gates", (local.d_gates * vg).sum(-2), jvp(call_g, (gates,), (vg,))[1])
    for k, p in params.items():
        t = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        call_p = lambda q, k=k: functional_call(bound, {**frozen, f"cell.{k}": q}, (gates, c_prev))  # noqa: E731
        expected = (local.d_params[k] * t.reshape(1, -1, n)).sum(-2)
        mismatch(f"parameter {k!r}", expected, jvp(call_p, (p.detach(),), (t,))[1])
    return names
