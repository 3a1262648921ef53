"""The per-stream state a gradient method carries from one segment to the next."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class Carry:
    """State of B streams between segments. Every tensor is detached; row b belongs to stream b.

    Attributes:
        c: recurrent state c_{t} after the last processed step, shape (B, N).
        window: the last ``window - 1`` inputs, flattened to (B, (window-1)*D), already zeroed where a
            reset separates them from the next step; None for cells with ``window == 1``.
        sensitivities: RTRL/SnAP only: for each tracked cell parameter (by its ``named_parameters`` name)
            dc/dtheta in the canonical layout (B, K, N, F): the parameter viewed as (K, N, F), where column
            n holds the entries that influence unit n. The input projection weight is (B, G, N, window*D),
            its bias (B, G, N, 1), a per-unit vector (B, 1, N, 1) and a (K, N) per-unit matrix (B, K, N, 1).
    """

    c: Tensor
    window: Tensor | None = None
    sensitivities: dict[str, Tensor] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.c.shape[0]

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
