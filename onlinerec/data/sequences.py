"""Supervised streams: variable-length sequences dealt to B parallel streams and cut into M-step Segments.

A dataset of sequences (each a pair ``(inputs (L, ...), targets (L, ...))``) becomes, per epoch, B streams
that play sequences back to back. Each batch is a :class:`SequenceSegment` of the next M steps of every
stream, so the carried state of slot b always belongs to stream b (docs/concepts.md#the-segment).

Assignment (deterministic, documented contract)
    Sequences are dealt **in index order** to the stream that becomes free first, the lowest slot on ties.
    So at the start of an epoch sequence b goes to slot b (b < B), and every later sequence starts on the
    first stream that has finished its previous one. Start times are non-decreasing in the sequence index,
    every sequence is played exactly once per epoch, whole and in order of its steps, and with equal lengths
    the deal is plain round robin (sequence i -> slot i mod B).

Padding convention
    Streams only run dry at the end of an epoch (the deal never leaves a stream idle while sequences remain).
    From then on, until the last segment is full (every segment has exactly M steps and B streams), a stream
    holds padding steps: ``inputs = pad_value``, ``targets = ignore_index`` (integer targets; float targets
    get ``pad_target``), ``sequence_id = -1`` and ``reset = True``. The reset on every padding step means
    padding never mixes into any sequence's carried state. ``segment.mask`` is True on real steps.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import lightning as L
import torch
from torch import Tensor

from onlinerec.data.segment import Segment, check_segment_length
from onlinerec.data.stream import SegmentStream

IGNORE_INDEX = -100
"""Target value of steps that carry no label (padding, or steps of a task with no answer); PyTorch's default."""


class SequenceDataset(Protocol):
    """What :class:`SequenceDataModule` reads: ``len(ds)`` and ``ds[i] -> (inputs (L, ...), targets (L, ...))``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]: ...


@dataclass
class SequenceSegment(Segment):
    """A :class:`Segment` of supervised sequences; adds which sequence each step belongs to.

    Attributes:
        sequence_id: (M, B) int64, the dataset index of the sequence at each step, -1 on padding steps.
            Per-sequence metrics (:class:`SequenceAccuracy`) group steps by it,
            since one sequence usually spans several segments.
    """

    sequence_id: Tensor | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sequence_id is None:
            self.sequence_id = torch.zeros(self.reset.shape, dtype=torch.long, device=self.reset.device)
        elif tuple(self.sequence_id.shape) != tuple(self.reset.shape):
            raise ValueError(f"SequenceSegment.sequence_id must have shape (M, B) = {tuple(self.reset.shape)}.")

    @property
    def mask(self) -> Tensor:
        """(M, B) bool: True on real steps, False on padding."""
        return self.sequence_id >= 0  # type: ignore[operator]  # set in __post_init__


def check_count(value: Any, name: str) -> int:
    """``value`` if it is an int >= 1, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
    return value


def _check_sequence(index: int, inputs: Tensor, targets: Tensor) -> int:
    if inputs.dim() < 1 or targets.dim() < 1 or inputs.shape[0] != targets.shape[0]:
        raise ValueError(
            f"sequence {index}: inputs {tuple(inputs.shape)} and targets {tuple(targets.shape)} must both start with "
            "the same length L (time first)."
        )
    if inputs.shape[0] == 0:
        raise ValueError(f"sequence {index} is empty; every sequence needs at least one step.")
    return inputs.shape[0]


def sequence_lengths(dataset: SequenceDataset) -> list[int]:
    """Every sequence's length: ``dataset.lengths()`` when the dataset has it, else by reading each sequence."""
    getter = getattr(dataset, "lengths", None)
    if callable(getter):
        return [int(n) for n in getter()]
    return [_check_sequence(i, *dataset[i]) for i in range(len(dataset))]


def count_segments(lengths: Sequence[int], num_streams: int, segment_length: int) -> int:
    """How many segments :func:`deal` yields for sequences of these lengths (the same deal, without the data)."""
    free = [0] * min(num_streams, max(len(lengths), 1))
    for n in lengths:  # the earliest free stream takes the next sequence
        heapq.heapreplace(free, free[0] + n)
    return -(-max(free) // segment_length) if lengths else 0


def deal(
    dataset: SequenceDataset,
    num_streams: int,
    segment_length: int,
    *,
    indices: Sequence[int] | None = None,
    ignore_index: int = IGNORE_INDEX,
    pad_value: float = 0,
    pad_target: float = 0.0,
) -> Iterator[SequenceSegment]:
    """One epoch of ``dataset`` as consecutive :class:`SequenceSegment` s of ``segment_length`` steps and ``num_streams`` streams.

    Sequences ``indices`` (default: all, in order) are dealt in that order to the stream that becomes free first
    (lowest slot on ties); the last segments are padded (see the module docstring). ``sequence_id`` holds the
    dataset index of each step's sequence.
    """
    for name, value in (("num_streams", num_streams), ("segment_length (M)", segment_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
    order = range(len(dataset)) if indices is None else indices
    m, free = segment_length, [(0, b) for b in range(num_streams)]  # (time the stream becomes free, slot): a heap
    active: list[tuple[int, int, Tensor, Tensor, int]] = []  # (slot, start, inputs, targets, index)
    nxt, t0 = 0, 0
    while True:
        t1 = t0 + m
        while nxt < len(order) and free[0][0] < t1:
            start, slot = heapq.heappop(free)
            index = order[nxt]
            inputs, targets = dataset[index]
            active.append((slot, start, inputs, targets, index))
            heapq.heappush(free, (start + _check_sequence(index, inputs, targets), slot))
            nxt += 1
        if not active:
            return
        x0, y0 = active[0][2], active[0][3]
        pad_y = pad_target if (y0.dtype.is_floating_point or y0.dtype.is_complex) else ignore_index
        inputs = torch.full((m, num_streams, *x0.shape[1:]), pad_value, dtype=x0.dtype)
        targets = torch.full((m, num_streams, *y0.shape[1:]), pad_y, dtype=y0.dtype)
        reset = torch.ones(m, num_streams, dtype=torch.bool)
        seq_id = torch.full((m, num_streams), -1, dtype=torch.long)
        for slot, start, x, y, index in active:
            lo, hi = max(start, t0), min(start + x.shape[0], t1)
            inputs[lo - t0 : hi - t0, slot] = x[lo - start : hi - start]
            targets[lo - t0 : hi - t0, slot] = y[lo - start : hi - start]
            reset[lo - t0 : hi - t0, slot] = False
            seq_id[lo - t0 : hi - t0, slot] = index
            if start >= t0:
                reset[start - t0, slot] = True
        yield SequenceSegment(inputs=inputs, reset=reset, targets=targets, sequence_id=seq_id)
        active = [p for p in active if p[1] + p[2].shape[0] > t1]
        t0 = t1


class SequenceStream(SegmentStream):
    """A resumable loader (:class:`~onlinerec.data.SegmentStream`) that serves :func:`deal` of a dataset every epoch.

    ``len()`` is the number of segments per epoch. ``rank`` / ``world_size`` give each DDP rank its own
    sequences (every ``world_size``-th, from ``rank``) and so its own streams.
    """

    def __init__(
        self,
        dataset: SequenceDataset,
        num_streams: int,
        segment_length: int,
        *,
        ignore_index: int = IGNORE_INDEX,
        pad_value: float = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        super().__init__(self._epoch)
        self.dataset, self.num_streams, self.segment_length = dataset, num_streams, segment_length
        self.ignore_index, self.pad_value = ignore_index, pad_value
        self.indices = range(rank, len(dataset), world_size)
        self._len: int | None = None

    def _epoch(self, epoch: int, rank: int = 0, world_size: int = 1) -> Iterator[SequenceSegment]:
        # this stream's shard of the sequences was fixed at construction (its rank and world_size arguments)
        return deal(
            self.dataset,
            self.num_streams,
            self.segment_length,
            indices=self.indices,
            ignore_index=self.ignore_index,
            pad_value=self.pad_value,
        )

    def __len__(self) -> int:
        if self._len is None:
            lengths = sequence_lengths(self.dataset)
            self._len = count_segments([lengths[i] for i in self.indices], self.num_streams, self.segment_length)
        return self._len


class SequenceDataModule(L.LightningDataModule):
    """Variable-length sequences as B parallel streams of consecutive M-step segments.

    Each split's loader is a :class:`SequenceStream` of its dataset (see the module docstring for how
    sequences are dealt to streams and how the last segments are padded): every batch is one
    :class:`SequenceSegment`, produced in the training process, stream slots are never shuffled, and a run
    resumed from a mid-epoch checkpoint continues with the very next segment. Under DDP every rank deals
    its own share of the sequences (every ``world_size``-th) to its own B streams.

    Args:
        train: training sequences (anything with ``len`` and ``[i] -> (inputs, targets)``), or None.
        val: validation sequences, or None.
        test: test sequences, or None (then ``test`` uses ``val``).
        num_streams: B, the number of parallel training streams.
        eval_streams: B for validation and test (default: ``num_streams``).
        M: segment length. None reads ``trainer.strategy.M`` (the one source of truth); give it to use
            the module without a trainer, or when the strategy has no ``M``.
        eval_M: segment length for validation and test (default: M). Evaluation carries state without
            gradients, so any length gives the same outputs; longer is faster.
        ignore_index: target of padding steps for integer targets.
        pad_value: input value of padding steps.
    """

    def __init__(
        self,
        train: SequenceDataset | None = None,
        val: SequenceDataset | None = None,
        test: SequenceDataset | None = None,
        num_streams: int = 32,
        eval_streams: int | None = None,
        M: int | None = None,
        eval_M: int | None = None,
        ignore_index: int = IGNORE_INDEX,
        pad_value: float = 0,
    ) -> None:
        super().__init__()
        self.train_set, self.val_set, self.test_set = train, val, test
        self.num_streams = check_count(num_streams, "num_streams")
        self.eval_streams = None if eval_streams is None else check_count(eval_streams, "eval_streams")
        self.M = None if M is None else check_segment_length(M)
        self.eval_M = None if eval_M is None else check_segment_length(eval_M, "eval_M")
        self.ignore_index = ignore_index
        self.pad_value = pad_value

    @property
    def segment_length(self) -> int:
        """M: the explicit ``M``, else ``trainer.strategy.M``."""
        m = self.M if self.M is not None else getattr(getattr(self.trainer, "strategy", None), "M", None)
        if m is None:
            strategy = getattr(self.trainer, "strategy", None)
            where = (
                "without a trainer"
                if self.trainer is None
                else f"with strategy {type(strategy).__name__}, which has no M"
            )
            raise RuntimeError(
                f"{type(self).__name__} is used {where}. Train with Trainer(strategy=RTRLStrategy(M=...)) (or TBPTT/SnAP), "
                "or pass M=... to the data module."
            )
        return int(m)

    @property
    def eval_segment_length(self) -> int:
        """Segment length of validation and test: ``eval_M``, else M when known, else 64 (any gives the same outputs)."""
        if self.eval_M is not None:
            return self.eval_M
        try:
            return self.segment_length
        except RuntimeError:
            return 64

    def stream(self, dataset: SequenceDataset, num_streams: int, segment_length: int) -> SequenceStream:
        """The loader of one split; under DDP each rank gets every ``world_size``-th sequence."""
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        return SequenceStream(
            dataset,
            num_streams,
            segment_length,
            ignore_index=self.ignore_index,
            pad_value=self.pad_value,
            rank=rank,
            world_size=world,
        )

    def _loader(self, dataset: SequenceDataset | None, split: str, evaluation: bool) -> SequenceStream:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__} has no {split} sequences; pass {split}=... .")
        if evaluation:
            return self.stream(dataset, self.eval_streams or self.num_streams, self.eval_segment_length)
        return self.stream(dataset, self.num_streams, self.segment_length)

    def train_dataloader(self) -> SequenceStream:
        return self._loader(self.train_set, "train", evaluation=False)

    def val_dataloader(self) -> SequenceStream:
        return self._loader(self.val_set, "val", evaluation=True)

    def test_dataloader(self) -> SequenceStream:
        return self._loader(self.test_set if self.test_set is not None else self.val_set, "test", evaluation=True)


class TensorSequences:
    """A list of ``(inputs, targets)`` pairs as a :class:`SequenceDataset` (handy for tests and small data)."""

    def __init__(self, pairs: Sequence[tuple[Tensor, Tensor]]) -> None:
        self.pairs = list(pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.pairs[index]

    def lengths(self) -> list[int]:
        return [x.shape[0] for x, _ in self.pairs]


def index_generator(seed: int, index: int, split: int = 0) -> torch.Generator:
    """A generator for item ``index`` of split ``split`` of a dataset seeded with ``seed``.

    Items are independent of access order, and different (seed, split, index) triples get unrelated streams.
    """
    key = hash((int(seed), int(split), int(index))) % (2**63 - 1)  # tuples of ints hash deterministically
    return torch.Generator().manual_seed(key)
