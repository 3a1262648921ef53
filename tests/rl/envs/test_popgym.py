"""POPGym (optional; skipped where it is not installed): flat observations that keep the bounds of their parts, the
previous action where an env needs it, and ids that name the fix."""

from __future__ import annotations

import numpy as np
import pytest

from onlinerec.rl.envs import make_vector_env, num_actions


def test_popgym_repeat_previous():
    pytest.importorskip("popgym")
    env = make_vector_env("popgym:RepeatPreviousEasy", 2, seed=0)
    obs, _ = env.reset()
    assert obs.shape == (2, 4) and obs.dtype == np.float32
    assert env.single_action_space.n == 4 == num_actions("popgym:RepeatPreviousEasy")
    ended = False
    for _ in range(200):
        obs, r, term, trunc, info = env.step(np.zeros(2, dtype=np.int64))
        np.testing.assert_array_equal(info["episode_end"], term | trunc)
        ended |= info["episode_end"].any()
    assert ended
    with pytest.raises(ValueError, match="unknown POPGym env 'Nope'; available"):  # nothing close: no guess
        make_vector_env("popgym:Nope", 1)
    with pytest.raises(ValueError, match="did you mean 'RepeatPreviousHard'"):  # a typo names the fix
        make_vector_env("popgym:RepeatPreviousHrd", 1)
    assert num_actions("popgym:BattleshipEasy") == 64  # MultiDiscrete([8, 8]) flattened


def test_popgym_envs_that_need_the_previous_action_get_it():
    """MultiarmedBandit's observation is only "the action paid or not": which action it was comes from the previous
    action, appended one-hot as POPGym's PreviousAction does (0 after a reset), flattened after the 2 payout entries."""
    pytest.importorskip("popgym")
    env = make_vector_env("popgym:MultiarmedBanditEasy", 2, seed=0)
    obs, _ = env.reset()
    assert obs.shape == (2, 12)
    np.testing.assert_array_equal(obs[:, 2:], np.eye(10, dtype=np.float32)[[0, 0]])
    for _ in range(3):
        actions = np.array([3, 7])
        obs, *_ = env.step(actions)
        np.testing.assert_array_equal(obs[:, 2:], np.eye(10, dtype=np.float32)[actions])
        assert obs[:, :2].sum(1).tolist() == [1.0, 1.0]  # the payout one-hot is untouched
    assert make_vector_env("popgym:MultiarmedBanditEasy", 1, prev_action=False).single_observation_space.shape == (2,)
    # an env whose observation is enough keeps it as it is, unless asked
    assert make_vector_env("popgym:RepeatPreviousEasy", 1).single_observation_space.shape == (4,)
    assert make_vector_env("popgym:RepeatPreviousEasy", 1, prev_action=True).single_observation_space.shape == (8,)
    with pytest.raises(ValueError, match=r"popgym:MultiarmedBanditEasy does not take env_kwargs \['prev_actoin'\]"):
        make_vector_env("popgym:MultiarmedBanditEasy", 1, prev_actoin=False)  # a typo names itself


def test_popgym_flat_observations_keep_the_bounds_of_their_parts():
    """One-hot codes of the discrete parts are bounded to [0, 1] (``R2ACConfig.obs_norm_skip_binary`` reads that), a
    Box part keeps its own bounds, and every observation lies inside the flat space."""
    pytest.importorskip("popgym")
    bandit = make_vector_env("popgym:MultiarmedBanditEasy", 2, seed=0)  # payout one-hot + previous action one-hot
    space = bandit.single_observation_space
    assert space.low.tolist() == [0.0] * 12 and space.high.tolist() == [1.0] * 12
    cartpole = make_vector_env("popgym:PositionOnlyCartPoleEasy", 2, seed=0).single_observation_space
    np.testing.assert_allclose(cartpole.high, [4.8, 0.41887903], rtol=1e-6)
    np.testing.assert_array_equal(cartpole.low, -cartpole.high)
    obs, _ = bandit.reset()
    for _ in range(5):
        assert all(space.contains(o) for o in obs)
        obs, *_ = bandit.step(np.array([1, 4]))


def test_popgym_memory_games_observe_only_unit_bounded_features_and_control_envs_none():
    """What makes ``obs_norm_skip_binary`` exactly no normalisation on every POPGym memory game
    (``examples/configs/popgym.yaml`` rests on it) and plain ``obs_norm`` on every partially observed control env."""
    popgym = pytest.importorskip("popgym")
    control = tuple(f"{body}{level}" for body in ("CartPole", "Pendulum") for level in ("Easy", "Medium", "Hard"))
    kinds = {True: 0, False: 0}
    for cls in popgym.envs.ALL:
        space = make_vector_env(f"popgym:{cls.__name__}", 1, seed=0).single_observation_space
        unit = (space.low == 0) & (space.high == 1)
        is_control = cls.__name__.endswith(control)
        assert not unit.any() if is_control else unit.all(), cls.__name__
        kinds[is_control] += 1
    assert kinds == {True: 15, False: 33}  # 5 control tasks and 11 memory games, 3 levels each
