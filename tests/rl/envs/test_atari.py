"""Atari (ale-py, a core test dependency): shapes and minimal action sets, id errors, per-stream seeds, lives and
whole-game statistics on both backends, FIRE after a lost life, the torchbeast frame stack, and the direct emulator
loop against gymnasium's own steps."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from onlinerec.rl.envs import make_vector_env, num_actions
from onlinerec.rl.envs import spaces as env_spaces


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
