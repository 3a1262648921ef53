"""``RolloutDataModule(async_actor=True)``: a copy of the agent collects segment k + 1 on a thread while the learner
updates on segment k. Checked against a step-by-step replay: every segment is acted with the weights one update old
(the first with the initial weights), the segments are the plain loop's when the weights do not change, a checkpoint
resumes, and an env error reaches the caller."""

from __future__ import annotations

import threading

import lightning as L
import pytest
import torch
from gymnasium.vector import VectorWrapper
from lightning.pytorch.callbacks import ModelCheckpoint

from onlinerec import RTRLStrategy
from onlinerec.rl import R2AC, R2ACConfig, RolloutDataModule
from tests.rl.test_rollout import LENGTHS, M, make_env

B = len(LENGTHS)


def tiny(lr=1e-2):
    torch.manual_seed(0)
    return R2AC(3, (3,), cell="elstm", hidden_size=8, stem="mlp", fc_size=6, config=R2ACConfig(lr=lr))


class Record(L.Callback):
    """Every training segment and the weights the learner held when it arrived (before its update)."""

    def __init__(self) -> None:
        self.segments, self.weights = [], []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.segments.append(batch)
        self.weights.append({k: v.detach().clone() for k, v in module.state_dict().items()})


def fit(model, async_actor, steps=6, callbacks=(), ckpt_path=None, env=None):
    L.seed_everything(0, verbose=False)
    dm = RolloutDataModule(env or (lambda n, s: make_env(LENGTHS[:n])), num_envs=B, async_actor=async_actor)
    trainer = L.Trainer(
        strategy=RTRLStrategy(M=M),
        max_steps=steps,
        logger=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )
    trainer.fit(model, dm, ckpt_path=ckpt_path)
    return trainer, dm


def replay_logits(weights, segments):
    """The policy's logits on entries 0..M-1 of each segment, stepping one agent step at a time with the carried
    "act" state, segment j acted with ``weights[j]``."""
    actor, out = tiny(), []
    with torch.no_grad():
        for w, seg in zip(weights, segments):
            actor.load_state_dict(w)
            steps = [actor.act(seg.inputs[t], seg.rewards[t], seg.reset[t], stream="act")[1] for t in range(M)]
            out.append(torch.stack(steps))
    return out


def actor_threads():
    return [t for t in threading.enumerate() if t.name.startswith("onlinerec-actor")]


def test_each_segment_is_acted_with_the_weights_one_update_old():
    rec = Record()
    _, dm = fit(tiny(), async_actor=True, callbacks=[rec])
    segs, weights = rec.segments, rec.weights
    lagged = [weights[0]] + weights[:-1]  # segment 0: the initial weights; segment j: those before update j - 1
    for j, (seg, logits) in enumerate(zip(segs, replay_logits(lagged, segs))):
        torch.testing.assert_close(seg.behaviour_logits[1:], logits, rtol=1e-5, atol=1e-6, msg=f"segment {j}")
    current = replay_logits(weights, segs)  # the learner's own weights would have acted differently
    assert any(not torch.allclose(s.behaviour_logits[1:], c, atol=1e-4) for s, c in zip(segs[1:], current[1:]))
    assert dm.frames == 6 * M * B  # the segment still in flight at the end is not counted
    assert not actor_threads()  # teardown waited for it and stopped the thread


def test_with_fixed_weights_the_segments_are_the_plain_loops():
    plain, threaded = Record(), Record()
    fit(tiny(lr=0.0), async_actor=False, callbacks=[plain])
    fit(tiny(lr=0.0), async_actor=True, callbacks=[threaded])
    for a, b in zip(plain.segments, threaded.segments, strict=True):
        for name in ("inputs", "rewards", "reset", "actions", "behaviour_logits"):
            torch.testing.assert_close(getattr(b, name), getattr(a, name), rtol=0, atol=0, msg=name)


def test_a_checkpointed_run_resumes_with_the_background_actor(tmp_path):
    save = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    fit(tiny(), async_actor=True, steps=3, callbacks=[save])
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["RolloutDataModule"]["frames"] == 3 * M * B  # the learner's 3 segments, not the one in flight
    trainer, dm = fit(tiny(), async_actor=True, steps=6, ckpt_path=tmp_path / "last.ckpt")
    assert trainer.global_step == 6 and dm.frames == 6 * M * B and not actor_threads()


class _Broken(VectorWrapper):
    """A vector env whose step fails on the given call."""

    def __init__(self, env, fail_at):
        super().__init__(env)
        self.calls, self.fail_at = 0, fail_at

    def step(self, actions):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("the emulator died")
        return self.env.step(actions)


def test_an_env_error_on_the_actor_thread_reaches_fit():
    with pytest.raises(RuntimeError, match="the emulator died"):
        fit(tiny(), async_actor=True, env=lambda n, s: _Broken(make_env(LENGTHS[:n]), fail_at=2 * M + 2))
    assert not actor_threads()
