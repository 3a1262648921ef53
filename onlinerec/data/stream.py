"""A resumable stream of Segments, the shape every onlinerec training loader takes."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from onlinerec.data.segment import Segment

__all__ = ["SegmentStream", "StreamOrderError"]


class StreamOrderError(ValueError):
    """The training data would hand a stream's carried state to another stream (shuffling, interleaving), or give
    several DDP ranks the same streams."""


class SegmentStream:
    """Iterable of :class:`Segment` batches that Lightning can checkpoint and resume mid-epoch.

    Lightning saves ``state_dict()`` of a training loader that has one and calls ``load_state_dict()`` on
    resume; this stream records how many segments the trainer has *consumed* and, on resume, regenerates
    and skips them, so the first segment after a resume is the one the interrupted run would have seen next.
    Use it as the loader itself (``train_dataloader`` returns it), not wrapped in a DataLoader: segments are
    already batched over streams and must be produced in the training process (num_workers = 0).

    Under DDP every rank must serve its own streams: give ``make_segments`` the keyword parameters ``rank`` and
    ``world_size`` and it is called with this process's (or shard inside it yourself). An
    :class:`~onlinerec.OnlineRecurrentModule` refuses, with :class:`StreamOrderError`, ranks whose first training
    segments are identical.

    Args:
        make_segments: ``make_segments(epoch)`` (or ``make_segments(epoch, rank=..., world_size=...)``) returns a
            fresh iterator over one epoch's segments of this process. It must be deterministic given its arguments
            (seed from them) for resumes to be exact.
    """

    def __init__(self, make_segments: Callable[..., Iterator[Segment]]) -> None:
        self._make = make_segments
        params = inspect.signature(make_segments).parameters
        self._rank_aware = {"rank", "world_size"} <= set(params) or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        )
        self.epoch = 0
        self.consumed = 0  # segments of the current epoch handed out and not given back (see state_dict)
        self._skip = 0
        self._started = False
        self._exhausted = False

    def __iter__(self) -> Iterator[Segment]:
        if self._started and self._skip == 0:
            self.epoch += 1  # a fresh iteration after a finished or abandoned one is a new epoch
        self._started = True
        skip, self._skip = self._skip, 0
        self.consumed = 0
        self._exhausted = False
        for i, segment in enumerate(self._epoch_segments()):
            if i < skip:
                continue
            self.consumed = i + 1
            yield segment
        self._exhausted = True

    def _epoch_segments(self) -> Iterator[Segment]:
        world, rank = (
            (dist.get_world_size(), dist.get_rank()) if dist.is_available() and dist.is_initialized() else (1, 0)
        )
        if self._rank_aware:
            return self._make(self.epoch, rank=rank, world_size=world)
        return self._make(self.epoch)

    def state_dict(self) -> dict[str, Any]:
        # Lightning fetches one batch ahead of the one being trained on (that one is not consumed yet) unless it
        # knows the loader's length: then it fetches no further than the batch being trained on. At the end of an
        # epoch the look-ahead found nothing, so every segment handed out is consumed.
        ahead = 0 if self._exhausted or _has_len(self) else 1
        return {"epoch": self.epoch, "consumed": max(0, self.consumed - ahead)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self._skip = int(state["consumed"])
        self._started = True


def _has_len(obj: Any) -> bool:
    try:
        len(obj)
    except (TypeError, NotImplementedError):
        return False
    return True
