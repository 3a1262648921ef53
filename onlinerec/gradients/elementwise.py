"""The element-wise check: exact cheap RTRL's premise that a cell's recurrence mixes no hidden units (or batch rows).

:func:`check_elementwise` verifies it before training, by the contract, structurally (a trace of the ops,
:func:`~onlinerec.gradients.structure.structural_violation`) and numerically at several scales (:data:`PROBE_SCALES`).
:func:`recurrence_parameters` runs it once per cell and method, then lets
:func:`~onlinerec.gradients.derivatives.choose_paths` choose how the local derivatives are computed.
:func:`verify_linearization` checks the premise again on live states (RTRL's ``verify``). A cell that fails is refused
with :class:`NotElementwiseError`, which names the cell, what mixes units and what to use instead.
"""

from __future__ import annotations

import copy
import weakref

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp

from onlinerec.cells.base import call_checked
from onlinerec.gradients.derivatives import (
    BoundMethod,
    ClosedFormMismatchError,
    choose_paths,
    forward_mode,
    has_closed_form,
    mismatch,
    parameter_device,
    probe_randn,
    substituted,
)
from onlinerec.gradients.structure import structural_violation


class NotElementwiseError(TypeError):
    """A cell's recurrence mixes hidden units (or batch rows), so exact cheap RTRL does not apply."""


_CHECKED: weakref.WeakKeyDictionary[nn.Module, dict[str, tuple[str, ...]]] = weakref.WeakKeyDictionary()


def recurrence_parameters(
    cell: nn.Module, method: str, exclude: tuple[str, ...], num_gates: int, n: int, components: int = 1
) -> tuple[str, ...]:
    """Names of the parameters that ``cell.<method>`` reads, after checking (once per cell) that the
    method is element-wise in its state, its gates and each of those parameters (per unit of ``components``
    numbers: a unit may mix its own components), and choosing how its local derivatives are computed
    (:func:`~onlinerec.gradients.derivatives.choose_paths`).

    Raises:
        NotElementwiseError: naming the cell class and what mixes units.
        ClosedFormMismatchError: the cell's closed-form derivatives disagree with autodiff.
    """
    cache = _CHECKED.setdefault(cell, {})
    if method in cache:
        return cache[method]
    names = check_elementwise(cell, method, exclude, num_gates, n, components)
    choose_paths(cell, method, names, num_gates, n, components)
    cache[method] = names
    return names


PROBE_SCALES = (0.1, 1.0, 4.0, 16.0)
"""The numeric probe runs at states and gates scaled by each of these, so that a recurrence that mixes units only in
some region of its state (|c| > 2, say) is seen wherever that region is (docs/custom_cell.md)."""

_ADVICE = (
    "Exact RTRL needs a diagonal recurrent Jacobian (one K x K block per unit for units of K components); for a cell "
    "like this use SnAPStrategy (a diagonal approximation, for FullyRecurrentCell subclasses) or TBPTTStrategy."
)


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
    device = parameter_device(probe)
    bound = BoundMethod(probe, method)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # structure, not current values: a zero-initialised mixing matrix must not hide
        for p in probe.parameters():
            p.add_(0.3 * probe_randn(p.shape, gen, device))
    rows = next(r for r in range(3, 100) if r not in (num_gates, n, components))
    gates = probe_randn((rows, num_gates, n), gen, device)
    c_prev = probe_randn((rows, n) if components == 1 else (rows, components, n), gen, device)
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
        local = forward_mode(probe, method, params, g_s, c_s)
        at = "" if scale == 1.0 else f" (with states and gates scaled x{scale:g})"
        tangents = {"c": probe_randn(c_s.shape, gen, device), "g": probe_randn(g_s.shape, gen, device)}
        tangents |= {k: probe_randn(p.shape, gen, device) for k, p in params.items()}
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

        joint_ok = mismatch(sum(e for _, e in parts.values()), actual(None), 1e-9) is None
        if joint_ok and scale != 1.0:
            continue
        culprits = [
            what for what, (key, expected) in parts.items() if mismatch(expected, actual(key), 1e-9) is not None
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
    errors = [mismatch(e, a, tol, sc) for e, a, sc in zip(expected, got, scales)]
    err = max((e for e in errors if e is not None), default=None)
    if err is not None:
        if has_closed_form(cell):
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
