"""R2AC's sample-efficiency options: reward and advantage normalisation, mean losses, PPO's
clipped ratio, and several passes per segment with RTRL kept exact. The defaults are the paper's one-pass R2AC."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import gymnasium
import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

if __name__ == "__main__":  # run as a script by the DDP test below: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from onlinerec import ELSTMCell, OnlineRecurrentModule, RTRLStrategy
from onlinerec.gradients import RTRL
from onlinerec.gradients.carry import Carry, StackCarry
from onlinerec.rl import R2AC, R2ACConfig, RolloutDataModule, RolloutSegment, RolloutStream, vtrace
from onlinerec.rl.envs import make_vector_env
from onlinerec.rl.normalize import ObservationNormalizer, ReturnNormalizer, discounted_returns

torch.set_num_threads(1)

M, B, N = 3, 4, 6


def tiny(config=None, cls=R2AC, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(2, (4,), cell="elstm", hidden_size=N, stem="mlp", fc_size=5, config=config, **kw)


def record(count, dtype=torch.float32, seed=3):
    """``count`` consecutive segments of B T-maze streams, collected by a model of its own (so off-policy for the
    learners, with episode ends inside segments)."""
    collector = tiny(seed=seed).to(dtype)
    stream = RolloutStream(make_vector_env("memory:tmaze", B, seed=seed, length=3), collector)
    try:
        return [stream.next_segment(M) for _ in range(count)]
    finally:
        stream.close()


def fit(model, segments, ckpt_path=None, max_steps=None, callbacks=(), **kw):
    trainer = L.Trainer(
        strategy=RTRLStrategy(M=M),
        accelerator="cpu",
        max_steps=max_steps or len(segments) * model.config.passes,
        logger=False,
        enable_checkpointing=any(isinstance(cb, ModelCheckpoint) for cb in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **kw,
    )
    trainer.fit(model, DataLoader(segments, batch_size=None), ckpt_path=ckpt_path)
    return trainer


class Grads(L.Callback):
    """Every optimiser step's gradients (before clipping), with the index of the segment they came from."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, dict[str, torch.Tensor]]] = []
        self.batch = -1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch = batch_idx

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = {k: p.grad.clone() for k, p in pl_module.named_parameters() if p.grad is not None}
        self.steps.append((self.batch, grads))


class ManualOnePass(R2AC):
    """The several-passes loop with K = 1 and one minibatch (R2AC itself takes Lightning's automatic path there)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False


def assert_same(a, b, **tol):
    tol = tol or {"rtol": 0, "atol": 0}
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, msg=name, **tol)


# -- the defaults are the paper's ------------------------------------------------------------------------------------
def papers_losses(model, outputs, seg):
    """The V-trace losses as R2AC computed them before these options existed (a frozen copy)."""
    cfg = model.config
    params, values, bootstrap = outputs
    rewards = seg.rewards[1:].to(values.dtype).clamp(-cfg.reward_clip, cfg.reward_clip)
    discounts = cfg.discount * (~seg.reset[1:]).to(values.dtype)
    target_logp = model.policy.log_prob(params, seg.actions[1:])
    entropy = model.policy.entropy(params)
    vs, advantages = vtrace(
        seg.behaviour_logp[1:].to(values.dtype), target_logp.detach(), rewards, discounts, values.detach(), bootstrap
    )
    pg_loss = -(target_logp * advantages).sum()
    baseline_loss = cfg.baseline_cost * 0.5 * ((vs - values) ** 2).sum()
    entropy_loss = cfg.entropy_cost * (-entropy).sum()
    return {"loss": pg_loss + baseline_loss + entropy_loss, "pg_loss": pg_loss, "baseline_loss": baseline_loss}


def test_defaults_are_the_papers_one_pass_and_add_no_state():
    cfg = R2ACConfig()
    assert (cfg.epochs, cfg.minibatches, cfg.passes, cfg.ppo_clip) == (1, 1, 1, None)
    assert not cfg.reward_norm and not cfg.advantage_norm and cfg.loss_reduction == "sum"
    model = tiny(method="rtrl")
    assert model.automatic_optimization and model.loss_reduction == "sum" and model.return_normalizer is None
    assert not any(k.startswith("return_normalizer") for k in model.state_dict())  # old checkpoints still load
    for seg in record(3):
        outputs = model.learner_outputs(seg)
        got, want = model.segment_loss(outputs, seg), papers_losses(model, outputs, seg)
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)


def test_one_pass_through_the_manual_loop_equals_the_default_update():
    """K = 1 run through several_passes (manual optimisation: its own backward, clipping in on_before_optimizer_step,
    optimiser and LR-schedule steps) leaves the same weights and carry as Lightning's automatic step, bit for bit."""
    segments = record(4)
    cfg = dict(grad_clip=0.05, total_updates=10, lr=1e-2)  # a clip that bites and a decaying LR
    auto, manual = tiny(R2ACConfig(**cfg)), tiny(R2ACConfig(**cfg), cls=ManualOnePass)
    assert auto.automatic_optimization and not manual.automatic_optimization
    fit(auto, segments)
    trainer = fit(manual, segments)
    assert trainer.global_step == 4 and trainer.lr_scheduler_configs[0].scheduler.last_epoch == 4
    assert_same(auto, manual)
    torch.testing.assert_close(auto.carry().c, manual.carry().c, rtol=0, atol=0)


# -- several passes: exact RTRL ---------------------------------------------------------------------------------------
def reference_cell_gradient(model, segments, s, streams):
    """d(loss of segment s on ``streams``)/d(cell parameters) by full BPTT through the streams' whole history
    (entries 0..M-1 of segments 0..s, from a zero state), with the cell's own single-step forward."""
    model.zero_grad()
    with torch.no_grad():
        xs = [model.features(g.inputs, g.rewards) for g in segments[: s + 1]]
    x = torch.cat([f[:M] for f in xs])
    reset = torch.cat([g.reset[:M] for g in segments[: s + 1]])
    c = torch.zeros(B, N, dtype=torch.float64)
    out = []
    for t in range(x.shape[0]):
        c = model.cell(x[t], c * (~reset[t]).double().unsqueeze(-1))
        out.append(model.cell.readout(c, x[t]))
    params, values = model.heads(torch.stack(out[-M:]))
    seg = segments[s]
    with torch.no_grad():  # entry M: the bootstrap value, from the state after entry M-1
        x_m = xs[s][M]
        c_m = model.cell(x_m, c * (~seg.reset[M]).double().unsqueeze(-1))
        _, bootstrap = model.heads(model.cell.readout(c_m, x_m))
    loss = model.segment_loss((params[:, streams], values[:, streams], bootstrap[streams]), seg.select(streams))
    loss["loss"].backward()
    return {k: p.grad.clone() for k, p in model.cell.named_parameters()}


@pytest.mark.parametrize("epochs, minibatches", [(3, 1), (2, 2)])
def test_every_pass_gradient_is_bptt_over_the_stream_history(epochs, minibatches):
    """Fixed weights (lr = 0), float64: each optimiser step's cell gradient equals full BPTT through every earlier
    segment of its streams, for that step's loss: every pass restarts from the segment start's sensitivities."""
    segments = record(3, torch.float64)
    model = tiny(R2ACConfig(lr=0.0, grad_clip=0.0, epochs=epochs, minibatches=minibatches)).double()
    grads = Grads()
    fit(model, segments, callbacks=[grads])
    assert len(grads.steps) == 3 * epochs * minibatches
    groups = torch.arange(B).chunk(minibatches)
    for k, (s, got) in enumerate(grads.steps):
        streams = groups[k % minibatches]
        want = reference_cell_gradient(model, segments, s, streams)
        for name, value in want.items():
            torch.testing.assert_close(got[f"cell.{name}"], value, rtol=1e-9, atol=1e-12, msg=f"step {k}: {name}")


def reference_parallel_gradient(model, segments, s, streams):
    """:func:`reference_cell_gradient` for a core of branches side by side (``separate_critic``): full BPTT through
    the streams' whole history with check.reference_run, which steps every branch by its own single-step forward."""
    from onlinerec.gradients.check import reference_run

    model.zero_grad()
    with torch.no_grad():
        xs = [model.features(g.inputs, g.rewards) for g in segments[: s + 1]]
    x = torch.cat([f[:M] for f in xs])
    reset = torch.cat([g.reset[:M] for g in segments[: s + 1]])
    out, state = reference_run(model.cell, x, reset)
    params, values = model.heads(out[-M:])
    seg = segments[s]
    with torch.no_grad():  # entry M: the bootstrap value, from the state after entry M-1
        h_m, _ = reference_run(model.cell, xs[s][M:], seg.reset[M:], state)
        _, bootstrap = model.heads(h_m[0])
    loss = model.segment_loss((params[:, streams], values[:, streams], bootstrap[streams]), seg.select(streams))
    loss["loss"].backward()
    return {k: p.grad.clone() for k, p in model.cell.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("epochs, minibatches", [(1, 1), (2, 2)])
def test_separate_critic_passes_are_bptt_and_each_loss_trains_its_own_core(epochs, minibatches):
    """``separate_critic``, fixed weights (lr = 0), float64, RTRL across segments: every optimiser step's gradient of
    both cores equals full BPTT over the stream's history; the actor's stem, core and head get exactly the gradient
    without the value loss, the critic's exactly the value loss's (each loss reaches its own parameters only)."""
    segments = record(3, torch.float64)
    common = dict(lr=0.0, grad_clip=0.0, epochs=epochs, minibatches=minibatches)
    runs = {name: Grads() for name in ("both", "no_value_loss", "value_only")}
    models = {}
    for name, extra in {
        "both": {},
        "no_value_loss": {"baseline_cost": 0.0},
        "value_only": {"entropy_cost": 0.0, "ppo_clip": None},
    }.items():
        models[name] = tiny(R2ACConfig(**common, **extra), separate_critic=True).double()
        fit(models[name], segments, callbacks=[runs[name]])
    model = models["both"]
    assert type(model.cell).__name__ == "Parallel" and model.critic_stem is not None
    groups = torch.arange(B).chunk(minibatches)
    critic = ("cell.layers.1.", "critic_stem.", "critic_norm.", "value_mlp.", "baseline.")
    assert len(runs["both"].steps) == 3 * epochs * minibatches
    for k, ((s, got), (_, no_value)) in enumerate(zip(runs["both"].steps, runs["no_value_loss"].steps)):
        want = reference_parallel_gradient(model, segments, s, groups[k % minibatches])
        for name, value in want.items():
            torch.testing.assert_close(got[f"cell.{name}"], value, rtol=1e-9, atol=1e-12, msg=f"step {k}: {name}")
        for name, value in got.items():  # the value loss reaches the critic's parameters only
            if not name.startswith(critic):
                torch.testing.assert_close(value, no_value[name], rtol=1e-12, atol=1e-15, msg=f"step {k}: {name}")
        assert {n for n in got if n.startswith(critic)} and all(
            not n.startswith(critic) for n in no_value if no_value[n].abs().sum() > 0
        )


@pytest.mark.parametrize("epochs", [1, 2], ids=["one-pass", "two-passes"])
def test_separate_critic_resumes_exactly(epochs, tmp_path):
    """Both cores' carries (state and sensitivities) are in the checkpoint: 3 + 3 segments through a save and a resume
    end bit for bit where 6 straight segments end, weights and both carries."""
    segments = record(6)
    cfg = R2ACConfig(epochs=epochs, total_updates=40, lr=1e-2)
    straight = tiny(cfg, separate_critic=True)
    fit(straight, segments)
    first = tiny(cfg, separate_critic=True)
    save = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    fit(first, segments, max_steps=3 * epochs, callbacks=[save])
    resumed = tiny(cfg, separate_critic=True)
    fit(resumed, segments[3:] + segments[:3], ckpt_path=tmp_path / "last.ckpt", max_steps=6 * epochs)
    assert_same(straight, resumed)
    for got, want in zip(resumed.carry().layers, straight.carry().layers):  # the actor's core, then the critic's
        torch.testing.assert_close(got.c, want.c, rtol=0, atol=0)
        for key, value in want.sensitivities.items():
            torch.testing.assert_close(got.sensitivities[key], value, rtol=0, atol=0, msg=key)


def test_separate_critic_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="pass cell as a name"):
        R2AC(2, (4,), cell=ELSTMCell(6, 6), stem="mlp", fc_size=5,
             separate_critic=True)  # fmt: skip


@pytest.mark.parametrize("minibatches", [2, 4])
def test_minibatch_gradients_sum_to_the_full_batch_gradient(minibatches):
    """Sum reduction, lr = 0, float64: the minibatches' gradients add up to the one-pass gradient, every parameter."""
    segments = record(3, torch.float64)
    one, split = Grads(), Grads()
    fit(tiny(R2ACConfig(lr=0.0, grad_clip=0.0)).double(), segments, callbacks=[one])
    fit(tiny(R2ACConfig(lr=0.0, grad_clip=0.0, minibatches=minibatches)).double(), segments, callbacks=[split])
    assert len(one.steps) == 3 and len(split.steps) == 3 * minibatches
    for s, full in one.steps:
        parts = [g for seg, g in split.steps if seg == s]
        for name, value in full.items():
            total = sum(p[name] for p in parts)
            torch.testing.assert_close(total, value, rtol=1e-9, atol=1e-12, msg=f"segment {s}: {name}")


# -- an entropy cost that decays with the learning rate ----------------------------------------------------------------
class Costs(Grads):
    """:class:`Grads` plus each optimiser step's entropy cost and learning rate."""

    def __init__(self) -> None:
        super().__init__()
        self.costs: list[tuple[float, float]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        super().on_before_optimizer_step(trainer, pl_module, optimizer)
        self.costs.append((pl_module.entropy_cost_now(), optimizer.param_groups[0]["lr"]))


@pytest.mark.parametrize("epochs", [1, 2], ids=["one-pass", "two-passes"])
def test_entropy_cost_final_moves_the_cost_on_the_learning_rates_clock(epochs):
    """float64, fixed weights (lr 0 is a factor of every step's LR, so the schedule still runs): the gradient is
    linear in the entropy cost, so step k of the scheduled run must equal the constant-cost runs' gradients mixed at
    c_k = start + (final - start) k / total, the fraction by which the LR has decayed at the same step."""
    segments = record(3, torch.float64)
    start, final, total = 0.02, 0.005, 4 * epochs
    common = dict(lr=0.0, grad_clip=0.0, epochs=epochs, total_updates=total)
    runs = {}
    for name, extra in {
        "start": {"entropy_cost": start},
        "final": {"entropy_cost": final},
        "scheduled": {"entropy_cost": start, "entropy_cost_final": final},
    }.items():
        runs[name] = Costs()
        fit(tiny(R2ACConfig(**common, **extra)).double(), segments, callbacks=[runs[name]])
    assert [c for c, _ in runs["start"].costs] == [start] * 3 * epochs  # no schedule: constant
    for k, ((_, got), (_, g0), (_, g1)) in enumerate(
        zip(runs["scheduled"].steps, runs["start"].steps, runs["final"].steps, strict=True)
    ):
        cost = start + (final - start) * k / total
        assert runs["scheduled"].costs[k][0] == pytest.approx(cost, rel=1e-12)
        weight = (cost - start) / (final - start)
        for name, value in got.items():
            want = g0[name] + weight * (g1[name] - g0[name])
            torch.testing.assert_close(value, want, rtol=1e-9, atol=1e-12, msg=f"step {k}: {name}")


def test_entropy_cost_final_resumes_where_it_stopped(tmp_path):
    """3 + 3 segments through a checkpoint end bit for bit where 6 straight segments end: the cost's clock (the LR
    schedule's step count) is in the checkpoint, and the costs seen at every step are the same."""
    segments = record(6)
    cfg = R2ACConfig(entropy_cost=0.05, entropy_cost_final=0.0, epochs=2, total_updates=12, lr=1e-2)
    straight, costs = tiny(cfg), Costs()
    fit(straight, segments, callbacks=[costs])
    first, resumed_costs = tiny(cfg), Costs()
    save = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    fit(first, segments, max_steps=6, callbacks=[save, resumed_costs])
    resumed = tiny(cfg)
    fit(resumed, segments[3:] + segments[:3], ckpt_path=tmp_path / "last.ckpt", max_steps=12, callbacks=[resumed_costs])
    assert resumed_costs.costs == costs.costs and costs.costs[-1][0] == pytest.approx(0.05 / 12)
    assert_same(straight, resumed)


@pytest.mark.parametrize("bad", [-0.01, float("nan")])
def test_entropy_cost_final_must_be_a_cost(bad):
    with pytest.raises(ValueError, match="entropy_cost_final must be a number >= 0"):
        R2ACConfig(entropy_cost_final=bad)


def test_the_carry_moves_forward_once_and_stays_the_actors_state():
    """Training (lr > 0) with 2 epochs x 2 minibatches: after every segment the learner's carry is the actor's state
    (the carry moved forward is the first pass's, computed with the weights and the reward scale the actor acted
    with), global_step counts optimiser steps and the LR schedule steps with each."""
    checked = []

    class Check(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            torch.testing.assert_close(module.carry("train").c, module.carry("act").c, rtol=1e-5, atol=1e-6)
            assert trainer.global_step == 4 * (batch_idx + 1)
            assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == trainer.global_step
            checked.append(batch_idx)

    model = tiny(R2ACConfig(epochs=2, minibatches=2, lr=1e-2, reward_norm=True))  # the actor's reward scale too
    before = [p.detach().clone() for p in model.parameters()]
    trainer = L.Trainer(
        strategy=RTRLStrategy(M=M),
        max_steps=5 * 4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Check()],
    )
    dm = RolloutDataModule("memory:tmaze", num_envs=B, env_kwargs={"length": 3})
    trainer.fit(model, dm)
    assert checked == list(range(5)) and dm.frames == 5 * M * B
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert math.isclose(trainer.optimizers[0].param_groups[0]["lr"], 0.0, abs_tol=1e-12)  # decayed over 20 steps


class LogsEveryPass(R2AC):
    """R2AC logging at every optimiser step of several passes: each one calls ``self.log``."""

    def log_step(self, result, stream, num_streams):
        OnlineRecurrentModule.log_step(self, result, stream, num_streams)


def test_several_passes_log_once_per_segment_and_log_what_logging_every_pass_showed():
    """Lightning keeps a training step's last logged value, so logging only the last of 2 x 2 optimiser steps shows
    the same metrics as logging all four, for a quarter of the ``self.log`` calls; the weights are unchanged."""
    segments = record(3)
    calls: dict[type, list[str]] = {R2AC: [], LogsEveryPass: []}
    runs = {}
    for cls in (R2AC, LogsEveryPass):

        class Counting(cls):
            def log(self, name, *args, **kwargs):
                calls[cls].append(name)
                super().log(name, *args, **kwargs)

        model = tiny(R2ACConfig(epochs=2, minibatches=2, lr=1e-2, ppo_clip=0.2), cls=Counting)
        runs[cls] = (model, fit(model, segments).callback_metrics)
    (quiet, shown), (loud, expected) = runs[R2AC], runs[LogsEveryPass]
    assert calls[R2AC].count("train/loss") == 3 and calls[LogsEveryPass].count("train/loss") == 3 * 4
    assert set(shown) == set(expected) and "train/loss" in shown
    for name in set(expected) - {"fps"}:  # fps is a clock's reading
        torch.testing.assert_close(shown[name], expected[name], rtol=0, atol=0, msg=name)
    assert_same(quiet, loud)


@pytest.mark.parametrize(
    "strategy, cell, precision",
    [
        ("tbptt", "elstm", "32-true"),
        ("snap", "felstm", "32-true"),
        ("tbptt", None, "32-true"),
        ("rtrl", "stack", "32-true"),
        ("rtrl", "elstm", "bf16-mixed"),
    ],
    ids=["tbptt", "snap-felstm", "feed-forward", "rtrl-stack", "rtrl-bf16"],
)
def test_several_passes_train_every_method_cell_and_precision(strategy, cell, precision):
    from onlinerec import cells
    from onlinerec.training.strategies import make_strategy

    if cell == "stack":
        cell = cells.Stack([cells.make_cell("elstm", 6, N), cells.make_cell("elstm", N, N)], residual=True)
    torch.manual_seed(0)
    config = R2ACConfig(epochs=2, minibatches=2, reward_norm=True, advantage_norm=True, ppo_clip=0.2)
    model = R2AC(2, (4,), cell=cell, hidden_size=N, stem="mlp", fc_size=5, config=config)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = L.Trainer(
        strategy=make_strategy(strategy, M=M),
        accelerator="cpu",
        precision=precision,
        max_steps=2 * 4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, RolloutDataModule("memory:tmaze", num_envs=B, env_kwargs={"length": 3}))
    assert math.isfinite(float(trainer.callback_metrics["train/loss"])) and trainer.global_step == 8
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    if model.cell is not None:
        assert model.carry("train").batch_size == B


# -- reward normalisation ---------------------------------------------------------------------------------------------
def test_discounted_returns_and_running_statistics():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    done = torch.rand(7, 3, generator=gen) < 0.3
    start = torch.randn(3, generator=gen, dtype=torch.float64)
    returns, last = discounted_returns(start, rewards, done, 0.9)
    for b in range(3):  # sb3's loop: returns = returns * gamma + r; record; returns[done] = 0
        ret = float(start[b])
        for t in range(7):
            ret = ret * 0.9 + float(rewards[t, b])
            assert math.isclose(float(returns[t, b]), ret, rel_tol=1e-12)
            ret = 0.0 if done[t, b] else ret
        assert math.isclose(float(last[b]), ret, abs_tol=1e-12)
    norm = ReturnNormalizer()
    batches = [torch.randn(5, 4, generator=gen, dtype=torch.float64) * 3 + 1 for _ in range(4)]
    for x in batches:
        norm.update(x)
    everything = torch.cat([x.reshape(-1) for x in batches])
    assert math.isclose(float(norm.mean), float(everything.mean()), rel_tol=1e-4)
    assert math.isclose(float(norm.var), float(everything.var(correction=0)), rel_tol=1e-4)
    assert math.isclose(float(norm.count), 80 + 1e-4, rel_tol=1e-12)
    torch.testing.assert_close(norm.std, (norm.var + 1e-8).sqrt())


def test_reward_norm_divides_the_loss_and_input_rewards_by_the_return_scale():
    model = tiny(R2ACConfig(reward_norm=True, reward_clip=0.0))
    assert {"return_normalizer.mean", "return_normalizer.var", "return_normalizer.count"} <= set(model.state_dict())
    model.return_normalizer.var.fill_(4.0)
    r = torch.tensor([[1.0, -2.0]])
    torch.testing.assert_close(model._clip(r), r / math.sqrt(4.0 + 1e-8))
    model = tiny(R2ACConfig(reward_norm=True))  # reward_clip 1 clips the normalised reward
    model.return_normalizer.var.fill_(0.25)
    torch.testing.assert_close(model._clip(torch.tensor([0.2, 0.9])), torch.tensor([0.4, 1.0]))


@pytest.mark.parametrize("epochs", [1, 2], ids=["one-pass", "two-passes"])
def test_reward_norm_statistics_survive_a_checkpoint_and_the_resume_is_exact(epochs, tmp_path):
    """Statistics (buffers) and every stream's running return (a carried state) are in the checkpoint; training 3 + 3
    segments through a save and a resume ends bit for bit where 6 straight segments end."""
    segments = record(6)
    cfg = R2ACConfig(reward_norm=True, advantage_norm=True, epochs=epochs, total_updates=40, lr=1e-2)
    straight = tiny(cfg)
    fit(straight, segments)
    assert float(straight.return_normalizer.count) == pytest.approx(6 * M * B, abs=1e-3)

    first = tiny(cfg)
    save = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    fit(first, segments, max_steps=3 * epochs, callbacks=[save])  # stops mid-epoch, after segment 3
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    torch.testing.assert_close(saved["state_dict"]["return_normalizer.var"], first.return_normalizer.var)
    torch.testing.assert_close(saved["onlinerec"]["carries"]["returns"]["c"], first.carry("returns").c)
    resumed = tiny(cfg)
    # Lightning resumes at batch index 3 but reads a map-style loader from its start: put segments 4-6 there
    trainer = fit(resumed, segments[3:] + segments[:3], ckpt_path=tmp_path / "last.ckpt", max_steps=6 * epochs)
    assert trainer.global_step == 6 * epochs
    assert_same(straight, resumed)  # weights and the normaliser's buffers
    for name in ("train", "returns"):
        torch.testing.assert_close(resumed.carry(name).c, straight.carry(name).c, rtol=0, atol=0)


def test_reward_norm_exports_with_the_scale_at_export_time(tmp_path):
    model = tiny(R2ACConfig(reward_norm=True, reward_clip=0.0))
    model.return_normalizer.var.fill_(9.0)
    policy = torch.jit.load(str(model.export(tmp_path / "p.pt", output="params")))
    obs, reset, reward = torch.randn(2, 4), torch.ones(2, dtype=torch.bool), torch.tensor([3.0, -6.0])
    got, _ = policy(obs, reset, policy.initial_state(2), reward)
    _, want = model.act(obs, reward, reset, stream="check")
    torch.testing.assert_close(got, want)


# -- observation normalisation ----------------------------------------------------------------------------------------
def test_observation_statistics_are_per_feature_and_the_forward_centres_scales_and_clips():
    gen = torch.Generator().manual_seed(1)
    norm = ObservationNormalizer((3,), clip=2.0)
    scale, shift = torch.tensor([0.01, 1.0, 50.0], dtype=torch.float64), torch.tensor([5.0, -1.0, 0.0])
    batches = [torch.randn(4, 6, 3, generator=gen, dtype=torch.float64) * scale + shift for _ in range(3)]
    for x in batches:
        norm.update(x)
    everything = torch.cat([x.reshape(-1, 3) for x in batches])
    n, prior = everything.shape[0], 1e-4  # the prior: mean 0, var 1, weight 1e-4 (sb3's RunningMeanStd)
    mean, var = everything.mean(0), everything.var(0, correction=0)
    torch.testing.assert_close(norm.mean, mean * n / (n + prior), rtol=1e-12, atol=1e-15)
    want_var = (prior + n * var + mean**2 * prior * n / (n + prior)) / (n + prior)  # all samples pooled with the prior
    torch.testing.assert_close(norm.var, want_var, rtol=1e-9, atol=0)
    obs = torch.tensor([[5.0, -1.0, 0.0], [5.1, 3.0, -500.0]])
    want = ((obs.double() - norm.mean) / (norm.var + 1e-8).sqrt()).clamp(-2, 2).float()
    torch.testing.assert_close(norm(obs), want)
    assert norm(obs)[1].tolist() == [2.0, 2.0, -2.0]  # the clip
    with pytest.raises(ValueError, match=r"samples of shape \(3,\)"):
        norm.update(torch.zeros(4, 2))


def test_obs_norm_feeds_the_stem_normalised_observations_and_counts_every_new_entry():
    model = tiny(R2ACConfig(obs_norm=True, obs_clip=0.0))
    assert {"obs_normalizer.mean", "obs_normalizer.var", "obs_normalizer.count"} <= set(model.state_dict())
    model.obs_normalizer.mean.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    model.obs_normalizer.var.fill_(4.0)
    obs, reward = torch.randn(2, 3, 4), torch.zeros(2, 3)
    want = model.stem(((obs - model.obs_normalizer.mean.float()) / 2.0).reshape(6, 4)).reshape(2, 3, -1)
    torch.testing.assert_close(model.features(obs, reward)[..., :-1], want, rtol=1e-5, atol=1e-6)

    segments = record(4)
    fresh = tiny(R2ACConfig(obs_norm=True))
    fit(fresh, segments)
    seen = torch.cat([s.inputs[1:].reshape(-1, 4) for s in segments]).double()  # entry 0 repeats the last entry M
    assert float(fresh.obs_normalizer.count) == pytest.approx(4 * M * B, abs=1e-3)
    torch.testing.assert_close(fresh.obs_normalizer.mean, seen.mean(0), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"obs_shape": (3, 8, 8), "stem": "nature"}, r"shape \(3, 8, 8\)"),
        ({"obs_shape": (2, 4), "stem": "mlp"}, r"shape \(2, 4\)"),
    ],
    ids=["image", "matrix"],
)
def test_obs_norm_on_observations_that_are_not_flat_vectors_names_the_alternative(kwargs, what):
    with pytest.raises(ValueError, match=what) as err:
        R2AC(2, cell="elstm", hidden_size=N, fc_size=5, config=R2ACConfig(obs_norm=True), **kwargs)
    assert "NormalizeObservation" in str(err.value)


def test_obs_norm_statistics_survive_a_checkpoint_and_the_resume_is_exact(tmp_path):
    segments = record(6)
    cfg = R2ACConfig(obs_norm=True, reward_norm=True, epochs=2, total_updates=40, lr=1e-2)
    straight = tiny(cfg)
    fit(straight, segments)
    first = tiny(cfg)
    save = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    fit(first, segments, max_steps=6, callbacks=[save])
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    torch.testing.assert_close(saved["state_dict"]["obs_normalizer.mean"], first.obs_normalizer.mean)
    resumed = tiny(cfg)
    fit(resumed, segments[3:] + segments[:3], ckpt_path=tmp_path / "last.ckpt", max_steps=12)
    assert_same(straight, resumed)  # weights and both normalisers' buffers, bit for bit


def test_obs_norm_exports_with_the_statistics_at_export_time(tmp_path):
    model = tiny(R2ACConfig(obs_norm=True))
    model.obs_normalizer.mean.copy_(torch.tensor([3.0, -3.0, 0.5, 0.0]))
    model.obs_normalizer.var.copy_(torch.tensor([0.01, 9.0, 1.0, 100.0]))
    policy = torch.jit.load(str(model.export(tmp_path / "p.pt", output="params")))
    obs, reset, reward = torch.randn(2, 4), torch.ones(2, dtype=torch.bool), torch.tensor([1.0, 0.0])
    got, _ = policy(obs, reset, policy.initial_state(2), reward)
    _, want = model.act(obs, reward, reset, stream="check")
    torch.testing.assert_close(got, want)
    _, plain = tiny(R2ACConfig()).act(obs, reward, reset, stream="check")  # same weights (seed), no normalisation
    assert not torch.allclose(want, plain)


def flat_space(low, high):
    return gymnasium.spaces.Box(np.array(low, np.float32), np.array(high, np.float32))


def test_obs_norm_skip_binary_passes_features_bounded_to_0_1_and_normalises_the_rest():
    norm = ObservationNormalizer((3,), clip=0.0, keep=torch.tensor([True, False, False]))
    norm.mean.copy_(torch.tensor([0.5, 2.0, -1.0]))
    norm.var.fill_(4.0)
    obs = torch.tensor([[1.0, 4.0, 1.0], [0.0, 0.0, -1.0]])
    assert norm(obs).tolist() == [[1.0, 1.0, 1.0], [0.0, -1.0, 0.0]]
    assert set(norm.state_dict()) == set(ObservationNormalizer((3,)).state_dict())  # checkpoints keep their keys
    with pytest.raises(ValueError, match=r"keep must be a mask of the observation's shape \(3,\)"):
        ObservationNormalizer((3,), keep=torch.tensor([True, False]))

    cfg = R2ACConfig(obs_norm=True, obs_norm_skip_binary=True)
    mixed = flat_space([0, 0, 0, -4.8, -np.inf], [1, 1, 1, 4.8, np.inf])  # a one-hot of 3, then two continuous
    model = R2AC.from_spaces(mixed, gymnasium.spaces.Discrete(2), cell="elstm", hidden_size=N, fc_size=5, config=cfg)
    assert model.obs_normalizer.keep.tolist() == [True, True, True, False, False]
    continuous = flat_space([-1, -4.8], [1, 4.8])  # nothing to keep: plain obs_norm
    model = R2AC.from_spaces(continuous, gymnasium.spaces.Discrete(2), cell="elstm", hidden_size=N, config=cfg)
    assert model.obs_normalizer.keep is None


def test_obs_norm_skip_binary_on_one_hot_observations_is_no_normalisation_exactly():
    """Every POPGym memory game's observation is one-hot codes: there the agent computes what it computes without
    obs_norm, bit for bit, whatever the statistics."""
    one_hot, action = flat_space([0] * 4, [1] * 4), gymnasium.spaces.Discrete(2)
    models = []
    for cfg in (R2ACConfig(obs_norm=True, obs_norm_skip_binary=True), R2ACConfig()):
        torch.manual_seed(0)
        models.append(R2AC.from_spaces(one_hot, action, cell="elstm", hidden_size=N, stem="mlp", fc_size=5, config=cfg))
    skipping, plain = models
    skipping.obs_normalizer.update(torch.rand(10, 4) * 7)
    obs = torch.eye(4)[torch.randint(0, 4, (2, 3))]
    reward = torch.randn(2, 3)
    assert torch.equal(skipping.features(obs, reward), plain.features(obs, reward))


def test_obs_norm_skip_binary_exports_with_its_mask(tmp_path):
    mixed, action = flat_space([0, 0, -5], [1, 1, 5]), gymnasium.spaces.Discrete(2)
    cfg = R2ACConfig(obs_norm=True, obs_norm_skip_binary=True)
    model = R2AC.from_spaces(mixed, action, cell="elstm", hidden_size=N, stem="mlp", fc_size=5, config=cfg)
    model.obs_normalizer.mean.copy_(torch.tensor([0.3, 0.3, 2.0]))
    model.obs_normalizer.var.fill_(9.0)
    policy = torch.jit.load(str(model.export(tmp_path / "p.pt", output="params")))
    obs, reset, reward = (
        torch.tensor([[1.0, 0.0, 4.0], [0.0, 1.0, -3.0]]),
        torch.ones(2, dtype=torch.bool),
        torch.ones(2),
    )
    got, _ = policy(obs, reset, policy.initial_state(2), reward)
    _, want = model.act(obs, reward, reset, stream="check")
    torch.testing.assert_close(got, want)


def test_obs_norm_skip_binary_needs_the_spaces_bounds():
    with pytest.raises(ValueError, match=r"built from obs_shape alone: build it with observation_space="):
        tiny(R2ACConfig(obs_norm=True, obs_norm_skip_binary=True))


# -- advantages, reductions, PPO's ratio -------------------------------------------------------------------------------
def test_advantage_norm_gives_zero_mean_unit_std_advantages():
    seg = record(1)[0]
    plain, normed = tiny(method="rtrl"), tiny(R2ACConfig(advantage_norm=True), method="rtrl")
    outputs = plain.learner_outputs(seg)
    vs, adv = plain.targets(outputs, seg)
    vs_n, adv_n = normed.targets(outputs, seg)
    torch.testing.assert_close(vs_n, vs)
    assert abs(float(adv_n.mean())) < 1e-6 and float(adv_n.std(correction=0)) == pytest.approx(
        1.0, abs=1e-4
    )  # eps 1e-8 vs std ~1e-3
    torch.testing.assert_close(adv_n, (adv - adv.mean()) / (adv.std(correction=0) + 1e-8))


def test_mean_reduction_is_the_sum_over_M_times_B():
    seg = record(1)[0]
    summed, meaned = tiny(method="rtrl"), tiny(R2ACConfig(loss_reduction="mean"), method="rtrl")
    assert meaned.loss_reduction == "mean" and summed.loss_reduction == "sum"  # the base module's DDP scaling reads it
    a, b = summed.losses(seg), meaned.losses(seg)
    for name in ("loss", "pg_loss", "baseline_loss", "entropy_loss"):
        torch.testing.assert_close(b[name], a[name] / (M * B), rtol=1e-6, atol=1e-9, msg=name)
    torch.testing.assert_close(b["entropy"], a["entropy"])


def test_ppo_clip_is_the_clipped_ratio_on_unweighted_vtrace_advantages():
    seg = record(1)[0]
    model = tiny(R2ACConfig(ppo_clip=0.2), method="rtrl")
    outputs = model.learner_outputs(seg)
    params, values, bootstrap = outputs
    logp = model.policy.log_prob(params, seg.actions[1:])
    mu = seg.behaviour_logp[1:]
    rewards = seg.rewards[1:].clamp(-1, 1)
    discounts = 0.99 * (~seg.reset[1:]).float()
    vs, weighted = vtrace(mu, logp.detach(), rewards, discounts, values.detach(), bootstrap)
    vs2, adv = model.targets(outputs, seg)
    vs_next = torch.cat([vs[1:], bootstrap[None]])
    torch.testing.assert_close(vs2, vs)
    torch.testing.assert_close(adv, rewards + discounts * vs_next - values.detach())
    torch.testing.assert_close(weighted, torch.exp(logp.detach() - mu).clamp(max=1.0) * adv)
    ratio = torch.exp(logp - mu)
    want = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).sum()
    got = model.segment_loss(outputs, seg)
    torch.testing.assert_close(got["pg_loss"], want)
    assert 0.0 <= float(got["clip_fraction"]) <= 1.0


def test_trace_lambda_reaches_the_targets():
    """model.targets with trace_lambda equals vtrace called with it (and differs from lambda = 1)."""
    seg = record(1)[0]
    model = tiny(R2ACConfig(trace_lambda=0.5), method="rtrl")
    outputs = model.learner_outputs(seg)
    params, values, bootstrap = outputs
    logp = model.policy.log_prob(params, seg.actions[1:]).detach()
    args = (seg.behaviour_logp[1:], logp, seg.rewards[1:].clamp(-1, 1), 0.99 * (~seg.reset[1:]).float())
    vs, adv = model.targets(outputs, seg)
    want_vs, want_adv = vtrace(*args, values.detach(), bootstrap, trace_lambda=0.5)
    torch.testing.assert_close(vs, want_vs)
    torch.testing.assert_close(adv, want_adv)
    plain_vs, _ = vtrace(*args, values.detach(), bootstrap)
    assert not torch.allclose(vs, plain_vs)


def test_adam_and_the_epsilons_reach_the_optimizer():
    opt = tiny(R2ACConfig(optimizer="adam", adam_eps=1e-7, lr=3e-4)).configure_optimizers()
    assert isinstance(opt, torch.optim.Adam) and opt.defaults["eps"] == 1e-7 and opt.defaults["lr"] == 3e-4
    opt = tiny(R2ACConfig(rms_eps=1e-5)).configure_optimizers()
    assert isinstance(opt, torch.optim.RMSprop) and opt.defaults["eps"] == 1e-5


# -- errors ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields, match",
    [
        ({"epochs": 0}, r"epochs must be an int >= 1, got 0"),
        ({"minibatches": -1}, r"minibatches must be an int >= 1, got -1"),
        ({"epochs": 1.5}, r"epochs must be an int >= 1"),
        ({"loss_reduction": "avg"}, r"loss_reduction must be 'sum' or 'mean', got 'avg'"),
        ({"ppo_clip": 0.0}, r"ppo_clip must be a number > 0 .* or None"),
        ({"optimizer": "sgd"}, r"optimizer must be 'rmsprop' or 'adam', got 'sgd'"),
        ({"trace_lambda": 1.2}, r"trace_lambda must be a number in \[0, 1\] .*got 1.2"),
        ({"trace_lambda": "0.8"}, r"trace_lambda must be a number in \[0, 1\]"),
        ({"obs_norm_skip_binary": True}, r"obs_norm is off: set obs_norm=True as well"),
    ],
)
def test_bad_values_are_refused_with_their_fix(fields, match):
    with pytest.raises(ValueError, match=match):
        R2ACConfig(**fields)
    with pytest.raises(ValueError, match=match):
        tiny(config=fields)


def test_minibatches_must_divide_the_streams():
    with pytest.raises(ValueError, match=r"minibatches = 3 does not divide the 4 streams.*\[1, 2, 4\]"):
        fit(tiny(R2ACConfig(minibatches=3)), record(1))


# -- Carry.select ----------------------------------------------------------------------------------------------------
def test_carry_select_copies_the_chosen_streams():
    from onlinerec import ELSTMCell

    cell = ELSTMCell(3, 4).double()
    method = RTRL()
    gen = torch.Generator().manual_seed(0)
    carry = method.init_carry(cell, 5)
    for _ in range(3):  # one step at a time, donated: a lazily scaled carry
        x = torch.randn(1, 5, 3, generator=gen, dtype=torch.float64)
        _, carry = method.unroll(cell, x, torch.zeros(1, 5, dtype=torch.bool), carry, donate=True)
    streams = torch.tensor([4, 1])
    picked = carry.select(streams)
    assert picked.batch_size == 2 and (picked.scale is None) == (carry.scale is None)
    torch.testing.assert_close(picked.c, carry.c[streams])
    for name, value in carry.sensitivities.items():
        torch.testing.assert_close(picked.sensitivities[name], value[streams])
    before = {k: v.clone() for k, v in carry.sensitivities.items()}
    x = torch.randn(1, 2, 3, generator=gen, dtype=torch.float64)
    method.unroll(cell, x, torch.zeros(1, 2, dtype=torch.bool), picked, donate=True)  # consumes the copy only
    for name, value in carry.sensitivities.items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)
    stack = StackCarry([carry, carry.select(torch.arange(5))]).select(streams)
    assert isinstance(stack, StackCarry) and [layer.batch_size for layer in stack.layers] == [2, 2]
    with pytest.raises(TypeError, match="1-d integer tensor"):
        carry.select(torch.tensor([0.0, 1.0]))
    with pytest.raises(IndexError, match=r"\[0, 5\)"):
        carry.select(torch.tensor([5]))
    assert isinstance(Carry(torch.zeros(3, 2)).select(torch.tensor([2])), Carry)


# -- the runner -------------------------------------------------------------------------------------------------------
def test_runner_takes_the_new_fields_and_counts_optimiser_steps():
    from onlinerec.rl.experiment import ExperimentConfig, parse_experiment
    from onlinerec.rl.resume import config_changes
    from onlinerec.rl.runner import build

    argv = ["--r2ac.epochs", "2", "--r2ac.minibatches", "2", "--r2ac.reward_norm", "true", "--r2ac.ppo_clip", "0.2"]
    argv += ["--r2ac.loss_reduction", "mean", "--r2ac.advantage_norm", "true"]
    cfg = parse_experiment([*argv, "--num_envs", "4", "--M", "4", "--total_frames", "64", "--stem", "mlp"])
    r = cfg.r2ac
    assert (r.epochs, r.minibatches, r.reward_norm, r.ppo_clip, r.loss_reduction, r.advantage_norm) == (
        2,
        2,
        True,
        0.2,
        "mean",
        True,
    )
    model, _, _, updates = build(cfg)
    assert updates == 4 * 4 and model.config.total_updates == 16 and not model.automatic_optimization
    assert model.return_normalizer is not None
    with pytest.raises(SystemExit):
        parse_experiment(["--r2ac.loss_reduction", "avg"])
    # a run started before these fields existed ran with their defaults: it resumes as the same experiment
    import dataclasses
    import json

    stored = json.loads(json.dumps(dataclasses.asdict(ExperimentConfig()), default=str))
    for name in ("epochs", "minibatches", "reward_norm", "advantage_norm", "loss_reduction", "ppo_clip"):
        del stored["r2ac"][name]
    assert config_changes(stored, ExperimentConfig()) == {}
    assert set(config_changes(stored, cfg)) >= {"r2ac.epochs", "r2ac.reward_norm", "num_envs"}


REPLACEMENT = (
    "detach_value was removed: give the value a core of its own with separate_critic: true, or lower baseline_cost"
)


@pytest.mark.parametrize(
    "how",
    ["option", "option=", "dashes", "group", "config file", "default config"],
)
def test_a_removed_field_is_refused_with_what_replaces_it(how, tmp_path, capsys):
    """``r2ac.detach_value`` is gone: a command line or a config file that sets it exits naming what replaces it."""
    from onlinerec.rl.experiment import parse_experiment

    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("M: 4\nr2ac:\n  lr: 1.0e-3\n  detach_value: true\n")
    argv, default = {
        "option": (["--r2ac.detach_value", "true"], None),
        "option=": (["--M", "4", "--r2ac.detach_value=false"], None),
        "dashes": (["--r2ac.detach-value", "true"], None),
        "group": (["--r2ac", "{detach_value: true}"], None),
        "config file": (["--config", str(yaml_file)], None),
        "default config": ([], yaml_file),
    }[how]
    with pytest.raises(SystemExit) as exit_:
        parse_experiment(argv, default_config=default)
    assert exit_.value.code == 2
    assert REPLACEMENT in capsys.readouterr().err
    assert parse_experiment(["--M", "4"]).M == 4  # without it, the same parser takes the command line


def test_a_removed_field_is_refused_by_the_agent_and_ignored_where_it_was_off():
    """A model's config dict that sets the removed field is refused with what replaces it; set to false (a
    checkpoint or a run folder saved while it existed: what R2AC does now) it is dropped, and the run resumes."""
    import dataclasses
    import json

    from onlinerec.rl.experiment import ExperimentConfig
    from onlinerec.rl.r2ac_config import config_from_dict
    from onlinerec.rl.resume import config_changes

    with pytest.raises(ValueError, match=REPLACEMENT):
        tiny({"detach_value": True, "lr": 1e-3})
    with pytest.raises(TypeError):
        R2ACConfig(detach_value=True)  # the field is gone
    assert config_from_dict({"detach_value": False, "lr": 1e-3}) == R2ACConfig(lr=1e-3)
    torch.testing.assert_close(  # the same weights from the same seed: nothing else changed
        dict(tiny({"detach_value": False}).state_dict()), dict(tiny(R2ACConfig()).state_dict()), rtol=0, atol=0
    )
    stored = json.loads(json.dumps(dataclasses.asdict(ExperimentConfig()), default=str))
    assert config_changes({**stored, "r2ac": {**stored["r2ac"], "detach_value": False}}, ExperimentConfig()) == {}
    changed = config_changes({**stored, "r2ac": {**stored["r2ac"], "detach_value": True}}, ExperimentConfig())
    assert changed == {"r2ac.detach_value": (True, None)}


# -- DDP ----------------------------------------------------------------------------------------------------------
DDP_CONFIG = dict(lr=0.0, grad_clip=0.0, epochs=2, reward_norm=True, obs_norm=True)


class _RankStreams(L.LightningDataModule):
    """Rank r trains on streams 2r and 2r + 1 of the saved 4-stream segments."""

    def __init__(self, segments):
        super().__init__()
        self.segments = segments

    def train_dataloader(self):
        r = self.trainer.global_rank
        return DataLoader([s.select(torch.arange(2 * r, 2 * r + 2)) for s in self.segments], batch_size=None)


def _ddp_main(out: Path) -> None:
    """2 processes x 2 streams, 2 passes per segment (Lightning relaunches this file for rank 1)."""
    segments = [RolloutSegment(**d) for d in torch.load(out / "segments.pt", weights_only=True)]
    model = tiny(R2ACConfig(**DDP_CONFIG)).double()
    grads = Grads()
    trainer = L.Trainer(
        strategy=RTRLStrategy(M=M),
        accelerator="cpu",
        devices=2,
        max_steps=len(segments) * 2,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[grads],
    )
    trainer.fit(model, _RankStreams(segments))
    stats = {k: v.clone() for k, v in model.state_dict().items() if "normalizer." in k}
    torch.save({"grads": [g for _, g in grads.steps], "stats": stats}, out / f"rank{trainer.global_rank}.pt")


@pytest.mark.slow
def test_ddp_two_ranks_take_the_one_process_gradient_of_every_pass(tmp_path):
    """2 ranks x 2 streams with 2 passes per segment (several manual_backward calls per step under DDP): every
    optimiser step's all-reduced gradient, and the reward- and observation-norm statistics, equal 1 process x 4 streams (float64)."""
    segments = record(3, torch.float64)
    torch.save([{f.name: getattr(s, f.name) for f in fields(s)} for s in segments], tmp_path / "segments.pt")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    for var in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    single, grads = tiny(R2ACConfig(**DDP_CONFIG)).double(), Grads()
    fit(single, segments, callbacks=[grads])
    for r in (0, 1):
        got = torch.load(tmp_path / f"rank{r}.pt", weights_only=True)
        assert len(got["grads"]) == len(grads.steps) == 6
        for k, ((_, want), have) in enumerate(zip(grads.steps, got["grads"])):
            for name, value in want.items():
                torch.testing.assert_close(have[name], value, rtol=1e-9, atol=1e-12, msg=f"rank {r} step {k}: {name}")
        want_stats = {k: v for k, v in single.state_dict().items() if "normalizer." in k}
        assert set(got["stats"]) == set(want_stats) and len(want_stats) == 6  # returns' and observations' statistics
        for name, value in want_stats.items():
            torch.testing.assert_close(got["stats"][name], value, rtol=1e-12, atol=0, msg=name)


if __name__ == "__main__":
    _ddp_main(Path(sys.argv[1]))


def test_a_feed_forward_agent_with_separate_critic_has_a_stem_each():
    """Without a core (cell=None) the heads read [actor's features; reward] and [critic's features; reward]."""
    model = R2AC(3, (5,), cell=None, stem="mlp", fc_size=4, separate_critic=True, core_norm=True)
    x = model.features(torch.randn(2, 3, 5), torch.zeros(2, 3))
    assert x.shape == (2, 3, 10)
    params, values = model.heads(x)
    values.sum().backward()
    touched = {n.split(".")[0] for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert touched == {"critic_stem", "critic_norm", "baseline"} and params.shape == (2, 3, 3)
