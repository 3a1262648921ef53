"""The env layer for the problems users bring: Box actions, Dict/Tuple observations, gymnasium wrappers from the
config, a factory where an env id goes, rl-zoo's masked-velocity envs, and Atari's FIRE after a lost life."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from onlinerec.rl import RolloutDataModule
from onlinerec.rl.envs import action_kind, ensure_contract, make_vector_env, num_actions
from onlinerec.rl.envs import spaces as env_spaces
from onlinerec.rl.spaces import check_agent_fits_env


class Recorder(gym.Env):
    """Records the actions it is given; observation space and action space chosen by the test."""

    def __init__(self, action_space=None, observation_space=None, length=3):
        self.action_space = action_space or spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.observation_space = observation_space or spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.length = length
        self.actions = []

    def _obs(self):
        self.observation_space.seed(int(self.np_random.integers(2**31)))  # observations follow the env's seed
        return self.observation_space.sample()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.actions.append(action)
        self.t += 1
        return self._obs(), 0.0, self.t >= self.length, False, {}


gym.register("OnlinerecTest/Recorder-v0", entry_point=Recorder)


# --------------------------------------------------------------------------------------------------------------
# action spaces
# --------------------------------------------------------------------------------------------------------------
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

    inner = gym.make("CartPoleNoVel-v1")
    while not isinstance(inner, MaskVelocity):  # under gymnasium's own checker wrappers
        inner = inner.env
    assert inner.indices == (1, 3)
    assert gym.make("PendulumNoVel-v1").get_wrapper_attr("indices") == (2,)


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


# --------------------------------------------------------------------------------------------------------------
# observation spaces
# --------------------------------------------------------------------------------------------------------------
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


def test_minigrid_dict_observation():
    pytest.importorskip("minigrid")
    env = make_vector_env("MiniGrid-MemoryS7-v0", 2, seed=0, dict_obs=True)
    obs, _ = env.reset()
    assert env.single_observation_space["direction"] == spaces.Discrete(4)
    assert obs["image"].shape == (2, 3, 7, 7) and obs["direction"].shape == (2,)
    obs, *_ = env.step(np.array([0, 1]))  # turn left / right: the direction changes
    assert obs["direction"].dtype.kind == "i"
    env.close()


# --------------------------------------------------------------------------------------------------------------
# wrappers from the config, factories, vectorisation
# --------------------------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------------------------
# Atari: FIRE after a lost life (torchbeast) and the backends
# --------------------------------------------------------------------------------------------------------------
def test_atari_fire_on_life_loss_serves_the_ball_again():
    """Breakout with an agent that never presses FIRE: with fire_on_life_loss the env serves after each lost life
    (the game ends after 5 lives), without it the game stalls after the first."""
    pytest.importorskip("ale_py")
    for fire, lost_lives in ((True, 4), (False, 1)):
        env = make_vector_env("ALE/Breakout-v5", 1, seed=0, fire_on_life_loss=fire, backend="torchbeast")
        env.reset()
        lost, ended = 0, False
        for _ in range(1500):
            obs, _, term, _, info = env.step(np.zeros(1, dtype=np.int64))
            lost += int(info["life_lost"][0])
            assert term[0] == (info["life_lost"][0] or info["episode_end"][0])
            if info["episode_end"][0]:
                ended = True
                break
        assert lost == lost_lives and ended == fire
        env.close()


def test_atari_backend_choice():
    pytest.importorskip("ale_py")
    from onlinerec.rl.envs.atari import AtariEpisodicLife, atari_has_fire

    assert atari_has_fire("ALE/Breakout-v5") and not atari_has_fire("ALE/MsPacman-v5")
    assert not isinstance(make_vector_env("ALE/Breakout-v5", 1), AtariEpisodicLife)  # auto: torchbeast's stack
    assert isinstance(make_vector_env("ALE/MsPacman-v5", 1), AtariEpisodicLife)  # no FIRE: the native env
    assert isinstance(make_vector_env("ALE/Breakout-v5", 1, fire_on_life_loss=False), AtariEpisodicLife)
    with pytest.raises(ValueError, match="fire_on_life_loss=True.*backend='torchbeast'"):
        make_vector_env("ALE/Breakout-v5", 1, backend="native")
    with pytest.raises(ValueError, match="backend must be one of"):
        make_vector_env("ALE/Breakout-v5", 1, backend="envpool")


def test_atari_torchbeast_stack_refills_the_frame_stack_after_a_lost_life():
    pytest.importorskip("ale_py")
    env = make_vector_env("ALE/Breakout-v5", 1, seed=0, backend="torchbeast")
    env.reset()
    for _ in range(1500):
        obs, _, _, _, info = env.step(np.zeros(1, dtype=np.int64))
        if info["life_lost"][0]:
            stack = obs[0]
            assert all(np.array_equal(stack[0], frame) for frame in stack)  # 4 copies of the new life's frame
            break
    else:
        pytest.fail("no life lost")
    assert env_spaces("ALE/Breakout-v5")[0].shape == (4, 84, 84)


@pytest.mark.parametrize("max_frames", [108_000, 300], ids=["game-overs", "truncations"])
def test_atari_frames_driving_the_emulator_equals_the_gymnasium_steps(max_frames, monkeypatch):
    """AtariFrames' direct ``ale.act`` loop gives the same screens, rewards, flags and info as stepping ale-py's env
    frame by frame through gymnasium, across lost lives, game overs and (300 frames) truncations."""
    pytest.importorskip("ale_py")
    from onlinerec.rl.envs.atari import AtariFrames

    calls = []
    ale_frame = AtariFrames._ale_frame

    def counted(self, action):
        calls.append(1)
        return ale_frame(self, action)

    monkeypatch.setattr(AtariFrames, "_ale_frame", counted)

    def run(direct: bool) -> list:
        monkeypatch.setattr(AtariFrames, "_direct", AtariFrames._direct if direct else (lambda self: False))
        env = make_vector_env("ALE/Breakout-v5", 2, seed=3, backend="torchbeast", max_episode_frames=max_frames)
        rng = np.random.default_rng(0)
        steps = [env.reset()[0]]
        for _ in range(700):
            obs, reward, term, trunc, info = env.step(rng.integers(0, 4, size=2))
            keys = ("lives", "episode_frame_number", "frame_number", "life_lost", "episode_end", "episode_return")
            steps.append((obs, reward, term, trunc, {k: np.asarray(info[k]).copy() for k in keys}))
        env.close()
        return steps

    direct = run(True)
    taken = len(calls)
    assert taken >= 1400  # the direct loop ran: make_atari's env qualifies
    wrapped = run(False)
    assert len(calls) == taken  # and the other run did not take it
    ends = sum(int(s[4]["episode_end"].sum()) + int(s[3].sum()) for s in wrapped[1:])
    assert ends >= 2  # episodes ended in both runs (game overs, or truncations)
    assert np.array_equal(direct[0], wrapped[0])
    for t, (a, b) in enumerate(zip(direct[1:], wrapped[1:])):
        for x, y in zip(a[:4], b[:4]):
            assert np.array_equal(x, y), t
        for k in a[4]:
            assert np.array_equal(a[4][k], b[4][k]), (t, k)
