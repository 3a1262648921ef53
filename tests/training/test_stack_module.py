"""Stacks and cells of K > 1 components inside Lightning: OnlineRecurrentModule and R2AC train them, checkpoints keep
every layer's carried state (with its sensitivities), resuming is exact, and old single-cell carries load as before."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import onlinerec.gradients.inplace as inplace
from onlinerec import RTRLStrategy, Segment, SegmentStream, SnAPStrategy, TBPTTStrategy
from onlinerec.cells import LRUCell, LSTMCell, MinGRUCell, QRNNCell, Stack, make_cell
from onlinerec.gradients import RTRL
from onlinerec.gradients.carry import Carry, StackCarry, load_carry
from tests.helpers import Regressor, quiet_trainer

M = 4


def segments(epoch: int, count: int = 6):
    gen = torch.Generator().manual_seed(epoch)
    for _ in range(count):
        x = torch.randn(M, 3, 2, generator=gen)
        reset = torch.rand(M, 3, generator=gen) < 0.15
        yield Segment(x, reset, x.cumsum(0)[..., :1])


def lru_stack():
    # K = 2 units, an input window (QRNN) and a norm between layers, residuals where widths match
    return Stack([LRUCell(2, 6), QRNNCell(2, 5), MinGRUCell(5, 5)], residual=True, norm="layer")


def _assert_same_carry(a, b):
    assert type(a) is type(b)
    if isinstance(a, StackCarry):
        assert len(a.layers) == len(b.layers)
        for x, y in zip(a.layers, b.layers):
            _assert_same_carry(x, y)
        return
    torch.testing.assert_close(a.c, b.c, rtol=0, atol=0)
    assert (a.window is None) == (b.window is None)
    if a.window is not None:
        torch.testing.assert_close(a.window, b.window, rtol=0, atol=0)
    assert a.sensitivities.keys() == b.sensitivities.keys()
    for key, value in a.sensitivities.items():
        torch.testing.assert_close(b.sensitivities[key], value, rtol=0, atol=0)


@pytest.mark.parametrize("strategy", [RTRLStrategy(M=M), SnAPStrategy(M=M), TBPTTStrategy(M=M)], ids=str)
def test_module_trains_a_stack_with_every_strategy(strategy):
    torch.manual_seed(0)
    model = Regressor(lru_stack())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    quiet_trainer(strategy, max_steps=3).fit(model, SegmentStream(segments))
    for name, value in model.state_dict().items():
        assert not torch.equal(value, before[name]), f"{name} did not change"
    carry = model.carry()
    assert isinstance(carry, StackCarry) and len(carry.layers) == 3
    assert carry.layers[0].c.shape == (3, 2, 6) and carry.layers[1].window is not None
    assert all(bool(layer.sensitivities) == (not isinstance(strategy, TBPTTStrategy)) for layer in carry.layers)


def test_module_trains_an_lstm_stack_with_snap_and_tbptt():
    torch.manual_seed(0)
    model = Regressor(make_cell("lstm", 2, 5, layers=2))
    quiet_trainer(SnAPStrategy(M=M), max_steps=2).fit(model, SegmentStream(segments))
    assert model.carry().layers[1].sensitivities["recurrent_proj.weight"].shape == (3, 2, 4, 5, 5)


def test_stack_carries_round_trip_through_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = Regressor(lru_stack())
    t = quiet_trainer(RTRLStrategy(M=M), max_steps=3, limit_val_batches=1, val_check_interval=3)
    t.fit(model, SegmentStream(segments), SegmentStream(segments))
    path = tmp_path / "last.ckpt"
    t.save_checkpoint(path)
    raw = torch.load(path, weights_only=True)  # plain data: loads without unpickling code
    restored = Regressor(lru_stack())
    restored.on_load_checkpoint(raw)
    assert set(restored._carries) == {"train", "val"}
    for name, carry in model._carries.items():
        _assert_same_carry(carry, restored._carries[name])


@pytest.mark.parametrize("cell", ["stack", "lru"])
def test_resume_is_exact_with_a_stack_and_with_k2_units(tmp_path, cell):
    """6 steps straight == 3 steps, checkpoint, 3 more: same parameters and the same carry in every layer."""

    def build():
        torch.manual_seed(0)
        return Regressor(lru_stack() if cell == "stack" else LRUCell(2, 6))

    def run(max_steps, ckpt=None, dirpath=None):
        model = build()
        callbacks = [ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1, save_top_k=-1)] if dirpath else []
        t = quiet_trainer(
            RTRLStrategy(M=M), max_steps=max_steps, callbacks=callbacks, enable_checkpointing=bool(dirpath)
        )
        t.fit(model, SegmentStream(segments), ckpt_path=ckpt)
        return model

    straight = run(8)
    run(3, dirpath=tmp_path)
    resumed = run(8, ckpt=next(tmp_path.glob("*step=3.ckpt")))
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    _assert_same_carry(straight.carry(), resumed.carry())


def test_fully_online_resume_is_exact_with_k2_units_scaled_by_blocks(tmp_path, monkeypatch):
    """M = 1: the module donates its carries, so the LRU's sensitivities are kept as S = A S~ with a K x K block per
    unit; a checkpoint keeps S~ and A, and resuming continues bit for bit."""
    monkeypatch.setattr(inplace, "SMALL_CARRY", 0)  # this carry is small: scale it lazily all the same

    def online(epoch: int, count: int = 12):
        gen = torch.Generator().manual_seed(epoch)
        for _ in range(count):
            x = torch.randn(1, 3, 2, generator=gen)
            yield Segment(x, torch.rand(1, 3, generator=gen) < 0.15, x[..., :1])

    def run(max_steps, ckpt=None, dirpath=None):
        torch.manual_seed(0)
        model = Regressor(LRUCell(2, 6))
        callbacks = [ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1, save_top_k=-1)] if dirpath else []
        t = quiet_trainer(
            RTRLStrategy(M=1), max_steps=max_steps, callbacks=callbacks, enable_checkpointing=bool(dirpath)
        )
        t.fit(model, SegmentStream(online), ckpt_path=ckpt)
        return model

    straight = run(10)
    assert straight.carry().scale is not None and straight.carry().scale.shape == (3, 2, 2, 6)
    run(4, dirpath=tmp_path)
    resumed = run(10, ckpt=next(tmp_path.glob("*step=4.ckpt")))
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    _assert_same_carry(straight.carry(), resumed.carry())
    torch.testing.assert_close(straight.carry().scale, resumed.carry().scale, rtol=0, atol=0)


def test_resuming_a_stack_with_another_strategy_restarts_only_the_sensitivities(tmp_path):
    torch.manual_seed(0)
    model = Regressor(lru_stack())
    t = quiet_trainer(TBPTTStrategy(M=M), max_steps=2)
    t.fit(model, SegmentStream(segments))
    t.save_checkpoint(tmp_path / "tbptt.ckpt")
    torch.manual_seed(0)
    again = Regressor(lru_stack())
    with pytest.warns(UserWarning, match="restart from zero"):
        quiet_trainer(RTRLStrategy(M=M), max_steps=3).fit(
            again, SegmentStream(segments), ckpt_path=tmp_path / "tbptt.ckpt"
        )
    assert all(layer.sensitivities for layer in again.carry().layers)


def test_single_cell_carries_keep_their_layout():
    """Checkpoints written before stacks existed hold Carry.state_dict()s: they load as a Carry, as before."""
    carry = RTRL().init_carry(QRNNCell(2, 3), 2)
    state = carry.state_dict()
    assert set(state) == {"c", "window", "sensitivities"}
    loaded = load_carry(state)
    assert isinstance(loaded, Carry) and loaded.sensitivities.keys() == carry.sensitivities.keys()


def test_lookahead_of_a_stack_leaves_its_carry_untouched():
    torch.manual_seed(0)
    model = Regressor(lru_stack())
    model.method = RTRL()
    seg = next(segments(0))
    model.unroll(seg.inputs[:2], seg.reset[:2])
    saved = model.carry()
    ahead = model.lookahead(seg.inputs[2:], seg.reset[2:])
    assert model.carry() is saved and not ahead.requires_grad
    torch.testing.assert_close(ahead, model.unroll(seg.inputs[2:], seg.reset[2:]))


def test_r2ac_trains_a_stack_and_checkpoints_every_layer(tmp_path):
    rl = pytest.importorskip("onlinerec.rl")
    env = dict(env="memory:tmaze", num_envs=3, env_kwargs=dict(length=3))
    torch.manual_seed(0)
    stack = Stack([LRUCell(9, 6), MinGRUCell(9, 8)], residual=True)
    model = rl.R2AC(2, (4,), cell=stack, stem="mlp", fc_size=8)
    t = L.Trainer(
        strategy=RTRLStrategy(M=M),
        max_steps=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)],
    )
    t.fit(model, rl.RolloutDataModule(**env))
    assert isinstance(model.carry("train"), StackCarry) and isinstance(model.carry("act"), StackCarry)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    restored = rl.R2AC(2, (4,), cell=Stack([LRUCell(9, 6), MinGRUCell(9, 8)], residual=True), stem="mlp", fc_size=8)
    restored.on_load_checkpoint(saved)
    for name in ("train", "act"):
        _assert_same_carry(model.carry(name), restored._carries[name])
    # and by name, through make_cell: a 2-layer LSTM baseline trained by TBPTT
    by_name = rl.R2AC(2, (4,), cell="lru", hidden_size=6, stem="mlp", fc_size=8, cell_kwargs={"layers": 2})
    assert isinstance(by_name.cell, Stack) and by_name.cell.num_layers == 2
    lstm = rl.R2AC(2, (4,), cell="lstm", hidden_size=6, stem="mlp", fc_size=8, cell_kwargs={"layers": 2})
    quiet_trainer(TBPTTStrategy(M=M), max_steps=1).fit(lstm, rl.RolloutDataModule(**env))
    assert isinstance(lstm.cell.layers[0], LSTMCell) and not lstm.carry("train").layers[0].sensitivities
