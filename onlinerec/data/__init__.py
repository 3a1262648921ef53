"""Data: the Segment batch type, supervised segmented-sequence data modules, the copy and delayed-recall tasks."""

from onlinerec.data.segment import Segment
from onlinerec.data.stream import SegmentStream
from onlinerec.data.sequences import (
    IGNORE_INDEX,
    SequenceAccuracy,
    SequenceClassifier,
    SequenceDataModule,
    SequenceDataset,
    SequenceSegment,
    SequenceStream,
    TensorSequences,
    TokenAccuracy,
    masked_cross_entropy,
)
from onlinerec.data.copy_task import CopyTask, CopyTaskDataModule, CopyTaskModule, NoOpAccuracy, PrintAccuracy  # noqa: I001
from onlinerec.data.delayed_recall import DelayedRecall, DelayedRecallDataModule

__all__ = [
    "IGNORE_INDEX",
    "CopyTask",
    "CopyTaskDataModule",
    "CopyTaskModule",
    "DelayedRecall",
    "DelayedRecallDataModule",
    "NoOpAccuracy",
    "PrintAccuracy",
    "Segment",
    "SegmentStream",
    "SequenceAccuracy",
    "SequenceClassifier",
    "SequenceDataModule",
    "SequenceDataset",
    "SequenceSegment",
    "SequenceStream",
    "TensorSequences",
    "TokenAccuracy",
    "masked_cross_entropy",
]
