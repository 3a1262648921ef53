"""MiniGrid memory rooms (optional; skipped where it is not installed): the partial view, pixels, the dict
observation with the agent's direction, and a misspelt id that names the near miss."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from onlinerec.rl.envs import make_vector_env


def test_minigrid_memory():
    pytest.importorskip("minigrid")
    env = make_vector_env("MiniGrid-MemoryS7-v0", 2, seed=0)
    obs, _ = env.reset()
    assert obs.shape == (2, 3, 7, 7) and obs.dtype == np.uint8
    assert env.single_action_space.n == 7
    obs, *_ = env.step(np.zeros(2, dtype=np.int64))
    env = make_vector_env("minigrid:MiniGrid-MemoryS7-v0", 1, seed=0, pixels=True)
    assert env.reset()[0].shape == (1, 3, 56, 56)
    with pytest.raises(ValueError, match="did you mean 'MiniGrid-MemoryS7-v0'"):
        make_vector_env("minigrid:MiniGrid-MemoryS7-v9", 1)


def test_minigrid_dict_observation():
    pytest.importorskip("minigrid")
    env = make_vector_env("MiniGrid-MemoryS7-v0", 2, seed=0, dict_obs=True)
    obs, _ = env.reset()
    assert env.single_observation_space["direction"] == spaces.Discrete(4)
    assert obs["image"].shape == (2, 3, 7, 7) and obs["direction"].shape == (2,)
    obs, *_ = env.step(np.array([0, 1]))  # turn left / right: the direction changes
    assert obs["direction"].dtype.kind == "i"
    env.close()
