"""The structural half of the element-wise check: follow every op of one call of a recurrence and see where each value
comes from.

Every value derived from ``c_prev``, the gates or a per-unit parameter carries two labels: the hidden unit and the batch
row it was computed from (0: none, a constant). Running the recurrence once under a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` propagates them op by op:

- element-wise ops (``torch.Tag.pointwise``: arithmetic, ``torch.where``, activations, comparisons) combine the labels
  of their operands position by position; operands from two different units (or rows) in one position are a mixing;
- shape and copy ops (views, ``stack``, ``cat``, indexing with constant indices, ``roll``, ``flip``, dtype casts) are
  applied to the labels themselves, so a value that moves keeps the label of the unit it came from;
- reductions, ops along one dimension (softmax, cumsum, sort) and matrix products are allowed only where every value
  they combine comes from the same unit and row (a sum over the gate axis or over a unit's K components, never over
  units);
- a Python decision on such a value (``if``, ``bool()``, ``.item()``) and any op this list does not know are refused.

At the end, position n of the new state must hold values of unit n and its own row only. This sees both branches of a
``torch.where`` (so a neighbour read only in some region of the state is found wherever it would happen), but not
control flow that leaves torch (``.tolist()``, ``.numpy()``, Python state): the numeric probes and RTRL's runtime
verification cover that (docs/custom_cell.md#what-the-element-wise-check-guarantees).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["structural_violation"]

_BIG = 1 << 40  # above any label: the neutral element when taking the smallest label of a group
_ROLES = ("hidden unit", "batch row")

_FACTORIES = {
    "empty",
    "empty_strided",
    "zeros",
    "ones",
    "full",
    "arange",
    "linspace",
    "eye",
    "scalar_tensor",
    "rand",
    "randn",
    "randint",
    "lift_fresh_copy",
}
_SCALAR_READS = {"_local_scalar_dense", "item", "is_nonzero", "equal", "allclose"}
_ALONG_DIM = {
    "_softmax",
    "_log_softmax",
    "softmax",
    "log_softmax",
    "cumsum",
    "cumprod",
    "logcumsumexp",
    "cummax",
    "cummin",
    "sort",
    "argsort",
    "topk",
}
_CONTRACTIONS = {"mm", "bmm", "addmm", "baddbmm", "mv", "addmv", "dot", "vdot"}
_MOVES = {
    "clone",
    "_to_copy",
    "contiguous",
    "stack",
    "cat",
    "roll",
    "flip",
    "repeat",
    "tile",
    "index",
    "index_select",
    "gather",
    "take",
    "_unsafe_view",
    "constant_pad_nd",
    "narrow_copy",
    "expand_copy",
    "permute_copy",
    "select_copy",
    "slice_copy",
    "view_copy",
    "squeeze_copy",
    "unsqueeze_copy",
    "t_copy",
    "transpose_copy",
    "alias_copy",
    "unbind_copy",
    "split_copy",
    "split_with_sizes_copy",
    "diag_embed",
    "tril",
    "triu",
    "repeat_interleave",
    "rot90",
    "masked_select",
    "lift_fresh",
}
_INDEX_ARGS = {"index", "indices", "mask", "repeats"}
_EXTRA_POINTWISE = {"complex", "polar"}


class _Refused(Exception):
    pass


def _blank(t: Tensor) -> Tensor:
    """Zero labels laid out like ``t`` (same sizes and strides), so that views of them follow views of ``t``."""
    if any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape)):  # expanded: never written through
        return torch.zeros(t.shape, dtype=torch.int64)
    return torch.empty_strided(t.size(), t.stride(), dtype=torch.int64).zero_()


def _laid_out_like(t: Tensor, labels: Tensor) -> Tensor:
    out = _blank(t)
    out.copy_(labels.expand(t.shape))
    return out


def _combine(labels: list[Tensor], shape: torch.Size) -> tuple[Tensor, tuple[int, int] | None]:
    """Position by position: the one nonzero label of the operands (0 if none), and a pair of different ones if any."""
    if not labels:
        return torch.zeros(shape, dtype=torch.int64), None
    stacked = torch.stack([lab.expand(shape) for lab in labels])
    hi = stacked.amax(0)
    lo = torch.where(stacked == 0, _BIG, stacked).amin(0)
    return hi, _first_conflict(lo, hi)


def _first_conflict(lo: Tensor, hi: Tensor) -> tuple[int, int] | None:
    bad = (lo != _BIG) & (lo != hi)
    if not bool(bad.any()):
        return None
    where = tuple(bad.nonzero()[0].tolist())
    return int(lo[where]) - 1, int(hi[where]) - 1


def _common(labels: Tensor, dims: list[int] | None, keepdim: bool) -> tuple[Tensor, tuple[int, int] | None]:
    """The one nonzero label of each group reduced over ``dims`` (None: all), and a conflicting pair if any."""
    lo = torch.where(labels == 0, _BIG, labels)
    if dims is None or len(dims) == 0 or labels.dim() == 0:
        hi_r, lo_r = labels.amax(), lo.amin()
        if keepdim:
            hi_r, lo_r = hi_r.reshape([1] * labels.dim()), lo_r.reshape([1] * labels.dim())
    else:
        hi_r, lo_r = labels.amax(dims, keepdim), lo.amin(dims, keepdim)
    return hi_r, _first_conflict(lo_r, hi_r)


def _arg(func: Any, args: tuple, kwargs: dict, name: str, default: Any = None) -> Any:
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            if name in kwargs:
                return kwargs[name]
            return args[i] if i < len(args) else (a.default_value if a.has_default_value() else default)
    return default


class _Tracer(TorchDispatchMode):
    """Propagates (unit, row) labels through every op of a call; records the first refusal."""

    def __init__(self) -> None:
        super().__init__()
        self._labels: dict[int, tuple[Tensor, tuple[Tensor, Tensor]]] = {}
        self.refusal: str | None = None

    # -- labels -------------------------------------------------------------------------------------------------------
    def set(self, t: Tensor, labels: tuple[Tensor, Tensor]) -> None:
        self._labels[id(t)] = (t, labels)

    def get(self, t: Tensor) -> tuple[Tensor, Tensor]:
        entry = self._labels.get(id(t))
        if entry is not None and entry[0] is t:
            return entry[1]
        labels = (_blank(t), _blank(t))
        self.set(t, labels)
        return labels

    def labelled(self, t: Tensor) -> bool:
        entry = self._labels.get(id(t))
        return entry is not None and entry[0] is t and any(bool((lab != 0).any()) for lab in entry[1])

    def refuse(self, message: str) -> None:
        if self.refusal is None:
            self.refusal = message

    # -- dispatch -----------------------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.refusal is None:
            try:
                self._propagate(func, args, kwargs, out)
            except _Refused as why:
                self.refuse(str(why))
            except Exception as err:  # noqa: BLE001 - an op whose labels we cannot compute: refuse, never guess
                self.refuse(f"uses {func}, which the structural check could not follow ({type(err).__name__}: {err})")
        return out

    def _propagate(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        name = func.overloadpacket.__name__
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
        any_labelled = any(self.labelled(t) for t in inputs)
        op = f"{func}"
        if name in _SCALAR_READS or not outputs:
            if any_labelled:
                raise _Refused(
                    f"reads a value computed from the state as a Python number ({op}: an `if`, bool(), float() or "
                    ".item() on a tensor), so every unit's result may depend on other units; choose per unit with "
                    "torch.where instead"
                )
            return
        schema_args = func._schema.arguments
        mutated = schema_args and schema_args[0].alias_info is not None and schema_args[0].alias_info.is_write
        is_view = not mutated and any(r.alias_info is not None for r in func._schema.returns)
        if name in _FACTORIES or name.endswith("_like") or name.startswith("new_"):
            for t in outputs:
                self.set(t, (_blank(t), _blank(t)))
            return
        if mutated:
            self._mutate(func, name, args, kwargs, op)
            return
        if torch.Tag.pointwise in func.tags or name in _EXTRA_POINTWISE:
            per_role = []
            for role in range(2):
                hi, conflict = _combine([self.get(t)[role] for t in inputs], outputs[0].shape)
                self._check(conflict, role, "combines", op)
                per_role.append(hi)
            for t in outputs:
                self.set(t, tuple(_laid_out_like(t, lab) for lab in per_role))
            return
        if name in ("view_as_real", "view_as_complex", "real", "imag"):
            self._complex_view(name, args[0], outputs[0], op)
            return
        if is_view or name in _MOVES:
            self._move(func, args, kwargs, outputs, op)
            return
        if torch.Tag.reduction in func.tags or name in _ALONG_DIM:
            dims = _arg(func, args, kwargs, "dim")
            dims = [dims] if isinstance(dims, int) else (None if dims is None else list(dims))
            along = name in _ALONG_DIM
            keepdim = along or bool(_arg(func, args, kwargs, "keepdim", False))
            per_role = []
            for role in range(2):
                lab, conflict = _common(self.get(inputs[0])[role], dims, keepdim)
                self._check(conflict, role, "reduces over", op)
                per_role.append(lab)
            for t in outputs:
                self.set(t, tuple(_laid_out_like(t, lab if along else lab.reshape(t.shape)) for lab in per_role))
            return
        if name in _CONTRACTIONS:
            self._contract(name, args, outputs[0], op)
            return
        if any_labelled:
            raise _Refused(
                f"uses {op}, which the structural check does not know (it follows element-wise ops, shape and copy "
                "ops, reductions and matrix products)"
            )
        for t in outputs:
            self.set(t, (_blank(t), _blank(t)))

    def _check(self, conflict: tuple[int, int] | None, role: int, verb: str, op: str) -> None:
        if conflict is None:
            return
        a, b = (f"{_ROLES[role]} {i}" for i in conflict)
        what = {
            "combines": f"combines values of {a} and {b}",
            "pairs": f"combines values of {a} and {b}",
            "masks": f"masks values of {a} with a mask computed from {b}",
            "reduces over": f"reduces over {_ROLES[role]}s ({a} and {b})",
            "sums over": f"sums over {_ROLES[role]}s ({a} and {b})",
        }[verb]
        raise _Refused(f"{what} in {op}")

    def _index_args(self, func: Any, args: tuple, kwargs: dict, op: str) -> None:
        """Positions must be constants, except a boolean mask of the indexed tensor's own shape whose labels agree
        with that tensor's at every position (``x[x > 0] = ...``: element-wise)."""
        for i, a in enumerate(func._schema.arguments):
            if a.name not in _INDEX_ARGS:
                continue
            value = kwargs.get(a.name, args[i] if i < len(args) else None)
            for t in [v for v in tree_flatten(value)[0] if isinstance(v, Tensor)]:
                if not self.labelled(t):
                    continue
                base = args[0]
                if t.dtype == torch.bool and t.shape == base.shape:
                    for role in range(2):
                        _, conflict = _combine([self.get(base)[role], self.get(t)[role]], base.shape)
                        self._check(conflict, role, "masks", op)
                    continue
                raise _Refused(f"{op} selects positions computed from the state (data-dependent indexing)")

    def _label_args(self, func: Any, args: tuple, kwargs: dict, role: int) -> tuple[list, dict]:
        """The op's arguments with every data tensor replaced by its labels (indices kept, scalars and dtypes zeroed)."""

        def swap(a: Any, value: Any) -> Any:
            if a.name in _INDEX_ARGS:  # the labels live on the CPU, whatever device the cell runs on
                return tree_map(lambda v: v.cpu() if isinstance(v, Tensor) else v, value)
            if isinstance(value, Tensor):
                return self.get(value)[role]
            if isinstance(value, (list, tuple)) and any(isinstance(v, Tensor) for v in value):
                return type(value)(self.get(v)[role] if isinstance(v, Tensor) else v for v in value)
            if a.name == "dtype":
                return None
            if str(a.type) in ("number", "Optional[number]") and value is not None:
                return 0
            return value

        schema = func._schema.arguments
        new_args = [swap(schema[i], v) if i < len(schema) else v for i, v in enumerate(args)]
        by_name = {a.name: a for a in schema}
        new_kwargs = {k: swap(by_name[k], v) if k in by_name else v for k, v in kwargs.items()}
        return new_args, new_kwargs

    def _move(self, func: Any, args: tuple, kwargs: dict, outputs: list[Tensor], op: str) -> None:
        self._index_args(func, args, kwargs, op)
        results = []
        for role in range(2):
            new_args, new_kwargs = self._label_args(func, args, kwargs, role)
            res = [t for t in tree_flatten(func(*new_args, **new_kwargs))[0] if isinstance(t, Tensor)]
            results.append(res)
        if any(len(r) != len(outputs) for r in results):
            raise _Refused(f"uses {op}, whose labels the structural check could not lay out")
        for i, t in enumerate(outputs):
            labels = tuple(r[i] if r[i].dtype == torch.int64 else r[i].long() for r in results)
            if any(lab.shape != t.shape for lab in labels):
                raise _Refused(f"uses {op}, whose labels the structural check could not lay out")
            self.set(t, labels)

    def _mutate(self, func: Any, name: str, args: tuple, kwargs: dict, op: str) -> None:
        target = args[0]
        labels = self.get(target)
        others = [t for t in tree_flatten((args[1:], kwargs))[0] if isinstance(t, Tensor)]
        if name in ("zero_", "fill_") and not any(self.labelled(t) for t in others):
            for lab in labels:
                lab.zero_()
            return
        if name in ("copy_", "fill_"):
            for role in range(2):
                labels[role].copy_(self.get(args[1])[role].expand(target.shape))
            return
        if name == "index_put_":
            if _arg(func, args, kwargs, "accumulate", False) and any(self.labelled(t) for t in [target, *others]):
                raise _Refused(f"{op} accumulates into positions of the state")
            self._index_args(func, args, kwargs, op)
            for role in range(2):
                new_args, new_kwargs = self._label_args(func, args, kwargs, role)
                new_args[0] = labels[role]
                func(*new_args, **new_kwargs)
            return
        if torch.Tag.pointwise in func.tags:
            for role in range(2):
                hi, conflict = _combine([labels[role], *(self.get(t)[role] for t in others)], target.shape)
                self._check(conflict, role, "combines", op)
                labels[role].copy_(hi)
            return
        if any(self.labelled(t) for t in [target, *others]):
            raise _Refused(f"uses the in-place {op}, which the structural check does not know")
        for lab in labels:
            lab.zero_()

    def _complex_view(self, name: str, source: Tensor, out: Tensor, op: str) -> None:
        labels = self.get(source)
        if name == "view_as_real":
            self.set(out, tuple(lab.unsqueeze(-1).expand(out.shape) for lab in labels))
        elif name == "view_as_complex":
            per_role = []
            for role, lab in enumerate(labels):
                hi, conflict = _combine([lab[..., 0], lab[..., 1]], out.shape)
                self._check(conflict, role, "pairs", op)
                per_role.append(hi)
            self.set(out, tuple(per_role))
        else:
            self.set(out, labels)

    def _contract(self, name: str, args: tuple, out: Tensor, op: str) -> None:
        """A matrix product: each output value sums a row of one operand times a column of the other, so the labels
        along the contracted dimension must agree; biases (addmm ...) combine element-wise."""
        bias, a, b = (args[0], args[1], args[2]) if name.startswith("add") or name == "baddbmm" else (None, *args[:2])
        per_role = []
        for role in range(2):
            la, lb = self.get(a)[role], self.get(b)[role]
            if name in ("dot", "vdot"):
                lab, conflict = _common(torch.stack([la, lb]), None, False)
            else:
                if lb.dim() == 1:  # mv: a vector
                    lb = lb.unsqueeze(-1)
                ra, conflict_a = _common(la, [-1], True)  # (..., i, 1)
                rb, conflict_b = _common(lb, [-2], True)  # (..., 1, j)
                self._check(conflict_a or conflict_b, role, "sums over", op)
                lab, conflict = _combine([ra, rb], torch.broadcast_shapes(ra.shape, rb.shape))
                lab = lab.reshape(out.shape) if lab.numel() == out.numel() else lab
            self._check(conflict, role, "sums over", op)
            if bias is not None:
                lab, conflict = _combine([lab, self.get(bias)[role]], out.shape)
                self._check(conflict, role, "combines", op)
            per_role.append(lab)
        self.set(out, tuple(_laid_out_like(out, lab) for lab in per_role))


def _unit_labels(t: Tensor, rows: bool) -> tuple[Tensor, Tensor]:
    """Labels of an input: unit n along the last axis (1-based), row r along the first (for state and gates)."""
    units = (torch.arange(t.shape[-1]) + 1).expand(t.shape)
    if rows:
        row = (torch.arange(t.shape[0]) + 1).reshape(-1, *([1] * (t.dim() - 1))).expand(t.shape)
    else:
        row = torch.zeros(t.shape, dtype=torch.int64)
    return _laid_out_like(t, units), _laid_out_like(t, row)


def structural_violation(
    call: Callable[[Tensor, Tensor], Tensor], gates: Tensor, c_prev: Tensor, unit_params: dict[str, Tensor]
) -> str | None:
    """Run ``call(gates, c_prev)`` once under the label tracer; the reason it mixes units or rows, or None.

    ``gates`` (R, G, N) and ``c_prev`` (R, N) or (R, K, N) are labelled by unit (last axis) and row (first axis), each
    tensor of ``unit_params`` (the per-unit parameters as ``call`` reads them, shape (..., N)) by unit."""
    tracer = _Tracer()
    tracer.set(gates, _unit_labels(gates, rows=True))
    tracer.set(c_prev, _unit_labels(c_prev, rows=True))
    for p in unit_params.values():
        tracer.set(p, _unit_labels(p, rows=False))
    with torch.no_grad(), tracer:
        out = call(gates, c_prev)
    if tracer.refusal is not None:
        return tracer.refusal
    if not isinstance(out, Tensor) or out.shape != c_prev.shape:
        return None  # the shape check reports this
    expected = _unit_labels(c_prev, rows=True)
    for role, (got, want) in enumerate(zip(tracer.get(out), expected)):
        wrong = (got != 0) & (got != want)
        if bool(wrong.any()):
            where = tuple(wrong.nonzero()[0].tolist())
            return (
                f"returns at {_ROLES[role]} {int(want[where]) - 1} a value computed from {_ROLES[role]} "
                f"{int(got[where]) - 1}"
            )
    return None
