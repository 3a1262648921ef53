"""The Segment: every training batch, supervised or RL, is M consecutive steps of B parallel streams."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from torch import Tensor


def check_segment_length(M: Any, name: str = "M") -> int:
    """``M`` itself if it is an int >= 1, else a ValueError that says what M is."""
    if isinstance(M, bool) or not isinstance(M, int) or M < 1:
        raise ValueError(
            f"{name} (steps between weight updates) must be an int >= 1, got {M!r}. M = 1 is fully online learning."
        )
    return M


@dataclass
class Segment:
    """M consecutive steps from B streams, time-major.

    Streams keep their slot from one segment to the next (never shuffled): the carried state of slot b
    belongs to stream b.

    Attributes:
        inputs: (M, B, ...) what the model reads at each step.
        reset: (M, B) bool; True where a new sequence/episode starts. The carried state of that stream is
            zeroed *before* the flagged step.
        targets: (M, B, ...) supervised targets, or None (RL segments carry their own fields).
    """

    inputs: Tensor
    reset: Tensor
    targets: Tensor | None = None

    distinct_per_rank: ClassVar[bool] = False
    """True for segment types whose source gives every DDP rank its own streams by construction (rollouts from envs
    seeded by rank), so the module need not check that ranks differ."""

    def __post_init__(self) -> None:
        if not isinstance(self.inputs, Tensor) or self.inputs.dim() < 2:
            raise ValueError("Segment.inputs must be a tensor shaped (M, B, ...).")
        m, b = self.inputs.shape[:2]
        if not isinstance(self.reset, Tensor) or self.reset.dtype != torch.bool or tuple(self.reset.shape) != (m, b):
            got = (
                (self.reset.dtype, tuple(self.reset.shape))
                if isinstance(self.reset, Tensor)
                else type(self.reset).__name__
            )
            raise ValueError(
                f"Segment.reset must be a bool tensor of shape (M, B) = {(m, b)}; got {got}. Build it with dtype=torch.bool "
                "(e.g. reset.bool()), True where a stream starts a new sequence, one row per step and one column per stream."
            )
        if self.targets is not None and tuple(self.targets.shape[:2]) != (m, b):
            raise ValueError(f"Segment.targets must start with (M, B) = {(m, b)}; got {tuple(self.targets.shape)}.")

    @property
    def length(self) -> int:
        """The number of steps the segment holds (M for a plain Segment)."""
        return self.inputs.shape[0]

    @property
    def steps(self) -> int:
        """M, the number of steps a weight update trains on (a rollout segment holds one more: the bootstrap)."""
        return self.length

    @property
    def num_streams(self) -> int:
        """B, the number of parallel streams."""
        return self.inputs.shape[1]

    def to(self, device: torch.device | str) -> Segment:
        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        return type(self)(**{k: v.to(device) if isinstance(v, Tensor) else v for k, v in values.items()})
