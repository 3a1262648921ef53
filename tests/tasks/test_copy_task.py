"""Copy task: fixed vocabulary (both bits are trained and scored), the metrics of docs/copy_task.md, no NaN without labels."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from onlinerec import RTRLStrategy
from onlinerec.data import IGNORE_INDEX, CopyTask, CopyTaskDataModule, DelayedRecall, SequenceSegment
from onlinerec.data.copy_task import BLANK
from onlinerec.tasks import (
    CopyTaskModule,
    NoOpAccuracy,
    PrintAccuracy,
    SequenceAccuracy,
    SequenceClassifier,
    TokenAccuracy,
    masked_cross_entropy,
)

X = IGNORE_INDEX


def test_sequences_follow_spec_and_use_the_fixed_vocabulary():
    data = CopyTask(200, level=7, seed=3)
    assert data.lengths() == [len(data[i][0]) for i in range(len(data))]
    targets_seen = set()
    for i in range(len(data)):
        x, y = data[i]
        n = len(x) - 7
        assert 1 <= n <= 7 and len(y) == len(x)
        assert torch.equal(x[n:], torch.full((7,), BLANK))  # pattern, then T blanks
        assert torch.equal(y[:n], torch.full((n,), BLANK)) and torch.equal(
            y[n : 2 * n], x[:n]
        )  # L blanks, then the copy
        assert (y[2 * n :] == BLANK).all()
        assert set(x.tolist()) <= {0, 1, 2} and set(y.tolist()) <= {0, 1, 2}
        targets_seen |= set(y.tolist())
    assert targets_seen == {0, 1, 2}, "both bits and the blank are targets; the pad/ignore index is never one"
    assert torch.equal(CopyTask(5, 7, seed=3)[4][0], data[4][0]), "item i depends only on (seed, split, i)"
    other = CopyTask(200, 7, seed=3, split=1)
    assert any(not torch.equal(other[i][0], data[i][0]) for i in range(10)), "splits differ"


def test_both_bits_count_in_the_accuracy():
    # The released code's bug: bit "1" shared the pad index, so always answering "0" scored 100%. Here it must not.
    targets = torch.cat([CopyTask(40, 20, seed=1)[i][1] for i in range(40)])
    lazy = targets.clone()
    lazy[lazy == 1] = 0  # never emits the bit 1
    acc = PrintAccuracy()
    acc.update(lazy, targets)
    ones, bits = int((targets == 1).sum()), int((targets < 2).sum())
    assert ones > 0 and acc.compute().item() == pytest.approx(1 - ones / bits)
    perfect = PrintAccuracy()
    perfect.update(targets, targets)
    assert perfect.compute().item() == 1.0
    # and the loss trains bit 1: its logit gets a gradient
    logits = torch.zeros(len(targets), 3, requires_grad=True)
    masked_cross_entropy(logits, targets).backward()
    assert (logits.grad[targets == 1, 1] < 0).all()


def test_metrics_against_hand_computed_examples():
    # Two streams over two segments; targets with blank (2), bits, padding (X); sequence ids (-1 on padding).
    t1 = torch.tensor([[2, 0], [1, 2], [0, 2]])
    p1 = torch.tensor([[2, 0], [1, 1], [1, 2]])
    s1 = torch.tensor([[0, 1], [0, 1], [0, 1]])
    t2 = torch.tensor([[2, 1], [X, 2], [X, X]])
    p2 = torch.tensor([[2, 1], [0, 2], [1, 0]])
    s2 = torch.tensor([[2, 1], [-1, 1], [-1, -1]])
    # (target, prediction) per sequence: 0: (2,2) (1,1) (0,1) -> wrong; 1: (0,0) (2,1) (2,2) (1,1) (2,2) -> wrong;
    # 2: (2,2) -> right. Padding (X, id -1) is never scored.
    metrics = {
        "token": (TokenAccuracy(), 7 / 9),  # 9 scored steps, 2 wrong
        "print": (PrintAccuracy(), 3 / 4),  # bit targets: 0->0, 1->1, 0->1 wrong, 1->1
        "noop": (NoOpAccuracy(), 4 / 5),  # blank targets: 2->2, 2->1 wrong, 2->2, 2->2, 2->2
        "seq": (SequenceAccuracy(), 1 / 3),
    }
    for metric, expected in metrics.values():
        metric.update(p1, t1, sequence_id=s1) if isinstance(metric, SequenceAccuracy) else metric.update(p1, t1)
        metric.update(p2, t2, sequence_id=s2) if isinstance(metric, SequenceAccuracy) else metric.update(p2, t2)
        assert metric.compute().item() == pytest.approx(expected)
    logits = torch.nn.functional.one_hot(p1, 3).float()  # logits give the same answer as labels
    acc = TokenAccuracy()
    acc.update(logits, t1)
    assert acc.compute().item() == pytest.approx(4 / 6)


def test_sequence_accuracy_counts_ignored_steps_as_right_and_skips_padding():
    acc = SequenceAccuracy()
    target = torch.tensor([[X, X], [3, X]])
    acc.update(torch.tensor([[0, 0], [3, 1]]), target, sequence_id=torch.tensor([[5, -1], [5, 6]]))
    assert acc.compute().item() == 1.0  # sequence 5 right at its only label; sequence 6 has none


def test_no_nan_when_every_label_is_ignored():
    logits = torch.randn(4, 3, 5, requires_grad=True)
    loss = masked_cross_entropy(logits, torch.full((4, 3), X))
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(logits.grad).all() and (logits.grad == 0).all()
    nothing = torch.full((3, 2), X)
    for metric in (TokenAccuracy(), PrintAccuracy(), SequenceAccuracy()):
        metric.update(torch.zeros(3, 2, dtype=torch.long), nothing, sequence_id=torch.full((3, 2), -1))
        assert metric.compute().item() == 0.0
    # and a model step on a segment without labels (most delayed-recall segments) stays finite
    model = SequenceClassifier(9, 4, hidden_size=6, method="rtrl")
    seg = SequenceSegment(
        torch.zeros(3, 2, dtype=torch.long), torch.ones(3, 2, dtype=torch.bool), torch.full((3, 2), X)
    )
    loss = model.segment_loss(model(seg.inputs, seg.reset), seg)["loss"]
    loss.backward()
    assert loss.item() == 0.0 and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_copy_task_trains_fully_online_with_rtrl_and_reports_spec_metrics(tmp_path):
    L.seed_everything(0, verbose=False)
    model = CopyTaskModule(hidden_size=8, lr=1e-2)
    data = CopyTaskDataModule(level=4, train_size=12, val_size=6, test_size=6, num_streams=3, eval_M=5)
    trainer = L.Trainer(
        strategy=RTRLStrategy(M=1),
        max_steps=8,
        val_check_interval=8,
        limit_val_batches=None,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=1.0,
    )
    trainer.fit(model, data)
    assert trainer.global_step == 8
    logged = trainer.callback_metrics
    for name in ("train/loss", "val/loss", "val/acc", "val/seq_acc", "val/print_acc", "val/noop_acc"):
        assert name in logged and torch.isfinite(logged[name]), name
    assert 0.0 <= float(logged["val/print_acc"]) <= 1.0
    trainer.save_checkpoint(tmp_path / "copy.ckpt")
    restored = CopyTaskModule.load_from_checkpoint(tmp_path / "copy.ckpt")
    assert restored.hparams.hidden_size == 8 and torch.equal(restored.head.weight, model.head.weight)


def test_delayed_recall_labels_only_the_query():
    data = DelayedRecall(20, delay=9, num_symbols=3, seed=1)
    for i in range(len(data)):
        x, y = data[i]
        assert len(x) == 11 and x[0] >= 3 and x[-1] == 6 and (x[1:-1] < 3).all()
        assert (y[:-1] == X).all() and y[-1] == x[0] - 3
    variable = DelayedRecall(30, delay=9, min_delay=2, seed=1)
    assert variable.lengths() == [len(variable[i][0]) for i in range(30)] and min(variable.lengths()) < 11


def test_model_metrics_stay_separate_when_their_first_updates_agree():
    # torchmetrics may merge metrics whose states match after the first update; here token and no-op accuracy
    # agree on an all-blank first segment and must still differ afterwards.
    metrics = CopyTaskModule(hidden_size=4).val_metrics
    blanks = torch.full((2, 2), BLANK)
    metrics.update(blanks, blanks, sequence_id=torch.zeros(2, 2, dtype=torch.long))
    bits = torch.tensor([[0, 1], [1, 0]])
    metrics.update(torch.zeros(2, 2, dtype=torch.long), bits, sequence_id=torch.ones(2, 2, dtype=torch.long))
    got = {k: float(v) for k, v in metrics.compute().items()}
    assert got == {"acc": 0.75, "noop_acc": 1.0, "print_acc": 0.5, "seq_acc": 0.5}
