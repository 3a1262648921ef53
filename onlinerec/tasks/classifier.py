"""SequenceClassifier: per-step classification of token sequences, trained online on SequenceSegments."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import Metric, MetricCollection
from typing_extensions import override

from onlinerec.cells import ElementwiseCell, cell_reference, make_cell
from onlinerec.data.segment import Segment
from onlinerec.data.sequences import IGNORE_INDEX
from onlinerec.tasks.metrics import SequenceAccuracy, TokenAccuracy, masked_cross_entropy
from onlinerec.training.module import OnlineRecurrentModule

__all__ = ["SequenceClassifier"]


class SequenceClassifier(OnlineRecurrentModule):
    """Per-step classification of token sequences: one-hot (or embedding) -> cell -> readout -> Linear.

    Trains on :class:`SequenceSegment` batches with the mean cross-entropy over labelled steps
    (:func:`masked_cross_entropy`: 0, not NaN, on a segment without labels), and reports token accuracy
    (``acc``) on every split plus the metrics of :meth:`eval_metrics` on validation and test. Each training
    step returns ``{"loss", "correct", "count"}`` so callbacks can follow online accuracy.

    Args:
        vocab_size: number of input tokens (inputs are int64 token ids).
        num_classes: number of target classes.
        hidden_size: N, the cell's width.
        cell: the recurrent cell: a registered name ("elstm", "lru", ... :data:`~onlinerec.cells.CELLS`), a class
            path ("my_pkg.cells.MyCell", no registration needed; on the command line ``--model.cell my_pkg.MyCell``),
            a cell instance built for ``embedding_dim or vocab_size`` inputs and ``hidden_size`` units (a
            :class:`~onlinerec.cells.Stack` too), or a :func:`~onlinerec.cells.cell_spec`. Checkpoints store a name
            or class path as it is and an instance as its spec (class path and constructor arguments), so
            ``load_from_checkpoint`` rebuilds it in any process where its module can be imported.
        cell_kwargs: extra keyword arguments of the cell when ``cell`` is a name or class path (e.g.
            ``{"forget_bias": 3.0}`` for eLSTM).
        embedding_dim: None feeds one-hot tokens (D = vocab_size); an int learns an embedding of that width.
        ignore_index: target value of unlabelled and padding steps.
        lr, betas, eps: Adam's hyper-parameters.
        method: a gradient method or its alias; None takes the trainer strategy's.
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        hidden_size: int = 64,
        cell: str | dict[str, Any] | ElementwiseCell = "elstm",
        cell_kwargs: dict[str, Any] | None = None,
        embedding_dim: int | None = None,
        ignore_index: int = IGNORE_INDEX,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        method: str | None = None,
    ) -> None:
        width = embedding_dim or vocab_size
        built = make_cell(cell, width, hidden_size, **(cell_kwargs or {}))
        super().__init__(built, lr=lr, method=method)
        # Given explicitly, so that the cell is stored as what rebuilds it (cell_reference), never as the module, even
        # when a subclass's own __init__ (whose arguments Lightning would otherwise collect) was given an instance.
        self.save_hyperparameters(
            {
                "vocab_size": vocab_size,
                "num_classes": num_classes,
                "hidden_size": hidden_size,
                "cell": cell_reference(built if isinstance(cell, ElementwiseCell) else cell),
                "cell_kwargs": cell_kwargs,
                "embedding_dim": embedding_dim,
                "ignore_index": ignore_index,
                "lr": lr,
                "betas": betas,
                "eps": eps,
                "method": method,
            }
        )
        self.vocab_size, self.num_classes, self.ignore_index = vocab_size, num_classes, ignore_index
        self.betas, self.eps = tuple(betas), eps
        self.embedding = nn.Embedding(vocab_size, embedding_dim) if embedding_dim else None
        self.head = nn.Linear(self.cell.output_size, num_classes)
        # compute_groups=False: metrics with equal states after the first update must not be merged (torchmetrics
        # would then share one state between, e.g., token and no-op accuracy for the rest of the epoch).
        self.train_metrics = MetricCollection({"acc": TokenAccuracy(ignore_index)}, compute_groups=False)
        self.val_metrics = MetricCollection(
            {"acc": TokenAccuracy(ignore_index), **self.eval_metrics()}, compute_groups=False
        )
        self.test_metrics = MetricCollection(
            {"acc": TokenAccuracy(ignore_index), **self.eval_metrics()}, compute_groups=False
        )

    def eval_metrics(self) -> dict[str, Metric]:
        """Extra validation/test metrics; ``update(logits, targets, sequence_id=...)`` is called on each."""
        return {"seq_acc": SequenceAccuracy(self.ignore_index)}

    def encode(self, inputs: Tensor) -> Tensor:
        if self.embedding is not None:
            return self.embedding(inputs)
        return nn.functional.one_hot(inputs, self.vocab_size).to(self.head.weight.dtype)

    def logits(self, segment: Segment, stream: str = "train") -> Tensor:
        """Class logits (M, B, C) of one segment, carrying ``stream``'s state."""
        return self.head(self(segment.inputs, segment.reset, stream))

    @override
    def segment_loss(self, outputs: Tensor, segment: Segment) -> dict[str, Tensor]:
        """Mean cross-entropy over the labelled steps; updates the split's metrics; returns the loss with
        ``correct`` and ``count`` (labelled steps), which callbacks can follow (online accuracy)."""
        targets = segment.targets
        if targets is None:
            raise ValueError(f"{type(self).__name__} needs supervised segments (Segment.targets is None).")
        logits = self.head(outputs)
        labelled = targets != self.ignore_index
        predicted = logits.detach().argmax(-1)
        sequence_id = getattr(segment, "sequence_id", None)
        if sequence_id is None:  # a plain Segment: all of it is one sequence per stream
            sequence_id = torch.zeros_like(segment.reset, dtype=torch.long)
        self._metrics(self.current_stream or "train").update(predicted, targets, sequence_id=sequence_id)
        return {
            "loss": masked_cross_entropy(logits, targets, self.ignore_index),
            "correct": ((predicted == targets) & labelled).sum(),
            "count": labelled.sum(),
        }

    def _metrics(self, stream: str) -> MetricCollection:
        return getattr(self, f"{stream}_metrics")

    def _log_metrics(self, stream: str) -> None:
        # Metrics are logged once per epoch (computed and synced across ranks here), not on every step.
        metrics = self._metrics(stream)
        # compute() already syncs the metric across ranks, so every rank logs the same value: sync_dist only silences
        # Lightning's reminder to sync epoch-level values
        self.log_dict({f"{stream}/{k}": v for k, v in metrics.compute().items()}, prog_bar=True, sync_dist=True)
        metrics.reset()

    @override
    def on_train_epoch_end(self) -> None:
        self._log_metrics("train")

    @override
    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    @override
    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr, betas=self.betas, eps=self.eps)
