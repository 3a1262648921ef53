"""The cell contract: one dense input projection, then a recurrence that is element-wise per hidden unit.

A cell is a pure single step. Time loops, resets and carried state live in :mod:`onlinerec.gradients`.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

_EXPLAINING = False  # set while a failed recurrence is being explained: nested failures are left as they are


def _explained(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``fn`` (a cell's recurrence), whose common contract errors name the cell and the fix."""

    @functools.wraps(fn)
    def recurrence(self: ElementwiseCell, gates: Tensor, c_prev: Tensor) -> Tensor:
        try:
            out = fn(self, gates, c_prev)
        except IndexError as err:
            hint = None if _EXPLAINING else gates_hint(self, fn, gates, c_prev, err)
            if hint is None:
                raise
            raise IndexError(hint) from err
        except RuntimeError as err:
            if "in-place operation" not in str(err) or _EXPLAINING:
                raise
            raise RuntimeError(in_place_message(type(self).__name__, "recurrence", "c_prev or gates")) from err
        if out.shape != c_prev.shape:  # caught here, before a time loop broadcasts it into ever larger states
            raise ValueError(shape_message(self, "recurrence", out, gates, c_prev))
        return out

    recurrence._onlinerec_wrapped = True  # type: ignore[attr-defined]
    return recurrence


def gates_hint(
    cell: nn.Module,
    fn: Callable[..., Tensor],
    gates: Tensor,
    c_prev: Tensor,
    err: Exception,
    method: str = "recurrence",
) -> str | None:
    """If ``fn(cell, gates, c_prev)`` failed with an IndexError because it reads more gates than ``gates`` has (a
    forgotten ``num_gates``), the message that says so; else None. Tries up to 16 more gates on zero inputs."""
    global _EXPLAINING
    if gates.dim() < 2:
        return None
    g = gates.shape[-2]
    _EXPLAINING = True
    try:
        with torch.no_grad():
            for more in range(g + 1, g + 17):
                wider = torch.zeros(*gates.shape[:-2], more, gates.shape[-1], dtype=gates.dtype, device=gates.device)
                try:
                    fn(cell, wider, torch.zeros_like(c_prev))
                except Exception:  # noqa: BLE001, S112 - not enough gates yet, or another problem: try more
                    continue
                return (
                    f"{type(cell).__name__}.{method} reads more gates than the cell declares: it fails on gates of "
                    f"shape (..., {g}, N) ({err}) but runs on (..., {more}, N). Set the class attribute "
                    f"`num_gates = {more}` on {type(cell).__name__} (it is {g} now, ElementwiseCell's default is 1): "
                    f"the input projection then makes {more} gate pre-activations per unit, gates[..., 0, :] to "
                    f"gates[..., {more - 1}, :]."
                )
    finally:
        _EXPLAINING = False
    return None


def in_place_message(cls: str, method: str, arg: str) -> str:
    """The error for a recurrence that changes one of its inputs in place."""
    return (
        f"{cls}.{method} modifies its argument {arg} in place (e.g. c_prev.mul_(f), c_prev += x or c_prev[...] = x). "
        "The gradient methods use its inputs again after the call and differentiate through them, so a recurrence "
        "must leave them unchanged: compute a new tensor instead (c = c_prev * f, c = c_prev + x, torch.where(...))."
    )


def shape_message(cell: nn.Module, method: str, out: Any, gates: Tensor, c_prev: Tensor) -> str:
    """The error for a recurrence whose result is not a new state of c_prev's shape."""
    shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
    k = getattr(cell, "num_components", 1)
    state = "(..., N)" if k == 1 else f"(..., K, N) with K = num_components = {k}"
    return (
        f"{type(cell).__name__}.{method} returned {shape} for c_prev of shape {tuple(c_prev.shape)} (gates "
        f"{tuple(gates.shape)}): it must return the new state, with c_prev's shape {state} and N = hidden_size = "
        f"{c_prev.shape[-1]}. Pick the gates you need (gates[..., g, :]) and combine them element-wise with c_prev; "
        "if each unit holds several numbers, set num_components = K and return (..., K, N)."
    )


def call_checked(cell: ElementwiseCell, gates: Tensor, c_prev: Tensor, method: str = "recurrence") -> Tensor:
    """``cell.<method>(gates, c_prev)`` on plain tensors, checking the cell contract with errors that name the cell and
    the fix: enough gates (``num_gates``), no in-place change of an input, and a new state of ``c_prev``'s shape."""
    cls = type(cell).__name__
    versions = (gates._version, c_prev._version)
    fn = getattr(cell, method)
    with torch.no_grad():
        try:
            out = fn(gates, c_prev)
        except IndexError as err:
            raw = getattr(fn, "__wrapped__", getattr(type(cell), method))
            hint = gates_hint(cell, raw, gates, c_prev, err, method)
            if hint is None or isinstance(err.__cause__, IndexError):
                raise
            raise IndexError(hint) from err
        except RuntimeError as err:
            if "size of tensor" not in str(err):
                raise
            raise RuntimeError(
                f"{cls}.{method} failed on gates of shape {tuple(gates.shape)} and c_prev of shape "
                f"{tuple(c_prev.shape)}: {err}. The gates hold num_gates = {gates.shape[-2]} pre-activations per unit "
                "along dim -2: take one with gates[..., g, :], of shape (..., N), before combining it with c_prev."
            ) from err
    for arg, before, after in zip(("gates", "c_prev"), versions, (gates._version, c_prev._version)):
        if after != before:
            raise ValueError(in_place_message(cls, method, arg))
    if not isinstance(out, Tensor) or out.shape != c_prev.shape:
        raise ValueError(shape_message(cell, method, out, gates, c_prev))
    return out


class ElementwiseCell(nn.Module, ABC):
    """Base class of every onlinerec cell.

    A step computes ``gates = input_proj(u_t)`` with ``u_t`` the last ``window`` inputs concatenated
    (``u_t = x_t`` for ``window = 1``), then ``c_t = recurrence(gates, c_{t-1})`` and finally the
    feed-forward output ``h_t = readout(c_t, x_t)``.

    Subclasses set the class attribute :attr:`num_gates`, call ``super().__init__(input_size, hidden_size)``,
    create their per-unit parameters (shape ``(N,)`` or ``(P, N)``) and implement :meth:`recurrence`
    with element-wise operations only. They never write a derivative: the gradient methods obtain
    every derivative RTRL needs from :meth:`recurrence` by automatic differentiation.

    A unit may hold several numbers (:attr:`num_components` K > 1, e.g. the real and imaginary part of a complex
    state): its state is then (..., K, N) and its Jacobian a K x K block per unit (docs/rtrl.md#multi-component-units).
    """

    num_gates: ClassVar[int] = 1
    """G: how many gate pre-activations per hidden unit the input projection produces."""
    num_components: ClassVar[int] = 1
    """K: how many numbers each hidden unit holds. K = 1: the state is (..., N). K > 1: it is (..., K, N), and
    unit n may mix its own K components (``c_prev[..., :, n]``) but read no other unit."""
    window: ClassVar[int] = 1
    """How many consecutive inputs the projection reads (QRNN's width-2 filter: 2). Earlier inputs are
    feed-forward state, carried across segments but never differentiated through time."""
    structural_check: ClassVar[bool] = True
    """Whether RTRL and SnAP trace :meth:`recurrence` op by op before trusting it
    (docs/custom_cell.md#what-the-element-wise-check-guarantees). Set it to False only for a recurrence that uses an op
    the trace cannot follow and that you know to be element-wise; the numeric probes and RTRL's runtime verification
    still run."""

    def __new__(cls, *args: Any, **kwargs: Any) -> ElementwiseCell:
        # Remember the constructor's arguments, so that cell_spec() can name a way to build the cell again (checkpoints).
        self = super().__new__(cls)
        object.__setattr__(self, "_onlinerec_init", (args, kwargs))
        return self

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("recurrence")
        if callable(own) and not getattr(own, "__isabstractmethod__", False) and not hasattr(own, "_onlinerec_wrapped"):
            cls.recurrence = _explained(own)  # type: ignore[method-assign]

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{type(self).__name__}: {name} must be a positive int, got {value!r}.")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.input_proj = nn.Linear(self.window * input_size, self.num_gates * hidden_size)

    @property
    def output_size(self) -> int:
        """Width of :meth:`readout`'s output (N, or K*N for the default readout of K > 1 components, unless a subclass
        says otherwise)."""
        return self.hidden_size * self.num_components

    @property
    def state_shape(self) -> tuple[int, ...]:
        """Shape of one stream's state: (N,) for K = 1, (K, N) for K > 1."""
        k = self.num_components
        return (self.hidden_size,) if k == 1 else (k, self.hidden_size)

    @abstractmethod
    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        """One step of the state: gates (..., G, N) and c_prev (..., N) -> c (..., N); with K > 1 components,
        c_prev and c are (..., K, N).

        Must be element-wise: unit n of the result may read only ``gates[..., :, n]``, ``c_prev[..., n]`` (K > 1:
        ``c_prev[..., :, n]``) and column n of per-unit parameters. Leading dimensions are independent rows.
        """

    def readout(self, c: Tensor, x: Tensor) -> Tensor:
        """Feed-forward output from the new state c (..., N), or (..., K, N), and the step's input x (..., D).

        Not differentiated through time; the default returns c (K > 1: its K components side by side, (..., K*N)).
        Works on any leading dimensions, so the framework applies it to a whole segment (M, B, ...) at once.
        """
        return c if self.num_components == 1 else c.flatten(-2)

    def recurrence_derivatives(
        self, gates: Tensor, c_prev: Tensor, params: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]] | None:
        """Optional, for speed: :meth:`recurrence` and its local derivatives in closed form. None (the default): the
        gradient methods take them from :meth:`recurrence` by automatic differentiation, as for every cell.

        Rows: gates (R, G, N), c_prev (R, N) or (R, K, N); ``params`` holds the per-unit parameters to differentiate
        (name -> tensor of shape (N,) or (P, N); use these values, not the module's). Returns ``(c, d_state, d_gates,
        d_params)``: the new state; dc/dc_prev, (R, N) or per-unit blocks (R, K, K, N) with
        ``d_state[r, k, j, n] = dc_k/dc_prev_j``; dc/dgates, (R, G, N) or (R, K, G, N); and per name dc/dp, (R, P, N)
        or (R, K, P, N). Broadcast views (``expand``) are fine.

        An override is checked against automatic differentiation once per cell (a float64 probe at random states,
        gates and parameters) before it is used; a mismatch raises
        :class:`~onlinerec.gradients.ClosedFormMismatchError`, so a wrong closed form never trains silently.
        """
        return None

    def forward(self, u: Tensor, c_prev: Tensor) -> Tensor:
        """One pure step: window features u (B, window*D) and c_prev (B, N) -> c (B, N) (K > 1: (B, K, N))."""
        gates = self.input_proj(u).unflatten(-1, (self.num_gates, self.hidden_size))
        return self.recurrence(gates, c_prev)

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}"


class FullyRecurrentCell(ElementwiseCell):
    """A cell whose gates also read the whole previous state through a dense matrix R.

    ``recurrence(gates, c_prev) = combine(gates, R r(c_prev) + b_R, c_prev)`` with ``R = recurrent_proj``
    (``nn.Linear(N, G*N)``, with the bias b_R only if :attr:`recurrent_bias`) and r(c_prev) =
    :meth:`recurrent_input` (c_prev itself for K = 1; one component of each unit for K > 1, e.g. the LSTM's h).
    By default ``combine(gates, mixed, c_prev) = pointwise(gates + mixed, c_prev)``: subclasses implement
    :meth:`pointwise`, or override :meth:`combine` when the recurrent projection enters otherwise (the GRU's
    ``r * (U_n h + b_n)``). Both must be element-wise per unit.

    The Jacobian dc_t/dc_{t-1} is dense, so exact RTRL would cost O(N^4) per step and
    :class:`~onlinerec.gradients.RTRL` refuses such cells; SnAP-1 and TBPTT train them.
    """

    recurrent_bias: ClassVar[bool] = False
    """Whether ``recurrent_proj`` has a bias of its own (PyTorch's LSTM and GRU have b_hh besides b_ih)."""
    recurrent_component: ClassVar[int] = -1
    """K > 1: the component of each unit that R reads (the LSTM's h: the last, -1)."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        self.recurrent_proj = nn.Linear(hidden_size, self.num_gates * hidden_size, bias=self.recurrent_bias)

    def recurrent_input(self, c_prev: Tensor) -> Tensor:
        """What R multiplies: c_prev (..., N) for K = 1, its component :attr:`recurrent_component` for K > 1."""
        return c_prev if self.num_components == 1 else c_prev[..., self.recurrent_component, :]

    def pointwise(self, pre_gates: Tensor, c_prev: Tensor) -> Tensor:
        """Element-wise part: full pre-activations (..., G, N) and c_prev -> c (used by the default :meth:`combine`)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement pointwise(pre_gates, c_prev) or combine(gates, mixed, c_prev)."
        )

    def combine(self, gates: Tensor, mixed: Tensor, c_prev: Tensor) -> Tensor:
        """Element-wise part from the input gates (..., G, N), the recurrent projection ``mixed`` (..., G, N) and
        c_prev. Default: ``pointwise(gates + mixed, c_prev)``."""
        return self.pointwise(gates + mixed, c_prev)

    def joint_pointwise(self, both: Tensor, c_prev: Tensor) -> Tensor:
        """:meth:`combine` with its two projections stacked along the gate axis, ``both`` (..., 2G, N): the form whose
        local derivatives SnAP-1 takes when :meth:`combine` is overridden."""
        g = self.num_gates
        return self.combine(both[..., :g, :], both[..., g:, :], c_prev)

    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        mixed = self.recurrent_proj(self.recurrent_input(c_prev)).unflatten(-1, (self.num_gates, self.hidden_size))
        return self.combine(gates, mixed, c_prev)


def normal_(tensor: Tensor, std: float) -> Tensor:
    """In-place N(0, std^2) init without autograd (the paper's eLSTM init uses std 0.1)."""
    with torch.no_grad():
        return tensor.normal_(0.0, std)
