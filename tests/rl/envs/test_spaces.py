"""The spaces every family hands the agent: Box actions passed through as float32, MultiDiscrete actions flattened,
the action spaces it cannot serve refused with the reason, and Dict and Tuple observations passed through (also to
the rollout data module's ``spaces()``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from onlinerec.rl import RolloutDataModule
from onlinerec.rl.envs import action_kind, ensure_contract, make_vector_env
from tests.rl.envs.stand_ins import Recorder


def test_box_actions_pass_through_as_float32_of_the_right_shape():
    env = make_vector_env("gymnasium:OnlinerecTest/Recorder-v0", 3, seed=0)
    assert action_kind(env.single_action_space) == "continuous"
    env.reset()
    env.step([[0.5, -2.0], [0.0, 0.1], [3.0, 1.0]])  # a list of float64, out of bounds: no clipping here
    env.step(torch.zeros(3, 2, dtype=torch.float64).numpy())
    actions = [e.unwrapped.actions for e in env.env.envs]
    assert all(a[0].dtype == np.float32 and a[0].shape == (2,) for a in actions)
    np.testing.assert_allclose(actions[0][0], [0.5, -2.0])
    np.testing.assert_allclose(actions[2][0], [3.0, 1.0])


@pytest.mark.parametrize(
    "space, message",
    [
        (spaces.Tuple((spaces.Discrete(2), spaces.Box(-1, 1, (1,)))), "mixed Discrete/Box is not supported"),
        (spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Box(-1, 1, (1,))}), "mixed Discrete/Box is not supported"),
        (spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))), "Tuple action spaces are not supported"),
        (spaces.Discrete(3, start=1), "must start at 0"),
        (spaces.Box(0, 3, (2,), dtype=np.int64), "float dtype"),
    ],
)
def test_unsupported_action_spaces_are_refused(space, message):
    with pytest.raises(ValueError, match=message):
        make_vector_env("gymnasium:OnlinerecTest/Recorder-v0", 1, action_space=space)
    with pytest.raises(ValueError, match=message):
        ensure_contract(SyncVectorEnv([lambda: Recorder(space)]))


def test_multidiscrete_is_flattened():
    env = make_vector_env("gymnasium:OnlinerecTest/Recorder-v0", 2, action_space=spaces.MultiDiscrete([2, 3]))
    assert env.single_action_space == spaces.Discrete(6)
    env.reset()
    env.step(np.array([5, 1]))
    np.testing.assert_array_equal(env.env.envs[0].unwrapped.actions[0], [1, 2])


DICT_OBS = spaces.Dict(
    {
        "image": spaces.Box(0, 255, (3, 5, 5), dtype=np.uint8),
        "vector": spaces.Box(-1.0, 1.0, (4,), dtype=np.float32),
        "flag": spaces.Discrete(3),
    }
)


TUPLE_OBS = spaces.Tuple((spaces.Box(-1.0, 1.0, (2,), dtype=np.float32), spaces.Discrete(4)))


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP], ids=lambda m: m.name)
def test_dict_and_tuple_observations_pass_through(mode):
    for space in (DICT_OBS, TUPLE_OBS):
        env = ensure_contract(
            SyncVectorEnv([lambda space=space: Recorder(spaces.Discrete(2), space, length=2)] * 3, autoreset_mode=mode),
            seed=0,
        )
        obs, _ = env.reset()
        assert env.single_observation_space == space
        for _ in range(2):
            obs, _, term, _, info = env.step(np.zeros(3, dtype=np.int64))
        assert term.all()
        if space is DICT_OBS:
            assert obs["image"].shape == (3, 3, 5, 5) and obs["image"].dtype == np.uint8
            assert obs["flag"].shape == (3,) and set(info["final_obs"][0]) == {"image", "vector", "flag"}
        else:
            assert obs[0].shape == (3, 2) and obs[1].shape == (3,) and len(info["final_obs"][0]) == 2


def test_dict_observations_through_the_rollout_datamodule_spaces():
    dm = RolloutDataModule(
        "gymnasium:OnlinerecTest/Recorder-v0",
        num_envs=2,
        env_kwargs={"action_space": spaces.Discrete(2), "observation_space": DICT_OBS},
    )
    obs_space, act_space, repeat = dm.spaces()
    assert obs_space == DICT_OBS and act_space == spaces.Discrete(2) and repeat == 1
    with pytest.raises(ValueError, match="use spaces()"):
        dm.env_spaces()
