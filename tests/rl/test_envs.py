"""Env adapters (onlinerec.rl.envs): the SAME_STEP contract, episode statistics, seeds, shapes and errors.

The built-in T-maze and a tiny registered gymnasium env test the semantics deterministically; Atari is tested
with ale-py (a core test dependency); ProcGen, POPGym and MiniGrid skip when not installed; DMLab runs against a
stand-in module that follows the documented ``deepmind_lab.Lab`` API (the real engine is never run here).
"""

from __future__ import annotations

import sys
import types

import gymnasium
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from onlinerec.rl.envs import FAMILIES, MissingBackendError, make_vector_env, num_actions, parse_env_id


def _done(term, trunc):
    return np.logical_or(term, trunc)


# --------------------------------------------------------------------------------------------------------------
# registry and errors
# --------------------------------------------------------------------------------------------------------------
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


def test_parse_env_id():
    assert parse_env_id("ALE/Pong-v5") == (FAMILIES["atari"], "ALE/Pong-v5")
    assert parse_env_id("procgen:chaser") == (FAMILIES["procgen"], "chaser")
    assert parse_env_id("dmlab:rooms_watermaze") == (FAMILIES["dmlab"], "rooms_watermaze")
    assert parse_env_id("MiniGrid-MemoryS7-v0")[0] is FAMILIES["minigrid"]
    assert parse_env_id("popgym:RepeatPreviousEasy") == (FAMILIES["popgym"], "RepeatPreviousEasy")
    assert parse_env_id("memory:tmaze") == (FAMILIES["memory"], "tmaze")


def test_invalid_procgen_mode_rejected_before_creation():
    # No procgen needed: the (game, mode) pair is checked before the backend is imported (procgen would abort).
    from onlinerec.rl.envs.procgen import check_procgen_mode

    with pytest.raises(ValueError, match="no 'memory' mode"):
        make_vector_env("procgen:chaser", 2, distribution_mode="memory")
    with pytest.raises(ValueError, match="no 'extreme' mode"):
        check_procgen_mode("maze", "extreme")
    with pytest.raises(ValueError, match="unknown ProcGen game"):
        check_procgen_mode("pacman", "hard")
    with pytest.raises(ValueError, match="unknown ProcGen distribution_mode"):
        check_procgen_mode("chaser", "nightmare")
    check_procgen_mode("maze", "memory")
    check_procgen_mode("chaser", "hard")


# --------------------------------------------------------------------------------------------------------------
# built-in T-maze: deterministic checks of the contract
# --------------------------------------------------------------------------------------------------------------
def test_tmaze_shapes_and_metadata():
    env = make_vector_env("memory:tmaze", 3, seed=0, length=5, num_cues=3)
    obs, info = env.reset()
    assert obs.shape == (3, 5) and obs.dtype == np.uint8
    assert env.single_observation_space.shape == (5,)
    assert env.single_action_space.n == 3 == num_actions("memory:tmaze", num_cues=3)
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert env.metadata["frames_per_step"] == 1
    np.testing.assert_array_equal(obs[np.arange(3), info["cue"]], 1)


def test_tmaze_same_step_autoreset():
    L = 3
    env = make_vector_env("memory:tmaze", 4, seed=1, length=L)
    obs, info = env.reset()
    cue = info["cue"].copy()
    for t in range(L):  # cue, corridor, corridor; then the junction is shown
        obs, r, term, trunc, info = env.step(np.zeros(4, dtype=np.int64))
        assert not _done(term, trunc).any() and (r == 0).all()
        assert (obs[:, :2] == 0).all()
        assert (obs[:, 2] == (t + 1 < L)).all() and (obs[:, 3] == (t + 1 == L)).all()
    # the choice: streams 0, 1 right, 2, 3 wrong
    act = cue.copy()
    act[2:] = 1 - cue[2:]
    obs, r, term, trunc, info = env.step(act)
    np.testing.assert_array_equal(r, [1, 1, 0, 0])  # the old episode's last reward
    assert term.all() and not trunc.any()  # flagged on the step that ended it
    new_cue = info["cue"]
    np.testing.assert_array_equal(obs[np.arange(4), new_cue], 1)  # obs is already the next episode's first
    assert (obs[:, 2:] == 0).all()
    assert info["episode_end"].all()
    np.testing.assert_array_equal(info["episode_return"], [1, 1, 0, 0])
    np.testing.assert_array_equal(info["episode_length"], L + 1)
    obs, r, term, trunc, info = env.step(act)
    assert not term.any() and not info["episode_end"].any()


def test_tmaze_memory_policy_solves_it_and_random_does_not():
    L, n = 7, 16
    env = make_vector_env("memory:tmaze", n, seed=3, length=L)
    obs, info = env.reset()
    remembered = info["cue"].copy()
    rets = []
    for _ in range(10 * (L + 1)):
        obs, r, term, trunc, info = env.step(remembered)
        rets += list(info["episode_return"][info["episode_end"]])
        start = obs[:, :2].any(1)
        remembered[start] = obs[start, :2].argmax(1)
    assert len(rets) == 10 * n and np.all(np.asarray(rets) == 1.0)
    env = make_vector_env("memory:tmaze", n, seed=3, length=L)
    env.reset()
    rng = np.random.default_rng(0)
    rets = []
    for _ in range(20 * (L + 1)):
        *_, info = env.step(rng.integers(2, size=n))
        rets += list(info["episode_return"][info["episode_end"]])
    assert 0.35 < np.mean(rets) < 0.65


def test_tmaze_episodic_life_statistics():
    """Trials are 'lives': each sets terminated (resets the RNN), but statistics cover the whole game."""
    L, trials = 2, 3
    for episodic_life in (True, False):
        env = make_vector_env("memory:tmaze", 2, seed=5, length=L, trials=trials, episodic_life=episodic_life)
        obs, info = env.reset()
        cue = info["cue"].copy()
        act = np.zeros(2, dtype=np.int64)
        total = np.zeros(2)
        for step in range(1, 2 * trials * (L + 1) + 1):
            act[:] = cue if step % 2 else 1 - cue  # stream-independent, deterministic choices
            obs, r, term, trunc, info = env.step(act)
            total += r
            trial_end = step % (L + 1) == 0
            game_end = step % (trials * (L + 1)) == 0
            assert info["trial_end"].all() == trial_end
            assert term.all() == (game_end or (trial_end and episodic_life))
            assert not term.any() or term.all()
            assert info["episode_end"].all() == game_end and info["episode_end"].any() == game_end
            if game_end:
                np.testing.assert_allclose(info["episode_return"], total)
                np.testing.assert_array_equal(info["episode_length"], trials * (L + 1))
                total[:] = 0
            else:
                assert (info["episode_return"] == 0).all() and (info["episode_length"] == 0).all()
            cue = info["cue"].copy()


def test_tmaze_seeds_distinct_per_stream_and_reproducible():
    def cues(seed, n, steps=200, reset_seed=None):
        env = make_vector_env("memory:tmaze", n, seed=seed, length=0)
        _, info = env.reset(seed=reset_seed)
        out = [info["cue"].copy()]
        for _ in range(steps):
            *_, info = env.step(np.zeros(n, dtype=np.int64))
            out.append(info["cue"].copy())
        return np.stack(out, 1)  # (n, steps+1)

    a = cues(10, 4)
    assert len({tuple(row) for row in a}) == 4  # streams differ
    np.testing.assert_array_equal(a, cues(10, 4))  # reproducible
    np.testing.assert_array_equal(a[:2], cues(10, 2))  # stream i's seed does not depend on num_envs
    np.testing.assert_array_equal(a, cues(0, 4, reset_seed=10))  # reset(seed=s) reseeds the same way
    b = cues(11, 4)
    assert not {tuple(row) for row in a} & {tuple(row) for row in b}  # seeds 10 and 11 share no stream


def test_tmaze_partial_reset_mask():
    env = make_vector_env("memory:tmaze", 3, seed=0, length=4)
    env.reset()
    env.step(np.zeros(3, dtype=np.int64))
    mask = np.array([True, False, False])
    obs, _ = env.reset(options={"reset_mask": mask})
    assert obs[0, :2].any() and not obs[1:, :2].any()


# --------------------------------------------------------------------------------------------------------------
# generic gymnasium path (SyncVectorEnv, SAME_STEP): an env that ends at a known step
# --------------------------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------------------------
# Atari (ale-py)
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("game,n", [("Pong", 6), ("Breakout", 4), ("Qbert", 6)])
def test_atari_shapes_and_minimal_action_sets(game, n):
    pytest.importorskip("ale_py")
    env = make_vector_env(f"ALE/{game}-v5", 2, seed=0)
    try:
        obs, info = env.reset()
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        assert env.single_observation_space.shape == (4, 84, 84)
        assert env.single_action_space.n == n == num_actions(f"ALE/{game}-v5")
        assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        assert env.metadata["frames_per_step"] == 4
        obs, r, term, trunc, info = env.step(np.zeros(2, dtype=np.int64))
        assert obs.shape == (2, 4, 84, 84) and r.shape == (2,)
        assert info["episode_end"].dtype == bool and info["episode_return"].shape == (2,)
    finally:
        env.close()


def test_atari_full_action_space_and_bad_ids():
    pytest.importorskip("ale_py")
    assert num_actions("ALE/Breakout-v5", full_action_space=True) == 18
    with pytest.raises(ValueError, match="unknown Atari game"):
        make_vector_env("ALE/NoSuchGame-v5", 1)
    with pytest.raises(ValueError, match="ALE/<Game>-v5"):
        make_vector_env("ALE/Pong-v4", 1)


def test_atari_paper_action_counts():
    pytest.importorskip(
        "ale_py"
    )  # docs/r2ac.md#per-environment-settings: the paper's five games with minimal action sets
    counts = {g: num_actions(f"ALE/{g}-v5") for g in ("Breakout", "Gravitar", "MsPacman", "Qbert", "Seaquest")}
    assert counts == {"Breakout": 4, "Gravitar": 18, "MsPacman": 9, "Qbert": 6, "Seaquest": 18}


def _atari_run(seed, num_envs, steps, actions, **kw):
    env = make_vector_env("ALE/Breakout-v5", num_envs, seed=seed, **kw)
    obs, _ = env.reset()
    out = [obs.copy()]
    for t in range(steps):
        obs, *_ = env.step(actions[t, :num_envs])
        out.append(obs.copy())
    env.close()
    return np.stack(out, 1)


@pytest.mark.parametrize("backend", ["native", "torchbeast"])
def test_atari_stream_seeds(backend):
    pytest.importorskip("ale_py")
    # sticky actions make every step depend on the stream's seed (without them only the no-op count does: 1..30)
    kw = {"backend": backend, "fire_on_life_loss": backend == "torchbeast", "repeat_action_probability": 0.25}
    actions = np.random.default_rng(0).integers(4, size=(40, 3))
    a = _atari_run(5, 3, 40, actions, **kw)
    b = _atari_run(5, 1, 40, actions, **kw)
    np.testing.assert_array_equal(a[0], b[0])  # stream 0's seed does not depend on num_envs
    np.testing.assert_array_equal(a, _atari_run(5, 3, 40, actions, **kw))  # reproducible
    c = _atari_run(6, 3, 40, actions, **kw)
    for i in range(3):  # seeds 5 and 6 share no stream (the no-op starts differ)
        assert not any(np.array_equal(a[i], c[j]) for j in range(3))


@pytest.mark.parametrize("backend", ["native", "torchbeast"])
def test_atari_episodic_life_and_full_game_statistics(backend):
    """Breakout with random actions: lost lives set `terminated` (game goes on), game over ends the episode."""
    pytest.importorskip("ale_py")
    env = make_vector_env("ALE/Breakout-v5", 1, seed=0, backend=backend, fire_on_life_loss=backend == "torchbeast")
    obs, info = env.reset()
    lives0 = int(info["lives"][0])
    assert lives0 == 5
    rng = np.random.default_rng(0)
    total, steps, life_losses = 0.0, 0, 0
    for _ in range(5000):
        obs, r, term, trunc, info = env.step(rng.integers(4, size=1))
        total += float(r[0])
        steps += 1
        if info["episode_end"][0]:
            assert term[0] or trunc[0]
            assert int(info["lives"][0]) == lives0  # SAME_STEP: already the new game's info
            assert info["episode_frame_number"][0] < 200  # ... at its start (no-ops and fire reset only)
            assert info["episode_return"][0] == pytest.approx(total)  # whole game, not one life
            assert info["episode_length"][0] == steps
            assert life_losses == lives0 - 1
            break
        if term[0]:
            assert info["life_lost"][0]
            life_losses += 1
            assert int(info["lives"][0]) == lives0 - life_losses  # the game goes on
    else:
        pytest.fail("no game over in 5000 random steps")
    env.close()


@pytest.mark.parametrize("backend", ["native", "torchbeast"])
def test_atari_without_episodic_life(backend):
    pytest.importorskip("ale_py")
    env = make_vector_env("ALE/Breakout-v5", 1, seed=0, episodic_life=False, backend=backend)
    env.reset()
    rng = np.random.default_rng(0)
    for _ in range(5000):
        obs, r, term, trunc, info = env.step(rng.integers(4, size=1))
        assert info["episode_end"][0] == (term[0] or trunc[0])
        if term[0]:
            assert int(info["lives"][0]) == 5  # only game over terminates
            break
    else:
        pytest.fail("no game over in 5000 random steps")
    env.close()


# --------------------------------------------------------------------------------------------------------------
# ProcGen (optional: procgen-mirror)
# --------------------------------------------------------------------------------------------------------------
def test_procgen_shapes_and_same_step():
    pytest.importorskip("procgen")
    env = make_vector_env("procgen:chaser", 3, seed=0, num_levels=10, start_level=0)
    obs, info = env.reset()
    assert obs.shape == (3, 3, 64, 64) and obs.dtype == np.uint8
    assert env.single_action_space.n == 15 == num_actions("procgen:chaser")
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert len(set(info["level_seed"].tolist())) > 1 or True  # 10 levels: may repeat
    rng = np.random.default_rng(0)
    total, steps, ended = np.zeros(3), np.zeros(3, dtype=np.int64), False
    for _ in range(3000):
        obs, r, term, trunc, info = env.step(rng.integers(15, size=3))
        total += r
        steps += 1
        end = info["episode_end"]
        np.testing.assert_array_equal(end, term | trunc)
        if end.any():
            np.testing.assert_allclose(info["episode_return"][end], total[end], rtol=1e-5)
            np.testing.assert_array_equal(info["episode_length"][end], steps[end])
            total[end], steps[end], ended = 0, 0, True
    assert ended
    env.close()


def test_procgen_memory_mode_and_seeds():
    pytest.importorskip("procgen")
    a = make_vector_env("procgen:maze", 4, seed=3, distribution_mode="memory")
    b = make_vector_env("procgen:maze", 4, seed=3, distribution_mode="memory")
    la, lb = a.reset()[1]["level_seed"], b.reset()[1]["level_seed"]
    assert len(set(la.tolist())) == 4  # distinct per stream
    np.testing.assert_array_equal(la, lb)  # reproducible from the seed
    a.close(), b.close()


def test_procgen_import_survives_a_shadowing_procgen_py(tmp_path, monkeypatch):
    """`python examples/procgen.py` puts examples/ first on sys.path, so `import procgen` finds the script."""
    import importlib.machinery
    import importlib.util

    (tmp_path / "procgen.py").write_text("SCRIPT = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "procgen", raising=False)
    real = importlib.util.find_spec("procgen", None) is not None and any(
        importlib.machinery.PathFinder.find_spec("procgen", [p]) for p in sys.path[1:] if p != str(tmp_path)
    )
    if real:
        env = make_vector_env("procgen:chaser", 1, seed=0)
        assert env.reset()[0].shape == (1, 3, 64, 64)
        env.close()
    else:
        with pytest.raises(MissingBackendError, match="onlinerec\\[procgen\\]"):
            make_vector_env("procgen:chaser", 1, seed=0)


def test_procgen_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "procgen", None)
    with pytest.raises(MissingBackendError, match="onlinerec\\[procgen\\]"):
        make_vector_env("procgen:chaser", 1)


# --------------------------------------------------------------------------------------------------------------
# DMLab: a stand-in module following the documented deepmind_lab.Lab API
# --------------------------------------------------------------------------------------------------------------
class FakeLab:
    """Follows deepmind_lab.Lab: (level, observations, config, renderer); reset(seed=); step(action, num_steps=)
    -> reward; is_running(); observations() -> {'RGB_INTERLEAVED': (H, W, 3) uint8}; close(). An episode lasts
    `episodeFrames` frames (a level option, passed through config as DMLab does for unknown keys)."""

    instances: list = []

    def __init__(self, level, observations, config=None, renderer="software"):
        assert observations == ["RGB_INTERLEAVED"]
        assert all(isinstance(v, str) for v in config.values())  # DMLab wants string config values
        self.level, self.config, self.renderer = level, dict(config), renderer
        self.w, self.h = int(config["width"]), int(config["height"])
        self.episode_frames = int(config.get("episodeFrames", 10))
        self.seeds, self.actions = [], []
        self.frame, self.running = 0, False
        FakeLab.instances.append(self)

    @staticmethod
    def pixel(seed, frame):
        return (seed * 7 + (frame * 37 if frame % 2 else 250 - frame)) % 256

    def reset(self, episode=-1, seed=None):
        self.seeds.append(seed)
        self.frame, self.running = 0, True

    def step(self, action, num_steps=1):
        assert action.dtype == np.intc and action.shape == (7,)
        assert self.running
        self.actions.append(action.copy())
        reward = 0.0
        for _ in range(num_steps):
            self.frame += 1
            reward += 1.0 + action[3]  # 2 per frame when moving forward
            if self.frame >= self.episode_frames:
                self.running = False
                break
        return reward

    def is_running(self):
        return self.running

    def observations(self):
        if not self.running:
            raise RuntimeError("DMLab has no observations once the episode ended")
        img = np.zeros((self.h, self.w, 3), dtype=np.uint8)
        img[..., 0] = self.pixel(self.seeds[-1], self.frame)
        img[0, 0, 1] = self.frame
        return {"RGB_INTERLEAVED": img}

    def close(self):
        self.running = False


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


# --------------------------------------------------------------------------------------------------------------
# installable memory tasks (optional: popgym, minigrid)
# --------------------------------------------------------------------------------------------------------------
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
