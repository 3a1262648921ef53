"""Independent env streams: every stream's seed comes from ``numpy.random.SeedSequence`` over
(run seed, purpose, DDP rank, restart, stream index), so runs with different seeds, training and evaluation, DDP ranks
and resumes never share a stream — checked on the seeds each backend receives and on what the streams show, for
the T-maze, gymnasium, POPGym, MiniGrid, Atari, DMLab (stand-in) and ProcGen (where installed)."""

from __future__ import annotations

import types

import gymnasium as gym
import numpy as np
import pytest
import torch

from onlinerec.rl import RolloutDataModule
from onlinerec.rl.envs import PURPOSES, make_vector_env, run_env_seed, stream_seed, stream_seeds

RUN_SEEDS = (0, 1, 2)


def test_stream_seeds_are_disjoint_across_seeds_and_independent_of_num_envs():
    seen: set[int] = set()
    for seed in range(20):
        s = stream_seeds(seed, 32)
        assert len(set(s.tolist())) == 32 and s.dtype == np.int64 and (0 <= s).all() and (s < 2**31).all()
        assert not seen & set(s.tolist())  # seed + i would have shared 31 of 32 with the next seed
        seen |= set(s.tolist())
        np.testing.assert_array_equal(stream_seeds(seed, 5), s[:5])
        assert stream_seed(seed, 3) == s[3]
    assert stream_seed(7, 0, restart=1) not in stream_seeds(7, 100)
    with pytest.raises(ValueError, match="non-negative"):
        stream_seeds(-1, 2)


def test_run_env_seeds_are_distinct_for_every_seed_purpose_rank_and_restart():
    keys = [(s, p, r, k) for s in range(5) for p in PURPOSES for r in range(4) for k in range(3)]
    seeds = {run_env_seed(s, purpose=p, rank=r, restart=k) for s, p, r, k in keys}
    assert len(seeds) == len(keys)
    streams = [set(stream_seeds(x, 32).tolist()) for x in seeds]
    assert len(set().union(*streams)) == 32 * len(keys)  # not one stream shared among 120 x 32
    with pytest.raises(ValueError, match="purpose"):
        run_env_seed(0, purpose="test")


class RecordSeed(gym.Wrapper):
    """Puts the seed each reset received into its info (-1: none)."""

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, dict(info, reset_seed=-1 if seed is None else int(seed))


RECORD = [{"class_path": f"{__name__}.RecordSeed"}]


def received_seeds(env_id, num_envs, seed, **kwargs):
    env = make_vector_env(env_id, num_envs, seed=seed, wrappers=RECORD, **kwargs)
    try:
        return env.reset()[1]["reset_seed"].tolist()
    finally:
        env.close()


@pytest.mark.parametrize(
    "env_id, backend",
    [
        ("gymnasium:CartPole-v1", None),
        ("popgym:RepeatPreviousEasy", "popgym"),
        ("MiniGrid-MemoryS7-v0", "minigrid"),
    ],
)
def test_single_env_families_seed_stream_i_with_stream_seed(env_id, backend):
    if backend:
        pytest.importorskip(backend)
    for seed in RUN_SEEDS:
        assert received_seeds(env_id, 4, seed) == stream_seeds(seed, 4).tolist()
    train = received_seeds(env_id, 4, run_env_seed(0, purpose="train"))
    evaluation = received_seeds(env_id, 4, run_env_seed(0, purpose="eval"))
    assert not set(train) & set(evaluation)


def _tmaze_cues(seed, n=8, steps=200):
    env = make_vector_env("memory:tmaze", n, seed=seed, length=0)  # a new cue at every step
    _, info = env.reset()
    cues = [info["cue"].copy()]
    for _ in range(steps):
        *_, info = env.step(np.zeros(n, dtype=np.int64))
        cues.append(info["cue"].copy())
    return [tuple(row) for row in np.stack(cues, 1)]


def test_tmaze_runs_train_and_eval_share_no_stream():
    """Seeded as ``seed + i``, runs with seeds 0 and 1 would share 15 of 16 training streams, whose cues the seed fixes."""
    streams = {}
    for seed in RUN_SEEDS:
        for purpose in PURPOSES:
            streams[seed, purpose] = _tmaze_cues(run_env_seed(seed, purpose=purpose))
    everything = [row for rows in streams.values() for row in rows]
    assert len(set(everything)) == len(everything)  # 6 x 8 streams of 201 cues: all different
    assert _tmaze_cues(run_env_seed(1)) == streams[1, "train"]  # and reproducible


def test_popgym_streams_differ_between_seeds():
    pytest.importorskip("popgym")

    def observations(seed):
        env = make_vector_env("popgym:RepeatPreviousEasy", 4, seed=seed)
        obs = [env.reset()[0]]
        for _ in range(40):
            obs.append(env.step(np.zeros(4, dtype=np.int64))[0])
        return [o.tobytes() for o in np.stack(obs, 1)]

    a, b = observations(0), observations(1)
    assert len(set(a)) == 4 and not set(a) & set(b) and observations(0) == a


def _atari_frames(seed, backend):
    env = make_vector_env(
        "ALE/Breakout-v5",
        3,
        seed=seed,
        backend=backend,
        fire_on_life_loss=backend == "torchbeast",
        repeat_action_probability=0.25,  # every step draws from the stream's seeded RNG
    )
    try:
        obs = [env.reset()[0]]
        actions = np.random.default_rng(0).integers(4, size=(30, 3))
        for a in actions:
            obs.append(env.step(a)[0])
        return [o.tobytes() for o in np.stack(obs, 1)]
    finally:
        env.close()


@pytest.mark.parametrize("backend", ["native", "torchbeast"])
def test_atari_train_and_eval_streams_differ(backend):
    pytest.importorskip("ale_py")
    train = _atari_frames(run_env_seed(0, purpose="train"), backend)
    evaluation = _atari_frames(run_env_seed(0, purpose="eval"), backend)
    other = _atari_frames(run_env_seed(1, purpose="train"), backend)
    assert len(set(train)) == 3 and not set(train) & set(evaluation) and not set(train) & set(other)


def test_procgen_one_rand_seed_derived_like_a_stream_seed():
    pytest.importorskip("procgen")
    a = make_vector_env("procgen:maze", 4, seed=0, distribution_mode="memory")
    b = make_vector_env("procgen:maze", 4, seed=1, distribution_mode="memory")
    try:
        la, lb = a.reset()[1]["level_seed"], b.reset()[1]["level_seed"]
        assert a.rand_seed == stream_seed(0, 0) and b.rand_seed == stream_seed(1, 0)
        assert not set(la.tolist()) & set(lb.tolist())
    finally:
        a.close(), b.close()


def test_dmlab_streams_from_stream_seeds(monkeypatch):
    from tests.rl.envs.stand_ins import FakeLab

    mod = types.ModuleType("deepmind_lab")
    mod.Lab = FakeLab
    FakeLab.instances = []
    monkeypatch.setitem(__import__("sys").modules, "deepmind_lab", mod)
    env = make_vector_env("dmlab:rooms_watermaze", 3, seed=5, vectorization="sync")
    env.reset()
    first = [lab.seeds[0] for lab in FakeLab.instances]
    assert first == [np.random.RandomState(stream_seed(5, i)).randint(2**31 - 1) for i in range(3)]
    env.close()


class _Agent:
    device = torch.device("cpu")

    def act(self, obs, reward, reset, *, greedy=False, stream="act"):
        return torch.zeros(obs.shape[0], dtype=torch.int64), torch.zeros(obs.shape[0], 2)


def test_datamodule_seeds_ranks_and_resumes_apart():
    """The data module's env seed is run_env_seed(seed, "train", rank, restarts): ranks and resumes share nothing."""
    got = {}
    for rank in (0, 1):
        for restarts in (0, 1):
            dm = RolloutDataModule("memory:tmaze", num_envs=4, seed=3, env_kwargs={"length": 0})
            dm._restarts = restarts
            made = []
            make_env = dm.make_env
            dm.make_env = lambda n, seed, made=made, make_env=make_env: made.append(seed) or make_env(n, seed)
            dm.trainer = types.SimpleNamespace(  # what train_dataloader reads of a DDP trainer on rank `rank`
                global_rank=rank, lightning_module=_Agent(), max_steps=1, strategy=types.SimpleNamespace(M=1)
            )
            dm.train_dataloader()
            got[rank, restarts] = made[0]
            dm.teardown("fit")
    assert got == {(r, k): run_env_seed(3, purpose="train", rank=r, restart=k) for r in (0, 1) for k in (0, 1)}
    streams = [set(stream_seeds(x, 4).tolist()) for x in got.values()]
    assert len(set().union(*streams)) == 16
