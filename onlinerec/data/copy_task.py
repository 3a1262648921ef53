"""The diagnostic copy task (docs/copy_task.md), generated on the fly, with a fixed vocabulary.

For a maximum pattern length T (the "level"), a sequence draws L uniformly from {1..T} and a pattern
p of L uniform bits. Then (T + L steps each)::

    inputs  = p,        then T blanks
    targets = L blanks, then p, then (T - L) blanks

Tokens are fixed: ``0`` and ``1`` are the bits and ``2`` is the blank, for inputs and targets alike.
Padding uses the separate ``ignore_index`` (-100). The released code built its vocabularies in order of
first appearance, so that the bit "1" got the index of its padding token and was never trained nor
scored (docs/copy_task.md#vocabulary-bug-in-the-released-code); here both bits are classes like any other, and the blank counts too.

The model and its metrics (sequence, print and no-op accuracy) are in :mod:`onlinerec.tasks.copy_task`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from onlinerec.data.sequences import SequenceDataModule, index_generator

ZERO, ONE, BLANK = 0, 1, 2
VOCAB_SIZE = 3


class CopyTask:
    """``size`` copy-task sequences of level ``T``, generated on the fly: item i depends only on (seed, split, i).

    ``dataset[i] = (inputs (T+L,), targets (T+L,))``, int64 tokens in {0, 1, 2 = blank}. ``split`` (0 train,
    1 validation, 2 test) keeps the splits of one seed apart.
    """

    def __init__(self, size: int, level: int = 50, seed: int = 42, split: int = 0) -> None:
        if level < 1 or size < 0:
            raise ValueError(f"need level >= 1 and size >= 0, got level={level}, size={size}.")
        self.size, self.level, self.seed, self.split = size, level, seed, split

    def __len__(self) -> int:
        return self.size

    def _pattern(self, index: int) -> Tensor:
        gen = index_generator(self.seed, index, self.split)
        length = int(torch.randint(1, self.level + 1, (1,), generator=gen))
        return torch.randint(2, (length,), generator=gen)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        p = self._pattern(index)
        n, t = p.shape[0], self.level
        inputs = torch.cat([p, torch.full((t,), BLANK)])
        targets = torch.cat([torch.full((n,), BLANK), p, torch.full((t - n,), BLANK)])
        return inputs, targets

    def lengths(self) -> list[int]:
        return [self.level + self._pattern(i).shape[0] for i in range(self.size)]


class CopyTaskDataModule(SequenceDataModule):
    """The copy task as B streams of M-step segments (M from the trainer's strategy unless given).

    Args:
        level: T, the maximum pattern length (the paper uses 50 and 500); sequences are T + L steps.
        train_size: training sequences per epoch (the paper's files hold 9999).
        val_size: validation sequences.
        test_size: test sequences.
        seed: data seed (the three splits are generated independently from it).
        num_streams: B, parallel training streams (the paper's batch: 128).
        eval_streams, M, eval_M: see :class:`SequenceDataModule`.
    """

    def __init__(
        self,
        level: int = 50,
        train_size: int = 9999,
        val_size: int = 999,
        test_size: int = 999,
        seed: int = 42,
        num_streams: int = 128,
        eval_streams: int | None = None,
        M: int | None = None,
        eval_M: int | None = None,
    ) -> None:
        super().__init__(
            CopyTask(train_size, level, seed, 0),
            CopyTask(val_size, level, seed, 1),
            CopyTask(test_size, level, seed, 2),
            num_streams=num_streams,
            eval_streams=eval_streams,
            M=M,
            eval_M=eval_M,
        )
        self.save_hyperparameters()
