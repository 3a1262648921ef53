"""Stream order: a training loader must hand every stream's next segment to the same slot (no shuffling).

onlinerec carries each stream's state from one training batch to the next, so a loader that shuffles or interleaves
streams would hand one stream's memory to another without any error. :func:`check_stream_order` refuses such loaders
once per fit; :class:`ContinuityCheck` checks :class:`~onlinerec.data.sequences.SequenceSegment` batches as they arrive.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SubsetRandomSampler, WeightedRandomSampler
from torch.utils.data.distributed import DistributedSampler

from onlinerec.data.stream import StreamOrderError

__all__ = ["ContinuityCheck", "StreamOrderError", "check_batching", "check_ranks_differ", "check_stream_order"]


_ADVICE = (
    "onlinerec carries each stream's state from one training batch to the next, so batch k+1 must continue the "
    "streams of batch k, slot for slot. Serve Segments in order: a SegmentStream, a SequenceDataModule, or a "
    "DataLoader(dataset, batch_size=None, shuffle=False, num_workers=0)."
)


def _describe_order_problem(loader: DataLoader, world_size: int) -> str | None:
    samplers = [loader.sampler, getattr(loader.batch_sampler, "sampler", None)]
    for s in samplers:
        if isinstance(s, (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)):
            return f"the training DataLoader samples in random order ({type(s).__name__}, e.g. from shuffle=True)"
        if isinstance(s, DistributedSampler):
            if s.shuffle:
                return "the training DataLoader's DistributedSampler shuffles"
            if s.num_replicas > 1:
                return (
                    f"the training DataLoader has a DistributedSampler that deals every {s.num_replicas}-th batch to each "
                    "rank, so a rank's consecutive batches are not consecutive segments. Under DDP give each rank its own "
                    "streams (shard by trainer.global_rank) and pass Trainer(use_distributed_sampler=False)"
                )
    if isinstance(loader.dataset, IterableDataset) and loader.num_workers > 0:
        return (
            f"the training DataLoader reads an IterableDataset with num_workers={loader.num_workers}: each worker "
            "iterates its own copy and their batches are interleaved, so consecutive batches come from different "
            "copies of the streams. Use num_workers=0"
        )
    return None


def check_stream_order(trainer: L.Trainer | None) -> None:
    """Raise :class:`StreamOrderError` if the trainer's training loader(s) reorder streams between batches.

    Detected: a ``DataLoader`` with a random sampler (``shuffle=True``, ``RandomSampler``, ``SubsetRandomSampler``,
    ``WeightedRandomSampler``); a ``DistributedSampler`` that shuffles or splits batches across ranks; an
    ``IterableDataset`` read by several worker processes. Loaders that are not ``DataLoader`` s (a SegmentStream,
    a rollout stream) are trusted. SequenceSegment batches are also checked for continuity as they arrive (see
    ``OnlineRecurrentModule``).
    """
    if trainer is None:
        return
    try:
        loaders = trainer.train_dataloader
    except Exception:  # noqa: BLE001  (no fit loop yet: nothing to check)
        return
    if loaders is None:
        return
    flat = _flatten(loaders)
    for loader in flat:
        if isinstance(loader, DataLoader):
            problem = _describe_order_problem(loader, trainer.world_size)
            if problem:
                raise StreamOrderError(f"{problem}. {_ADVICE}")


def check_batching(loaders: Any, split: str) -> None:
    """Raise a TypeError naming the fix if a ``DataLoader`` would re-batch Segments (its default ``batch_size=1``).

    A Segment is already a batch of B streams; torch's ``default_collate`` cannot stack Segments and would fail with
    a message that does not say why. Checks map-style datasets (their first item); iterable ones are left alone.
    """
    from onlinerec.data.segment import Segment

    for loader in _flatten(loaders):
        if (
            not isinstance(loader, DataLoader)
            or loader.batch_size is None
            or isinstance(loader.dataset, IterableDataset)
        ):
            continue
        try:
            first = loader.dataset[0] if len(loader.dataset) else None  # type: ignore[arg-type]
        except Exception:  # noqa: S112 -- a dataset we cannot peek into: the batch check in the step still applies
            continue
        if isinstance(first, Segment):
            raise TypeError(
                f"the {split} DataLoader batches Segments (batch_size={loader.batch_size}), but each Segment already "
                "holds B streams: build it with DataLoader(segments, batch_size=None), or serve a SegmentStream."
            )


def _flatten(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _flatten(v)]
    if isinstance(obj, (list, tuple)):
        return [x for v in obj for x in _flatten(v)]
    return [obj]


class ContinuityCheck:
    """Checks, segment by segment, that a stream slot keeps its sequence unless it is reset.

    Reads ``segment.sequence_id`` (:class:`~onlinerec.data.sequences.SequenceSegment`); segments without it pass.
    A stream that is not reset at a segment's first step must continue the sequence it held at the end of the
    previous segment, else the loader reordered or shuffled the streams.
    """

    def __init__(self) -> None:
        self.last: Tensor | None = None

    def check(self, segment: Any, continuing: bool = True) -> None:
        """Raise :class:`StreamOrderError` if a slot moved to another sequence without a reset.
        ``continuing=False`` (no carried state yet) only records the segment's last sequence ids."""
        ids = getattr(segment, "sequence_id", None)
        if not isinstance(ids, Tensor):
            return
        last, self.last = self.last, ids[-1].detach()
        if not continuing or last is None or last.shape != ids[0].shape:
            return
        moved = (~segment.reset[0]) & (ids[0] != last.to(ids.device))
        if bool(moved.any()):
            b = int(moved.nonzero()[0, 0])
            raise StreamOrderError(
                f"stream slot {b} held sequence {int(last[b])} at the end of the previous segment but continues with "
                f"sequence {int(ids[0, b])} without a reset: the streams were reordered or shuffled between segments. "
                "onlinerec carries each slot's state to the next segment, so keep every sequence in its slot "
                "(no shuffling, no DataLoader workers) or set reset=True where a new sequence starts."
            )


def check_ranks_differ(segment: Any) -> None:
    """Under DDP, raise :class:`StreamOrderError` on every rank if all ranks got the same training segment.

    Each rank must own its streams; a loader that does not shard by rank (a ``SegmentStream`` whose
    ``make_segments`` ignores the rank, a dataset read whole on every process) trains every rank on the same data,
    which DDP would average without complaint. One small all-gather of a fingerprint of the segment's inputs.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    x = segment.inputs.detach().to(torch.float64)
    fingerprint = (tuple(x.shape), round(float(x.sum()), 9), round(float((x * x).sum()), 9))
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, fingerprint)
    if all(f == gathered[0] for f in gathered):
        raise StreamOrderError(
            f"all {len(gathered)} DDP ranks got the same first training segment, so every rank would train on the same "
            "streams. Give each rank its own: shard by trainer.global_rank in your data module, or build the "
            "SegmentStream with make_segments(epoch, rank, world_size) (onlinerec's data modules do this)."
        )
