"""Damaged or hostile checkpoint files: every load path names the file, says what is wrong and offers a way out."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from onlinerec import RTRLStrategy, SegmentStream
from onlinerec.training.checkpoint import CorruptCheckpointError, atomic_torch_save, load_checkpoint_file
from tests.helpers import Regressor, quiet_trainer
from tests.training.test_resume import M, segments


@pytest.fixture
def good(tmp_path: Path) -> Path:
    """A real checkpoint of a short RTRL fit."""
    trainer = quiet_trainer(RTRLStrategy(M=M), max_steps=2)
    trainer.fit(Regressor(), SegmentStream(segments))
    path = tmp_path / "good.ckpt"
    trainer.save_checkpoint(path, weights_only=False)
    return path


def damaged(good: Path, kind: str) -> Path:
    data = good.read_bytes()
    path = good.with_name(f"{kind}.ckpt")
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(bytes(range(256)) * 40)
    elif kind == "text":
        path.write_text("epoch: 3\nthis is not a checkpoint\n" * 20)
    elif kind == "bitflip":  # one flipped byte inside a stored tensor: torch.load alone would accept it
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(flipped))
    return path


EXPECTED = {
    "truncated": "is truncated or damaged",
    "empty": "is empty",
    "garbage": "is not a checkpoint: it holds data",
    "text": "is not a checkpoint: it holds text",
    "bitflip": "is damaged: the checksum",
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_every_load_path_names_the_file_and_the_damage(good, kind):
    bad = damaged(good, kind)
    pattern = rf"checkpoint {bad}.* {EXPECTED[kind]}.*Start fresh.*good\.ckpt"  # names the file, the damage, a way out
    with pytest.raises(CorruptCheckpointError, match=pattern):
        load_checkpoint_file(bad)
    with pytest.raises(CorruptCheckpointError, match=EXPECTED[kind]):  # Trainer resume (the strategy's checkpoint IO)
        quiet_trainer(RTRLStrategy(M=M), max_steps=3).fit(Regressor(), SegmentStream(segments), ckpt_path=bad)
    with pytest.raises(CorruptCheckpointError, match=EXPECTED[kind]):
        Regressor.load_from_checkpoint(bad)


def test_a_pickle_that_would_run_code_is_refused_and_never_run(tmp_path, good):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "payload": Payload()}, evil)  # a valid archive holding a code-running object
    with pytest.raises(pickle.UnpicklingError, match=r"holds objects other than tensors.*If you trust this file"):
        load_checkpoint_file(evil)
    raw = tmp_path / "raw.ckpt"
    raw.write_bytes(pickle.dumps(Payload()))  # a bare pickle, not even a checkpoint archive
    with pytest.raises(CorruptCheckpointError, match="is not a checkpoint") as err:
        load_checkpoint_file(raw)
    assert "weights_only=False" not in str(err.value)  # the risky advice is only for valid checkpoints
    assert not marker.exists()


def test_the_writer_checks_what_it_wrote_before_replacing_the_last_good_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"step": 1}, path)

    def corrupt_save(obj, f, *args, **kwargs):  # a disk that garbles the write
        f.write(b"PK\x03\x04" + b"\x00" * 64)

    monkeypatch.setattr(torch, "save", corrupt_save)
    with pytest.raises(CorruptCheckpointError):
        atomic_torch_save({"step": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint_file(path)["step"] == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
