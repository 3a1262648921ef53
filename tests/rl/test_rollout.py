"""RolloutStream / RolloutDataModule: resets at every position, the overlap convention, frame counting, and the
learner's carry equal to the actor's state (checked against a step-by-step reference)."""

from __future__ import annotations

import itertools
import types

import gymnasium as gym
import lightning as L
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from onlinerec import RTRLStrategy, SnAPStrategy, TBPTTStrategy
from onlinerec.rl import R2AC, RolloutDataModule, RolloutSegment, RolloutStream


class Countdown(gym.Env):
    """Episode length ``length``; obs = [steps into the episode, episode counter, 1]; reward = the action + 1
    (so the reward seen at entry t+1 identifies the action taken at entry t)."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(0, 1000, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.t = 0
        self.episode = -1

    def reset(self, *, seed=None, options=None):
        self.t = 0
        self.episode += 1
        return np.array([0, self.episode, 1], np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        return np.array([self.t, self.episode, 1], np.float32), float(action) + 1.0, done, False, {}


def make_env(lengths):
    return SyncVectorEnv([lambda n=n: Countdown(n) for n in lengths], autoreset_mode=AutoresetMode.SAME_STEP)


class ScriptedAgent:
    """Acts (global step + stream) % 3 and records what it was shown."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.calls = []

    def act(self, obs, reward, reset, *, greedy=False, stream="act"):
        self.calls.append((obs.clone(), reward.clone(), reset.clone()))
        b = obs.shape[0]
        actions = (torch.arange(b) + len(self.calls)) % 3
        logits = torch.nn.functional.one_hot(actions, 3).float() * 2.0
        return actions, logits


M, LENGTHS = 5, [1, 2, 3, 4, 5, 6, 7]  # episode lengths 1..M+2: resets land on every entry position


def collect(num_segments, m=M, repeat=1):
    agent = ScriptedAgent()
    stream = RolloutStream(make_env(LENGTHS), agent, action_repeat=repeat)
    return agent, [stream.next_segment(m) for _ in range(num_segments)]


def test_reset_flags_mark_episode_starts_at_every_position():
    _, segments = collect(8)
    positions = set()
    for k, seg in enumerate(segments):
        assert isinstance(seg, RolloutSegment) and seg.length == M + 1
        first_obs = seg.inputs[..., 0] == 0  # steps into the episode == 0 <=> an episode starts here
        assert torch.equal(seg.reset, first_obs)
        positions |= {int(t) for t in torch.nonzero(seg.reset[1:])[:, 0] + 1}
        if k == 0:
            assert seg.reset[0].all()  # the first step of every stream
        # an episode end sets the flag on the step that shows the next episode's first obs
        assert torch.equal(seg.episode_end[1:], seg.reset[1:])
    assert positions == set(range(1, M + 1))


def test_overlap_entry_zero_repeats_previous_last_entry():
    _, segments = collect(4)
    for prev, seg in itertools.pairwise(segments):
        for name in (
            "inputs",
            "reset",
            "rewards",
            "actions",
            "behaviour_logits",
            "behaviour_logp",
            "episode_end",
            "episode_return",
        ):
            assert torch.equal(getattr(seg, name)[0], getattr(prev, name)[-1]), name


def test_actions_and_logits_lead_to_the_entry_that_stores_them():
    agent, segments = collect(3)
    calls = iter(agent.calls)
    for seg in segments:
        for t in range(M):  # the actor sees entries 0..M-1 of every segment, in order
            obs, reward, reset = next(calls)
            assert (
                torch.equal(obs, seg.inputs[t])
                and torch.equal(reward, seg.rewards[t])
                and torch.equal(reset, seg.reset[t])
            )
        assert torch.equal(
            seg.rewards[1:], seg.actions[1:].float() + 1.0
        )  # reward at t+1 came from action stored at t+1
        logp = torch.log_softmax(seg.behaviour_logits[1:], -1).gather(-1, seg.actions[1:, :, None]).squeeze(-1)
        torch.testing.assert_close(seg.behaviour_logp[1:], logp)
    assert next(calls, None) is None


def test_episode_statistics_and_frame_counting():
    _, segments = collect(6, repeat=4)
    for k, seg in enumerate(segments, start=1):
        assert seg.frames == k * M * len(LENGTHS) * 4
        returns, lengths = seg.completed_episodes()
        ends = torch.nonzero(seg.episode_end[1:])
        for (t, b), r, n in zip(ends.tolist(), returns.tolist(), lengths.tolist()):
            assert n == LENGTHS[b]
        assert (returns > 0).all()


def test_first_segment_placeholders():
    _, (seg,) = collect(1)
    assert (seg.actions[0] == 0).all() and (seg.rewards[0] == 0).all()
    torch.testing.assert_close(seg.behaviour_logp[0], torch.full((len(LENGTHS),), -np.log(3.0)))


# -- learner carry vs actor state ----------------------------------------------------------------------------
def tiny_model(cell="elstm", method=None, seed=0):
    torch.manual_seed(seed)
    return R2AC(3, (3,), cell=cell, hidden_size=8, stem="mlp", fc_size=6, method=method)


def reference_logits(model, segments):
    """Step-by-step reference: the cell's single-step forward over the stream's entries 0..M-1 of each segment
    (each entry once), zeroing c before every flagged step."""
    c = None
    out = []
    with torch.no_grad():
        for seg in segments:
            x = model.features(seg.inputs, seg.rewards)
            steps = []
            for t in range(seg.length - 1):
                c = torch.zeros(x.shape[1], model.cell.hidden_size) if c is None else c
                c = model.cell(x[t], c * (~seg.reset[t]).float().unsqueeze(-1))
                steps.append(model.policy(model.cell.readout(c, x[t])))
            out.append(torch.stack(steps))
    return out


@pytest.mark.parametrize("method", ["rtrl", "tbptt", "snap"])
def test_learner_equals_actor_with_fixed_weights(method):
    model = tiny_model(method=method)
    stream = RolloutStream(make_env(LENGTHS), model)
    segments, outputs = [], []
    for _ in range(5):  # as in training: the actor collects a segment, then the learner unrolls it
        segments.append(stream.next_segment(M))
        outputs.append(model.learner_outputs(segments[-1]))
        # the carry handed on is the state after entry M-1 = the actor's state
        torch.testing.assert_close(model._carries["train"].c, model._carries["act"].c, rtol=1e-5, atol=1e-6)
    ref = reference_logits(model, segments)
    prev_bootstrap = None
    for k, (seg, (logits, values, bootstrap)) in enumerate(zip(segments, outputs)):
        # the learner's logits on entries 0..M-1 are the behaviour logits stored at entries 1..M (on-policy)
        torch.testing.assert_close(logits.detach(), seg.behaviour_logits[1:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits.detach(), ref[k], rtol=1e-5, atol=1e-5)
        if prev_bootstrap is not None:  # entry M's bootstrap value is the next segment's value at entry 0
            torch.testing.assert_close(prev_bootstrap, values[0].detach(), rtol=1e-5, atol=1e-6)
        prev_bootstrap = bootstrap


@pytest.mark.parametrize("strategy", [RTRLStrategy, TBPTTStrategy, SnAPStrategy])
def test_learner_carry_equals_actor_state_while_training(strategy):
    """With updates between segments, the learner's carry still equals the actor's state at every segment end
    (both advance with the same weights: the actor first, the learner next, then the update)."""
    checked = []

    class Check(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            torch.testing.assert_close(module._carries["train"].c, module._carries["act"].c, rtol=1e-5, atol=1e-6)
            checked.append(batch_idx)

    model = tiny_model()
    dm = RolloutDataModule(lambda n, s: make_env(LENGTHS[:n]), num_envs=len(LENGTHS))
    params0 = [p.detach().clone() for p in model.parameters()]
    trainer = L.Trainer(
        strategy=strategy(M=M),
        max_steps=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Check()],
    )
    trainer.fit(model, dm)
    assert checked == list(range(6))
    assert any(not torch.equal(a, b) for a, b in zip(params0, model.parameters()))
    assert dm.frames == 6 * M * len(LENGTHS)


def test_datamodule_needs_an_online_strategy():
    model = tiny_model()
    dm = RolloutDataModule(lambda n, s: make_env(LENGTHS[:n]), num_envs=2)
    trainer = L.Trainer(
        max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    with pytest.raises(RuntimeError, match="strategy"):
        trainer.fit(model, dm)


@pytest.mark.parametrize(("passes", "segments"), [(1, 10), (4, 3)])
def test_an_epoch_holds_the_segments_that_max_steps_allows(passes, segments):
    """max_steps counts optimiser steps: with several per segment (R2AC's epochs) the loader, and so the progress
    bar's total, holds max_steps / passes segments (rounded up), not max_steps."""
    dm = RolloutDataModule(lambda n, s: make_env(LENGTHS[:n]), num_envs=2)
    agent = tiny_model()
    agent.config = types.SimpleNamespace(passes=passes)
    dm.trainer = types.SimpleNamespace(
        global_rank=0, lightning_module=agent, max_steps=10, strategy=types.SimpleNamespace(M=2)
    )
    try:
        assert len(dm.train_dataloader()) == segments
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("method", ["rtrl", "snap"])
def test_r2ac_cell_gradient_over_segments_equals_bptt_over_the_stream(method):
    """With fixed weights, the cell's gradient accumulated over consecutive segments (each entry processed once in
    the learner's chain; entry M only bootstraps) equals full BPTT through the concatenated stream (float64)."""
    model = tiny_model(method=method).double()
    stream = RolloutStream(make_env(LENGTHS), model)
    gen = torch.Generator().manual_seed(3)
    segments, weights = [], []
    model.zero_grad()
    for _ in range(4):
        seg = stream.next_segment(M)
        w = torch.randn(M, len(LENGTHS), 3, generator=gen, dtype=torch.float64)
        logits, _, _ = model.learner_outputs(seg)
        (w * logits).sum().backward()
        segments.append(seg)
        weights.append(w)
    got = {k: p.grad.clone() for k, p in model.cell.named_parameters() if p.grad is not None}

    model.zero_grad()
    with torch.no_grad():
        x = torch.cat([model.features(s.inputs, s.rewards)[:M] for s in segments])  # entries 0..M-1 of each segment
    reset = torch.cat([s.reset[:M] for s in segments])
    c = torch.zeros(x.shape[1], model.cell.hidden_size, dtype=torch.float64)
    out = []
    for t in range(x.shape[0]):
        c = model.cell(x[t], c * (~reset[t]).double().unsqueeze(-1))
        out.append(model.policy(model.cell.readout(c, x[t])))
    (torch.cat(weights) * torch.stack(out)).sum().backward()
    expected = {k: p.grad.clone() for k, p in model.cell.named_parameters() if p.grad is not None}
    assert got.keys() == expected.keys()
    for k, value in expected.items():
        torch.testing.assert_close(got[k], value, rtol=1e-9, atol=1e-12)


class TimedOut(Countdown):
    """Countdown whose episodes end by a time limit (truncated) instead of terminating."""

    def step(self, action):
        obs, reward, done, _, info = super().step(action)
        return obs, reward, False, done, info


@pytest.mark.parametrize("cell", ["elstm", None])
def test_truncation_values_are_the_value_of_the_final_observation(cell):
    """bootstrap_truncation: where a time limit cut an episode, the segment holds the agent's value of that episode's
    final observation ([length, episode, 1]), computed from the episode's own history: checked against the learner's
    forward over the whole episode followed by the final observation. Elsewhere it is 0."""
    from onlinerec.rl.r2ac_config import R2ACConfig

    torch.manual_seed(0)
    model = R2AC(3, (3,), cell=cell, hidden_size=8, stem="mlp", fc_size=6, config=R2ACConfig(bootstrap_truncation=True))
    lengths = [2, 3, 5]
    stream = RolloutStream(
        SyncVectorEnv([lambda n=n: TimedOut(n) for n in lengths], autoreset_mode=AutoresetMode.SAME_STEP), model
    )
    segments = [stream.next_segment(4) for _ in range(4)]
    history = {i: [] for i in range(len(lengths))}  # (obs, reward input) of the current episode, per stream
    checked = 0
    for k, seg in enumerate(segments):
        for t in range(0 if k == 0 else 1, seg.length):  # entry 0 repeats the previous segment's last entry
            for i, n in enumerate(lengths):
                if seg.reset[t, i] and history[i]:  # the episode in history[i] was cut by its time limit
                    assert len(history[i]) == n
                    final = torch.tensor([[[float(n), history[i][0][0][1].item(), 1.0]]])
                    obs = torch.cat([torch.stack([o for o, _ in history[i]]).unsqueeze(1), final])
                    rewards = torch.stack([r for _, r in history[i]] + [seg.rewards[t, i]]).unsqueeze(1)
                    reset = torch.zeros(len(obs), 1, dtype=torch.bool)
                    reset[0] = True
                    with torch.no_grad():
                        x = model.features(obs, rewards)
                        h = x if cell is None else model(x, reset, stream="reference")
                        expected = model.heads(h[-1])[1]
                    model.reset_streams("reference")
                    torch.testing.assert_close(seg.truncation_value[t, i : i + 1], expected)
                    checked += 1
                elif t > 0:
                    assert seg.truncation_value[t, i] == 0
                if seg.reset[t, i]:
                    history[i] = []
                history[i].append((seg.inputs[t, i], seg.rewards[t, i]))
    assert checked >= 6
    assert (segments[0].truncation_value != 0).any()


def test_truncation_bootstrap_adds_gamma_times_the_value_to_the_reward():
    """The targets with bootstrap_truncation equal V-trace's on rewards that carry gamma * truncation_value (the
    discount stays 0 at the cut); without the option the field is ignored; off by default (the paper's R2AC)."""
    from onlinerec.rl.r2ac_config import R2ACConfig
    from onlinerec.rl.vtrace import vtrace

    torch.manual_seed(0)
    on = R2AC(3, (3,), cell="elstm", hidden_size=8, stem="mlp", fc_size=6, config=R2ACConfig(bootstrap_truncation=True))
    off = R2AC(3, (3,), cell="elstm", hidden_size=8, stem="mlp", fc_size=6)
    off.load_state_dict(on.state_dict())
    assert off.config.bootstrap_truncation is False
    seg = RolloutStream(
        SyncVectorEnv([lambda n=n: TimedOut(n) for n in [2, 3]], autoreset_mode=AutoresetMode.SAME_STEP), on
    ).next_segment(4)
    assert (seg.truncation_value != 0).any()
    m = seg.length - 1
    values, bootstrap = torch.randn(m, 2), torch.randn(2)
    logp = torch.log_softmax(torch.randn(m, 2, 3), -1).gather(-1, seg.actions[1:].unsqueeze(-1)).squeeze(-1)
    gamma = on.config.discount
    vs, adv = on._targets(logp, values, bootstrap, seg)
    ref_vs, ref_adv = vtrace(
        seg.behaviour_logp[1:],
        logp,
        seg.rewards[1:].clamp(-1, 1) + gamma * seg.truncation_value[1:],
        gamma * (~seg.reset[1:]).float(),
        values,
        bootstrap,
    )
    torch.testing.assert_close((vs, adv), (ref_vs, ref_adv))
    plain = off._targets(logp, values, bootstrap, seg)
    ref_plain = vtrace(
        seg.behaviour_logp[1:], logp, seg.rewards[1:].clamp(-1, 1), gamma * (~seg.reset[1:]).float(), values, bootstrap
    )
    torch.testing.assert_close(plain, ref_plain)
    assert not torch.allclose(plain[0], vs)
