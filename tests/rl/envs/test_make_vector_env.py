"""``make_vector_env``: env ids and the family each names, unknown ids that list the families, a factory where an env
id goes, and vector wrappers on every family."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from onlinerec.rl import RolloutDataModule
from onlinerec.rl.envs import FAMILIES, make_vector_env, parse_env_id
from tests.rl.envs.stand_ins import Recorder


def test_unknown_id_lists_families():
    with pytest.raises(ValueError) as e:
        make_vector_env("NoSuchEnv-v0", 2)
    msg = str(e.value)
    for fam in FAMILIES.values():
        assert fam.id_format in msg
    with pytest.raises(ValueError):
        make_vector_env("atari:Pong", 2)
    with pytest.raises(ValueError, match="unknown built-in memory task"):
        make_vector_env("memory:nope", 2)


def test_unknown_env_id_lists_the_known_families():
    envs = pytest.importorskip("onlinerec.rl.envs")
    with pytest.raises(ValueError, match=r"unknown env id 'nosuch:env'.*atari: ALE/<Game>-v5.*memory: memory:tmaze"):
        envs.make_vector_env("nosuch:env", 2)
    rl = pytest.importorskip("onlinerec.rl")
    with pytest.raises(ValueError, match=r"unknown env id"):
        rl.RolloutDataModule("ALE-Pong", num_envs=2).env_spaces()


def test_parse_env_id():
    assert parse_env_id("ALE/Pong-v5") == (FAMILIES["atari"], "ALE/Pong-v5")
    assert parse_env_id("procgen:chaser") == (FAMILIES["procgen"], "chaser")
    assert parse_env_id("dmlab:rooms_watermaze") == (FAMILIES["dmlab"], "rooms_watermaze")
    assert parse_env_id("MiniGrid-MemoryS7-v0")[0] is FAMILIES["minigrid"]
    assert parse_env_id("popgym:RepeatPreviousEasy") == (FAMILIES["popgym"], "RepeatPreviousEasy")
    assert parse_env_id("memory:tmaze") == (FAMILIES["memory"], "tmaze")


def user_factory(num_envs, seed, length=3):
    """A user's own vector env in gymnasium's default NEXT_STEP mode, unseeded."""
    return SyncVectorEnv([lambda: Recorder(spaces.Discrete(2), length=length)] * num_envs)


def test_factory_id_and_callable_work_where_an_env_id_goes():
    env = make_vector_env(f"factory:{__name__}.user_factory", 2, seed=4, length=5)
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs, _ = env.reset()
    again = make_vector_env(user_factory, 2, seed=4).reset()[0]
    np.testing.assert_array_equal(obs, again)  # the adapter seeded the unseeded factory env from `seed`
    assert not np.array_equal(obs, make_vector_env(user_factory, 2, seed=5).reset()[0])
    dm = RolloutDataModule(f"factory:{__name__}.user_factory", num_envs=2, env_kwargs={"length": 2})
    assert dm.env_spaces() == ((2,), 2, 1)


def test_vector_wrappers_apply_to_every_family():
    env = make_vector_env(
        "memory:tmaze",
        2,
        seed=0,
        length=0,
        vector_wrappers=[{"class_path": "gymnasium.wrappers.vector.ClipReward", "init_args": {"max_reward": 0.5}}],
    )
    env.reset()
    _, reward, *_ = env.step(np.zeros(2, dtype=np.int64))
    assert reward.max() <= 0.5 and env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
