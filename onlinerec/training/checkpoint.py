"""Checkpoint files: atomic writes, weights-only loading, and the carried state of every rank.

:class:`AtomicCheckpointIO` is the default ``checkpoint_io`` of the onlinerec strategies (``RTRLStrategy``,
``TBPTTStrategy``, ``SnAPStrategy``). It differs from Lightning's ``TorchCheckpointIO`` in two ways:

- **Atomic, durable writes.** A checkpoint is written to a temporary file in the same directory, flushed and
  ``fsync``-ed, then moved over the target with ``os.replace`` (atomic on POSIX and Windows), and the directory is
  fsync-ed. A crash or exception midway leaves the previous file at that path untouched and no partial file
  under the checkpoint's name. Remote paths (``s3://`` …) fall back to Lightning's fsspec transaction.
- **Weights-only loading by default.** ``load_checkpoint`` passes ``weights_only=True`` to ``torch.load`` unless
  the caller asks otherwise, so resuming from a checkpoint never runs pickled code. Everything onlinerec stores
  (parameters, optimizer and scheduler state, carried state, loader position) is plain tensors, numbers and
  strings. A checkpoint that holds other objects (for instance hyper-parameters that are class instances) is
  refused with a message; if you trust the file, resume with ``trainer.fit(..., weights_only=False)``.
- **Damage is detected, and named.** ``torch.save`` writes a zip archive that stores a CRC-32 of every entry. The
  writer reads the new file back and checks them before it replaces the previous checkpoint, and every load path
  (Trainer resume, ``load_from_checkpoint`` of onlinerec modules, the RL runner, ``load_stem``) checks them again:
  an empty, truncated or bit-flipped file, or one that is not a checkpoint at all, raises
  :class:`CorruptCheckpointError` naming the file, what is wrong with it, and the ways out (start fresh, or resume
  from another checkpoint in the same folder). Checking costs one read of the file (about 1 GB/s).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

__all__ = [
    "AtomicCheckpointIO",
    "CorruptCheckpointError",
    "atomic_torch_save",
    "drop_carried_state",
    "load_checkpoint_file",
    "peek_checkpoint",
    "verify_checkpoint_file",
]

CARRY_KEY = "onlinerec"
"""Top-level checkpoint key under which OnlineRecurrentModule stores carried state."""


def _is_local(path: _PATH) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


def _fsync_dir(directory: str) -> None:
    # Make the rename itself durable. Not every platform/filesystem lets us open a directory; that is fine.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class CorruptCheckpointError(ValueError):
    """A checkpoint file is empty, truncated, damaged (a CRC mismatch) or not a checkpoint at all."""


def verify_checkpoint_file(path: _PATH) -> None:
    """Raise :class:`CorruptCheckpointError` unless ``path`` is a complete, undamaged ``torch.save`` archive.

    Checks that the file exists and is not empty, that it is a zip archive with its central directory (a truncated
    file has none), and the CRC-32 of every entry (a flipped byte anywhere in the weights changes it).
    """
    fs = get_filesystem(path)
    if not fs.exists(path):
        raise FileNotFoundError(f"Checkpoint file not found: {path}")
    size = fs.size(path)
    if not size:
        raise CorruptCheckpointError(_corrupt(path, "is empty (0 bytes): the write that produced it never finished"))
    with fs.open(path, "rb") as f:
        head = f.read(4)
        f.seek(0)
        if head != b"PK\x03\x04":
            what = "text" if _looks_like_text(head + f.read(512)) else "data"
            raise CorruptCheckpointError(
                _corrupt(path, f"is not a checkpoint: it holds {what}, not the zip archive torch.save writes")
            )
        try:
            with zipfile.ZipFile(f) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise CorruptCheckpointError(
                _corrupt(path, f"is truncated or damaged ({size:,} bytes; the zip archive is incomplete: {err})")
            ) from None
        if bad is not None:
            raise CorruptCheckpointError(
                _corrupt(path, f"is damaged: the checksum (CRC-32) of its entry {bad!r} does not match")
            )


def _looks_like_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _corrupt(path: _PATH, what: str) -> str:
    siblings = []
    with contextlib.suppress(Exception):
        here = Path(str(path))
        siblings = sorted(p.name for p in here.parent.glob("*.ckpt") if p != here)[:5]
    others = f" Other checkpoints in that folder: {', '.join(siblings)}." if siblings else ""
    return (
        f"checkpoint {path} {what}. It cannot be resumed from. Start fresh (fit without ckpt_path; for `onlinerec rl` or "
        f"`onlinerec stream`, a new --out_dir) or resume from another checkpoint.{others}"
    )


def atomic_torch_save(obj: Any, path: _PATH) -> None:
    """``torch.save(obj, path)`` that never leaves a partial file at ``path``: temp file, fsync, a read-back check of
    every entry's CRC (:func:`verify_checkpoint_file`), then ``os.replace``."""
    path = os.fspath(str(path).removeprefix("file://"))
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        verify_checkpoint_file(tmp)  # a bad disk write must not replace the last good checkpoint
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync_dir(directory)


def load_checkpoint_file(path: _PATH, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
    """``torch.load`` with ``weights_only=True`` unless asked otherwise, after :func:`verify_checkpoint_file`, and a
    clear error when weights-only loading refuses a valid checkpoint."""
    weights_only = True if weights_only is None else weights_only
    verify_checkpoint_file(path)
    fs = get_filesystem(path)
    try:
        with fs.open(path, "rb") as f:
            return torch.load(f, map_location=map_location, weights_only=weights_only)
    except pickle.UnpicklingError as err:
        if not weights_only:
            raise
        raise pickle.UnpicklingError(
            f"{path} holds objects other than tensors and plain containers, so it was not loaded: onlinerec loads "
            "checkpoints with torch.load(weights_only=True) so that a checkpoint cannot run code. If you trust this "
            "file, resume with trainer.fit(..., weights_only=False), or allow the named classes with "
            f"torch.serialization.add_safe_globals([...]). torch said: {err}"
        ) from err


def peek_checkpoint(path: _PATH) -> dict[str, Any]:
    """A checkpoint's contents with its tensors memory-mapped, not read (weights only; local files): a cheap look at
    its hyper-parameters and onlinerec's entries. Check the file first (:func:`verify_checkpoint_file`)."""
    return torch.load(os.fspath(path), map_location="cpu", weights_only=True, mmap=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning ``CheckpointIO`` with crash-safe writes and weights-only loading (see the module docstring).

    The onlinerec strategies use it unless given ``checkpoint_io=`` or a ``CheckpointIO`` plugin.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options; write a custom CheckpointIO to use them.")
        if not _is_local(path):
            super().save_checkpoint(checkpoint, path)
            return
        atomic_torch_save(checkpoint, path)

    @override
    def load_checkpoint(
        self,
        path: _PATH,
        map_location: Callable | Any | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        return load_checkpoint_file(path, map_location=map_location, weights_only=weights_only)


def drop_carried_state(src: _PATH, dst: _PATH | None = None) -> Path:
    """Write a copy of checkpoint ``src`` without onlinerec's carried state (to ``dst``, default ``src`` + ``.nocarry``).

    Use it to resume with a different number of processes: carried state belongs to the streams of each rank and
    cannot be re-dealt, so resuming a checkpoint saved by W processes with W' != W is refused. Without carried state
    every stream starts from a zero state (and, for RTRL/SnAP, zero sensitivities) — as at the start of training.
    """
    ckpt = load_checkpoint_file(src)
    ckpt.pop(CARRY_KEY, None)
    out = Path(f"{src}.nocarry" if dst is None else dst)
    atomic_torch_save(ckpt, out)
    return out
