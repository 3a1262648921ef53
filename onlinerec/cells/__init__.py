"""Recurrent cells: pure single steps. Element-wise ones (exact RTRL is cheap) and fully recurrent ones (SnAP-1, TBPTT),
and :class:`Stack` for deep models, :class:`Parallel` for cores side by side."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from onlinerec.cells.base import ElementwiseCell, FullyRecurrentCell
from onlinerec.cells.classic import GRUCell, LSTMCell
from onlinerec.cells.composite import CompositeCell
from onlinerec.cells.elstm import ELSTMCell, FELSTMCell
from onlinerec.cells.indrnn import IndRNNCell
from onlinerec.cells.lru import LRUCell
from onlinerec.cells.minimal import MinGRUCell, MinLSTMCell
from onlinerec.cells.parallel import Parallel
from onlinerec.cells.qrnn import QRNNCell
from onlinerec.cells.rtu import RTUCell
from onlinerec.cells.sru import SRUCell
from onlinerec.cells.stack import Stack
from onlinerec.registry import Registry


class _CellRegistry(Registry):
    """The cell registry: a class path into ``__main__`` that this process cannot resolve (a cell class defined in the
    script that saved a checkpoint) gets an error that says how to load such a checkpoint."""

    def resolve(self, spec: str | type) -> type:
        try:
            return super().resolve(spec)
        except ValueError as err:
            if isinstance(spec, str) and spec.startswith("__main__."):
                raise ValueError(main_class_error(spec)) from None
            if isinstance(spec, str) and spec.isidentifier() and spec[:1].isupper():  # a class's bare name
                raise ValueError(
                    f"{err} A checkpoint that stores a cell of your own by its class name is loaded with "
                    f"load_from_checkpoint(path, cell={spec}(...)), the cell built as it was for training."
                ) from None
            raise


def main_class_error(path: str, init_args: Mapping[str, Any] | None = None) -> str:
    """The error for a cell class path ``__main__.<Name>`` that this process cannot import."""
    name = path.rpartition(".")[2]
    built = f"{name}({', '.join(f'{k}={v!r}' for k, v in init_args.items())})" if init_args is not None else None
    how = f" (it was built as {built})" if built else ""
    return (
        f"{path!r} names a cell class defined in the script that saved this checkpoint (its __main__ module), which "
        f"no other process can import. Pass the cell when loading: load_from_checkpoint(path, cell={name}(...)), "
        f"with {name} imported or defined where you load{how}; the weights still come from the checkpoint. Or define "
        f"{name} in an importable module (e.g. my_cells.py, and `from my_cells import {name}` in the training "
        f"script): the checkpoints saved from then on name it my_cells.{name}, which any process can import."
    )


CELLS: Registry[ElementwiseCell] = _CellRegistry(
    "cell",
    ElementwiseCell,
    {
        "elstm": ELSTMCell,
        "felstm": FELSTMCell,
        "qrnn": QRNNCell,
        "sru": SRUCell,
        "lru": LRUCell,
        "rtu": RTUCell,
        "mingru": MinGRUCell,
        "minlstm": MinLSTMCell,
        "indrnn": IndRNNCell,
        "lstm": LSTMCell,
        "gru": GRUCell,
    },
)
"""Cells by name, for configs and the command line. ``CELLS.register("mine", MyCell)`` adds one; a class path
("my_package.cells.MyCell") works everywhere a name does, without registering."""


def make_cell(
    cell: str | type | Mapping[str, Any] | ElementwiseCell | Sequence[str | type | Mapping[str, Any]],
    input_size: int,
    hidden_size: int,
    *,
    layers: int = 1,
    residual: bool = False,
    norm: str | None = None,
    layer_kwargs: Sequence[Mapping[str, Any]] | None = None,
    **kwargs: Any,
) -> ElementwiseCell:
    """A cell from a registered name ("elstm", "lru", ...), a class path, a class, an instance, or a
    :func:`cell_spec` (``{"class_path": ..., "init_args": {...}}``, what checkpoints store for an instance).

    An instance (or the cell a spec builds) is returned as it is after checking that its sizes are ``input_size`` and
    ``hidden_size`` (``kwargs`` must then be empty).

    ``layers > 1`` (or ``residual`` / ``norm``) builds a :class:`Stack` of ``layers`` such cells with ``hidden_size``
    units each, the first reading ``input_size`` features and each next one its predecessor's ``output_size``; every
    layer gets the same ``kwargs``. So a config or the command line names a deep model with the same three fields
    as a single cell (e.g. ``R2AC(cell="lru", cell_kwargs={"layers": 4, "residual": True})``).

    A list of names (or classes, or specs) builds a :class:`Stack` of different cells, bottom first, with the same
    width rule (e.g. ``make_cell(["lru", "mingru"], 65, 64, residual=True, norm="layer", layer_kwargs=[{"slow_fraction":
    0.5}, {}])``: an LRU, whose output keeps its input's width, under a minGRU of 64 units). ``layer_kwargs`` gives
    each layer's own arguments, one mapping per layer (``hidden_size`` among them: that layer's own width); ``kwargs``
    must then be empty (the layers take different ones).
    """
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise ValueError(f"layers must be a positive int, got {layers!r}.")
    if isinstance(cell, Sequence) and not isinstance(cell, str):
        return _mixed_stack(list(cell), input_size, hidden_size, layers, residual, norm, layer_kwargs, kwargs)
    if layer_kwargs is not None:
        raise ValueError(
            "layer_kwargs (one mapping of arguments per layer) goes with a list of cells, e.g. cell=['lru', 'mingru']; "
            f"for one kind of cell ({cell!r}) give its arguments directly."
        )
    if isinstance(cell, Mapping):
        cell = build_cell_spec(cell)
    if layers > 1 or residual or norm is not None:
        if isinstance(cell, ElementwiseCell):
            raise ValueError(
                f"got a {type(cell).__name__} instance and layers={layers}, residual={residual}, norm={norm!r}: "
                "pass a cell name or class to build a stack of new layers, or build Stack([...]) yourself."
            )
        built, width = [], input_size
        for _ in range(layers):
            built.append(CELLS.build(cell, width, hidden_size, **kwargs))
            width = built[-1].output_size
        return Stack(built, residual=residual, norm=norm)
    if isinstance(cell, ElementwiseCell):
        if kwargs:
            raise ValueError(
                f"got a {type(cell).__name__} instance and cell keyword arguments {sorted(kwargs)}; pass one or the other."
            )
        if (cell.input_size, cell.hidden_size) != (input_size, hidden_size):
            raise ValueError(
                f"the given {type(cell).__name__} has input_size={cell.input_size}, hidden_size={cell.hidden_size}, but this "
                f"model feeds it {input_size} features and expects {hidden_size} units: build it as "
                f"{type(cell).__name__}({input_size}, {hidden_size}, ...) or pass its name instead."
            )
        return cell
    return CELLS.build(cell, input_size, hidden_size, **kwargs)


def _mixed_stack(
    cells: list[Any],
    input_size: int,
    hidden_size: int,
    layers: int,
    residual: bool,
    norm: str | None,
    layer_kwargs: Sequence[Mapping[str, Any]] | None,
    kwargs: Mapping[str, Any],
) -> Stack:
    """make_cell's list form: one layer per entry, bottom first, each with its own entry of ``layer_kwargs``."""
    if not cells:
        raise ValueError("a list of cells needs at least one cell, e.g. ['lru', 'mingru'].")
    if layers != 1:
        raise ValueError(f"the list of cells {cells} already names the layers: leave layers out (got layers={layers}).")
    if any(isinstance(c, ElementwiseCell) for c in cells):
        raise ValueError(
            "a list of cells takes names, classes or specs; to stack instances build Stack([...]) yourself."
        )
    if kwargs:
        raise ValueError(
            f"the layers {cells} take different arguments: give each its own in layer_kwargs (one mapping per layer, "
            f"e.g. layer_kwargs=[{{'slow_fraction': 0.5}}, {{}}]), not {sorted(kwargs)} for all of them."
        )
    per_layer = [dict(k) for k in layer_kwargs] if layer_kwargs is not None else [{} for _ in cells]
    if len(per_layer) != len(cells) or not all(isinstance(k, dict) for k in per_layer):
        raise ValueError(
            f"layer_kwargs must be a list of {len(cells)} mappings, one per layer of {cells}; got {layer_kwargs!r}."
        )
    built: list[ElementwiseCell] = []
    width = input_size
    for i, (cell, kw) in enumerate(zip(cells, per_layer)):
        units = kw.pop("hidden_size", hidden_size)  # a layer of its own width, e.g. as wide as its input for a residual
        try:
            built.append(make_cell(cell, width, units, **kw))
        except (TypeError, ValueError) as err:
            raise type(err)(f"layer {i} ({cell!r}): {err}") from err
        width = built[-1].output_size
    return Stack(built, residual=residual, norm=norm)


def _path(cls: type) -> str:
    """A built-in cell's registered name; any other class's full class path (which needs no registration)."""
    name = CELLS.path_of(cls)
    return name if cls.__module__.startswith("onlinerec.") else f"{cls.__module__}.{cls.__qualname__}"


def _plain(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, ElementwiseCell):
        return cell_spec(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, where) for k, v in value.items()}
    raise ValueError(
        f"{where} is a {type(value).__name__}: a checkpoint can keep only numbers, strings, bools, None, lists, dicts "
        "and cells as a cell's constructor arguments. Give the cell plain arguments (and set tensors on it after "
        "construction: its weights are saved anyway)."
    )


def cell_spec(cell: ElementwiseCell) -> dict[str, Any]:
    """How to build ``cell`` again, as plain data: ``{"class_path": path, "init_args": {name: value}}``.

    ``path`` is the registered name of a built-in cell and the full class path of any other (so no registration is
    needed where it is rebuilt; the class's module must be importable there); ``init_args`` are the arguments its
    constructor was called with, by keyword (a cell among them, e.g. the layers of a :class:`Stack`, becomes a nested
    spec). :func:`make_cell` (and ``CELLS``' ``resolve(path)(**init_args)``) builds a new cell from it; the built-in
    models store it in their hyper-parameters, so that ``load_from_checkpoint`` (weights only) rebuilds a cell that
    was given as an instance. The weights are not part of the spec: they are in the state dict.
    """
    if not isinstance(cell, ElementwiseCell):
        raise TypeError(f"cell_spec takes an onlinerec cell (ElementwiseCell), got {type(cell).__name__}.")
    cls = type(cell)
    if "<locals>" in cls.__qualname__:
        raise ValueError(
            f"{cls.__qualname__} is defined inside a function, so no other process can import it to rebuild the cell "
            f"from a checkpoint: define {cls.__name__} at the top level of a module."
        )
    args, kwargs = getattr(cell, "_onlinerec_init", ((), {}))
    signature = inspect.signature(cls.__init__)
    params = list(signature.parameters.values())[1:]  # without self
    try:
        bound = signature.replace(parameters=params).bind(*args, **kwargs)
    except TypeError as err:
        raise ValueError(f"cannot record how {cls.__name__} was built ({err}).") from err
    init_args: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                raise ValueError(
                    f"{cls.__name__} was built with extra positional arguments (*{name}), which a checkpoint cannot "
                    f"name by keyword: give {cls.__name__}.__init__ named parameters."
                )
        elif kind is inspect.Parameter.VAR_KEYWORD:
            init_args.update({k: _plain(v, f"{cls.__name__} argument {k!r}") for k, v in value.items()})
        else:
            init_args[name] = _plain(value, f"{cls.__name__} argument {name!r}")
    return {"class_path": _path(cls), "init_args": init_args}


def _is_spec(value: Any) -> bool:
    return isinstance(value, Mapping) and "class_path" in value and set(value) <= {"class_path", "init_args"}


def build_cell_spec(spec: Mapping[str, Any]) -> ElementwiseCell:
    """The cell a :func:`cell_spec` describes (nested specs among its arguments are built too)."""
    if not _is_spec(spec):
        raise ValueError(
            f"a cell given as a mapping must be a cell_spec, {{'class_path': ..., 'init_args': {{...}}}}; got keys "
            f"{sorted(spec)}."
        )

    def revive(value: Any) -> Any:
        if _is_spec(value):
            return build_cell_spec(value)
        if isinstance(value, list):
            return [revive(v) for v in value]
        return value

    path = spec["class_path"]
    if isinstance(path, str) and path.startswith("__main__."):
        try:
            CELLS.resolve(path)
        except ValueError:
            raise ValueError(main_class_error(path, spec.get("init_args") or {})) from None
    cls = CELLS.resolve(path)
    return cls(**{k: revive(v) for k, v in (spec.get("init_args") or {}).items()})


def cell_reference(cell: Any) -> str | dict[str, Any] | list[Any] | None:
    """What a model's hyper-parameters store for its ``cell`` argument, so that a checkpoint rebuilds the cell in any
    process: a built-in name as given, a user class (by name, path or class) as its full class path, an instance as its
    :func:`cell_spec`, a spec as it is, None as None, and a list of cells (a mixed stack) as the list of those."""
    if isinstance(cell, (list, tuple)):
        return [cell_reference(c) for c in cell]
    if cell is None or _is_spec(cell):
        return None if cell is None else dict(cell)  # type: ignore[arg-type]
    if isinstance(cell, ElementwiseCell):
        return cell_spec(cell)
    cls = CELLS.resolve(cell)  # type: ignore[arg-type]
    if isinstance(cell, str) and cls.__module__.startswith("onlinerec."):
        return cell
    return _path(cls)


__all__ = [
    "CELLS",
    "CompositeCell",
    "ELSTMCell",
    "ElementwiseCell",
    "FELSTMCell",
    "FullyRecurrentCell",
    "GRUCell",
    "IndRNNCell",
    "LRUCell",
    "LSTMCell",
    "MinGRUCell",
    "MinLSTMCell",
    "Parallel",
    "QRNNCell",
    "RTUCell",
    "SRUCell",
    "Stack",
    "build_cell_spec",
    "cell_reference",
    "cell_spec",
    "make_cell",
]
