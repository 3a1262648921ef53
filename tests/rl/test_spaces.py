"""``check_agent_fits_env``: an agent is checked against the env it acts in, from its ``action_space``,
``num_actions`` or ``action_dim``, and a mismatch names both sides."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

import tests.rl.envs.stand_ins  # noqa: F401  (registers OnlinerecTest/Recorder-v0)
from onlinerec.rl.envs import make_vector_env
from onlinerec.rl.spaces import check_agent_fits_env


class _Agent:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


def test_check_agent_fits_env_reads_action_space_num_actions_or_action_dim():
    box = make_vector_env("gymnasium:OnlinerecTest/Recorder-v0", 1)
    check_agent_fits_env(_Agent(action_dim=2, obs_shape=(2,)), box)
    check_agent_fits_env(_Agent(action_space=spaces.Box(-1.0, 1.0, (2,), np.float32)), box)
    with pytest.raises(ValueError, match="continuous actions"):
        check_agent_fits_env(_Agent(num_actions=2), box)
    with pytest.raises(ValueError, match="action_dim = 3"):
        check_agent_fits_env(_Agent(action_dim=3), box)
    with pytest.raises(ValueError, match="acts in"):
        check_agent_fits_env(_Agent(action_space=spaces.Box(-2.0, 2.0, (2,), np.float32)), box)
    tmaze = make_vector_env("memory:tmaze", 1)
    check_agent_fits_env(_Agent(num_actions=2, action_space=spaces.Discrete(2)), tmaze)
    with pytest.raises(ValueError, match="Gaussian policy"):
        check_agent_fits_env(_Agent(action_dim=1), tmaze)
    with pytest.raises(ValueError, match="num_actions = 3"):
        check_agent_fits_env(_Agent(num_actions=3), tmaze)
