"""Data: the Segment batch type and the streams and data modules that produce it (no models, losses or metrics)."""

from onlinerec.data.copy_task import CopyTask, CopyTaskDataModule
from onlinerec.data.delayed_recall import DelayedRecall, DelayedRecallDataModule
from onlinerec.data.segment import Segment
from onlinerec.data.sequences import (
    IGNORE_INDEX,
    SequenceDataModule,
    SequenceDataset,
    SequenceSegment,
    SequenceStream,
    TensorSequences,
)
from onlinerec.data.stream import SegmentStream, StreamOrderError

__all__ = [
    "IGNORE_INDEX",
    "CopyTask",
    "CopyTaskDataModule",
    "DelayedRecall",
    "DelayedRecallDataModule",
    "Segment",
    "SegmentStream",
    "SequenceDataModule",
    "SequenceDataset",
    "SequenceSegment",
    "SequenceStream",
    "StreamOrderError",
    "TensorSequences",
]
