"""The per-stream state a gradient method carries from one segment to the next: a :class:`Carry` per cell, a
:class:`StackCarry` (one carry per layer) for a :class:`~onlinerec.cells.Stack`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class Carry:
    """State of B streams between segments. Every tensor is detached; row b belongs to stream b.

    Attributes:
        c: recurrent state c_{t} after the last processed step, shape (B, N); (B, K, N) for a cell with
            K = ``num_components`` > 1.
        window: the last ``window - 1`` inputs, flattened to (B, (window-1)*D), already zeroed where a
            reset separates them from the next step; None for cells with ``window == 1``.
        sensitivities: RTRL/SnAP only: for each tracked cell parameter (by its ``named_parameters`` name)
            dc/dtheta in the canonical layout (B, P, N, F): the parameter viewed as (P, N, F), where column
            n holds the entries that influence unit n. The input projection weight is (B, G, N, window*D),
            its bias (B, G, N, 1), a per-unit vector (B, 1, N, 1) and a (P, N) per-unit matrix (B, P, N, 1).
            With K > 1 components per unit each gains a component axis after B, dc[k]/dtheta:
            (B, K, G, N, window*D) for the input projection weight, (B, K, P, N, 1) for a per-unit parameter.
    """

    c: Tensor
    window: Tensor | None = None
    sensitivities: dict[str, Tensor] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.c.shape[0]

    @property
    def device(self) -> torch.device:
        return self.c.device

    def state_only(self) -> Carry:
        """The state and input window without sensitivities (what a method without them, e.g. TBPTT, carries)."""
        return Carry(c=self.c, window=self.window)

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors only, so checkpoints load with ``torch.load(weights_only=True)``."""
        return {"c": self.c, "window": self.window, "sensitivities": dict(self.sensitivities)}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Carry:
        return cls(c=state["c"], window=state.get("window"), sensitivities=dict(state.get("sensitivities", {})))

    def to(self, device: torch.device | str) -> Carry:
        return Carry(
            c=self.c.to(device),
            window=None if self.window is None else self.window.to(device),
            sensitivities={k: v.to(device) for k, v in self.sensitivities.items()},
        )

    def nbytes(self) -> int:
        """Bytes held by the carried tensors (sensitivities dominate for RTRL)."""
        tensors = [self.c, *self.sensitivities.values()] + ([] if self.window is None else [self.window])
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class StackCarry:
    """The carry of a :class:`~onlinerec.cells.Stack`: one carry per layer, bottom first, each made by the same method.

    Same interface as :class:`Carry` (``batch_size``, ``device``, ``to``, ``state_only``, ``state_dict`` /
    :func:`load_carry`, ``nbytes``); ``layers[l]`` is layer l's own :class:`Carry`.
    """

    layers: list[Carry | StackCarry]

    @property
    def batch_size(self) -> int:
        return self.layers[0].batch_size

    @property
    def device(self) -> torch.device:
        return self.layers[0].device

    def state_only(self) -> StackCarry:
        return StackCarry([layer.state_only() for layer in self.layers])

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors only: ``{"layers": [each layer's state_dict]}``."""
        return {"layers": [layer.state_dict() for layer in self.layers]}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> StackCarry:
        return cls([load_carry(layer) for layer in state["layers"]])

    def to(self, device: torch.device | str) -> StackCarry:
        return StackCarry([layer.to(device) for layer in self.layers])

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)


def load_carry(state: dict[str, Any]) -> Carry | StackCarry:
    """A carry from its ``state_dict``: a :class:`StackCarry` if it has ``"layers"``, else a :class:`Carry` (the layout
    of every checkpoint written before stacks existed)."""
    return StackCarry.from_state_dict(state) if "layers" in state else Carry.from_state_dict(state)
