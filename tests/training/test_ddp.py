"""DDP: 2 processes (gloo, CPU) give the 1-process gradient on the union of their streams; resume under DDP is exact.

Each rank owns half of the streams and its own carried state; only gradients cross processes. The loss is a mean
over streams (and steps), so DDP's gradient average over ranks equals the gradient of the mean over all streams
(docs/distributed.md, "Loss scaling").

The 2-process runs launch this file as a script (Lightning re-launches the script for rank 1, so it must be a real
file); the 1-process reference runs in the test process. One launch does all three methods.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

if __name__ == "__main__":  # run as a script by the launcher tests below: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from onlinerec import (
    ELSTMCell,
    FELSTMCell,
    QRNNCell,
    RTRLStrategy,
    Segment,
    SnAPStrategy,
    TBPTTStrategy,
)
from onlinerec.data.stream import SegmentStream, StreamOrderError
from onlinerec.training.callbacks import NonFiniteError
from tests.helpers import Regressor

HERE = Path(__file__).resolve()
TOTAL_STREAMS, M, STEPS, D = 4, 3, 5, 2
CASES = {  # method -> (strategy, cell); SnAP on a fully recurrent cell, where it is not RTRL
    "rtrl": (RTRLStrategy, ELSTMCell),
    "tbptt": (TBPTTStrategy, QRNNCell),
    "snap": (SnAPStrategy, FELSTMCell),
}


# -- the task, shared by the script and the tests ----------------------------------------------------------------
def union_segments(epoch: int, segments: int = STEPS):
    """All TOTAL_STREAMS streams; each stream resets at its own random steps."""
    gen = torch.Generator().manual_seed(1000 + epoch)
    for _ in range(segments):
        x = torch.randn(M, TOTAL_STREAMS, D, generator=gen, dtype=torch.float64)
        reset = torch.rand(M, TOTAL_STREAMS, generator=gen) < 0.2
        yield Segment(x, reset, x.cumsum(0)[..., :1])


def shard(segments, rank: int, world: int):
    """Rank r owns streams [r*B, (r+1)*B) with B = TOTAL_STREAMS / world."""
    b = TOTAL_STREAMS // world
    for s in segments:
        cols = slice(rank * b, (rank + 1) * b)
        yield Segment(s.inputs[:, cols], s.reset[:, cols], s.targets[:, cols])


class ShardedStreams(L.LightningDataModule):
    """Each rank reads its own shard of the union of streams (the pattern a user's data module follows)."""

    def train_dataloader(self):
        rank, world = self.trainer.global_rank, self.trainer.world_size
        return SegmentStream(lambda epoch: shard(union_segments(epoch), rank, world))


class GradRecorder(Callback):
    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads.append({n: p.grad.detach().clone() for n, p in pl_module.named_parameters() if p.grad is not None})


def make_trainer(method: str, devices: int, max_steps: int, callbacks=(), **kwargs) -> L.Trainer:
    strategy_cls, _ = CASES[method]
    return L.Trainer(
        strategy=strategy_cls(M=M),
        accelerator="cpu",
        devices=devices,
        precision="64-true",
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=bool(kwargs.pop("enable_checkpointing", False)),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **kwargs,
    )


def fit(method: str, devices: int, max_steps: int = STEPS, ckpt_path=None, callbacks=(), **kwargs):
    torch.manual_seed(0)
    model = Regressor(CASES[method][1](D, 5))
    rec = GradRecorder()
    trainer = make_trainer(method, devices, max_steps, [rec, *callbacks], **kwargs)
    trainer.fit(model, ShardedStreams(), ckpt_path=ckpt_path)
    return trainer, model, rec.grads


def carry_of(model) -> dict[str, torch.Tensor]:
    carry = model._carries["train"]
    out = {"c": carry.c.detach().cpu()}
    if carry.window is not None:
        out["window"] = carry.window.cpu()
    out.update({f"S/{k}": v.cpu() for k, v in carry.sensitivities.items()})
    return out


# -- the 2-process script ---------------------------------------------------------------------------------------
def script_main(out: Path, launcher: str) -> None:
    import atexit

    # registered before any strategy's own exit hook, so it runs after it (atexit is last in, first out)
    atexit.register(record_group_at_exit, out)
    torch.set_num_threads(1)
    devices = 2
    results = {}
    for method in CASES:
        trainer, model, grads = fit(method, devices)
        rank = trainer.global_rank
        torch.save(
            {"grads": grads, "params": model.state_dict(), "carry": carry_of(model)},
            out / f"grads_{method}_rank{rank}.pt",
        )
        results[method] = trainer.world_size

    # resume under DDP: 5 steps straight == 2 steps, checkpoint, then 3 more from the checkpoint
    method = "rtrl"
    _, straight, _ = fit(method, devices, max_steps=STEPS)
    ckdir = out / "ckpts"
    cb = ModelCheckpoint(dirpath=ckdir, every_n_train_steps=1, save_top_k=-1)
    fit(method, devices, max_steps=2, callbacks=[cb], enable_checkpointing=True)
    trainer, resumed, _ = fit(method, devices, max_steps=STEPS, ckpt_path=ckdir / "epoch=0-step=2.ckpt")
    rank = trainer.global_rank
    torch.save(
        {
            "straight": straight.state_dict(),
            "resumed": resumed.state_dict(),
            "straight_carry": carry_of(straight),
            "resumed_carry": carry_of(resumed),
        },
        out / f"resume_rank{rank}.pt",
    )

    r2ac_main(out, devices)

    # a NaN loss on rank 1 only: FiniteGuard stops *both* ranks at the same step (no rank left hanging in a collective)
    nandir = out / "nan_ckpts"
    torch.manual_seed(0)
    model = NaNOnRank1(CASES["rtrl"][1](D, 5))
    trainer = make_trainer(
        "rtrl",
        devices,
        STEPS,
        [ModelCheckpoint(dirpath=nandir, every_n_train_steps=1, save_top_k=-1)],
        enable_checkpointing=True,
    )
    try:
        trainer.fit(model, ShardedStreams())
        message = "no error"
    except NonFiniteError as err:
        message = str(err)
    rank = trainer.global_rank
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    (out / f"nan_rank{rank}.json").write_text(
        json.dumps({"message": message, "finite": finite, "global_step": trainer.global_step})
    )

    # a SegmentStream that does not shard by rank: both ranks would train on the same streams; refused on every rank
    torch.manual_seed(0)
    trainer = make_trainer("rtrl", devices, STEPS)
    try:
        trainer.fit(Regressor(CASES["rtrl"][1](D, 5)), SegmentStream(lambda epoch: shard(union_segments(epoch), 0, 2)))
        message = "no error"
    except StreamOrderError as err:
        message = str(err)
    (out / f"unsharded_rank{trainer.global_rank}.json").write_text(json.dumps({"message": message}))
    if rank == 0:
        (out / "done.json").write_text(json.dumps({"world_size": results, "launcher": launcher}))


def record_group_at_exit(out: Path) -> None:
    rank = os.environ.get("LOCAL_RANK", "0")
    (out / f"exit_rank{rank}.json").write_text(json.dumps({"initialized": torch.distributed.is_initialized()}))


R2AC_STEPS, R2AC_ENVS = 3, 3


def r2ac_main(out: Path, devices: int) -> None:
    """R2AC (RTRL, eLSTM, tiny MLP stem) on the built-in T-maze: 3 steps on 2 processes, checkpointed, resumed to 5."""
    from onlinerec.rl import R2AC, RolloutDataModule

    def run(steps, ckpt_path=None, callbacks=(), async_actor=False):
        torch.manual_seed(0)
        model = R2AC(2, (4,), cell="elstm", hidden_size=8, stem="mlp", fc_size=8)
        dm = RolloutDataModule("memory:tmaze", num_envs=R2AC_ENVS, env_kwargs=dict(length=3), async_actor=async_actor)
        trainer = L.Trainer(
            strategy=RTRLStrategy(M=M),
            accelerator="cpu",
            devices=devices,
            max_steps=steps,
            logger=False,
            enable_checkpointing=bool(callbacks),
            callbacks=list(callbacks),
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model, dm, ckpt_path=ckpt_path)
        return trainer, model, dm

    ckdir = out / "r2ac_ckpts"
    trainer, model, dm = run(
        R2AC_STEPS, callbacks=[ModelCheckpoint(dirpath=ckdir, every_n_train_steps=R2AC_STEPS, save_top_k=-1)]
    )
    rank = trainer.global_rank
    result = {
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "carry_c": model._carries["train"].c.clone(),
        "act_c": model._carries["act"].c.clone(),
        "loss": float(trainer.callback_metrics["train/loss"]),
        "frames": float(trainer.callback_metrics["frames"]),  # logged by the RolloutMonitor: every rank's frames
        "dm_frames": dm.frames,
    }
    trainer2, model2, dm2 = run(R2AC_STEPS + 2, ckpt_path=ckdir / f"epoch=0-step={R2AC_STEPS}.ckpt")
    result.update(resumed_step=trainer2.global_step, resumed_dm_frames=dm2.frames)
    _, model3, dm3 = run(R2AC_STEPS, async_actor=True)  # each rank's actor on its own thread
    result.update(async_params={k: v.detach().clone() for k, v in model3.state_dict().items()}, async_frames=dm3.frames)
    torch.save(result, out / f"r2ac_rank{rank}.pt")


class NaNOnRank1(Regressor):
    NAN_STEP = 3

    def segment_loss(self, outputs, segment):
        loss = super().segment_loss(outputs, segment)
        if self.trainer.global_rank == 1 and self.trainer.global_step == self.NAN_STEP:
            loss = loss * float("nan")
        return loss


def launch(out: Path, launcher: str = "lightning", timeout: float = 300) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    for var in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK"):
        env.pop(var, None)
    if launcher == "torchrun":
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(HERE),
            str(out),
            launcher,
        ]
    else:
        cmd = [sys.executable, str(HERE), str(out), launcher]
    # its own process group, so that a hung run is ended with every rank it started
    proc = subprocess.Popen(
        cmd, env=env, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"DDP script timed out after {timeout} s.\nstderr:\n{stderr[-8000:]}") from None
    if proc.returncode != 0 or not (out / "done.json").exists():
        raise AssertionError(
            f"DDP script failed (rc {proc.returncode}).\nstdout:\n{stdout[-4000:]}\nstderr:\n{stderr[-8000:]}"
        )
    return proc


# -- the tests --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    launch(out, "lightning")
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


@pytest.mark.parametrize("method", list(CASES))
def test_ddp_gradient_equals_single_process_on_union_of_streams(ddp_run, method):
    """Every step's (all-reduced) gradient on 2 ranks x 2 streams == 1 process x 4 streams, to <= 1e-6 relative."""
    torch.set_num_threads(1)
    _, single, ref = fit(method, devices=1)
    assert len(ref) == STEPS
    ranks = [torch.load(ddp_run / f"grads_{method}_rank{r}.pt", weights_only=True) for r in (0, 1)]
    for r, got in enumerate(ranks):
        assert len(got["grads"]) == STEPS
        for step, (g, e) in enumerate(zip(got["grads"], ref)):
            assert g.keys() == e.keys()
            for name in e:
                err = rel(g[name], e[name])
                assert err <= 1e-6, f"rank {r} step {step} {name}: relative error {err}"
        for name, value in single.state_dict().items():  # hence identical parameters after the last update
            assert rel(got["params"][name], value) <= 1e-6, name
    # each rank carried its own half of the streams: together they are the single process's carry
    carry = carry_of(single)
    for key, value in carry.items():
        both = torch.cat([ranks[0]["carry"][key], ranks[1]["carry"][key]])
        assert rel(both, value) <= 1e-6, key
    assert method != "tbptt" or not any(k.startswith("S/") for k in carry)


def test_ddp_resume_is_exact_with_every_ranks_carry(ddp_run):
    """Under DDP, a run checkpointed at step 2 and resumed ends where the uninterrupted run ends, on every rank."""
    for r in (0, 1):
        res = torch.load(ddp_run / f"resume_rank{r}.pt", weights_only=True)
        for name, value in res["straight"].items():
            torch.testing.assert_close(res["resumed"][name], value, rtol=0, atol=0, msg=f"rank {r} {name}")
        for key, value in res["straight_carry"].items():
            torch.testing.assert_close(res["resumed_carry"][key], value, rtol=0, atol=0, msg=f"rank {r} carry {key}")
    # the two ranks hold different streams, so their carries differ: rank 1's was not rank 0's copy
    c0 = torch.load(ddp_run / "resume_rank0.pt", weights_only=True)["resumed_carry"]["c"]
    c1 = torch.load(ddp_run / "resume_rank1.pt", weights_only=True)["resumed_carry"]["c"]
    assert not torch.equal(c0, c1)


def test_ddp_checkpoint_holds_every_ranks_carry_and_refuses_another_world_size(ddp_run):
    from onlinerec.training.checkpoint import drop_carried_state

    path = ddp_run / "ckpts" / "epoch=0-step=2.ckpt"
    raw = torch.load(path, weights_only=True)
    saved = raw["onlinerec"]
    assert saved["world_size"] == 2 and len(saved["rank_carries"]) == 2
    c = [saved["rank_carries"][r]["train"]["c"] for r in (0, 1)]
    assert c[0].shape == (2, 5) and not torch.equal(c[0], c[1])

    with pytest.raises(ValueError, match=r"carried state of 2 training process.*this run has 1.*drop_carried_state"):
        fit("rtrl", devices=1, ckpt_path=path)
    fresh = drop_carried_state(path)  # the documented way out: streams restart from zero
    trainer, model, _ = fit("rtrl", devices=1, ckpt_path=fresh)
    assert trainer.global_step == STEPS and model._carries["train"].batch_size == TOTAL_STREAMS


def test_ddp_nan_on_one_rank_stops_every_rank_at_that_step(ddp_run):
    step = NaNOnRank1.NAN_STEP
    for r in (0, 1):
        res = json.loads((ddp_run / f"nan_rank{r}.json").read_text())
        assert f"global step {step}" in res["message"], res["message"]
        assert res["finite"] and res["global_step"] == step
    assert "the loss is nan" in json.loads((ddp_run / "nan_rank1.json").read_text())["message"]
    # rank 0's loss was finite; it sees rank 1's NaN through the all-reduced gradients
    assert "gradients of cell." in json.loads((ddp_run / "nan_rank0.json").read_text())["message"]
    ckpts = sorted(p.name for p in (ddp_run / "nan_ckpts").glob("*.ckpt"))
    assert ckpts[-1] == f"epoch=0-step={step}.ckpt", ckpts  # nothing written after the bad step
    last = torch.load(ddp_run / "nan_ckpts" / ckpts[-1], weights_only=True)
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values())


def test_ddp_ranks_training_on_the_same_streams_are_refused(ddp_run):
    """A user's SegmentStream that ignores the rank would give both ranks the same data: every rank stops at once."""
    for r in (0, 1):
        message = json.loads((ddp_run / f"unsharded_rank{r}.json").read_text())["message"]
        assert "all 2 DDP ranks got the same first training segment" in message and "rank, world_size" in message


def test_ddp_r2ac_trains_on_two_processes_and_resumes(ddp_run):
    """R2AC on 2 processes: ranks stay in sync, act in different envs, count frames of both, and resume from a
    checkpoint holding both ranks' carried state (train and act streams); with ``async_actor`` the ranks stay in
    sync as well."""
    res = [torch.load(ddp_run / f"r2ac_rank{r}.pt", weights_only=True) for r in (0, 1)]
    for name, value in res[0]["params"].items():
        torch.testing.assert_close(
            res[1]["params"][name], value, rtol=0, atol=0, msg=name
        )  # DDP kept the replicas equal
    assert not torch.equal(res[0]["carry_c"], res[1]["carry_c"])  # each rank carried the state of its own envs
    for r in res:
        assert torch.isfinite(torch.tensor(r["loss"]))
        per_rank = R2AC_STEPS * M * R2AC_ENVS
        assert r["dm_frames"] == per_rank and r["frames"] == 2 * per_rank  # the logged count covers all ranks
        assert r["resumed_step"] == R2AC_STEPS + 2 and r["resumed_dm_frames"] == (R2AC_STEPS + 2) * M * R2AC_ENVS
    for name, value in res[0]["async_params"].items():  # with background actors too
        torch.testing.assert_close(res[1]["async_params"][name], value, rtol=0, atol=0, msg=name)
    assert not torch.equal(res[0]["async_params"]["baseline.weight"], res[0]["params"]["baseline.weight"])
    assert res[0]["async_frames"] == res[1]["async_frames"] == R2AC_STEPS * M * R2AC_ENVS
    saved = torch.load(ddp_run / "r2ac_ckpts" / f"epoch=0-step={R2AC_STEPS}.ckpt", weights_only=True)
    assert saved["onlinerec"]["world_size"] == 2
    for r in (0, 1):
        carries = saved["onlinerec"]["rank_carries"][r]
        assert {"train", "act"} <= set(carries) and "input_proj.weight" in carries["train"]["sensitivities"]
        torch.testing.assert_close(carries["train"]["c"], res[r]["carry_c"], rtol=0, atol=0)


def test_ddp_process_group_is_destroyed_before_the_interpreter_exits(ddp_run):
    """A gloo group left to the interpreter's finalisation can abort a finished run (SIGABRT, exit status -6)."""
    paths = [ddp_run / f"exit_rank{r}.json" for r in (0, 1)]
    deadline = time.monotonic() + 60  # rank 1 is rank 0's child and may still be exiting
    while not all(p.exists() for p in paths) and time.monotonic() < deadline:
        time.sleep(0.2)
    for path in paths:
        assert json.loads(path.read_text()) == {"initialized": False}, path.name


@pytest.mark.slow
def test_ddp_under_torchrun(tmp_path):
    """The same script under torchrun (the multi-node launcher): TorchElasticEnvironment, same gradients."""
    launch(tmp_path, "torchrun")
    torch.set_num_threads(1)
    _, _, ref = fit("rtrl", devices=1)
    got = torch.load(tmp_path / "grads_rtrl_rank1.pt", weights_only=True)["grads"]
    for g, e in zip(got, ref):
        for name in e:
            assert rel(g[name], e[name]) <= 1e-6


if __name__ == "__main__":
    script_main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "lightning")
