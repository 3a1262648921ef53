"""The built-in T-maze (``memory:tmaze``), which checks the SAME_STEP contract deterministically: shapes and metadata,
autoreset, episode statistics with trials as lives, per-stream seeds, masked resets, and a policy that remembers the
cue solves it where a random one does not."""

from __future__ import annotations

import numpy as np
from gymnasium.vector import AutoresetMode

from onlinerec.rl.envs import make_vector_env, num_actions


def _done(term, trunc):
    return np.logical_or(term, trunc)


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
