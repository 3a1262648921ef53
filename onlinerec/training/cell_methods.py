"""Which gradient methods train a cell, and what to do when the chosen one cannot, in a command line's own terms.

``onlinerec demo`` and ``onlinerec rl`` ask :func:`method_refusal` before they start, so that a cell the method
refuses (a fully recurrent LSTM under RTRL, a cell of your own whose recurrence reads other units) is a usage error
whose advice names their options, not a traceback from the first update.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from onlinerec.cells import CompositeCell, ElementwiseCell, FullyRecurrentCell
from onlinerec.gradients import METHODS, NotElementwiseError

__all__ = ["method_refusal", "methods_that_train"]

LABELS = {"rtrl": "exact RTRL", "snap": "SnAP-1", "tbptt": "TBPTT"}


def _leaves(cell: ElementwiseCell) -> Iterator[ElementwiseCell]:
    if isinstance(cell, CompositeCell):
        for layer in cell.layers:
            yield from _leaves(layer)
    else:
        yield cell


def _refusal(cell: ElementwiseCell, method: str) -> NotElementwiseError | None:
    try:
        METHODS.resolve(method)().check_cell(cell)
    except NotElementwiseError as err:
        return err
    return None


def methods_that_train(cell: ElementwiseCell) -> list[str]:
    """The names in :data:`~onlinerec.gradients.METHODS` that train ``cell`` (every layer of a stack), sorted."""
    return sorted(name for name in METHODS if _refusal(cell, name) is None)


def method_refusal(
    cell: ElementwiseCell,
    method: str,
    choose: Callable[[Sequence[str]], str],
    cell_option: str = "--cell",
    offered: Sequence[str] | None = None,
) -> str | None:
    """None if ``method`` trains ``cell``; else why not and what does, as one message.

    Args:
        cell: the cell as it will be trained (a stack is checked layer by layer).
        method: a name in :data:`~onlinerec.gradients.METHODS`.
        choose: how the caller's interface picks the methods that do train it, e.g.
            ``lambda ms: " or ".join(f"--method {m}" for m in ms)``.
        cell_option: how the caller's interface picks another cell.
        offered: the methods the caller's interface offers (None: every method in ``METHODS``).
    """
    method = getattr(METHODS.resolve(method), "name", method)  # "RTRL" or a class path: the registered name
    refused = next(((leaf, err) for leaf in _leaves(cell) if (err := _refusal(leaf, method)) is not None), None)
    if refused is None:
        return None
    leaf, err = refused
    name = type(leaf).__name__
    others = [m for m in methods_that_train(cell) if m != method and (offered is None or m in offered)]
    fully_recurrent = isinstance(leaf, FullyRecurrentCell)
    if fully_recurrent and method == "rtrl":
        why = f"{name} is fully recurrent (its gates read every unit), so exact RTRL refuses it."
    elif fully_recurrent:
        why = f"{LABELS.get(method, method)} cannot train {name}: {_first_sentence(err)}."
    else:  # a cell of its own that mixes units: the element-wise check says where
        why = f"{_first_sentence(_refusal(leaf, 'rtrl') or err)}, so {LABELS.get(method, method)} cannot train it."
    advice = [f"Train it with {choose(others)}"] if others else []
    if fully_recurrent:
        advice.append(f"keep exact RTRL with an element-wise cell such as {cell_option} elstm")
        return f"{why} {', or '.join(advice)}."
    if others and "snap" not in others and (offered is None or "snap" in offered):
        advice[0] += (
            " (SnAP-1 approximates only FullyRecurrentCell subclasses, whose gates read the state through "
            "recurrent_proj)"
        )
    advice.append(
        f"make {name}'s recurrence element-wise (each unit reads only its own state), which exact RTRL trains "
        "(docs/custom_cell.md)"
    )
    return f"{why} {'; or '.join(advice)}."


def _first_sentence(err: Exception) -> str:
    return str(err).split(". ", 1)[0].rstrip(".")
