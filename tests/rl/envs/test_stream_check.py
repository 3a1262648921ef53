"""A factory whose streams ignore their seed is noticed at the start (a warning, once); envs whose streams differ,
also those with a constant first observation, are not; and the check changes nothing in a seeded run."""

from __future__ import annotations

import random
import warnings

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from onlinerec.rl.envs import checks, make_vector_env

MESSAGE = r"streams most likely ignore the seed they are given"


class Cue(gymnasium.Env):
    """A memory task: a random cue, then blanks. ``fixed_rng``: draws from its own generator with a fixed seed and
    ignores the seed reset gives it (the mistake); else from gymnasium's ``self.np_random``. ``cue_at``: the step
    that shows the cue (0: the first observation)."""

    observation_space = spaces.Box(0.0, 1.0, shape=(3,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, fixed_rng: bool = False, cue_at: int = 0):
        self.fixed = np.random.default_rng(0) if fixed_rng else None
        self.cue_at = cue_at

    def _obs(self):
        obs = np.zeros(3, dtype=np.float32)
        if self.t == self.cue_at:
            obs[self.cue] = 1.0
        obs[2] = float(self.t == 3)
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.fixed if self.fixed is not None else self.np_random
        self.t, self.cue = 0, int(rng.integers(2))
        return self._obs(), {}

    def step(self, action):
        if self.t == 3:
            return self._obs(), float(action == self.cue), True, False, {}
        self.t += 1
        return self._obs(), 0.0, False, False, {}


class LastAction(gymnasium.Env):
    """No randomness: the first observation is always zero, then the action just taken (one-hot)."""

    observation_space = spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        return np.eye(2, dtype=np.float32)[int(action)], 0.0, False, False, {}


def ignoring_seed(num_envs: int, seed: int):
    return SyncVectorEnv([lambda: Cue(fixed_rng=True) for _ in range(num_envs)])


def seeded(num_envs: int, seed: int):
    return SyncVectorEnv([Cue for _ in range(num_envs)])


def late_cue(num_envs: int, seed: int):
    return SyncVectorEnv([lambda: Cue(cue_at=2) for _ in range(num_envs)])


def last_action(num_envs: int, seed: int):
    return SyncVectorEnv([LastAction for _ in range(num_envs)])


def global_rng(num_envs: int, seed: int):
    """A factory that draws from numpy's global generator while it builds the env (a delay per stream)."""
    delays = np.random.randint(2, 4, size=num_envs)
    envs = [lambda d=d: gymnasium.wrappers.TimeLimit(Cue(), max_episode_steps=int(d)) for d in delays]
    return SyncVectorEnv(envs)


@pytest.fixture(autouse=True)
def fresh_checks(monkeypatch):
    monkeypatch.setattr(checks, "_CHECKED", set())


@pytest.mark.parametrize("env_id", [ignoring_seed, f"factory:{__name__}.ignoring_seed"], ids=["callable", "factory_id"])
def test_streams_that_ignore_their_seed_are_noticed_once(env_id):
    with pytest.warns(UserWarning, match=MESSAGE) as record:
        make_vector_env(env_id, 4, seed=0).close()
    message = str(next(w.message for w in record if "ignore the seed" in str(w.message)))
    assert "stream_seed(seed, i)" in message and "self.np_random" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_vector_env(env_id, 4, seed=1).close()  # once per factory


@pytest.mark.parametrize("factory", [seeded, late_cue, last_action], ids=["seeded", "constant_start", "no_randomness"])
def test_streams_that_differ_are_not_flagged(factory):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_vector_env(factory, 4, seed=0).close()


def test_the_fix_the_warning_names_works():
    def fixed(num_envs: int, seed: int):  # each stream's env gets a seed of its own from the factory's seed
        from onlinerec.rl.envs import stream_seed

        class Seeded(Cue):
            def __init__(self, i):
                super().__init__()
                self.fixed = np.random.default_rng(stream_seed(seed, i))

        return SyncVectorEnv([lambda i=i: Seeded(i) for i in range(num_envs)])

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_vector_env(fixed, 4, seed=0).close()


def rollout(env_id, steps: int = 12):
    """Observations and rewards of a short rollout with fixed actions, and the global generators' next draws."""
    env = make_vector_env(env_id, 3, seed=5)
    obs, _ = env.reset()
    seen = [obs]
    for t in range(steps):
        obs, reward, *_ = env.step(np.full(3, t % 2, dtype=np.int64))
        seen += [obs, reward]
    env.close()
    return np.concatenate([np.ravel(x) for x in seen]), (random.random(), np.random.rand(), torch.rand(1).item())  # noqa: S311


@pytest.mark.parametrize("factory", [global_rng, ignoring_seed], ids=["global_rng", "ignoring_seed"])
def test_the_check_changes_nothing_in_a_seeded_run(monkeypatch, factory):
    def seeded_rollout():
        random.seed(3)
        np.random.seed(3)
        torch.manual_seed(3)
        return rollout(factory)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setattr(checks, "_CHECKED", set())
        checked = seeded_rollout()
        monkeypatch.setattr(checks, "warn_if_streams_identical", lambda *a, **k: False)
        unchecked = seeded_rollout()
    np.testing.assert_array_equal(checked[0], unchecked[0])
    assert checked[1] == unchecked[1]


def test_one_stream_is_not_checked(monkeypatch):
    calls = []
    monkeypatch.setattr(checks, "_identical_streams", lambda *a: calls.append(a))
    make_vector_env(ignoring_seed, 1, seed=0).close()
    assert not calls
