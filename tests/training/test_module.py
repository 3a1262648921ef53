"""Strategies and OnlineRecurrentModule: tiny fits, aliases, errors, carried state in checkpoints."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from onlinerec import (
    STRATEGIES,
    FELSTMCell,
    NotElementwiseError,
    OnlineRecurrentModule,
    QRNNCell,
    RTRLStrategy,
    Segment,
    SegmentStream,
    SnAPStrategy,
    TBPTTStrategy,
)
from onlinerec.gradients import RTRL, TBPTT, SnAP
from tests.helpers import Regressor, quiet_trainer


class RandomStreams(IterableDataset):
    """B = 3 streams of a boring regression task, cut into M-step segments; a reset every 7 steps."""

    def __init__(self, m: int, segments: int = 8, seed: int = 0) -> None:
        self.m, self.segments, self.seed = m, segments, seed

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.seed)
        for i in range(self.segments):
            x = torch.randn(self.m, 3, 2, generator=gen)
            steps = torch.arange(i * self.m, (i + 1) * self.m)
            reset = (steps % 7 == 0).unsqueeze(1).expand(self.m, 3).clone()
            yield Segment(x, reset, x.cumsum(0)[..., :1])


trainer = quiet_trainer


@pytest.mark.parametrize(
    "strategy", [RTRLStrategy(M=4), TBPTTStrategy(M=4), SnAPStrategy(M=4), "rtrl", "tbptt", "snap"], ids=str
)
def test_fast_dev_run_changes_parameters(strategy):
    torch.manual_seed(0)
    model = Regressor()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    t = trainer(strategy, fast_dev_run=3)
    t.fit(model, DataLoader(RandomStreams(t.strategy.M), batch_size=None))
    for name, value in model.state_dict().items():
        assert not torch.equal(value, before[name]), f"{name} did not change"
    assert isinstance(t.strategy.method, (RTRL, TBPTT, SnAP))


def test_string_aliases_resolve_to_the_strategies():
    for name, cls in STRATEGIES.items():
        t = trainer(name)
        assert type(t.strategy) is cls and t.strategy.M == 50


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_segment_length_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="M"):
        RTRLStrategy(M=bad)


def test_strategy_exposes_M_and_method():
    s = SnAPStrategy(M=7)
    assert s.M == 7 and isinstance(s.method, SnAP) and s.method.n == 1


def test_rtrl_refuses_a_fully_recurrent_cell_in_fit():
    model = Regressor(FELSTMCell(2, 6))
    with pytest.raises(NotElementwiseError, match="FELSTMCell"):
        trainer(RTRLStrategy(M=4), fast_dev_run=1).fit(model, DataLoader(RandomStreams(4), batch_size=None))
    trainer(SnAPStrategy(M=4), fast_dev_run=1).fit(model, DataLoader(RandomStreams(4), batch_size=None))


def test_module_without_gradient_method_explains_what_to_do():
    model = Regressor()
    seg = next(iter(RandomStreams(4)))
    with pytest.raises(RuntimeError, match="RTRLStrategy"):
        model(seg.inputs, seg.reset)
    model_with_method = Regressor()
    model_with_method.method = RTRL()
    assert model_with_method(seg.inputs, seg.reset).shape == (4, 3, 5)


def test_changing_the_number_of_streams_is_an_error():
    model = Regressor()
    model.method = TBPTT()
    model(torch.zeros(2, 3, 2), torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="B = 3 to B = 5"):
        model(torch.zeros(2, 5, 2), torch.zeros(2, 5, dtype=torch.bool))


def test_carried_state_round_trips_through_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = Regressor(QRNNCell(2, 6))  # QRNN also carries its input window
    t = trainer(RTRLStrategy(M=4), max_steps=5)
    t.fit(model, DataLoader(RandomStreams(4), batch_size=None))
    path = tmp_path / "last.ckpt"
    t.save_checkpoint(path)
    saved = model._carries["train"]
    assert saved.sensitivities and saved.window is not None

    raw = torch.load(path, weights_only=True)  # plain tensors: loads without unpickling code
    assert "onlinerec" in raw
    restored = Regressor(QRNNCell(2, 6))
    restored.on_load_checkpoint(raw)
    carry = restored._carries["train"]
    torch.testing.assert_close(carry.c, saved.c, rtol=0, atol=0)
    torch.testing.assert_close(carry.window, saved.window, rtol=0, atol=0)
    for name, value in saved.sensitivities.items():
        torch.testing.assert_close(carry.sensitivities[name], value, rtol=0, atol=0)


def test_resume_continues_exactly(tmp_path):
    """5 steps, checkpoint, 5 more from the checkpoint == 10 uninterrupted steps (same parameters, same carry)."""

    def run(max_steps, ckpt=None, save=None):
        torch.manual_seed(0)
        model = Regressor()
        t = trainer(RTRLStrategy(M=4), max_steps=max_steps)
        stream = SegmentStream(lambda epoch: iter(RandomStreams(4, segments=10, seed=epoch)))
        t.fit(model, stream, ckpt_path=ckpt)
        if save:
            t.save_checkpoint(save)
        return model

    straight = run(10)
    run(5, save=tmp_path / "half.ckpt")
    resumed = run(10, ckpt=tmp_path / "half.ckpt")
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    torch.testing.assert_close(straight._carries["train"].c, resumed._carries["train"].c, rtol=0, atol=0)


def test_validation_streams_have_their_own_state():
    torch.manual_seed(0)
    model = Regressor()
    t = trainer(RTRLStrategy(M=4), max_steps=3, limit_val_batches=2, val_check_interval=3)
    loader = DataLoader(RandomStreams(4), batch_size=None)
    t.fit(model, loader, loader)
    assert set(model._carries) >= {"train", "val"}
    assert not model._carries["val"].sensitivities and model._carries["train"].sensitivities


@pytest.mark.parametrize("stop", [3, 5, 9])
def test_resume_is_exact_across_epochs_with_checkpoint_callback(tmp_path, stop):
    """Checkpoints written by ModelCheckpoint mid-epoch and at epoch ends resume to the same result (4 segments/epoch)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(max_steps, ckpt=None, dirpath=None):
        torch.manual_seed(0)
        model = Regressor()
        callbacks = [ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1, save_top_k=-1)] if dirpath else []
        t = trainer(RTRLStrategy(M=4), max_steps=max_steps, enable_checkpointing=bool(dirpath), callbacks=callbacks)
        stream = SegmentStream(lambda epoch: iter(RandomStreams(4, segments=4, seed=epoch)))
        t.fit(model, stream, ckpt_path=ckpt)
        return model

    straight = run(11)
    run(stop, dirpath=tmp_path)
    ckpt = next(tmp_path.glob(f"*step={stop}.ckpt"))
    resumed = run(11, ckpt=ckpt)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("strategy", ["rtrl", "tbptt", "snap"])
def test_validate_and_test_run_with_the_onlinerec_strategies(strategy):
    model = Regressor()
    t = trainer(strategy, limit_val_batches=2, limit_test_batches=2)
    loader = DataLoader(RandomStreams(4), batch_size=None)
    assert "val/loss" in t.validate(model, loader, verbose=False)[0]
    assert "test/loss" in t.test(model, loader, verbose=False)[0]


def test_feed_forward_module_trains_without_a_cell():
    class FeedForward(OnlineRecurrentModule):
        def __init__(self):
            super().__init__(None, lr=1e-2)
            self.net = torch.nn.Linear(2, 1)

        def encode(self, inputs):
            return self.net(inputs)

        def segment_loss(self, outputs, segment):
            return torch.nn.functional.mse_loss(outputs, segment.targets)

    model = FeedForward()
    before = model.net.weight.clone()
    trainer(TBPTTStrategy(M=4), fast_dev_run=2).fit(model, DataLoader(RandomStreams(4), batch_size=None))
    assert not torch.equal(before, model.net.weight) and model.carry() is None


def test_lookahead_leaves_the_carried_state_untouched():
    torch.manual_seed(0)
    model = Regressor()
    model.method = RTRL()
    seg = next(iter(RandomStreams(6)))
    model.unroll(seg.inputs[:4], seg.reset[:4])
    saved = model.carry()
    ahead = model.lookahead(seg.inputs[4:], seg.reset[4:])
    assert model.carry() is saved and not ahead.requires_grad
    torch.testing.assert_close(ahead, model.unroll(seg.inputs[4:], seg.reset[4:]))


def test_train_loss_is_logged_only_for_segments_with_labels(tmp_path):
    """Delayed recall labels one step per sequence: most segments have none, and used to log train/loss = 0.000."""
    import csv

    from lightning.pytorch.loggers import CSVLogger

    from onlinerec.data import DelayedRecallDataModule
    from onlinerec.tasks import SequenceClassifier

    torch.manual_seed(0)
    data = DelayedRecallDataModule(delay=14, train_size=64, val_size=8, num_streams=4)  # 16-step sequences, M = 4
    t = trainer(RTRLStrategy(M=4), max_steps=16, logger=CSVLogger(tmp_path, name="", version=""), log_every_n_steps=1)
    t.fit(SequenceClassifier(9, 4, hidden_size=6), data)
    with open(tmp_path / "metrics.csv") as f:
        losses = [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert 0 < len(losses) < 16 and all(v > 0 for v in losses)  # only segments holding a query step


def test_validate_after_fit_keeps_the_training_metrics():
    from onlinerec.data import DelayedRecallDataModule
    from onlinerec.tasks import SequenceClassifier

    data = DelayedRecallDataModule(delay=5, train_size=64, val_size=16, num_streams=8)
    model = SequenceClassifier(9, 4, hidden_size=8)
    t = trainer(RTRLStrategy(M=4), max_steps=6, num_sanity_val_steps=0, check_val_every_n_epoch=100)
    t.fit(model, data)
    t.validate(model, data, verbose=False)
    assert {"train/loss", "train/acc", "val/loss", "val/acc"} <= set(t.callback_metrics)
