"""What every through-time gradient method shares: input checks, the input window, the time loop."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import Tensor

from onlinerec.cells.base import ElementwiseCell
from onlinerec.cells.composite import CompositeCell
from onlinerec.gradients.carry import Carry, StackCarry


class GradientMethod(ABC):
    """A way to obtain gradients through time for segments of M steps from B streams.

    Contract: ``carry = init_carry(cell, B)``; then per segment
    ``states, carry = unroll(cell, inputs, reset, carry)`` and ``loss(states).backward()`` leaves the
    method's gradient in every cell parameter's ``.grad``. Nothing else is called in between.
    ``reset[t, b]`` zeroes stream b's state (and sensitivities) *before* step t.

    A :class:`~onlinerec.cells.Stack` is unrolled layer by layer over the segment, each layer by this method with its
    own carry (a :class:`StackCarry`); ``unroll`` then returns the stack's output instead of states.
    """

    name: ClassVar[str]
    supports_donation: ClassVar[bool] = False
    """Whether :meth:`_unroll` takes ``donate=`` (a method that never updates a carry in place ignores donation)."""

    def check_cell(self, cell: ElementwiseCell) -> None:
        """Raise a clear error if this method cannot train ``cell`` (for a stack: any of its layers)."""
        if not isinstance(cell, ElementwiseCell):
            raise TypeError(
                f"{type(self).__name__} trains onlinerec cells (ElementwiseCell subclasses), got {type(cell).__name__}."
            )
        if isinstance(cell, CompositeCell):
            for layer in cell.layers:
                self.check_cell(layer)

    def init_carry(
        self,
        cell: ElementwiseCell,
        batch_size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> Carry | StackCarry:
        """Zero state for ``batch_size`` streams, on the cell's device and dtype unless given (a :class:`StackCarry`
        with one carry per layer for a :class:`~onlinerec.cells.Stack`)."""
        self.check_cell(cell)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
        if isinstance(cell, CompositeCell):
            return StackCarry([self.init_carry(layer, batch_size, device=device, dtype=dtype) for layer in cell.layers])
        ref = cell.input_proj.weight
        device = ref.device if device is None else device
        dtype = ref.dtype if dtype is None else dtype
        window = None
        if cell.window > 1:
            window = torch.zeros(batch_size, (cell.window - 1) * cell.input_size, device=device, dtype=dtype)
        c = torch.zeros(batch_size, *cell.state_shape, device=device, dtype=dtype)
        return Carry(c=c, window=window, sensitivities=self._zero_sensitivities(cell, batch_size, device, dtype))

    def _zero_sensitivities(self, cell: ElementwiseCell, batch_size: int, device, dtype) -> dict[str, Tensor]:
        return {}

    def sensitivity_names(self, cell: ElementwiseCell) -> tuple[str, ...]:
        """Names of the cell parameters whose sensitivities this method carries (none for TBPTT)."""
        return ()

    def adapt_carry(self, cell: ElementwiseCell, carry: Carry | StackCarry) -> tuple[Carry | StackCarry, bool]:
        """A carry for this method from one made by another (resuming with a new strategy): the state and input
        window are kept, the sensitivities this method needs are kept or, if missing, start at zero. Returns the carry
        and whether any sensitivity restarted from zero (the gradient then truncates once)."""
        if isinstance(cell, CompositeCell):
            if not isinstance(carry, StackCarry) or len(carry.layers) != cell.num_layers:
                raise ValueError(_stack_carry_mismatch(cell, carry))
            adapted = [self.adapt_carry(layer, c) for layer, c in zip(cell.layers, carry.layers)]
            return StackCarry([c for c, _ in adapted]), any(restarted for _, restarted in adapted)
        if isinstance(carry, StackCarry):
            raise ValueError(_stack_carry_mismatch(cell, carry))
        needed, have = self.sensitivity_names(cell), set(carry.sensitivity_names())
        if have == set(needed):
            return carry, False
        if set(needed) <= have:
            sens, scale = carry.raw_sensitivities()  # a lazily scaled carry stays so (docs: Carry)
            return Carry(carry.c, carry.window, {k: sens[k] for k in needed}, scale=scale), False
        fresh = self.init_carry(cell, carry.batch_size, device=carry.c.device, dtype=carry.c.dtype)
        return Carry(carry.c, carry.window, fresh.sensitivities), True

    def unroll(
        self,
        cell: ElementwiseCell,
        inputs: Tensor,
        reset: Tensor,
        carry: Carry | StackCarry,
        *,
        donate: bool = False,
    ) -> tuple[Tensor, Carry | StackCarry]:
        """Run M steps. inputs (M, B, D) float, reset (M, B) bool -> states (M, B, N) ((M, B, K, N) for units of
        K > 1 components; the stack's output (M, B, output_size) for a :class:`~onlinerec.cells.Stack`) and the new
        carry.

        ``donate=True`` gives up ``carry``: the method may update its tensors in place and return them in the new
        carry, so the old one must not be used afterwards (its sensitivities may already hold the new values). RTRL
        and SnAP then write the new sensitivities over the old ones: during the step at M = 1, right after backward has
        read the old ones at M > 1 (see :class:`~onlinerec.gradients.carry.Carry`, "Deferred sensitivities"), so no
        second sensitivity-sized tensor is alive. With a donated M > 1 segment, the graph's backward can run once. The
        default leaves ``carry`` intact. ``OnlineRecurrentModule`` donates its own training streams' carries."""
        self.check_cell(cell)
        if isinstance(cell, CompositeCell):
            if not isinstance(carry, StackCarry) or len(carry.layers) != cell.num_layers:
                raise ValueError(_stack_carry_mismatch(cell, carry))
            if isinstance(inputs, Tensor) and inputs.dim() == 3 and inputs.shape[-1] != cell.input_size:
                raise ValueError(
                    f"inputs have D = {inputs.shape[-1]} features but the {type(cell).__name__} was built with "
                    f"input_size = {cell.input_size}."
                )
            out, layers = cell.unroll_layers(
                lambda layer, x, c: self.unroll(layer, x, reset, c, donate=donate), inputs, carry.layers
            )
            return out, StackCarry(layers)
        if isinstance(carry, StackCarry):
            raise ValueError(_stack_carry_mismatch(cell, carry))
        carry._check_not_donated()
        validate_segment(cell, inputs, reset, carry)
        if not donate:
            return self._unroll(cell, inputs, reset, carry)
        out = (
            self._unroll(cell, inputs, reset, carry, donate=True)
            if self.supports_donation
            else self._unroll(cell, inputs, reset, carry)
        )
        carry._give_up()
        return out

    def step(
        self, cell: ElementwiseCell, inputs: Tensor, reset: Tensor, carry: Carry | StackCarry
    ) -> tuple[Tensor, Carry | StackCarry]:
        """One step of B streams with ``carry`` donated: inputs (B, D), reset (B,) bool -> the state (B, ...) (a
        stack's output) and the new carry, as ``unroll(cell, inputs[None], reset[None], carry, donate=True)`` gives
        them for M = 1. A streaming learner calls it at every env step."""
        if not isinstance(inputs, Tensor) or inputs.dim() != 2:
            shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
            raise ValueError(
                f"step takes one step of B streams, inputs (B, D); got {shape}. For a segment of M steps (M, B, D), "
                "call unroll."
            )
        if not isinstance(reset, Tensor) or reset.dtype != torch.bool:
            what = reset.dtype if isinstance(reset, Tensor) else type(reset).__name__
            raise TypeError(f"step takes reset as a bool tensor (B,), got {what}; use reset.bool().")
        if reset.dim() != 1:
            raise ValueError(f"step takes reset of shape (B,), one flag a stream; got {tuple(reset.shape)}.")
        states, carry = self.unroll(cell, inputs.unsqueeze(0), reset.unsqueeze(0), carry, donate=True)
        return states[0], carry

    @abstractmethod
    def _unroll(self, cell: ElementwiseCell, inputs: Tensor, reset: Tensor, carry: Carry) -> tuple[Tensor, Carry]: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def validate_segment(cell: ElementwiseCell, inputs: Tensor, reset: Tensor, carry: Carry) -> None:
    """Shapes, dtypes and devices of one segment, with errors that say how to fix them."""
    if not isinstance(inputs, Tensor) or inputs.dim() != 3:
        shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
        raise ValueError(f"inputs must be a time-major tensor (M, B, D); got {shape}. Stack steps along dim 0.")
    m, b, d = inputs.shape
    if m < 1:
        raise ValueError("inputs has M = 0 steps; a segment needs M >= 1.")
    if d != cell.input_size:
        raise ValueError(
            f"inputs have D = {d} features but {type(cell).__name__} was built with input_size = {cell.input_size}."
        )
    ref = cell.input_proj.weight
    if inputs.dtype != ref.dtype:
        raise TypeError(
            f"inputs are {inputs.dtype} but the cell's parameters are {ref.dtype}; cast one to match (e.g. inputs.to({ref.dtype}))."
        )
    if inputs.device != ref.device:
        raise ValueError(
            f"inputs are on {inputs.device} but the cell is on {ref.device}; move them to the same device."
        )
    if not isinstance(reset, Tensor) or reset.dtype != torch.bool:
        what = reset.dtype if isinstance(reset, Tensor) else type(reset).__name__
        raise TypeError(
            f"reset must be a bool tensor (M, B), got {what}; use reset.bool() or build it with dtype=torch.bool."
        )
    if tuple(reset.shape) != (m, b):
        raise ValueError(f"reset has shape {tuple(reset.shape)} but inputs need (M, B) = {(m, b)}.")
    if carry.batch_size != b:
        raise ValueError(
            f"the carry holds {carry.batch_size} streams but inputs have B = {b}; make a new one with init_carry(cell, {b})."
        )
    if tuple(carry.c.shape[1:]) != cell.state_shape:
        raise ValueError(
            f"the carry's state has shape {tuple(carry.c.shape[1:])} per stream but {type(cell).__name__}'s is "
            f"{cell.state_shape}; make the carry with init_carry(cell, {b})."
        )


def _stack_carry_mismatch(cell: ElementwiseCell, carry: object) -> str:
    what = f"a carry of {len(carry.layers)} layers" if isinstance(carry, StackCarry) else "a single cell's carry"
    if isinstance(cell, CompositeCell):
        want = f"a {type(cell).__name__} of {cell.num_layers} {cell.parts_name}"
    else:
        want = f"a single {type(cell).__name__}"
    return f"got {what} for {want}; make the carry with init_carry for this cell."


def window_features(
    cell: ElementwiseCell, inputs: Tensor, keep: Tensor, window: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """Concatenate each step's last ``cell.window`` inputs (newest first), zeroing those before a reset.

    Returns features u (M, B, window*D) and the new carried window (already masked for the next segment).
    """
    w = cell.window
    if w == 1:
        return inputs, None
    m, b, d = inputs.shape
    if window is None:
        raise ValueError(
            f"{type(cell).__name__} reads {w} inputs per step but the carry has no window; make it with init_carry."
        )
    history = torch.cat([window.reshape(b, w - 1, d).flip(1).transpose(0, 1), inputs])  # oldest first
    keep_ext = torch.cat([keep.new_ones(w - 1, b), keep])  # the carried window is masked already
    n = history.shape[0]
    parts, mask = [inputs], keep_ext[w - 1 :]
    for k in range(1, w):
        parts.append(history[w - 1 - k : n - k] * mask.unsqueeze(-1))
        mask = mask * keep_ext[w - 1 - k : n - k]
    feats = torch.cat(parts, dim=-1)
    last, mask = [history[n - 1]], keep_ext.new_ones(b)
    for k in range(1, w - 1):
        mask = mask * keep_ext[n - k]
        last.append(history[n - 1 - k] * mask.unsqueeze(-1))
    return feats, torch.cat(last, dim=-1).detach()


def autograd_scan(cell: ElementwiseCell, gates: Tensor, c0: Tensor, keep: Tensor) -> Tensor:
    """The time loop, recorded by autograd: c_t = recurrence(gates_t, keep_t * c_{t-1}). gates (M, B, G, N) -> states
    (M, B, N), or (M, B, K, N) for units of K > 1 components."""
    c, states = c0, []
    mask = keep.unsqueeze(-1) if c0.dim() == 2 else keep.reshape(*keep.shape, *([1] * (c0.dim() - 1)))
    for t in range(gates.shape[0]):
        c = cell.recurrence(gates[t], c * mask[t])
        states.append(c)
    return torch.stack(states)


def project(cell: ElementwiseCell, feats: Tensor) -> Tensor:
    """All steps' gate pre-activations in one matmul: (M, B, window*D) -> (M, B, G, N)."""
    return cell.input_proj(feats).unflatten(-1, (cell.num_gates, cell.hidden_size))
