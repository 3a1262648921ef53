"""Local derivatives of a cell's element-wise recurrence, by automatic differentiation.

For an element-wise recurrence c = r(gates, c_prev; p), unit n of c reads only unit n of its inputs, so:
- one reverse-mode pass with a cotangent of ones yields dc/dc_prev (the diagonal Jacobian) and dc/dgates;
- one forward-mode pass per row k of a per-unit parameter p viewed as (P, N) yields dc/dp[k] per batch row.
:func:`check_elementwise` verifies that premise numerically before any of this is trusted.

Units of K > 1 components (state (R, K, N)) take K reverse passes instead of one, with the cotangent of ones on one
component at a time: pass j yields row j of each unit's K x K Jacobian block, dc_j/dgates and dc_j/dp.

Fast path: when the recurrence broadcasts a per-unit parameter against its row dimension (every built-in
cell does), calling it with one copy of the parameter per row, shape (R, *p.shape), makes the same reverse
pass yield dc/dp per row too, so one forward and one backward give everything. Whether a cell's recurrence
allows this is tested once per cell, against the forward-mode result, by :func:`recurrence_parameters`;
cells that fail the test keep the forward-mode path.
"""

from __future__ import annotations

import copy
import weakref
from contextlib import contextmanager
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
    """Derivatives of one element-wise update, for R rows (R = M*B when time is folded into the batch).

    Shapes for K = 1; with K > 1 components per unit each gains a leading component axis k of the output (dc_k) after
    R, and d_state is the per-unit block (R, K, K, N): d_state[r, k, j, n] = dc_{k,n}/dc_prev_{j,n}."""

    d_state: Tensor  # (R, N): dc_n/dc_prev_n
    d_gates: Tensor  # (R, G, N): dc_n/dgates_{g,n}
    d_params: dict[str, Tensor]  # name -> (R, P, N): dc_n/dp_{k,n}
    value: Tensor | None = None  # (R, N): the new state itself (the fast path returns it for free)


def _rows(p: Tensor, n: int) -> int:
    return p.numel() // n


def local_derivatives(
    cell: nn.Module, method: str, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor
) -> LocalDerivatives:
    """Derivatives of ``cell.<method>(gates, c_prev)`` at the given point; ``params`` are the per-unit
    parameters (name -> tensor, any shape ending in N) to differentiate. Inputs are treated as constants.

    Uses the one-pass reverse-mode path when :func:`recurrence_parameters` has validated it for this cell
    and method, and forward mode otherwise. c_prev is (R, N), or (R, K, N) for units of K > 1 components."""
    if c_prev.dim() in (2, 3) and _FAST.get(cell, {}).get(method, False):
        return _reverse_per_row(cell, method, params, gates, c_prev)
    return _forward_mode(cell, method, params, gates, c_prev)


def _component_grads(out: Tensor, inputs: tuple[Tensor, ...]) -> list[Tensor]:
    """For a state (R, K, N): the gradient of each component's sum with respect to each input, stacked along a new
    axis 1, i.e. (R, K, *input.shape[1:]) per input (K reverse passes; zeros where an input is unused)."""
    k = out.shape[1]
    rows = []
    for j in range(k):
        cotangent = torch.zeros_like(out)
        cotangent[:, j] = 1
        if out.requires_grad:
            rows.append(torch.autograd.grad(out, inputs, cotangent, retain_graph=j < k - 1, allow_unused=True))
        else:
            rows.append([None] * len(inputs))
    return [
        torch.stack([torch.zeros_like(x) if r[i] is None else r[i] for r in rows], dim=1) for i, x in enumerate(inputs)
    ]


def _owner(cell: nn.Module, name: str) -> tuple[nn.Module, str]:
    *path, attr = name.split(".")
    module = cell
    for part in path:
        module = getattr(module, part)
    return module, attr


@contextmanager
def substituted(cell: nn.Module, values: dict[str, Tensor]):
    """Within the block, ``cell`` reads the given tensors instead of its registered parameters.

    ``values`` maps parameter names (as in ``named_parameters``) to plain tensors of any shape that the cell's
    code accepts, e.g. detached copies or one copy per row. Cheaper than ``torch.func.functional_call``, which
    rebuilds the module's parameter dict on every call; the parameters are put back even if the block raises.
    """
    saved = []
    try:
        for name, value in values.items():
            module, attr = _owner(cell, name)
            saved.append((module, attr, module._parameters[attr]))
            module._parameters[attr] = value
        yield
    finally:
        for module, attr, old in reversed(saved):
            module._parameters[attr] = old


def _reverse_per_row(
    cell: nn.Module, method: str, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor
) -> LocalDerivatives:
    """One forward and one backward pass: rows (R, G, N) gates, (R, N) c_prev, parameters copied per row.
    (K backward passes for c_prev (R, K, N).)"""
    if c_prev.dim() == 3:
        return _reverse_per_row_blocks(cell, method, params, gates, c_prev)
    r, n = c_prev.shape
    with torch.enable_grad():
        g = gates.detach().requires_grad_(True)
        c = c_prev.detach().requires_grad_(True)
        rows = {k: v.detach().expand(r, *v.shape).requires_grad_(True) for k, v in params.items()}
        with substituted(cell, rows):
            out = getattr(cell, method)(g, c)
        if out.shape != c_prev.shape:
            raise ValueError(
                f"{type(cell).__name__}.{method} returned shape {tuple(out.shape)} for c_prev of shape {tuple(c_prev.shape)}."
            )
        inputs = (g, c, *rows.values())
        grads = (
            torch.autograd.grad(out, inputs, torch.ones_like(out), allow_unused=True)
            if out.requires_grad
            else [None] * len(inputs)
        )
    d_gates, d_state, *d_rows = (torch.zeros_like(x) if gr is None else gr for x, gr in zip(inputs, grads))
    d_params = {k: d.reshape(r, -1, n) for k, d in zip(rows, d_rows)}
    return LocalDerivatives(d_state, d_gates, d_params, out.detach())


def _reverse_per_row_blocks(
    cell: nn.Module, method: str, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor
) -> LocalDerivatives:
    """:func:`_reverse_per_row` for units of K > 1 components: one forward pass, K backward passes."""
    r, k, n = c_prev.shape
    with torch.enable_grad():
        g = gates.detach().requires_grad_(True)
        c = c_prev.detach().requires_grad_(True)
        rows = {name: v.detach().expand(r, *v.shape).requires_grad_(True) for name, v in params.items()}
        with substituted(cell, rows):
            out = getattr(cell, method)(g, c)
        if out.shape != c_prev.shape:
            raise ValueError(
                f"{type(cell).__name__}.{method} returned shape {tuple(out.shape)} for c_prev of shape {tuple(c_prev.shape)}."
            )
        d_gates, d_state, *d_rows = _component_grads(out, (g, c, *rows.values()))
    d_params = {name: d.reshape(r, k, -1, n) for name, d in zip(rows, d_rows)}
    return LocalDerivatives(d_state, d_gates, d_params, out.detach())


def _forward_mode(
    cell: nn.Module, method: str, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor
) -> LocalDerivatives:
    """The general path: reverse mode for state and gates (K passes for K > 1 components), one forward-mode pass per
    parameter row."""
    bound = _Bound(cell, method)
    n = c_prev.shape[-1]
    params = {k: v.detach() for k, v in params.items()}
    with torch.enable_grad():
        g = gates.detach().requires_grad_(True)
        c = c_prev.detach().requires_grad_(True)
        out = functional_call(bound, {f"cell.{k}": v for k, v in params.items()}, (g, c))
        if c_prev.dim() == 3 and out.shape == c_prev.shape:
            d_gates, d_state = _component_grads(out, (g, c))
        else:
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

        d_params[name] = vmap(along)(tangents).movedim(0, -2)  # (R, P, N), or (R, K, P, N)
    return LocalDerivatives(d_state, d_gates, d_params)


_CHECKED: weakref.WeakKeyDictionary[nn.Module, dict[str, tuple[str, ...]]] = weakref.WeakKeyDictionary()
_FAST: weakref.WeakKeyDictionary[nn.Module, dict[str, bool]] = weakref.WeakKeyDictionary()
_GATE_WEIGHTS: weakref.WeakKeyDictionary[nn.Module, dict[str, dict[str, tuple[int, ...]] | None]] = (
    weakref.WeakKeyDictionary()
)


def gate_weight_map(cell: nn.Module, method: str) -> dict[str, tuple[int, ...]] | None:
    """For a checked cell of one component per unit: if every per-unit parameter p of ``cell.<method>`` is a diagonal
    recurrent weight
    on gates, i.e. dc/dp[k] = dc/dgates[g_k] * c_prev for each row k (the eLSTM's w_z, w_f, the SRU's v_f:
    ``gates[g] + p[k] * c_prev``), the gate index g_k of each row, by parameter name; otherwise None.

    Then dc/dp never needs to be stored: it is a product of dc/dgates and c_prev. Established numerically
    by :func:`recurrence_parameters` at a random float64 point (with perturbed parameters)."""
    return _GATE_WEIGHTS.get(cell, {}).get(method)


def recurrence_parameters(
    cell: nn.Module, method: str, exclude: tuple[str, ...], num_gates: int, n: int, components: int = 1
) -> tuple[str, ...]:
    """Names of the parameters that ``cell.<method>`` reads, after checking (once per cell) that the
    method is element-wise in its state, its gates and each of those parameters (per unit of ``components``
    numbers: a unit may mix its own components).

    Raises:
        NotElementwiseError: naming the cell class and what mixes units.
    """
    cache = _CHECKED.setdefault(cell, {})
    if method in cache:
        return cache[method]
    names = check_elementwise(cell, method, exclude, num_gates, n, components)
    _FAST.setdefault(cell, {})[method] = _per_row_matches(cell, method, names, num_gates, n, components)
    _GATE_WEIGHTS.setdefault(cell, {})[method] = (
        _find_gate_weights(cell, method, names, num_gates, n) if components == 1 else None
    )
    cache[method] = names
    return names


def _state(rows: int, n: int, components: int, gen: torch.Generator) -> Tensor:
    shape = (rows, n) if components == 1 else (rows, components, n)
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _find_gate_weights(
    cell: nn.Module, method: str, names: tuple[str, ...], num_gates: int, n: int
) -> dict[str, tuple[int, ...]] | None:
    probe = copy.deepcopy(cell).double()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in probe.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    params = dict(probe.named_parameters())
    params = {k: params[k] for k in names}
    gates = torch.randn(5, num_gates, n, generator=gen, dtype=torch.float64)
    c_prev = torch.randn(5, n, generator=gen, dtype=torch.float64)
    try:
        local = _forward_mode(probe, method, params, gates, c_prev)
    except Exception:  # noqa: BLE001 - no map, the general path is used
        return None
    out = {}
    for k, d in local.d_params.items():
        rows = []
        for row in d.unbind(1):  # (R, N) for each row of the parameter viewed as (K, N)
            match = [
                g for g in range(num_gates) if torch.allclose(row, local.d_gates[:, g] * c_prev, rtol=1e-12, atol=1e-12)
            ]
            if not match or not row.abs().max() > 0:
                return None
            rows.append(match[0])
        out[k] = tuple(rows)
    return out


def _per_row_matches(
    cell: nn.Module, method: str, names: tuple[str, ...], num_gates: int, n: int, components: int = 1
) -> bool:
    """Whether the one-pass path gives the forward-mode derivatives for this cell (float64 probe).

    The probe uses a row count that equals no other dimension, so a parameter copy whose row dimension
    broadcasts against anything but the rows shows up as an error or a mismatch."""
    probe = copy.deepcopy(cell).double()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # structure, not current values (as in check_elementwise)
        for p in probe.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    params = dict(probe.named_parameters())
    params = {k: params[k] for k in names}
    taken = {1, num_gates, n, components} | {p.numel() // n for p in params.values()}
    r = next(k for k in range(3, 10**6) if k not in taken)
    gates = torch.randn(r, num_gates, n, generator=gen, dtype=torch.float64)
    c_prev = _state(r, n, components, gen)
    try:
        fast = _reverse_per_row(probe, method, params, gates, c_prev)
    except Exception:  # noqa: BLE001 - any failure just means "use the general path"
        return False
    slow = _forward_mode(probe, method, params, gates, c_prev)
    close = lambda a, b: a.shape == b.shape and torch.allclose(a, b, rtol=1e-12, atol=1e-12)  # noqa: E731
    with torch.no_grad():
        value = getattr(probe, method)(gates, c_prev)
    return (
        close(fast.d_state, slow.d_state)
        and close(fast.d_gates, slow.d_gates)
        and all(close(fast.d_params[k], slow.d_params[k]) for k in names)
        and close(fast.value, value)
    )


def check_elementwise(
    cell: nn.Module, method: str, exclude: tuple[str, ...], num_gates: int, n: int, components: int = 1
) -> tuple[str, ...]:
    """Probe ``cell.<method>`` at a random float64 point: for an element-wise map, a Jacobian-vector
    product with a random tangent equals the diagonal derivative times that tangent (with K = ``components`` > 1,
    each unit's K x K block times the tangent's K components of that unit). Any map that mixes units or batch rows
    fails this with probability one."""
    cls = type(cell).__name__
    probe = copy.deepcopy(cell).double()
    bound = _Bound(probe, method)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # structure, not current values: a zero-initialised mixing matrix must not hide
        for p in probe.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    gates = torch.randn(3, num_gates, n, generator=gen, dtype=torch.float64)
    c_prev = _state(3, n, components, gen)
    candidates = {k: p for k, p in probe.named_parameters() if not k.startswith(exclude)}
    with torch.enable_grad():
        out = bound(gates.requires_grad_(True), c_prev)  # a gradient path even if no parameter is read
        if out.shape != c_prev.shape:
            raise ValueError(
                f"{cls}.{method} returned shape {tuple(out.shape)} for c_prev of shape {tuple(c_prev.shape)}; it must return the new state with c_prev's shape."
            )
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
    local = _forward_mode(probe, method, params, gates, c_prev)

    def mismatch(what: str, expected: Tensor, actual: Tensor) -> None:
        if not torch.allclose(actual, expected, rtol=1e-9, atol=1e-9 * (1 + expected.abs().max().item())):
            raise NotElementwiseError(
                f"{cls}.{method} is not element-wise in {what}: unit n of the new state depends on other hidden "
                "units (or other batch rows). Exact RTRL needs a diagonal recurrent Jacobian (one K x K block per unit "
                "for units of K components); for a cell like this "
                "use SnAPStrategy (a diagonal approximation, for FullyRecurrentCell subclasses) or TBPTTStrategy."
            )

    frozen = {f"cell.{k}": v.detach() for k, v in params.items()}
    v = torch.randn(c_prev.shape, generator=gen, dtype=torch.float64)
    call_c = lambda c: functional_call(bound, frozen, (gates, c))  # noqa: E731
    blocks = components > 1  # d_state (R, K, K, N), d_gates (R, K, G, N): contract the input axis
    expected_c = (local.d_state * v.unsqueeze(1)).sum(2) if blocks else local.d_state * v
    mismatch("its previous state c_prev", expected_c, jvp(call_c, (c_prev,), (v,))[1])
    vg = torch.randn(gates.shape, generator=gen, dtype=torch.float64)
    call_g = lambda g: functional_call(bound, frozen, (g, c_prev))  # noqa: E731
    expected_g = (local.d_gates * vg.unsqueeze(1)).sum(2) if blocks else (local.d_gates * vg).sum(-2)
    mismatch("its gates", expected_g, jvp(call_g, (gates,), (vg,))[1])
    for k, p in params.items():
        t = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        call_p = lambda q, k=k: functional_call(bound, {**frozen, f"cell.{k}": q}, (gates, c_prev))  # noqa: E731
        expected = (local.d_params[k] * t.reshape(1, -1, n)).sum(-2)
        mismatch(f"parameter {k!r}", expected, jvp(call_p, (p.detach(),), (t,))[1])
    return names
