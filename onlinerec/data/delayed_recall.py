"""Delayed recall: a memory task whose credit-assignment span (the delay) is much longer than M.

Each sequence is ``delay + 2`` steps: a cue, ``delay`` distractors, then a query, and the answer is the cue.

============  =====================================  ==================================
step          input token                            target
============  =====================================  ==================================
0             ``num_symbols + cue`` (a marked cue)   ignored
1 .. delay    a random symbol in ``0 .. K-1``        ignored
delay + 1     ``2 K`` (the query)                    ``cue`` (one of ``K`` classes)
============  =====================================  ==================================

The distractors use the same K symbols as the cue, so a memory that simply integrates its inputs (what a
randomly initialised cell with slow forget gates does) drowns the cue in noise; solving the task needs a
learned, input-dependent write at the cue and protection of the memory afterwards. Learning that write
requires the gradient of the query's loss with respect to what happened ``delay`` steps earlier: exact RTRL
carries it across segments, TBPTT with M < delay cuts it, and stays at chance (1/K).
"""

from __future__ import annotations

import torch
from torch import Tensor

from onlinerec.data.sequences import IGNORE_INDEX, SequenceDataModule, index_generator


class DelayedRecall:
    """``size`` delayed-recall sequences generated on the fly: item i depends only on (seed, split, i).

    Inputs are int64 token ids in ``0 .. 2K`` (vocabulary ``2K + 1``); targets are ``ignore_index``
    except at the query, which holds the cue's class in ``0 .. K-1``.

    Args:
        size: number of sequences.
        delay: number of distractor steps between the cue and the query (the longest, if ``min_delay`` is set).
        num_symbols: K, the number of cue classes (chance accuracy is 1/K).
        seed: the data seed.
        split: which split of that seed (0 train, 1 validation, 2 test): splits never share sequences by construction.
        min_delay: if given, each sequence's delay is uniform in ``[min_delay, delay]``.
        ignore_index: target of unlabelled steps.
    """

    def __init__(
        self,
        size: int,
        delay: int = 100,
        num_symbols: int = 4,
        seed: int = 0,
        split: int = 0,
        min_delay: int | None = None,
        ignore_index: int = IGNORE_INDEX,
    ) -> None:
        if delay < 0 or num_symbols < 2 or size < 0:
            raise ValueError(f"need size >= 0, delay >= 0 and num_symbols >= 2; got {size}, {delay}, {num_symbols}.")
        if min_delay is not None and not 0 <= min_delay <= delay:
            raise ValueError(f"min_delay must lie in [0, delay={delay}], got {min_delay}.")
        self.size, self.delay, self.num_symbols, self.seed, self.split = size, delay, num_symbols, seed, split
        self.min_delay, self.ignore_index = min_delay, ignore_index

    @property
    def vocab_size(self) -> int:
        return 2 * self.num_symbols + 1

    @property
    def query_token(self) -> int:
        return 2 * self.num_symbols

    def __len__(self) -> int:
        return self.size

    def _delay(self, gen: torch.Generator) -> int:
        if self.min_delay is None or self.min_delay == self.delay:
            return self.delay
        return int(torch.randint(self.min_delay, self.delay + 1, (1,), generator=gen))

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        gen = index_generator(self.seed, index, self.split)
        delay = self._delay(gen)
        k = self.num_symbols
        cue = int(torch.randint(k, (1,), generator=gen))
        inputs = torch.cat([torch.tensor([k + cue]), torch.randint(k, (delay,), generator=gen), torch.tensor([2 * k])])
        targets = torch.full((delay + 2,), self.ignore_index, dtype=torch.long)
        targets[-1] = cue
        return inputs, targets

    def lengths(self) -> list[int]:
        if self.min_delay is None or self.min_delay == self.delay:
            return [self.delay + 2] * self.size
        return [self._delay(index_generator(self.seed, i, self.split)) + 2 for i in range(self.size)]


class DelayedRecallDataModule(SequenceDataModule):
    """Delayed recall (see :class:`DelayedRecall`) as B streams of M-step segments, with independent splits.

    Args:
        delay: distractor steps between cue and query (the longest, with ``min_delay``).
        num_symbols: K, the number of cue classes.
        train_size: training sequences per epoch.
        val_size: validation sequences (and as many test sequences).
        seed: data seed (the three splits are generated independently from it).
        min_delay: optional shortest delay.
        num_streams, eval_streams, M, eval_M: see :class:`SequenceDataModule`.
    """

    def __init__(
        self,
        delay: int = 100,
        num_symbols: int = 4,
        train_size: int = 10_000,
        val_size: int = 500,
        seed: int = 0,
        min_delay: int | None = None,
        num_streams: int = 32,
        eval_streams: int | None = None,
        M: int | None = None,
        eval_M: int | None = None,
    ) -> None:
        def split(size: int, which: int) -> DelayedRecall:
            return DelayedRecall(size, delay, num_symbols, seed, which, min_delay)

        super().__init__(
            split(train_size, 0),
            split(val_size, 1),
            split(val_size, 2),
            num_streams=num_streams,
            eval_streams=eval_streams,
            M=M,
            eval_M=eval_M,
        )
        self.save_hyperparameters()
