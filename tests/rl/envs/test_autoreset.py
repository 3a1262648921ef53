"""A user's gymnasium vector env in any autoreset mode (NEXT_STEP is gymnasium's default) is adapted to the SAME_STEP
contract — or refused with an error naming the mode and the fix — directly, through the rollout data module, in an
R2AC fit and in R2AC's evaluation."""

from __future__ import annotations

import gymnasium as gym
import lightning as L
import numpy as np
import pytest
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from onlinerec import RTRLStrategy
from onlinerec.rl import R2AC, RolloutDataModule, RolloutStream
from onlinerec.rl.envs import ensure_contract, make_vector_env
from onlinerec.rl.evaluation import evaluate

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


class Countdown(gym.Env):
    """Episodes of ``n`` steps; obs = [step in the episode, episodes started, 1]; reward 1 per step, ``n`` at the
    last one (an episode's return is 2n - 1); ``info["episode_id"]`` = episodes started."""

    def __init__(self, n: int = 3):
        self.n = n
        self.observation_space = gym.spaces.Box(0, 1e6, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.episode = -1
        self.t = 0

    def _obs(self):
        return np.array([self.t, self.episode, 1], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.episode = 0, self.episode + 1
        return self._obs(), {"episode_id": self.episode}

    def step(self, action):
        self.t += 1
        done = self.t >= self.n
        return self._obs(), float(self.n if done else 1), done, False, {"episode_id": self.episode}


LENGTHS = (3, 4)


def user_env(mode, vectorization="sync", lengths=LENGTHS, **kw):
    fns = [lambda n=n: Countdown(n) for n in lengths]
    if vectorization == "sync":
        return SyncVectorEnv(fns, autoreset_mode=mode, **kw)
    return AsyncVectorEnv(fns, autoreset_mode=mode, **kw)


@pytest.mark.parametrize("vectorization", ["sync", "async"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_every_mode_is_adapted_to_same_step(mode, vectorization):
    env = ensure_contract(user_env(mode, vectorization), seed=0)
    try:
        assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        obs, _ = env.reset()
        np.testing.assert_array_equal(obs[:, :2], [[0, 0], [0, 0]])
        t = np.zeros(2, dtype=int)
        episode = np.zeros(2, dtype=int)
        n = np.array(LENGTHS)
        for _ in range(13):
            obs, reward, terminated, truncated, info = env.step(np.zeros(2, dtype=np.int64))
            t += 1
            done = t == n
            np.testing.assert_array_equal(terminated, done)
            np.testing.assert_array_equal(reward, np.where(done, n, 1))  # the old episode's last reward
            np.testing.assert_array_equal(info["episode_end"], done)
            np.testing.assert_array_equal(info["episode_length"], np.where(done, n, 0))
            np.testing.assert_array_equal(info["episode_return"], np.where(done, 2 * n - 1, 0))
            for i in np.flatnonzero(done):  # the terminal observation is kept, the new episode starts now
                np.testing.assert_array_equal(info["final_obs"][i][:2], [n[i], episode[i]])
            t[done] = 0
            episode[done] += 1
            np.testing.assert_array_equal(obs[:, 0], t)  # no bogus extra transition after an episode end
            np.testing.assert_array_equal(obs[:, 1], episode)
            np.testing.assert_array_equal(info["episode_id"], episode)  # the new episode's info where reset
    finally:
        env.close()


def test_async_next_step_without_shared_memory_is_refused():
    # gymnasium 1.x's worker keeps its pending autoreset after a masked reset when shared_memory=False
    env = user_env(AutoresetMode.NEXT_STEP, "async", shared_memory=False)
    try:
        with pytest.raises(ValueError, match="NEXT_STEP.*SAME_STEP"):
            ensure_contract(env)
    finally:
        env.close()
    ok = ensure_contract(user_env(AutoresetMode.SAME_STEP, "async", shared_memory=False))
    ok.close()


class NoMaskedReset(SyncVectorEnv):
    """A NEXT_STEP vector env that can only reset all streams at once."""

    def reset(self, *, seed=None, options=None):
        if options and "reset_mask" in options:
            raise TypeError("reset_mask is not supported")
        return super().reset(seed=seed, options=options)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED], ids=lambda m: m.name)
def test_env_that_cannot_reset_single_streams_is_refused_with_the_fix(mode):
    env = ensure_contract(NoMaskedReset([lambda: Countdown(2)] * 2, autoreset_mode=mode))
    env.reset()
    env.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError, match=f"{mode.name} mode.*reset_mask.*AutoresetMode.SAME_STEP"):
        env.step(np.zeros(2, dtype=np.int64))


class ScriptedAgent:
    device = torch.device("cpu")

    def act(self, obs, reward, reset, *, greedy=False, stream="act"):
        b = obs.shape[0]
        return torch.zeros(b, dtype=torch.int64), torch.zeros(b, 2)


@pytest.mark.parametrize("vectorization", ["sync", "async"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_rollout_datamodule_marks_resets_where_user_episodes_start(mode, vectorization):
    dm = RolloutDataModule(lambda n, seed: user_env(mode, vectorization, lengths=(3, 4, 5)[:n]), num_envs=3)
    stream = RolloutStream(dm.make_env(3, 0), ScriptedAgent())
    try:
        segments = [stream.next_segment(4) for _ in range(6)]
    finally:
        stream.close()
    obs = torch.cat([s.inputs[1:] for s in segments])  # entries 1..M of each segment: the whole stream once
    reset = torch.cat([s.reset[1:] for s in segments])
    rewards = torch.cat([s.rewards[1:] for s in segments])
    assert torch.equal(reset, obs[..., 0] == 0)  # reset exactly where an episode's first observation is
    assert torch.equal(obs[1:, :, 0][~reset[1:]], obs[:-1, :, 0][~reset[1:]] + 1)  # steps inside an episode
    n = torch.tensor([3.0, 4.0, 5.0])
    assert torch.equal(rewards, torch.where(reset, n.expand_as(rewards), torch.ones_like(rewards)))
    ends = torch.cat([s.episode_end[1:] for s in segments])
    assert torch.equal(ends, reset)
    lengths = torch.cat([s.episode_length[1:] for s in segments])[ends]
    assert set(lengths.tolist()) <= {3, 4, 5}


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_r2ac_trains_and_evaluates_on_a_user_vector_env(mode):
    torch.manual_seed(0)
    model = R2AC(2, (3,), cell="elstm", hidden_size=8, stem="mlp", fc_size=8)
    dm = RolloutDataModule(lambda num_envs, seed: user_env(mode, lengths=[3] * num_envs), num_envs=2)
    trainer = L.Trainer(
        strategy=RTRLStrategy(M=4),
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, dm)
    assert dm.frames == 3 * 4 * 2
    result = evaluate(model, user_env(mode), num_episodes=6)  # a raw user env: evaluate adapts it too
    assert sorted(result["lengths"]) == [3, 3, 3, 4, 4, 4]
    assert sorted(result["returns"]) == [5.0] * 3 + [7.0] * 3  # 2n - 1: no reward lost or invented at the resets
    result = model.evaluate(make_vector_env(lambda n, s: user_env(mode), 2, seed=1), num_episodes=4)
    assert sorted(result["returns"]) == [5.0, 5.0, 7.0, 7.0]
