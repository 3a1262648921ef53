"""Supervised tasks: ready models with their losses and metrics (sequence classification, the copy task, the demo)."""

from onlinerec.tasks.classifier import SequenceClassifier
from onlinerec.tasks.copy_task import CopyTaskModule
from onlinerec.tasks.metrics import NoOpAccuracy, PrintAccuracy, SequenceAccuracy, TokenAccuracy, masked_cross_entropy

__all__ = [
    "CopyTaskModule",
    "NoOpAccuracy",
    "PrintAccuracy",
    "SequenceAccuracy",
    "SequenceClassifier",
    "TokenAccuracy",
    "masked_cross_entropy",
]
