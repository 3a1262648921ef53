"""Local derivatives of a cell's element-wise recurrence, by automatic differentiation or a checked closed form.

For an element-wise recurrence c = r(gates, c_prev; p), unit n of c reads only unit n of its inputs, so:
- one reverse-mode pass with a cotangent of ones yields dc/dc_prev (the diagonal Jacobian) and dc/dgates;
- one forward-mode pass per row k of a per-unit parameter p viewed as (P, N) yields dc/dp[k] per batch row.
The element-wise check (:mod:`onlinerec.gradients.elementwise`) verifies that premise before any of this is trusted.

Units of K > 1 components (state (R, K, N)) take K reverse passes instead of one, with the cotangent of ones on one
component at a time: pass j yields row j of each unit's K x K Jacobian block, dc_j/dgates and dc_j/dp.

Fast path: when the recurrence broadcasts a per-unit parameter against its row dimension (every built-in
cell does), calling it with one copy of the parameter per row, shape (R, *p.shape), makes the same reverse
pass yield dc/dp per row too, so one forward and one backward give everything. Whether a cell's recurrence
allows this is tested once per cell, against the forward-mode result, by :func:`choose_paths`, which also checks a
cell's closed form (``recurrence_derivatives``) against autodiff; cells that fail the test keep the forward-mode path.
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

from onlinerec.cells.base import ElementwiseCell


class ClosedFormMismatchError(ValueError):
    """A cell's closed-form :meth:`~onlinerec.cells.ElementwiseCell.recurrence_derivatives` disagrees with automatic
    differentiation of its recurrence, so it is not used (it would train with wrong gradients)."""


class BoundMethod(nn.Module):
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

    Uses the one-pass reverse-mode path when :func:`choose_paths` has validated it for this cell
    and method, and forward mode otherwise; a cell's own closed form when it has one and
    :func:`choose_paths` has checked it. c_prev is (R, N), or (R, K, N) for units of K > 1 components."""
    if _CLOSED.get(cell, {}).get(method, False):
        return _closed_form(cell, params, gates, c_prev)
    if c_prev.dim() in (2, 3) and _FAST.get(cell, {}).get(method, False):
        return _reverse_per_row(cell, method, params, gates, c_prev)
    return forward_mode(cell, method, params, gates, c_prev)


def has_closed_form(cell: nn.Module, method: str = "recurrence") -> bool:
    """Whether ``cell``'s local derivatives come from its own checked closed form (``recurrence_derivatives``; known
    once :func:`choose_paths` has run for it)."""
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


def forward_mode(
    cell: nn.Module, method: str, params: dict[str, Tensor], gates: Tensor, c_prev: Tensor
) -> LocalDerivatives:
    """The general path: reverse mode for state and gates (K passes for K > 1 components), one forward-mode pass per
    parameter row."""
    bound = BoundMethod(cell, method)
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
    by :func:`choose_paths` at a random float64 point (with perturbed parameters)."""
    return _GATE_WEIGHTS.get(cell, {}).get(method)


def choose_paths(
    cell: nn.Module, method: str, names: tuple[str, ...], num_gates: int, n: int, components: int = 1
) -> None:
    """Choose, once ``cell.<method>`` has passed the element-wise check, how :func:`local_derivatives` computes its
    derivatives: the one-pass reverse path where it matches forward mode, the cell's own closed form
    (``recurrence_derivatives``, for ``recurrence`` only) where it matches autodiff, and the gate map of
    :func:`gate_weight_map` for one component per unit; each tested at a float64 probe with perturbed parameters.

    Raises:
        ClosedFormMismatchError: the cell's closed form disagrees with autodiff (naming the derivative and by how much).
    """
    _FAST.setdefault(cell, {})[method] = _per_row_matches(cell, method, names, num_gates, n, components)
    _CLOSED.setdefault(cell, {})[method] = method == "recurrence" and _closed_form_matches(
        cell, names, num_gates, n, components
    )
    _GATE_WEIGHTS.setdefault(cell, {})[method] = (
        _find_gate_weights(cell, method, names, num_gates, n) if components == 1 else None
    )


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
            p.add_(0.3 * probe_randn(p.shape, gen, p.device))
    params = dict(probe.named_parameters())
    params = {k: params[k] for k in names}
    gates = probe_randn((5, num_gates, n), gen, parameter_device(probe))
    c_prev = probe_randn((5, n), gen, parameter_device(probe))
    try:
        local = forward_mode(probe, method, params, gates, c_prev)
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
    gates = probe_randn((r, num_gates, n), gen, parameter_device(probe))
    c_prev = _state(r, n, components, gen, parameter_device(probe))
    try:
        fast = _reverse_per_row(probe, method, params, gates, c_prev)
    except Exception:  # noqa: BLE001 - any failure just means "use the general path"
        return False
    slow = forward_mode(probe, method, params, gates, c_prev)
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
        gates = scale * probe_randn((r, num_gates, n), gen, parameter_device(probe))
        c_prev = scale * _state(r, n, components, gen, parameter_device(probe))
        with torch.no_grad():
            closed = _closed_form(probe, params, gates, c_prev)
        if closed is None:
            return False
        auto = forward_mode(probe, "recurrence", params, gates, c_prev)
        with torch.no_grad():
            value = probe.recurrence(gates, c_prev)
        pairs = [("the new state", value, closed.value), ("dc/dc_prev", auto.d_state, closed.d_state)]
        pairs += [("dc/dgates", auto.d_gates, closed.d_gates)]
        pairs += [(f"dc/d{k}", auto.d_params[k], closed.d_params.get(k)) for k in names]
        for what, expected, got in pairs:
            wrong = got is None or got.shape != expected.shape
            err = None if wrong else mismatch(expected, got, 1e-9)
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
            p.add_(0.3 * probe_randn(p.shape, gen, p.device))
    params = dict(probe.named_parameters())
    return probe, {k: params[k] for k in names}, gen


def parameter_device(module: nn.Module) -> torch.device:
    """The device of a module's parameters (the CPU if it has none)."""
    return next((t.device for t in module.parameters()), torch.device("cpu"))


def probe_randn(shape: tuple[int, ...], gen: torch.Generator, device: torch.device) -> Tensor:
    """A float64 probe point: standard normal numbers drawn on the CPU from ``gen``, then moved to ``device``."""
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(device)


def mismatch(expected: Tensor, actual: Tensor, tol: float, scale: float | None = None) -> float | None:
    """How far ``actual`` is from ``expected`` relative to ``scale`` (default: 1 + their largest magnitude), if more
    than ``tol``; else None. Non-finite entries (a probe point where the recurrence overflows) are left out."""
    diff = (actual - expected).abs().amax().item()
    top = max(expected.abs().amax().item(), actual.abs().amax().item()) if expected.numel() else 0.0
    if not (math.isfinite(diff) and math.isfinite(top)):
        finite = expected.isfinite() & actual.isfinite()
        if not bool(finite.any()):
            return None
        return mismatch(expected[finite], actual[finite], tol, scale)
    scale = 1 + top if scale is None else max(scale, top)
    return None if diff <= tol * scale else diff / max(scale, 1e-300)
