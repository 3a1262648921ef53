"""Observations that R2AC's obs_norm cannot read as they are get advice that works when followed: flatten them with
gymnasium's FlattenObservation through the env's ``wrappers`` (a factory wraps its streams' envs itself)."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from onlinerec.rl.envs import make_vector_env
from tests.helpers import TINY_RL

FLATTEN = "{wrappers: [{class_path: gymnasium.wrappers.FlattenObservation}]}"


class RowObs(gymnasium.Env):
    """A third-party env whose vector observations come as one row: shape (1, 3)."""

    observation_space = spaces.Box(-1.0, 1.0, shape=(1, 3), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def _obs(self):
        return self.np_random.uniform(-1, 1, size=(1, 3)).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action == 0), self.t >= 5, False, {}


if "OnlinerecRowObs-v0" not in gymnasium.registry:
    gymnasium.register("OnlinerecRowObs-v0", entry_point=RowObs)


def row_factory(num_envs: int, seed: int):
    return SyncVectorEnv([RowObs for _ in range(num_envs)])


def flat_row_factory(num_envs: int, seed: int):
    return SyncVectorEnv([lambda: gymnasium.wrappers.FlattenObservation(RowObs()) for _ in range(num_envs)])


def experiment(tmp_path, *extra: str):
    from onlinerec.rl.runner import parse_experiment

    return parse_experiment(
        ["--env", "gymnasium:OnlinerecRowObs-v0", "--r2ac.obs_norm", "true", "--stem", "mlp", *TINY_RL,
         "--total_frames", "16", "--eval_episodes", "1", "--eval_envs", "1", "--out_dir", str(tmp_path / "run"),
         *extra]
    )  # fmt: skip


def test_obs_norm_on_row_observations_names_flattening_through_wrappers(tmp_path):
    from onlinerec.rl.runner import build

    with pytest.raises(ValueError) as info:
        build(experiment(tmp_path))
    message = str(info.value)
    assert "observations of shape (1, 3)" in message
    assert f"env_kwargs: {FLATTEN}" in message


def test_the_flattening_advice_followed_trains(tmp_path):
    from onlinerec.rl.runner import run_experiment

    result = run_experiment(experiment(tmp_path, "--env_kwargs", FLATTEN))
    assert result["eval"]["returns"]  # trained and evaluated on the flattened observations


def test_per_stream_normalisation_advice_works():
    env = make_vector_env(
        "gymnasium:OnlinerecRowObs-v0",
        2,
        seed=0,
        wrappers=[{"class_path": "gymnasium.wrappers.FlattenObservation"}, "gymnasium.wrappers.NormalizeObservation"],
    )
    obs, _ = env.reset()
    assert obs.shape == (2, 3)
    env.close()


@pytest.mark.parametrize("env_id", [row_factory, f"factory:{__name__}.row_factory"], ids=["callable", "factory_id"])
def test_wrappers_for_a_factory_say_to_wrap_inside_it(env_id):
    with pytest.raises(ValueError) as info:
        make_vector_env(env_id, 2, seed=0, wrappers=[{"class_path": "gymnasium.wrappers.FlattenObservation"}])
    message = str(info.value)
    assert "wrap each stream's env inside the factory" in message
    assert "gymnasium.wrappers.FlattenObservation(MyEnv())" in message and "vector_wrappers=" in message


def test_both_ways_the_factory_message_names_work():
    env = make_vector_env(f"factory:{__name__}.flat_row_factory", 2, seed=0)  # wrapped inside the factory
    assert env.reset()[0].shape == (2, 3)
    env.close()
    clip = {"class_path": "gymnasium.wrappers.vector.ClipReward", "init_args": {"min_reward": 0.0, "max_reward": 0.5}}
    env = make_vector_env(row_factory, 2, seed=0, vector_wrappers=[clip])
    env.reset()
    _, reward, *_ = env.step(np.zeros(2, dtype=np.int64))
    assert reward.tolist() == [0.5, 0.5]
    env.close()
