"""R2AC end to end at toy size: every strategy and the feed-forward baseline fit, checkpoints resume, greedy eval."""

from __future__ import annotations

import math
import warnings

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from onlinerec import QRNNCell, RTRLStrategy, SnAPStrategy, TBPTTStrategy
from onlinerec.rl import R2AC, R2ACConfig, RolloutDataModule, make_stem
from onlinerec.rl.envs import make_vector_env

M, B = 4, 4
ENV = {"env": "memory:tmaze", "num_envs": B, "env_kwargs": {"length": 3}}


def tiny(cell="elstm", **kw):
    torch.manual_seed(0)
    return R2AC(2, (4,), cell=cell, hidden_size=8, stem="mlp", fc_size=8, **kw)


def trainer(strategy, steps, **kw):
    kw.setdefault("logger", False)
    kw.setdefault("enable_checkpointing", False)
    return L.Trainer(strategy=strategy, max_steps=steps, enable_progress_bar=False, enable_model_summary=False, **kw)


@pytest.mark.parametrize(
    "strategy, cell",
    [
        (RTRLStrategy, "elstm"),
        (TBPTTStrategy, "elstm"),
        (SnAPStrategy, "elstm"),
        (SnAPStrategy, "felstm"),
        (TBPTTStrategy, None),
    ],
    ids=["rtrl", "tbptt", "snap", "snap-felstm", "feed-forward"],
)
def test_fit_each_strategy(strategy, cell):
    model = tiny(cell)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    tr = trainer(strategy(M=M), 3)
    dm = RolloutDataModule(**ENV)
    tr.fit(model, dm)
    assert math.isfinite(float(tr.callback_metrics["train/loss"]))
    changed = {k for k, p in model.named_parameters() if not torch.equal(before[k], p)}
    assert {"policy.weight", "baseline.weight", "stem.fc.weight"} <= changed
    if cell is None:
        assert model.cell is None and not any(k.startswith("cell.") for k in before)
    else:
        assert "cell.input_proj.weight" in changed
    assert dm.frames == 3 * M * B == tr.callback_metrics["frames"]


def test_a_short_training_runs_on_the_device(device, tmp_path, monkeypatch):
    """``onlinerec rl --accelerator ... --devices 1`` trains R2AC on that device: the learner and the actor run there
    with their carried states (the envs step on the CPU), and the run finishes with its evaluation."""
    from onlinerec.rl.experiment import parse_experiment
    from onlinerec.rl.runner import run_experiment
    from tests.helpers import TINY_RL, accelerator

    seen = {}
    fit = L.Trainer.fit

    def watched_fit(self, model, *args, **kwargs):
        out = fit(self, model, *args, **kwargs)
        seen["model"], seen["carries"] = model.device, {k: c.device for k, c in model._carries.items()}
        return out

    monkeypatch.setattr(L.Trainer, "fit", watched_fit)
    args = [*TINY_RL, "--env", "memory:tmaze", "--env_kwargs", "{length: 3}", "--stem", "mlp", "--total_frames", "24"]
    args += ["--eval_episodes", "2", "--accelerator", accelerator(device), "--devices", "1"]
    result = run_experiment(parse_experiment([*args, "--out_dir", str(tmp_path / "run")]))
    assert result["updates"] == 3 and len(result["eval"]["returns"]) == 2
    assert seen["model"].type == device
    assert set(seen["carries"]) >= {"train", "act"} and {d.type for d in seen["carries"].values()} == {device}


def test_custom_cell_instance_and_size_check():
    model = R2AC(2, (4,), cell=QRNNCell(9, 8), hidden_size=8, stem="mlp", fc_size=8)
    trainer(RTRLStrategy(M=M), 1).fit(model, RolloutDataModule(**ENV))
    with pytest.raises(ValueError, match="fc_size"):
        R2AC(2, (4,), cell=QRNNCell(5, 8), stem="mlp", fc_size=8)


def test_mlp_heads_train_and_default_to_the_papers_linear_heads(tmp_path):
    plain = tiny()
    assert isinstance(plain.policy_mlp, torch.nn.Identity) and plain.hparams["head_sizes"] == []
    model = tiny(head_sizes=(6, 5))
    logits, value = model.heads(torch.randn(3, 8))
    assert model.policy_mlp[2].out_features == 5 and logits.shape == (3, 2) and value.shape == (3,)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    trainer(RTRLStrategy(M=M), 2).fit(model, RolloutDataModule(**ENV))
    changed = {k for k, p in model.named_parameters() if not torch.equal(before[k], p)}
    assert {"policy_mlp.0.weight", "policy_mlp.2.weight", "value_mlp.0.weight", "value_mlp.2.weight"} <= changed
    assert model.hparams["head_sizes"] == [6, 5]
    with pytest.raises(ValueError, match="head_sizes must be positive"):
        tiny(head_sizes=(4, 0))


def test_core_norm_makes_the_heads_blind_to_the_cores_scale_trains_and_reloads(tmp_path):
    plain, normed = tiny("lru"), tiny("lru", core_norm=True)
    assert isinstance(plain.core_norm, torch.nn.Identity) and plain.hparams["core_norm"] is False
    h = torch.randn(3, normed.cell.output_size)
    for a, b in zip(normed.heads(h), normed.heads(50 * h)):  # an LRU unit near |lambda| = 1 can grow its output so
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(plain.heads(h)[0], plain.heads(50 * h)[0])
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer(RTRLStrategy(M=M), 2, enable_checkpointing=True, callbacks=[ckpt]).fit(normed, RolloutDataModule(**ENV))
    assert not torch.equal(normed.core_norm.weight, torch.ones_like(normed.core_norm.weight))  # it learns
    again = R2AC.load_from_checkpoint(tmp_path / "last.ckpt")
    assert again.hparams["core_norm"] is True
    torch.testing.assert_close(again.heads(h)[0], normed.heads(h)[0])


def test_linear_lr_decay_to_zero():
    model = tiny(config=R2ACConfig(lr=1e-3))
    tr = trainer(RTRLStrategy(M=M), 4)
    tr.fit(model, RolloutDataModule(**ENV))
    assert tr.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0)
    opt = tr.optimizers[0]
    assert isinstance(opt, torch.optim.RMSprop) and opt.defaults["eps"] == 0.01 and opt.defaults["alpha"] == 0.99


def test_checkpoint_holds_carry_and_frames_and_resumes(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=3)
    model = tiny()
    tr = trainer(RTRLStrategy(M=M), 3, enable_checkpointing=True, callbacks=[ckpt])
    tr.fit(model, RolloutDataModule(**ENV))
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    carries = saved["onlinerec"]["carries"]
    assert {"train", "act"} <= set(carries)
    assert set(carries["train"]["sensitivities"]) >= {"input_proj.weight", "input_proj.bias"}
    torch.testing.assert_close(carries["train"]["c"], model._carries["train"].c)
    assert (
        saved["RolloutDataModule"]["frames"] == 3 * M * B
    )  # the frame counter is checkpointed once, by the data module

    from onlinerec.rl.runner import load_stem

    stem_only = tiny()  # the paper's pre-trained stem: copied from a checkpoint loaded weights-only
    load_stem(stem_only, tmp_path / "last.ckpt")
    for name, p in stem_only.stem.state_dict().items():
        torch.testing.assert_close(p, model.stem.state_dict()[name], rtol=0, atol=0)

    resumed = tiny()
    dm = RolloutDataModule(**ENV)
    tr2 = trainer(RTRLStrategy(M=M), 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr2.fit(resumed, dm, ckpt_path=tmp_path / "last.ckpt")
    # resumed mid-epoch: Lightning warns unless the loader says it needs no restoring (the streams restart anyway)
    assert not [w for w in caught if "not resumable" in str(w.message)]
    assert tr2.global_step == 5
    assert dm.frames == 5 * M * B == tr2.callback_metrics["frames"]


def test_greedy_evaluation_counts_episodes():
    model = tiny()
    env = make_vector_env("memory:tmaze", 3, seed=5, length=3)
    result = model.evaluate(env, num_episodes=7)
    assert len(result["returns"]) == 7 and all(r in (0.0, 1.0) for r in result["returns"])
    assert all(n == 4 for n in result["lengths"])
    assert model.training and "eval" not in model._carries


@pytest.mark.parametrize("stem", ["impala", "nature"])
def test_image_stems(stem):
    net = make_stem(stem, (4, 84, 84))
    out = net(torch.randint(0, 255, (2, 4, 84, 84), dtype=torch.uint8))
    assert out.shape == (2, 256) and (out >= 0).all()
    model = R2AC(6, (4, 84, 84), stem=stem, hidden_size=16)
    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    actions, logits = model.act(obs, torch.tensor([0.0, 5.0, -3.0]), torch.ones(3, dtype=torch.bool))
    assert actions.shape == (3,) and logits.shape == (3, 6)


@pytest.mark.parametrize("strategy", [RTRLStrategy, TBPTTStrategy, SnAPStrategy], ids=["rtrl", "tbptt", "snap"])
def test_bf16_mixed_precision_trains_every_method(strategy):
    """precision="bf16-mixed" on CPU: the stem's bfloat16 features used to reach the float32 cell and raise a
    TypeError; now every method trains, the losses are float32 and the carried state and sensitivities keep
    the parameters' dtype."""
    model = tiny()
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    tr = trainer(strategy(M=M), 3, precision="bf16-mixed", accelerator="cpu")
    tr.fit(model, RolloutDataModule(**ENV))
    assert math.isfinite(float(tr.callback_metrics["train/loss"]))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    changed = {k for k, p in model.named_parameters() if not torch.equal(before[k], p)}
    assert {"policy.weight", "baseline.weight", "stem.fc.weight", "cell.input_proj.weight"} <= changed
    carry = model.carry("train")
    assert carry.c.dtype == torch.float32
    assert all(s.dtype == torch.float32 for s in carry.sensitivities.values())
    if strategy is not TBPTTStrategy:
        assert carry.sensitivities


@pytest.mark.filterwarnings("ignore:.*AMP with fp16 is not supported on CPU.*")  # the fallback this test checks
def test_16_mixed_precision_where_supported():
    """precision="16-mixed": float16 autocast (with a gradient scaler) where Lightning offers it on this device."""
    model = tiny()
    try:
        tr = trainer(RTRLStrategy(M=M), 2, precision="16-mixed")
    except Exception as err:  # noqa: BLE001 - e.g. Lightning refusing float16 AMP on a CPU
        pytest.skip(f"16-mixed is not available here: {err}")
    tr.fit(model, RolloutDataModule(**ENV))
    assert math.isfinite(float(tr.callback_metrics["train/loss"]))
    assert all(s.dtype == torch.float32 for s in model.carry("train").sensitivities.values())
