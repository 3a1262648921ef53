"""The copy-task model (the paper's diagnostic): one-hot tokens -> cell -> output gate -> 3 classes.

The data (:class:`~onlinerec.data.copy_task.CopyTask`, :class:`~onlinerec.data.copy_task.CopyTaskDataModule`) lives in
:mod:`onlinerec.data.copy_task`.
"""

from __future__ import annotations

from typing import Any

from torchmetrics import Metric

from onlinerec.cells import ElementwiseCell
from onlinerec.data.copy_task import VOCAB_SIZE
from onlinerec.data.sequences import IGNORE_INDEX
from onlinerec.tasks.classifier import SequenceClassifier
from onlinerec.tasks.metrics import NoOpAccuracy, PrintAccuracy, SequenceAccuracy

__all__ = ["CopyTaskModule"]


class CopyTaskModule(SequenceClassifier):
    """Copy-task model (docs/copy_task.md#model-and-training): one-hot tokens (D = 3) -> cell -> output gate -> Linear(N -> 3).

    Reports, on validation and test, token accuracy ``acc``, sequence accuracy ``seq_acc``, print accuracy
    ``print_acc`` and no-op accuracy ``noop_acc``. Defaults follow the paper's optimiser (Adam, lr 3e-5,
    betas (0.9, 0.995), eps 1e-9; clip at 1.0 with ``Trainer(gradient_clip_val=1.0)``) at a smaller width.

    Args:
        hidden_size: N (the paper: 2048).
        cell, cell_kwargs, embedding_dim, lr, betas, eps, method: see :class:`SequenceClassifier`.
    """

    def __init__(
        self,
        hidden_size: int = 256,
        cell: str | dict[str, Any] | ElementwiseCell = "elstm",
        cell_kwargs: dict[str, Any] | None = None,
        embedding_dim: int | None = None,
        lr: float = 3e-5,
        betas: tuple[float, float] = (0.9, 0.995),
        eps: float = 1e-9,
        method: str | None = None,
    ) -> None:
        super().__init__(
            VOCAB_SIZE,
            VOCAB_SIZE,
            hidden_size=hidden_size,
            cell=cell,
            cell_kwargs=cell_kwargs,
            embedding_dim=embedding_dim,
            ignore_index=IGNORE_INDEX,
            lr=lr,
            betas=betas,
            eps=eps,
            method=method,
        )
        # Keep only this class's own arguments, so that load_from_checkpoint can rebuild it (the cell by name, class
        # path or spec, as SequenceClassifier recorded it: never the module itself).
        cell = self.hparams["cell"]
        self.save_hyperparameters(ignore=["vocab_size", "num_classes", "ignore_index"])

    def eval_metrics(self) -> dict[str, Metric]:
        return {
            "seq_acc": SequenceAccuracy(self.ignore_index),
            "print_acc": PrintAccuracy(self.ignore_index),
            "noop_acc": NoOpAccuracy(self.ignore_index),
        }
