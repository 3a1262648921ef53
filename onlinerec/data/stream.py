"""A resumable stream of Segments, the shape every onlinerec training loader takes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from onlinerec.data.segment import Segment


class SegmentStream:
    """Iterable of :class:`Segment` batches that Lightning can checkpoint and resume mid-epoch.

    Lightning saves ``state_dict()`` of a training loader that has one and calls ``load_state_dict()`` on
    resume; this stream records how many segments the trainer has *consumed* and, on resume, regenerates
    and skips them, so the first segment after a resume is the one the interrupted run would have seen next.
    Use it as the loader itself (``train_dataloader`` returns it), not wrapped in a DataLoader: segments are
    already batched over streams and must be produced in the training process (num_workers = 0).

    Args:
        make_segments: ``make_segments(epoch)`` returns a fresh iterator over one epoch's segments. It must be
            deterministic given the epoch (seed from it) for resumes to be exact.
    """

    def __init__(self, make_segments: Callable[[int], Iterator[Segment]]) -> None:
        self._make = make_segments
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
        for i, segment in enumerate(self._make(self.epoch)):
            if i < skip:
                continue
            self.consumed = i + 1
            yield segment
        self._exhausted = True

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
