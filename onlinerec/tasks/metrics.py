"""Losses and metrics over labelled steps of supervised segments (padding and unlabelled steps carry ``IGNORE_INDEX``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from onlinerec.data.copy_task import BLANK
from onlinerec.data.sequences import IGNORE_INDEX

__all__ = ["NoOpAccuracy", "PrintAccuracy", "SequenceAccuracy", "TokenAccuracy", "masked_cross_entropy"]


def masked_cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Mean cross-entropy over the steps whose target is not ``ignore_index``; exactly 0 (not NaN) if there are none.

    logits (..., C), targets (...) int. The result stays connected to ``logits``, so ``backward`` works
    (and gives zero gradients) on a segment without labels.
    """
    flat_t = targets.reshape(-1)
    total = torch.nn.functional.cross_entropy(
        logits.reshape(flat_t.shape[0], -1), flat_t, ignore_index=ignore_index, reduction="sum"
    )
    return total / (flat_t != ignore_index).sum().clamp_min(1)


def _labels(preds: Tensor, target: Tensor) -> Tensor:
    """Class predictions from logits (..., C) or from labels shaped like ``target``."""
    if preds.dim() == target.dim() + 1:
        return preds.argmax(-1)
    if preds.shape != target.shape:
        raise ValueError(
            f"preds {tuple(preds.shape)} must be labels shaped like target {tuple(target.shape)} or logits (..., C)."
        )
    return preds


class TokenAccuracy(Metric):
    """Fraction of scored steps whose predicted class equals the target.

    A step is scored unless its target is ``ignore_index`` (padding, unlabelled steps) or one of
    ``exclude``. With nothing scored, ``compute`` returns 0 (torchmetrics' ``zero_division=0`` convention).
    ``update(preds, target)`` takes logits (..., C) or labels; extra keyword arguments are ignored.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    correct: Tensor
    total: Tensor

    def __init__(self, ignore_index: int = IGNORE_INDEX, exclude: Sequence[int] = (), **kwargs) -> None:
        super().__init__(**kwargs)
        self.ignore_index = ignore_index
        self.exclude = tuple(exclude)
        self.add_state("correct", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0), dist_reduce_fx="sum")

    def scored(self, target: Tensor) -> Tensor:
        keep = target != self.ignore_index
        for value in self.exclude:
            keep &= target != value
        return keep

    def update(self, preds: Tensor, target: Tensor, **_: object) -> None:
        keep = self.scored(target)
        self.correct += ((_labels(preds, target) == target) & keep).sum()  # a mask, not an index: no device sync
        self.total += keep.sum()

    def compute(self) -> Tensor:
        return self.correct.float() / self.total.clamp_min(1)


class SequenceAccuracy(Metric):
    """Fraction of sequences whose every scored step is predicted exactly (sequence-level exact match).

    Steps are grouped by ``sequence_id`` (a :class:`SequenceSegment` field), so a sequence may span any number
    of segments and updates; padding (``sequence_id < 0``) is skipped, and steps whose target is
    ``ignore_index`` count as correct (docs/copy_task.md#metrics). Call ``compute`` once every sequence is complete (at epoch end).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, ignore_index: int = IGNORE_INDEX, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ignore_index = ignore_index
        self.add_state("ids", default=[], dist_reduce_fx="cat")
        self.add_state("errors", default=[], dist_reduce_fx="cat")

    def update(self, preds: Tensor, target: Tensor, sequence_id: Tensor) -> None:
        real = sequence_id >= 0
        wrong = (_labels(preds, target) != target) & (target != self.ignore_index)
        ids, inverse = torch.unique(sequence_id[real], return_inverse=True)
        errors = torch.zeros(ids.shape, dtype=torch.long, device=ids.device).index_add_(0, inverse, wrong[real].long())
        self.ids.append(ids)
        self.errors.append(errors)

    def compute(self) -> Tensor:
        if isinstance(self.ids, list) and not self.ids:
            return torch.tensor(0.0, device=self.device)
        ids, errors = dim_zero_cat(self.ids), dim_zero_cat(self.errors)
        if ids.numel() == 0:
            return torch.tensor(0.0, device=self.device)
        unique, inverse = torch.unique(ids, return_inverse=True)
        per_seq = torch.zeros(unique.shape, dtype=torch.long, device=ids.device).index_add_(0, inverse, errors)
        return (per_seq == 0).float().mean()


class PrintAccuracy(TokenAccuracy):
    """Accuracy on the steps whose target is a bit (0 or 1): the copy itself. Blank and padding are not scored."""

    def __init__(self, ignore_index: int = IGNORE_INDEX, blank: int = BLANK, **kwargs: Any) -> None:
        super().__init__(ignore_index, exclude=(blank,), **kwargs)


class NoOpAccuracy(TokenAccuracy):
    """Accuracy on the steps whose target is blank (the model must stay silent). Padding is not scored."""

    def __init__(self, ignore_index: int = IGNORE_INDEX, blank: int = BLANK, **kwargs: Any) -> None:
        super().__init__(ignore_index, **kwargs)
        self.blank = blank

    def scored(self, target: Tensor) -> Tensor:
        return target == self.blank
