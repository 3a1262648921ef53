"""Exact resume and safe checkpoint files: atomic writes (a crash mid-write leaves the previous checkpoint intact),
weights-only loading (a checkpoint cannot run code), and exact resume of the supervised data modules."""

from __future__ import annotations

import copy
import io
import pickle
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from onlinerec import ELSTMCell, OnlineRecurrentModule, RTRLStrategy, Segment, SnAPStrategy, TBPTTStrategy
from onlinerec.data.stream import SegmentStream
from onlinerec.training.checkpoint import AtomicCheckpointIO, atomic_torch_save, load_checkpoint_file
from tests.helpers import Regressor, accelerator, needs_cuda, quiet_trainer

M = 4


def segments(epoch: int, count: int = 6):
    gen = torch.Generator().manual_seed(epoch)
    for i in range(count):
        x = torch.randn(M, 3, 2, generator=gen)
        reset = torch.rand(M, 3, generator=gen) < 0.15
        yield Segment(x, reset, x.cumsum(0)[..., :1])


def trainer(max_steps: int, strategy=None, **kwargs) -> L.Trainer:
    return quiet_trainer(strategy or RTRLStrategy(M=M), max_steps=max_steps, **kwargs)


# -- atomic writes -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", [RTRLStrategy(M=M), TBPTTStrategy(M=M), SnAPStrategy(M=M), "rtrl"], ids=str)
def test_resume_strategies_write_checkpoints_atomically_by_default(strategy):
    t = trainer(1, strategy)
    assert isinstance(t.strategy.checkpoint_io, AtomicCheckpointIO)


def test_resume_strategies_keep_a_checkpoint_io_the_user_gives():
    mine = TorchCheckpointIO()
    assert RTRLStrategy(M=M, checkpoint_io=mine).checkpoint_io is mine
    assert trainer(1, RTRLStrategy(M=M), plugins=[mine]).strategy.checkpoint_io is mine


class _Crash(RuntimeError):
    pass


def _crashing_save(real_save):
    def save(obj, f, *args, **kwargs):
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        data = buf.getvalue()
        f.write(data[: len(data) // 2])  # half the file reaches the disk, then the process "dies"
        raise _Crash("simulated crash in the middle of writing a checkpoint")

    return save


def test_resume_crash_mid_write_leaves_the_previous_last_checkpoint_intact(tmp_path, monkeypatch):
    """ModelCheckpoint(save_last=True) rewrites last.ckpt every step; a crash while writing step 4's leaves step 3's."""
    torch.manual_seed(0)
    model = Regressor()

    class CrashAtStep4(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 4:  # runs just before ModelCheckpoint rewrites last.ckpt after the 4th step
                monkeypatch.setattr(torch, "save", _crashing_save(torch.save))

    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=1, save_top_k=0)  # only last.ckpt
    t = trainer(6, callbacks=[CrashAtStep4(), ckpt], enable_checkpointing=True)  # CrashAtStep4 runs before the save
    with pytest.raises(_Crash):
        t.fit(model, SegmentStream(segments))
    monkeypatch.undo()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no partial file, no temp file left
    last = load_checkpoint_file(tmp_path / "last.ckpt")  # loads, weights-only
    assert last["global_step"] == 3
    resumed = Regressor()  # and resumes
    t2 = trainer(5)
    t2.fit(resumed, SegmentStream(segments), ckpt_path=tmp_path / "last.ckpt")
    assert t2.global_step == 5


def test_resume_atomic_save_failure_keeps_old_file_and_removes_the_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "x.ckpt"
    atomic_torch_save({"v": torch.arange(3)}, path)
    monkeypatch.setattr(torch, "save", _crashing_save(torch.save))
    with pytest.raises(_Crash):
        AtomicCheckpointIO().save_checkpoint({"v": torch.arange(1000)}, path)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["x.ckpt"]
    assert torch.equal(load_checkpoint_file(path)["v"], torch.arange(3))


# -- weights-only loading --------------------------------------------------------------------------------------------
class _Payload:
    """Unpickling this runs code (here: creates a file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize(
    "env", [{}, {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}], ids=["default", "torch-told-to-unpickle"]
)
def test_resume_loads_checkpoints_weights_only_so_they_cannot_run_code(tmp_path, monkeypatch, env):
    """Weights-only is asked for explicitly, so it holds whatever torch's default (or its environment switch) says."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    torch.manual_seed(0)
    model = Regressor()
    t = trainer(2)
    t.fit(model, SegmentStream(segments))
    good = tmp_path / "good.ckpt"
    t.save_checkpoint(good)
    assert torch.load(good, weights_only=True)  # an onlinerec checkpoint is plain data

    evil, marker = tmp_path / "evil.ckpt", tmp_path / "code-ran"
    ckpt = torch.load(good, weights_only=True)
    ckpt["payload"] = _Payload(marker)
    torch.save(ckpt, evil)
    with pytest.raises(pickle.UnpicklingError, match=r"weights_only=True.*trust.*weights_only=False"):
        trainer(4).fit(Regressor(), SegmentStream(segments), ckpt_path=evil)
    assert not marker.exists()

    t3 = trainer(4)  # a normal checkpoint resumes through the same weights-only path
    t3.fit(Regressor(), SegmentStream(segments), ckpt_path=good)
    assert t3.global_step == 4


# -- exact resume of the supervised data modules --------------------------------------------------------------------
class _SizedStream(SegmentStream):
    def __len__(self) -> int:
        return 6


@pytest.mark.parametrize("sized", [False, True], ids=["unsized", "sized"])
@pytest.mark.parametrize("stop", [3, 6, 8])
def test_resume_segment_stream_with_and_without_len(tmp_path, stop, sized):
    """Lightning fetches one batch ahead only when it does not know the loader's length; both resume exactly."""
    cls = _SizedStream if sized else SegmentStream

    def run(max_steps, ckpt=None, dirpath=None):
        torch.manual_seed(0)
        model = Regressor()
        callbacks = [ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1, save_top_k=-1)] if dirpath else []
        t = trainer(max_steps, callbacks=callbacks, enable_checkpointing=bool(dirpath))
        t.fit(model, cls(segments), ckpt_path=ckpt)
        return model

    straight = run(10)
    run(stop, dirpath=tmp_path)
    resumed = run(10, ckpt=next(tmp_path.glob(f"*step={stop}.ckpt")))
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    torch.testing.assert_close(straight._carries["train"].c, resumed._carries["train"].c, rtol=0, atol=0)


def _sequence_setup():
    data = pytest.importorskip("onlinerec.data.sequences")
    gen = torch.Generator().manual_seed(0)
    pairs = []
    for i in range(11):
        n = 3 + (i * 5) % 9
        x = torch.randint(0, 4, (n,), generator=gen)
        pairs.append((torch.nn.functional.one_hot(x, 4).float(), x.roll(1)))
    return data, data.TensorSequences(pairs)


class _Tagger(OnlineRecurrentModule):
    def __init__(self) -> None:
        super().__init__(ELSTMCell(4, 6), lr=1e-2)
        self.head = torch.nn.Linear(6, 4)

    def segment_loss(self, outputs, segment):
        logits = self.head(outputs)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), segment.targets.flatten(), ignore_index=-100)


@pytest.mark.parametrize("stop", [2, 5, 9])
def test_resume_sequence_data_module_is_exact_mid_and_across_epochs(tmp_path, stop):
    """SequenceDataModule (variable-length sequences dealt to B = 3 streams): interrupted at `stop`, resumed, == straight."""
    data, sequences = _sequence_setup()

    def run(max_steps, ckpt=None, dirpath=None):
        torch.manual_seed(0)
        model = _Tagger()
        callbacks = [ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1, save_top_k=-1)] if dirpath else []
        t = trainer(
            max_steps, RTRLStrategy(M=3), callbacks=callbacks, enable_checkpointing=bool(dirpath), limit_val_batches=0
        )
        t.fit(model, data.SequenceDataModule(train=sequences, num_streams=3), ckpt_path=ckpt)
        return model

    straight = run(12)  # about 2.5 epochs
    run(stop, dirpath=tmp_path)
    resumed = run(12, ckpt=next(tmp_path.glob(f"*step={stop}.ckpt")))
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    torch.testing.assert_close(straight._carries["train"].c, resumed._carries["train"].c, rtol=0, atol=0)


# -- R2AC ---------------------------------------------------------------------------------------------------------
def test_resume_r2ac_restores_carried_state_counters_optimizer_and_scheduler(tmp_path):
    """An R2AC checkpoint restores, before the first resumed step: every carried stream ("train" with its RTRL
    sensitivities, "act"), global step, frame and episode counters, RMSProp state and the LR schedule's position.
    (The envs themselves are not checkpointable: they restart with new seeds and every stream is flagged reset.)"""
    rl = pytest.importorskip("onlinerec.rl")
    from onlinerec.rl.monitor import RolloutMonitor

    env = dict(env="memory:tmaze", num_envs=3, env_kwargs=dict(length=3))

    def model():
        torch.manual_seed(0)
        return rl.R2AC(2, (4,), cell="elstm", hidden_size=8, stem="mlp", fc_size=8, config=dict(total_updates=10))

    first, first_dm = model(), rl.RolloutDataModule(**env)
    t = trainer(
        4,
        RTRLStrategy(M=M),
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)],
    )
    t.fit(first, first_dm)
    (first_monitor,) = [cb for cb in t.callbacks if isinstance(cb, RolloutMonitor)]
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)

    seen = {}

    class Capture(L.Callback):
        def on_train_start(self, trainer, pl_module):
            seen["step"] = trainer.global_step
            (monitor,) = [cb for cb in trainer.callbacks if isinstance(cb, RolloutMonitor)]
            seen["frames"], seen["episodes"], seen["returns"] = (
                trainer.datamodule.frames,
                monitor.episodes,
                list(monitor.returns),
            )
            seen["carries"] = {
                k: (v.c.clone(), {n: s.clone() for n, s in v.sensitivities.items()})
                for k, v in pl_module._carries.items()
            }
            seen["optimizer"] = copy.deepcopy(trainer.optimizers[0].state_dict())  # live tensors: copy them
            seen["scheduler"] = copy.deepcopy(trainer.lr_scheduler_configs[0].scheduler.state_dict())
            seen["lr"] = trainer.optimizers[0].param_groups[0]["lr"]

    second = model()
    dm = rl.RolloutDataModule(**env)
    t2 = trainer(6, RTRLStrategy(M=M), callbacks=[Capture()])
    t2.fit(second, dm, ckpt_path=tmp_path / "last.ckpt")

    assert seen["step"] == 4 and seen["frames"] == first_dm.frames == 4 * M * 3
    assert seen["episodes"] == first_monitor.episodes > 0 and seen["returns"] == list(first_monitor.returns)
    for name, carry in first._carries.items():
        c, sens = seen["carries"][name]
        torch.testing.assert_close(c, carry.c, rtol=0, atol=0)
        for k, v in carry.sensitivities.items():
            torch.testing.assert_close(sens[k], v, rtol=0, atol=0)
    assert set(seen["carries"]) == {"train", "act"} and seen["carries"]["train"][1]  # RTRL sensitivities included
    for i, state in saved["optimizer_states"][0]["state"].items():
        for k, v in state.items():
            torch.testing.assert_close(seen["optimizer"]["state"][i][k], v, rtol=0, atol=0)
    assert seen["scheduler"]["last_epoch"] == 4 and seen["lr"] == pytest.approx(first.config.lr * (1 - 4 / 10))
    assert t2.global_step == 6 and dm.frames == 6 * M * 3
    assert all(torch.isfinite(p).all() for p in second.parameters())


# -- across devices -----------------------------------------------------------------------------------------------
def _segments_of(m: int):
    def make(epoch: int):
        gen = torch.Generator().manual_seed(epoch)
        for _ in range(24 // m):
            x = torch.randn(m, 3, 2, generator=gen)
            reset = torch.rand(m, 3, generator=gen) < 0.15
            yield Segment(x, reset, x.cumsum(0)[..., :1])

    return make


@pytest.mark.parametrize("m", [M, 1], ids=["M4", "M1"])
@pytest.mark.parametrize(
    "saved_on, resumed_on",
    [pytest.param("cuda", "cpu", marks=needs_cuda), pytest.param("cpu", "cuda", marks=needs_cuda)],
    ids=["gpu-to-cpu", "cpu-to-gpu"],
)
def test_resume_across_devices_restores_the_run_bit_for_bit_in_float64(tmp_path, monkeypatch, saved_on, resumed_on, m):
    """A checkpoint written on a GPU resumes on the CPU and the other way round: the weights and the carried state
    (RTRL's sensitivities; at M = 1 on the CPU, lazily scaled) arrive bit for bit in float64, on the resuming device;
    training then goes on as it does on the saving device (to rounding: the devices' kernels differ)."""
    from onlinerec.gradients import inplace

    monkeypatch.setattr(inplace, "SMALL_CARRY", 0)  # this carry is small: scale it lazily on the CPU all the same
    seen = {}

    class Capture(L.Callback):
        def on_train_start(self, trainer, pl_module):
            carry = pl_module.carry("train")
            seen["device"] = carry.device
            seen["carry"] = copy.deepcopy(carry.to("cpu").state_dict())  # training goes on in place
            seen["weights"] = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}

    def run(device, max_steps, ckpt=None, callbacks=()):
        torch.manual_seed(0)
        model = Regressor()
        t = trainer(
            max_steps,
            RTRLStrategy(M=m),
            precision="64-true",
            accelerator=accelerator(device),
            callbacks=list(callbacks),
        )
        t.fit(model, SegmentStream(_segments_of(m)), ckpt_path=ckpt)
        return model, t

    saved, t = run(saved_on, 6)
    t.save_checkpoint(tmp_path / "saved.ckpt")
    resumed, _ = run(resumed_on, 10, ckpt=tmp_path / "saved.ckpt", callbacks=[Capture()])
    reference, _ = run(saved_on, 10, ckpt=tmp_path / "saved.ckpt")

    assert seen["device"].type == resumed_on
    for name, value in saved.state_dict().items():
        torch.testing.assert_close(seen["weights"][name], value.cpu(), rtol=0, atol=0, msg=name)
    carry = copy.deepcopy(saved.carry("train").to("cpu").state_dict())
    assert ("scale" in carry) == (m == 1 and saved_on == "cpu")  # a lazy scale crosses to the GPU as it is
    for key in ("c", "scale"):
        if key in carry:
            torch.testing.assert_close(seen["carry"][key], carry[key], rtol=0, atol=0, msg=key)
    for name, s in carry["sensitivities"].items():
        torch.testing.assert_close(seen["carry"]["sensitivities"][name], s, rtol=0, atol=0, msg=name)
    for (name, a), b in zip(reference.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(b.cpu(), a.cpu(), rtol=1e-9, atol=1e-12, msg=name)
    assert resumed.carry("train").device.type == resumed_on
