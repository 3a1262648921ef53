"""Local derivatives of a cell's element-wise recurrence, by automatic differentiation.

For an element-wise recurrence c = r(gates, c_prev; p), unit n of c reads only unit n of its inputs, so:
- one reverse-mode pass with a cotangent of ones yields dc/dc_prev (the diagonal Jacobian) and dc/dgates;
- one forward-mode pass per row k of a per-unit parameter p viewed as (P, N) yields dc/dp[k] per batch row.
:func:`check_elementwise` verifies that premise (structurally, by tracing the ops, and numerically at several scales)
before any of this is trusted, and :func:`verify_linearization` checks it again on live states (RTRL's ``verify``).

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
import math
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp, vmap

from onlinerec.cells.base import ElementwiseCell, call_checked
from onlinerec.gradients.structure import structural_violation


class NotElementwiseError(TypeError):
    """A cell's recurrence mixes hidden units (or batch rows), so exact cheap RTRL does not apply."""


class ClosedFormMismatchError(ValueError):
    """A cell's closed-form :meth:`~onlinerec.cells.ElementwiseCell.recurrence_derivatives` disagrees with automatic
    differentiation of its recurrence, so it is not used (it would train with wrong gradients)."""


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
    and method, and forward mode otherwise; a cell's own closed form when it has one and
    :func:`recurrence_parameters` has checked it. c_prev is (R, N), or (R, K, N) for units of K > 1 components."""
    if _CLOSED.get(cell, {}).get(method, False):
        return _closed_form(cell, params, gates, c_prev)
    if c_prev.dim() in (2, 3) and _FAST.get(cell, {}).get(method, False):
        return _reverse_per_row(cell, method, params, gates, c_prev)
    return _forward_mode(cell, method, params, gates, c_prev)


def has_closed_form(cell: nn.Module, method: str = "recurrence") -> bool:
    """Whether ``cell``'s local derivatives come from its own checked closed form (``recurrence_derivatives``; known
    once :func:`recurrence_parameters` has run for it)."""
    return _CLOSED.get(cell, {}).get(method, False)


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


def _forward_per_row(
    cell: nn.Module, method: str, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor
) -> tuple[Tensor, Tensor, dict[str, Tensor], Tensor]:
    """Under grad mode: ``method`` on leaf copies of gates and c_prev with the parameters copied per row (R = the
    leading dim), so one backward pass gives every row its own parameter derivative. Returns (g, c, rows, out)."""
    r = c_prev.shape[0]
    g = gates.detach().requires_grad_(True)
    c = c_prev.detach().requires_grad_(True)
    rows = {k: v.detach().expand(r, *v.shape).requires_grad_(True) for k, v in params.items()}
    with substituted(cell, rows):
        out = getattr(cell, method)(g, c)
    if out.shape != c_prev.shape:
        raise ValueError(
            f"{type(cell).__name__}.{method} returned shape {tuple(out.shape)} for c_prev of shape {tuple(c_prev.shape)}."
        )
    return g, c, rows, out


def _reverse_per_row(
    cell: nn.Module, method: str, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor
) -> LocalDerivatives:
    """One forward and one backward pass: rows (R, G, N) gates, (R, N) c_prev, parameters copied per row.
    (K backward passes for c_prev (R, K, N).)"""
    if c_prev.dim() == 3:
        return _reverse_per_row_blocks(cell, method, params, gates, c_prev)
    r, n = c_prev.shape
    with torch.enable_grad():
        g, c, rows, out = _forward_per_row(cell, method, params, gates, c_prev)
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
        g, c, rows, out = _forward_per_row(cell, method, params, gates, c_prev)
        d_gates, d_state, *d_rows = _component_grads(out, (g, c, *rows.values()))
    d_params = {name: d.reshape(r, k, -1, n) for name, d in zip(rows, d_rows)}
    return LocalDerivatives(d_state, d_gates, d_params, out.detach())


def _closed_form(cell: nn.Module, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor) -> LocalDerivatives | None:
    """The cell's own :meth:`recurrence_derivatives`, as :class:`LocalDerivatives` (None if it has none)."""
    found = cell.recurrence_derivatives(gates, c_prev, params)
    if found is None:
        return None
    value, d_state, d_gates, d_params = found
    return LocalDerivatives(d_state, d_gates, dict(d_params), value)


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
_CLOSED: weakref.WeakKeyDictionary[nn.Module, dict[str, bool]] = weakref.WeakKeyDictionary()
"""Cells whose closed-form derivatives (``recurrence_derivatives``) have been checked against autodiff."""
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
    _CLOSED.setdefault(cell, {})[method] = method == "recurrence" and _closed_form_matches(
        cell, names, num_gates, n, components
    )
    _GATE_WEIGHTS.setdefault(cell, {})[method] = (
        _find_gate_weights(cell, method, names, num_gates, n) if components == 1 else None
    )
    cache[method] = names
    return names


def _state(rows: int, n: int, components: int, gen: torch.Generator, device: torch.device | None = None) -> Tensor:
    shape = (rows, n) if components == 1 else (rows, components, n)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(device or "cpu")


def _find_gate_weights(
    cell: nn.Module, method: str, names: tuple[str, ...], num_gates: int, n: int
) -> dict[str, tuple[int, ...]] | None:
    probe = copy.deepcopy(cell).double()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in probe.parameters():
            p.add_(0.3 * _randn(p.shape, gen, p.device))
    params = dict(probe.named_parameters())
    params = {k: params[k] for k in names}
    gates = _randn((5, num_gates, n), gen, _device(probe))
    c_prev = _randn((5, n), gen, _device(probe))
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
    probe, params, gen = _perturbed_probe(cell, names, seed=1)
    taken = {1, num_gates, n, components} | {p.numel() // n for p in params.values()}
    r = next(k for k in range(3, 10**6) if k not in taken)
    gates = _randn((r, num_gates, n), gen, _device(probe))
    c_prev = _state(r, n, components, gen, _device(probe))
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


def _closed_form_matches(cell: nn.Module, names: tuple[str, ...], num_gates: int, n: int, components: int) -> bool:
    """Whether the cell has a closed form of its local derivatives (``recurrence_derivatives``), after checking it
    against forward-mode autodiff (and the state against ``recurrence``) at a float64 probe with perturbed parameters,
    at two probe scales.

    Raises:
        ClosedFormMismatchError: naming the cell, the derivative that differs and by how much.
    """
    own = getattr(type(cell), "recurrence_derivatives", None)
    if own is None or own is ElementwiseCell.recurrence_derivatives:  # not overridden: nothing to probe
        return False
    probe, params, gen = _perturbed_probe(cell, names, seed=2)
    params = {k: v.detach() for k, v in params.items()}
    cls = type(cell).__name__
    for scale in (0.5, 3.0):
        r = 5
        gates = scale * _randn((r, num_gates, n), gen, _device(probe))
        c_prev = scale * _state(r, n, components, gen, _device(probe))
        with torch.no_grad():
            closed = _closed_form(probe, params, gates, c_prev)
        if closed is None:
            return False
        auto = _forward_mode(probe, "recurrence", params, gates, c_prev)
        with torch.no_grad():
            value = probe.recurrence(gates, c_prev)
        pairs = [("the new state", value, closed.value), ("dc/dc_prev", auto.d_state, closed.d_state)]
        pairs += [("dc/dgates", auto.d_gates, closed.d_gates)]
        pairs += [(f"dc/d{k}", auto.d_params[k], closed.d_params.get(k)) for k in names]
        for what, expected, got in pairs:
            wrong = got is None or got.shape != expected.shape
            err = None if wrong else _mismatch(expected, got, 1e-9)
            if wrong or err is not None:
                detail = (
                    f"shape {None if got is None else tuple(got.shape)} where {tuple(expected.shape)} is expected"
                    if wrong
                    else f"a relative error of {err:.2g}"
                )
                raise ClosedFormMismatchError(
                    f"{cls}.recurrence_derivatives disagrees with automatic differentiation of {cls}.recurrence: "
                    f"{what} has {detail} (float64 probe, rows of random states and gates scaled by {scale}). Fix the "
                    f"closed form, or delete the override: the derivatives then come from autodiff of recurrence."
                )
    return True


def _perturbed_probe(
    cell: nn.Module, names: tuple[str, ...], seed: int
) -> tuple[nn.Module, dict[str, Tensor], torch.Generator]:
    """A float64 copy of the cell with randomly perturbed parameters (structure, not current values, as in
    check_elementwise), its per-unit parameters ``names``, and the generator to draw probe points from."""
    probe = copy.deepcopy(cell).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in probe.parameters():
            p.add_(0.3 * _randn(p.shape, gen, p.device))
    params = dict(probe.named_parameters())
    return probe, {k: params[k] for k in names}, gen


PROBE_SCALES = (0.1, 1.0, 4.0, 16.0)
"""The numeric probe runs at states and gates scaled by each of these, so that a recurrence that mixes units only in
some region of its state (|c| > 2, say) is seen wherever that region is (docs/custom_cell.md)."""

_ADVICE = (
    "Exact RTRL needs a diagonal recurrent Jacobian (one K x K block per unit for units of K components); for a cell "
    "like this use SnAPStrategy (a diagonal approximation, for FullyRecurrentCell subclasses) or TBPTTStrategy."
)


def _device(module: nn.Module) -> torch.device:
    return next((t.device for t in module.parameters()), torch.device("cpu"))


def _randn(shape: tuple[int, ...], gen: torch.Generator, device: torch.device) -> Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(device)


def _mismatch(expected: Tensor, actual: Tensor, tol: float, scale: float | None = None) -> float | None:
    """How far ``actual`` is from ``expected`` relative to ``scale`` (default: 1 + their largest magnitude), if more
    than ``tol``; else None. Non-finite entries (a probe point where the recurrence overflows) are left out."""
    diff = (actual - expected).abs().amax().item()
    top = max(expected.abs().amax().item(), actual.abs().amax().item()) if expected.numel() else 0.0
    if not (math.isfinite(diff) and math.isfinite(top)):
        finite = expected.isfinite() & actual.isfinite()
        if not bool(finite.any()):
            return None
        return _mismatch(expected[finite], actual[finite], tol, scale)
    scale = 1 + top if scale is None else max(scale, top)
    return None if diff <= tol * scale else diff / max(scale, 1e-300)


def check_elementwise(
    cell: nn.Module, method: str, exclude: tuple[str, ...], num_gates: int, n: int, components: int = 1
) -> tuple[str, ...]:
    """Check that ``cell.<method>`` is element-wise per unit (with K = ``components`` > 1: per unit of K numbers, which
    it may mix), in three ways, on a float64 copy with perturbed parameters:

    1. the contract (:func:`~onlinerec.cells.base.call_checked`): enough gates, inputs left unchanged, the new state of
       c_prev's shape; every parameter it reads is per unit, of shape (N,) or (P, N);
    2. structurally (:func:`~onlinerec.gradients.structure.structural_violation`, unless the cell sets
       ``structural_check = False``): traced op by op, no value moves between units or batch rows, whichever branch
       of a ``torch.where`` is taken;
    3. numerically, at random points with states and gates scaled by each of :data:`PROBE_SCALES`: a Jacobian-vector
       product with a random tangent equals the diagonal derivative (each unit's K x K block) times that tangent.

    Returns the names of the per-unit parameters it reads.

    Raises:
        NotElementwiseError: naming the cell class, what mixes units and what to use instead.
        ValueError, IndexError: a broken contract (wrong output shape, an input changed in place, a forgotten
            ``num_gates``), naming the cell and the fix.
    """
    cls = type(cell).__name__
    where = f"{cls}.{method}"
    probe = copy.deepcopy(cell).double()
    device = _device(probe)
    bound = _Bound(probe, method)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # structure, not current values: a zero-initialised mixing matrix must not hide
        for p in probe.parameters():
            p.add_(0.3 * _randn(p.shape, gen, device))
    rows = next(r for r in range(3, 100) if r not in (num_gates, n, components))
    gates = _randn((rows, num_gates, n), gen, device)
    c_prev = _randn((rows, n) if components == 1 else (rows, components, n), gen, device)
    call_checked(probe, gates, c_prev, method)
    candidates = {k: p for k, p in probe.named_parameters() if not k.startswith(exclude)}
    with torch.enable_grad():
        out = bound(gates.clone().requires_grad_(True), c_prev)  # a gradient path even if no parameter is read
        used = torch.autograd.grad(out.sum(), list(candidates.values()), allow_unused=True) if candidates else []
    names = tuple(k for (k, _), gr in zip(candidates.items(), used) if gr is not None)
    for k in names:
        shape = tuple(candidates[k].shape)
        if not shape:
            raise NotElementwiseError(
                f"{where} reads the parameter {k!r} of shape () (one number shared by all units). A parameter that "
                f"the recurrence reads must be per unit, of shape (N,) or (P, N) with N = hidden_size = {n}, because "
                f"RTRL carries its sensitivity per unit: give every unit its own copy, nn.Parameter(torch.full(({n},), "
                "value)); keep a number that is not trained as a Python float or a buffer (register_buffer); or "
                "train this cell with TBPTTStrategy."
            )
        if shape[-1] != n:
            raise NotElementwiseError(
                f"{where} uses parameter {k!r} of shape {shape}, but a per-unit parameter "
                f"must have shape (N,) or (K, N) with N = hidden_size = {n}. If it mixes hidden units, exact RTRL "
                "does not apply: train this cell with SnAPStrategy or TBPTTStrategy."
            )
    params = {k: candidates[k] for k in names}
    if getattr(cell, "structural_check", True):
        plain = {k: p.detach().clone() for k, p in params.items()}
        with substituted(probe, plain):
            why = structural_violation(lambda g, c: getattr(probe, method)(g, c), gates, c_prev, plain)
        if why is not None:
            unknown = "structural check" in why  # an op the trace cannot follow, rather than a proven mixing
            raise NotElementwiseError(
                f"{where} is not element-wise: it {why}. {_ADVICE}"
                + (
                    f" If you know that it is element-wise, set `structural_check = False` on {cls}: RTRL then "
                    "relies on the numeric probes and its runtime verification."
                    if unknown
                    else ""
                )
            )
    frozen = {f"cell.{k}": v.detach() for k, v in params.items()}
    blocks = components > 1  # d_state (R, K, K, N), d_gates (R, K, G, N): contract the input axis
    for scale in PROBE_SCALES:  # at scale 1 each input on its own; elsewhere all at once, apart only to name a culprit
        g_s, c_s = gates * scale, c_prev * scale
        local = _forward_mode(probe, method, params, g_s, c_s)
        at = "" if scale == 1.0 else f" (with states and gates scaled x{scale:g})"
        tangents = {"c": _randn(c_s.shape, gen, device), "g": _randn(g_s.shape, gen, device)}
        tangents |= {k: _randn(p.shape, gen, device) for k, p in params.items()}
        if blocks:
            expected_c = (local.d_state * tangents["c"].unsqueeze(1)).sum(2)
            expected_g = (local.d_gates * tangents["g"].unsqueeze(1)).sum(2)
        else:
            expected_c, expected_g = local.d_state * tangents["c"], (local.d_gates * tangents["g"]).sum(-2)
        parts = {"its previous state c_prev": ("c", expected_c), "its gates": ("g", expected_g)}
        parts |= {f"parameter {k!r}": (k, (local.d_params[k] * tangents[k].reshape(1, -1, n)).sum(-2)) for k in params}

        def call(g: Tensor, c: Tensor, *ps: Tensor) -> Tensor:
            return functional_call(bound, {**frozen, **{f"cell.{k}": q for k, q in zip(params, ps)}}, (g, c))

        primals = (g_s, c_s, *(p.detach() for p in params.values()))
        order = ["g", "c", *params]

        def actual(only: str | None) -> Tensor:
            chosen = tuple(tangents[k] if only in (None, k) else torch.zeros_like(x) for k, x in zip(order, primals))
            return jvp(call, primals, chosen)[1]

        joint_ok = _mismatch(sum(e for _, e in parts.values()), actual(None), 1e-9) is None
        if joint_ok and scale != 1.0:
            continue
        culprits = [
            what for what, (key, expected) in parts.items() if _mismatch(expected, actual(key), 1e-9) is not None
        ]
        if culprits or not joint_ok:
            raise NotElementwiseError(
                f"{where} is not element-wise in {culprits[0] if culprits else 'its inputs'}{at}: unit n of the new "
                f"state depends on other hidden units (or other batch rows). {_ADVICE}"
            )
    return names


def verify_linearization(
    cell: nn.Module,
    names: tuple[str, ...],
    params: dict[str, Tensor],
    gates: Tensor,
    c_prev: Tensor,
    keep: Tensor,
    jh: Tensor,
    d_gates: Tensor,
    d_params: dict[str, Tensor],
    *,
    where: str,
    seed: int = 0,
) -> None:
    """Check the derivatives a scan used, on live states: one vector-Jacobian product of ``cell.recurrence`` with a
    random cotangent u (one reverse pass, cheaper than a forward-mode one in eager PyTorch) against what the diagonal
    derivatives (K x K blocks) predict, for c_prev, the gates and the per-unit parameters. A recurrence that mixes
    units (or rows) at these states fails it: the gradient of unit m's input then collects u_n J_nm from some n != m.

    Shapes: steps T and streams B, gates (T, B, G, N), c_prev (T, B, N) or (T, B, K, N) after the reset mask, keep
    (T, B), and jh, d_gates, d_params as in :class:`~onlinerec.gradients.scan.Linearization` (jh masked by keep).

    Raises:
        NotElementwiseError: naming the cell, the segment and step (``where``), and what to do.
    """
    t, b = keep.shape
    blocks = c_prev.dim() == 4
    work = torch.promote_types(c_prev.dtype, torch.float32)
    gen = torch.Generator().manual_seed(seed)
    rows = lambda x: x.detach().reshape(t * b, *x.shape[2:]).to(work)  # noqa: E731
    r = t * b
    device = c_prev.device
    # A cotangent that varies along rows and along units (and components) at the cost of two small random vectors:
    # a map that mixes units or rows still fails the check with probability one.
    lead = torch.randn(r, generator=gen, dtype=work).to(device)
    inner = torch.randn(tuple(c_prev.shape[2:]), generator=gen, dtype=work).to(device)
    u = lead.reshape(r, *([1] * inner.dim())) * inner
    kept = keep.detach().reshape(r, *([1] * inner.dim())).to(work)
    with torch.enable_grad(), torch.autocast(device.type, enabled=False):
        g = rows(gates).requires_grad_(True)
        c = rows(c_prev).requires_grad_(True)
        ps = {k: params[k].detach().to(work).requires_grad_(True) for k in names}
        with substituted(cell, ps):
            out = cell.recurrence(g, c)
        got = torch.autograd.grad(out, (g, c, *ps.values()), u, allow_unused=True)
    got = [torch.zeros_like(x) if y is None else y for x, y in zip((g, c, *ps.values()), got)]
    with torch.no_grad():
        j, dg = rows(jh), rows(d_gates)
        if blocks:  # j (R, K, K, N), dg (R, K, G, N), d_params (R, K, P, N): contract the output component k
            parts = [(dg * u.unsqueeze(2)).sum(1), (j * u.unsqueeze(2)).sum(1)]
            parts += [(rows(d_params[k]) * u.unsqueeze(2)).sum(1) for k in names]
        else:  # j (R, N), dg (R, G, N), d_params (R, P, N)
            parts = [dg * u.unsqueeze(1), j * u] + [rows(d_params[k]) * u.unsqueeze(1) for k in names]
        expected = [parts[0], parts[1]] + [p.sum(0).reshape(ps[k].shape) for p, k in zip(parts[2:], names)]
        scales = [parts[0].abs().amax().item(), parts[1].abs().amax().item()]
        scales += [p.abs().sum(0).amax().item() for p in parts[2:]]  # rounding grows with the sum over rows
        got[1] = got[1] * kept  # jh is zero where a reset cuts the stream
    # The scan's own precision sets the tolerance: its inputs' dtypes, or autocast's when it ran under autocast.
    dtypes = [x.dtype for x in (gates, c_prev, jh, d_gates) if x.dtype.is_floating_point]
    if torch.is_autocast_enabled(device.type):
        dtypes.append(torch.get_autocast_dtype(device.type))
    tol = max(1e-8, min(0.05, 1000 * max(torch.finfo(d).eps for d in dtypes)))
    errors = [_mismatch(e, a, tol, sc) for e, a, sc in zip(expected, got, scales)]
    err = max((e for e in errors if e is not None), default=None)
    if err is not None:
        if _CLOSED.get(cell, {}).get("recurrence", False):
            raise ClosedFormMismatchError(
                f"{type(cell).__name__}.recurrence_derivatives disagrees with automatic differentiation of "
                f"{type(cell).__name__}.recurrence on live states ({where}): a vector-Jacobian product differs from "
                f"what the closed form predicts by {err:.2g} (relative; tolerance {tol:.0e}), though it matched at "
                "the float64 probe. Fix the closed form for states like these, or delete the override: the "
                "derivatives then come from autodiff of recurrence."
            )
        raise NotElementwiseError(
            f"{type(cell).__name__}.recurrence mixed hidden units (or batch rows) on live states ({where}): a "
            f"vector-Jacobian product of the recurrence differs from what its diagonal derivatives predict by "
            f"{err:.2g} (relative; tolerance {tol:.0e}). The cell passed RTRL's structural and numeric checks, so "
            "its mixing depends on values that these did not see (a decision made outside torch, e.g. with .tolist() "
            "or NumPy, or a region of the state the probes did not reach), and RTRL's gradient would be wrong. Make "
            "the recurrence element-wise for every state, or train this cell with TBPTTStrategy (or, written as a "
            "FullyRecurrentCell, with SnAPStrategy)."
        )
