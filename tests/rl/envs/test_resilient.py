"""Env workers that crash, die or hang (``vectorization="resilient"``) are restarted with their stream flagged reset:
the crashed episode is dropped from the statistics, a worker that keeps failing is given up with a clear error, and
R2AC's run goes on."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import gymnasium
import lightning as L
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from onlinerec import RTRLStrategy
from onlinerec.rl.envs.base import stream_seed
from onlinerec.rl.envs.resilient import ResilientVectorEnv

M = 4


class FlakyEnv(gymnasium.Env):
    """obs = [stream tag, step in episode]; episodes last 6 steps. Fails once (the first instance to reach
    ``fail_at``, as recorded by a marker file): raises, hangs, or kills its process."""

    metadata: dict = {}

    def __init__(
        self, tag: int, fail: str | None = None, fail_at: int = 3, marker: str | None = None, always: bool = False
    ):
        self.tag, self.fail, self.fail_at, self.marker, self.always = tag, fail, fail_at, marker, always
        self.observation_space = gymnasium.spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.tag, self.t], dtype=np.float32), {"seed": -1 if seed is None else seed}

    def step(self, action):
        self.t += 1
        if self.fail and self.t == self.fail_at and (self.always or not os.path.exists(self.marker)):
            Path(self.marker).touch()
            if self.fail == "raise":
                raise RuntimeError("simulated env crash")
            if self.fail == "hang":
                time.sleep(60)
            if self.fail == "exit":
                os._exit(3)
        return np.array([self.tag, self.t], dtype=np.float32), 1.0, self.t >= 6, False, {}


def make_env(tmp_path, fail, bad_stream=1, num_envs=3, always=False, fail_at=3, **kwargs):
    marker = str(tmp_path / "failed")
    fns = [
        (lambda i=i: FlakyEnv(i, fail if i == bad_stream else None, fail_at=fail_at, marker=marker, always=always))
        for i in range(num_envs)
    ]
    return ResilientVectorEnv(fns, context="fork", seed=100, **kwargs)


@pytest.mark.parametrize("fail", ["raise", "exit", "hang"])
def test_fault_env_worker_is_restarted_and_its_stream_flagged_reset(tmp_path, fail, caplog):
    env = make_env(tmp_path, fail, step_timeout=2.0 if fail == "hang" else 30.0)  # healthy workers answer in ms
    try:
        assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        obs, info = env.reset(seed=100)
        assert obs.tolist() == [[0, 0], [1, 0], [2, 0]] and not info["restarted"].any()
        for _ in range(2):
            obs, rew, term, trunc, info = env.step(np.zeros(3, dtype=np.int64))
        assert obs[:, 1].tolist() == [2, 2, 2]
        with caplog.at_level(logging.WARNING, logger="onlinerec.rl.envs.resilient"):
            start = time.monotonic()
            obs, rew, term, trunc, info = env.step(np.zeros(3, dtype=np.int64))  # stream 1 fails at its 3rd step
            took = time.monotonic() - start
        assert info["restarted"].tolist() == [False, True, False]
        assert trunc.tolist() == [False, True, False] and not term.any()  # SAME_STEP: reset before the next step
        assert rew.tolist() == [1.0, 0.0, 1.0]
        assert obs.tolist() == [[0, 3], [1, 0], [2, 3]]  # a fresh episode in slot 1; the others went on
        assert env.restart_counts == [0, 1, 0] and env.events[0].env_index == 1
        reason = {"raise": "simulated env crash", "exit": "died (exit code 3)", "hang": "no reply within 2 s"}[fail]
        assert reason in env.events[0].reason
        assert any("env worker 1" in r.getMessage() and "flagged reset" in r.getMessage() for r in caplog.records)
        assert took < 20.0  # a hang costs the timeout (2 s), not the 60 s sleep
        assert info["seed"][1] == stream_seed(stream_seed(100, 1), 0, restart=1)  # a new, deterministic seed
        for _ in range(4):  # the run continues on every stream
            obs, rew, term, trunc, info = env.step(np.zeros(3, dtype=np.int64))
            assert not info["restarted"].any()
        assert obs[:, 1].tolist() == [1, 4, 1]  # streams 0 and 2 ended their 6-step episode and restarted (SAME_STEP)
    finally:
        env.close()


def test_fault_env_that_always_fails_is_given_up_with_a_clear_error(tmp_path):
    env = make_env(tmp_path, "raise", always=True, fail_at=1, max_restarts=2)  # fails at every episode's first step
    try:
        env.reset(seed=0)
        with pytest.raises(
            RuntimeError, match=r"env worker 1 failed 3 times in a row .*simulated env crash.*max_restarts"
        ):
            for _ in range(20):
                env.step(np.zeros(3, dtype=np.int64))
    finally:
        env.close()


def test_fault_restarted_stream_drops_its_episode_and_restarts_its_statistics(tmp_path):
    """Through the onlinerec env contract (SameStepEnv): the crash is not a finished episode, and the fresh
    episode's return and length count from the restart."""
    from onlinerec.rl.envs import SameStepEnv

    env = SameStepEnv(make_env(tmp_path, "raise", fail_at=3), seed=100)  # 6-step episodes, reward 1 per step
    try:
        env.reset()
        ends = []
        for _ in range(9):
            _, _, _, trunc, info = env.step(np.zeros(3, dtype=np.int64))
            ends.append(
                (info["episode_end"].tolist(), info["episode_return"].tolist(), info["episode_length"].tolist())
            )
        assert trunc.tolist() == [False, False, False]
        assert ends[2] == ([False, False, False], [0.0, 0.0, 0.0], [0, 0, 0])  # stream 1 crashed at step 3
        assert ends[5] == ([True, False, True], [6.0, 0.0, 6.0], [6, 0, 6])
        assert ends[8] == ([False, True, False], [0.0, 6.0, 0.0], [0, 6, 0])  # its fresh episode, counted from 0
    finally:
        env.close()


def test_fault_resilient_vectorization_from_the_env_factory():
    from onlinerec.rl.envs import make_vector_env
    from onlinerec.rl.envs.resilient import ResilientVectorEnv

    env = make_vector_env("gymnasium:CartPole-v1", 2, seed=3, vectorization="resilient")
    try:
        assert isinstance(env.env, ResilientVectorEnv) and env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        obs, _ = env.reset()
        assert obs.shape == (2, 4)
        for _ in range(30):
            obs, _, _, _, info = env.step(np.zeros(2, dtype=np.int64))  # always left: episodes end soon
            assert not info["restarted"].any()
        assert obs.shape == (2, 4) and info["episode_end"].dtype == bool
    finally:
        env.close()
    with pytest.raises(ValueError, match="'sync', 'async' or 'resilient'"):
        make_vector_env("gymnasium:CartPole-v1", 2, vectorization="threads")


def test_fault_r2ac_keeps_training_through_an_env_worker_crash(tmp_path, caplog):
    """End to end: R2AC acting in a ResilientVectorEnv whose stream 1 crashes mid-run. Training goes on, the crash
    is logged, and the next segment flags stream 1 reset at the entry where the fresh episode starts."""
    rl = pytest.importorskip("onlinerec.rl")
    from onlinerec.rl.envs import SameStepEnv

    def factory(num_envs, seed):
        return SameStepEnv(make_env(tmp_path, "raise", num_envs=num_envs, fail_at=5), seed=seed)

    resets = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            resets.append(batch.reset.clone())

    torch.manual_seed(0)
    model = rl.R2AC(2, (2,), cell="elstm", hidden_size=8, stem="mlp", fc_size=8)
    trainer = L.Trainer(
        strategy=RTRLStrategy(M=M),
        accelerator="cpu",
        devices=1,
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Record()],
    )
    with caplog.at_level(logging.WARNING, logger="onlinerec.rl.envs.resilient"):
        trainer.fit(model, rl.RolloutDataModule(factory, num_envs=3))
    assert trainer.global_step == 4
    assert any("env worker 1" in r.getMessage() for r in caplog.records)
    flags = torch.cat([r[1:] for r in resets])  # entries 1..M of each segment, in agent-step order
    # stream 1 crashed at its 5th step (agent step 5): that entry shows the fresh episode and carries the reset flag
    assert flags[4, 1] and not flags[4, 0] and not flags[4, 2]
    assert float(trainer.callback_metrics["env_restarts"]) == 1.0
    assert all(torch.isfinite(p).all() for p in model.parameters())
