"""The gymnasium family (``gymnasium:<id>``): SAME_STEP autoreset, episode statistics and stream seeds on a tiny
registered env, rl-zoo's masked-velocity envs, gymnasium wrappers from class paths and from a run's config, sync and
async vectorisation, and a misspelt id that is a usage error naming the near miss."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from onlinerec.rl import RolloutDataModule
from onlinerec.rl.envs import make_vector_env, num_actions


class _Countdown(gymnasium.Env):
    """Obs = steps taken in the episode (plus 100 · episodes started); ends after `n` steps with reward 10."""

    def __init__(self, n=3):
        self.n = n
        self.observation_space = gymnasium.spaces.Box(0, 10_000, shape=(1,), dtype=np.int64)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.episodes = -1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.episodes += 1
        return np.array([100 * self.episodes], dtype=np.int64), {"seed_draw": int(self.np_random.integers(1 << 30))}

    def step(self, action):
        self.t += 1
        done = self.t == self.n
        return np.array([100 * self.episodes + self.t]), (10.0 if done else 1.0), done, False, {}


gymnasium.register("OnlinerecTest/Countdown-v0", entry_point=_Countdown)


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_gymnasium_family_same_step(vectorization):
    env = make_vector_env("gymnasium:OnlinerecTest/Countdown-v0", 2, seed=7, n=3, vectorization=vectorization)
    try:
        assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        obs, info = env.reset()
        assert info["seed_draw"][0] != info["seed_draw"][1]
        np.testing.assert_array_equal(obs[:, 0], [0, 0])
        seen = []
        for t in range(1, 7):
            obs, r, term, trunc, info = env.step(np.zeros(2, dtype=np.int64))
            seen.append(obs[0, 0])
            if t % 3 == 0:
                assert term.all() and (r == 10).all() and info["episode_end"].all()
                np.testing.assert_array_equal(obs[:, 0], 100 * (t // 3))  # first obs of the next episode
                np.testing.assert_array_equal(info["final_obs"][0], [100 * (t // 3 - 1) + 3])
                np.testing.assert_array_equal(info["episode_return"], 12.0)
                np.testing.assert_array_equal(info["episode_length"], 3)
            else:
                assert not term.any() and not info["episode_end"].any() and (r == 1).all()
        assert seen == [1, 2, 100, 101, 102, 200]
    finally:
        env.close()


def test_gymnasium_family_stream_seeds():
    from onlinerec.rl.envs import stream_seed

    a = make_vector_env("gymnasium:OnlinerecTest/Countdown-v0", 3, seed=20).reset()[1]["seed_draw"]
    b = make_vector_env("gymnasium:OnlinerecTest/Countdown-v0", 1, seed=20).reset()[1]["seed_draw"]
    c = make_vector_env("gymnasium:OnlinerecTest/Countdown-v0", 3, seed=21).reset()[1]["seed_draw"]
    assert a[0] == b[0] and len(set(a.tolist())) == 3 and not set(a.tolist()) & set(c.tolist())
    single = _Countdown()
    assert single.reset(seed=stream_seed(20, 2))[1]["seed_draw"] == a[2]  # stream i is seeded stream_seed(seed, i)


def test_a_misspelt_gymnasium_id_is_a_usage_error_that_names_the_near_miss(tmp_path, capsys):
    """gymnasium's own NameNotFound used to end `onlinerec rl` in a traceback."""
    runner = pytest.importorskip("onlinerec.rl.runner")
    envs = pytest.importorskip("onlinerec.rl.envs")
    with pytest.raises(ValueError, match=r"unknown gymnasium env 'gymnasium:CartPoleNoVel-v2'.*provides.*v1"):
        envs.make_vector_env("gymnasium:CartPoleNoVel-v2", 1)
    out = tmp_path / "run"
    assert runner.main(["--env", "gymnasium:CartPol-v1", "--total_frames", "8", "--out_dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown gymnasium env") and "CartPole" in err and "Traceback" not in err
    assert not out.exists()  # nothing written


def test_pendulum_box_actions_and_novel_observations():
    env = make_vector_env("gymnasium:PendulumNoVel-v1", 2, seed=0)
    obs, _ = env.reset()
    assert env.single_action_space == spaces.Box(-2.0, 2.0, shape=(1,), dtype=np.float32)
    for _ in range(5):
        obs, reward, *_ = env.step(np.array([[1.5], [-1.5]]))
        assert (obs[:, 2] == 0).all() and (obs[:, :2] != 0).any()  # angular velocity masked, cos/sin kept
        assert reward.shape == (2,)
    with pytest.raises(ValueError, match="no discrete action count"):
        num_actions("gymnasium:PendulumNoVel-v1")


def test_cartpole_novel_masks_rl_zoos_entries_and_keeps_the_time_limit():
    env = make_vector_env("gymnasium:CartPoleNoVel-v1", 2, seed=0)
    obs, _ = env.reset()
    assert num_actions("gymnasium:CartPoleNoVel-v1") == 2
    lengths = []
    for _ in range(600):
        obs, _, _, _, info = env.step(np.array([0, 1]) if len(lengths) % 2 else np.array([1, 0]))
        assert (obs[:, [1, 3]] == 0).all() and (obs[:, [0, 2]] != 0).all()
        lengths += info["episode_length"][info["episode_end"]].tolist()
    assert lengths and max(lengths) <= 500
    from onlinerec.rl.envs.gymnasium_envs import MaskVelocity

    inner = gymnasium.make("CartPoleNoVel-v1")
    while not isinstance(inner, MaskVelocity):  # under gymnasium's own checker wrappers
        inner = inner.env
    assert inner.indices == (1, 3)
    assert gymnasium.make("PendulumNoVel-v1").get_wrapper_attr("indices") == (2,)


def test_positions_only_mujoco_envs_zero_every_velocity():
    pytest.importorskip("mujoco")
    env = make_vector_env("gymnasium:HopperNoVel-v5", 1, seed=0)
    obs, _ = env.reset()
    for _ in range(5):
        obs, *_ = env.step(np.zeros((1, 3), dtype=np.float32))
        assert (obs[0, 5:] == 0).all() and (obs[0, :5] != 0).all()  # qvel masked; height and angles kept
    full = gymnasium.make("Hopper-v5").unwrapped
    masked = gymnasium.make("HopperNoVel-v5").get_wrapper_attr("indices")
    assert masked == tuple(range(full.data.qpos.size - 1, full.observation_space.shape[0]))  # exactly the qvel entries
    for name in ("Walker2d", "HalfCheetah"):
        full = gymnasium.make(f"{name}-v5").unwrapped
        indices = gymnasium.make(f"{name}NoVel-v5").get_wrapper_attr("indices")
        assert indices == tuple(range(full.data.qpos.size - 1, full.observation_space.shape[0]))


def test_a_missing_mujoco_names_the_extra_that_installs_a_working_one(monkeypatch):
    from onlinerec.rl.envs import MissingBackendError

    def make(name, **kwargs):
        raise gymnasium.error.DependencyNotInstalled("Could not import mujoco")

    monkeypatch.setattr(gymnasium, "make", make)
    with pytest.raises(MissingBackendError, match=r"pip install 'onlinerec\[mujoco\]'.*mujoco<4"):
        make_vector_env("gymnasium:HopperNoVel-v5", 1)
    with pytest.raises(MissingBackendError, match="needs a package that is not installed: Could not import mujoco"):
        make_vector_env("gymnasium:CartPole-v1", 1)


def test_wrappers_from_class_paths_and_init_args():
    wrappers = [
        {"class_path": "gymnasium.wrappers.TimeLimit", "init_args": {"max_episode_steps": 7}},
        "gymnasium.wrappers.FlattenObservation",
        {"class_path": "TransformReward", "init_args": {"func": lambda r: r + 1.0}},  # bare name: gymnasium.wrappers
    ]
    env = make_vector_env("gymnasium:CartPole-v1", 2, seed=0, wrappers=wrappers)
    env.reset()
    for t in range(1, 8):
        _, reward, term, trunc, info = env.step(np.array([0, 1]))
        assert (reward == 2.0).all()
        if not term.any():
            assert trunc.all() == (t == 7)
    with pytest.raises(ValueError, match="cannot import 'gymnasium.wrappers.Nope'"):
        make_vector_env("gymnasium:CartPole-v1", 1, wrappers=[{"class_path": "gymnasium.wrappers.Nope"}])
    with pytest.raises(ValueError, match="unknown keys"):
        make_vector_env("gymnasium:CartPole-v1", 1, wrappers=[{"class_path": "TimeLimit", "args": {}}])
    with pytest.raises(ValueError, match="vector_wrappers"):
        make_vector_env("memory:tmaze", 1, wrappers=["gymnasium.wrappers.FlattenObservation"])


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_gymnasium_family_vectorisation_with_wrappers(vectorization):
    env = make_vector_env(
        "gymnasium:CartPoleNoVel-v1",
        2,
        seed=0,
        vectorization=vectorization,
        wrappers=[{"class_path": "gymnasium.wrappers.TimeLimit", "init_args": {"max_episode_steps": 4}}],
    )
    try:
        env.reset()
        for _ in range(4):
            *_, info = env.step(np.zeros(2, dtype=np.int64))
        assert info["episode_end"].all() and (info["episode_length"] == 4).all()
    finally:
        env.close()


def test_experiment_config_takes_wrappers_and_a_factory(tmp_path):
    from onlinerec.rl.experiment import parse_experiment

    config = tmp_path / "run.yaml"
    config.write_text(
        "env: gymnasium:CartPoleNoVel-v1\n"
        "env_kwargs:\n"
        "  wrappers:\n"
        "    - class_path: gymnasium.wrappers.TimeLimit\n"
        "      init_args: {max_episode_steps: 50}\n"
    )
    cfg = parse_experiment(["--config", str(config)])
    dm = RolloutDataModule(cfg.env, num_envs=2, seed=cfg.seed, env_kwargs=cfg.env_kwargs)
    env = dm.make_env(2, 0)
    env.reset()
    for _ in range(50):
        *_, info = env.step(np.zeros(2, dtype=np.int64))
        if info["episode_end"].any():
            break
    assert info["episode_end"].any() and info["episode_length"].max() <= 50
