"""DMLab, run against a stand-in module that follows the documented ``deepmind_lab.Lab`` API (the real engine is never
run here): the install hint when it is missing, and the adapter's levels, config, per-stream seeds, action repeat and
episode ends."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from onlinerec.rl.envs import MissingBackendError, make_vector_env, num_actions
from tests.rl.envs.stand_ins import FakeLab


@pytest.fixture
def fake_dmlab(monkeypatch):
    mod = types.ModuleType("deepmind_lab")
    mod.Lab = FakeLab
    FakeLab.instances = []
    monkeypatch.setitem(sys.modules, "deepmind_lab", mod)
    return mod


def test_dmlab_missing_module_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepmind_lab", None)  # makes `import deepmind_lab` raise ImportError
    with pytest.raises(MissingBackendError, match="Bazel") as e:
        make_vector_env("dmlab:rooms_watermaze", 2)
    assert isinstance(e.value, ImportError)
    assert num_actions("dmlab:rooms_watermaze") == 9  # known without the engine


def test_dmlab_adapter_with_stand_in(fake_dmlab):
    from onlinerec.rl.envs.dmlab import DMLAB_ACTIONS

    n, frames = 2, 10  # episodes of 10 frames: steps of 4, 4, then 2 frames (ends inside the repeat)
    env = make_vector_env("dmlab:rooms_watermaze", n, seed=4, vectorization="sync", config={"episodeFrames": frames})
    assert env.single_action_space.n == 9 and env.single_observation_space.shape == (3, 72, 96)
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP and env.metadata["frames_per_step"] == 4
    obs, info = env.reset()
    labs = FakeLab.instances
    assert [lab.level for lab in labs] == ["contributed/dmlab30/rooms_watermaze"] * n
    assert labs[0].config["width"] == "96" and labs[0].config["height"] == "72" and labs[0].config["logLevel"] == "WARN"
    assert obs.shape == (n, 3, 72, 96) and obs.dtype == np.uint8
    # per-stream seeds: stream i draws its level seeds from RandomState(stream_seed(seed, i))
    from onlinerec.rl.envs import stream_seed

    for i, lab in enumerate(labs):
        assert lab.seeds[0] == np.random.RandomState(stream_seed(4, i)).randint(2**31 - 1)
    assert labs[0].seeds[0] != labs[1].seeds[0]
    np.testing.assert_array_equal(obs[:, 0, 0, 0], [FakeLab.pixel(lab.seeds[0], 0) for lab in labs])

    # step 1: action 0 (forward) repeated 4 times, reward summed, frame = max of frames 3 and 4
    obs, r, term, trunc, info = env.step(np.array([0, 8]))
    np.testing.assert_array_equal(r, [8.0, 4.0])
    assert len(labs[0].actions) == 4 and all((a == DMLAB_ACTIONS[0]).all() for a in labs[0].actions)
    assert (labs[1].actions[0] == DMLAB_ACTIONS[8]).all()
    for i, lab in enumerate(labs):
        s = lab.seeds[0]
        assert obs[i, 0, 0, 0] == max(FakeLab.pixel(s, 3), FakeLab.pixel(s, 4))
        assert obs[i, 1, 0, 0] == 4
    assert not term.any()
    env.step(np.array([1, 1]))  # frames 5..8, backward: reward 1 + (-1) = 0 per frame
    # step 3: the episode ends after 2 of 4 frames -> terminated, the new episode's first frame, a new level seed
    obs, r, term, trunc, info = env.step(np.array([2, 2]))
    np.testing.assert_array_equal(r, [2.0, 2.0])
    assert term.all() and info["episode_end"].all()
    np.testing.assert_array_equal(info["episode_return"], [8 + 0 + 2, 4 + 0 + 2])
    np.testing.assert_array_equal(info["episode_length"], 3)
    for i, lab in enumerate(labs):
        rs = np.random.RandomState(stream_seed(4, i))
        expected = [rs.randint(2**31 - 1) for _ in range(2)]
        assert lab.seeds == expected
        assert obs[i, 0, 0, 0] == FakeLab.pixel(expected[1], 0) and obs[i, 1, 0, 0] == 0
    env.close()
