"""Resuming a run: whether the run folder's checkpoint continues this experiment, and from where.

A run folder holds one experiment. :func:`resume_point` finds its ``checkpoints/last.ckpt`` and refuses a folder whose
``config.json`` differs from the new config in a setting that defines the experiment (:func:`config_changes`; only the
budget and the reporting may change, :data:`RESUMABLE_CHANGES`), unless ``allow_config_change`` is set and the network
is the same; the changes allowed are recorded in ``config_changes.json``, each with the env frames it took effect at
(``[{"frames": 48, "changes": {"M": {"was": 4, "now": 2}}}]``), which the learning curve marks.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Any

from onlinerec.rl.curves import load_curve
from onlinerec.rl.experiment import ExperimentConfig
from onlinerec.rl.r2ac_config import REMOVED_FIELDS

__all__ = ["RESUMABLE_CHANGES", "RunFolderError", "config_changes", "resume_point"]


RESUMABLE_CHANGES = frozenset(
    {
        "total_frames",
        "eval_episodes",
        "eval_envs",
        "eval_greedy",
        "eval_max_steps",
        "checkpoint_every",
        "resume",
        "allow_config_change",
        "log_every",
        "threads",
        "progress",
        "tensorboard",
        "accelerator",
        "devices",
        "loggers",
        "eval_video",
    }
)
"""Fields a resumed run may change (its budget and its reporting); every other field defines the experiment."""


def flat_settings(config: dict[str, Any], groups: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    """``config`` with the settings of each group in ``groups`` (``r2ac``, ``stream``) under their dotted names
    (``r2ac.lr``), so that a comparison names the one setting that differs rather than the whole group."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and key in groups:
            out.update(flat_settings(value, groups, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(stored: dict[str, Any], cfg: ExperimentConfig) -> dict[str, tuple[Any, Any]]:
    """``{field: (stored value, new value)}`` for the fields that define the experiment and differ.
    (``r2ac.total_updates`` follows ``total_frames``, which may change, so it is not compared.) A field the stored
    config lacks was added since that run started, which therefore ran with its default (every new field's default
    keeps the old behaviour). A removed field (:data:`~onlinerec.rl.r2ac_config.REMOVED_FIELDS`) stored as false ran
    as R2AC runs now, so it is no change."""

    def flat(config: Any) -> dict[str, Any]:
        return flat_settings(json.loads(json.dumps(config, default=str)), ("r2ac",))

    old, new = {**flat(asdict(ExperimentConfig())), **flat(stored)}, flat(asdict(cfg))
    for name in REMOVED_FIELDS:
        if old.get(f"r2ac.{name}") is False:
            del old[f"r2ac.{name}"]
    skip = RESUMABLE_CHANGES | {"r2ac.total_updates"}
    return {
        k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if k not in skip and old.get(k) != new.get(k)
    }


class RunFolderError(ValueError):
    """The run's ``out_dir`` holds another experiment: resuming would mix two runs' results."""


_ARCHITECTURE = {
    "cell", "cell_kwargs", "layers", "hidden_size", "stem", "fc_size", "head_sizes", "core_norm",
    "separate_critic", "r2ac.reward_norm", "r2ac.obs_norm",
}  # fmt: skip
"""Config keys that change the network's parameters or buffers (the normalisers' statistics): a checkpoint of
another value cannot be continued."""


def _cli_value(value: Any) -> str:
    """``value`` as the command line takes it back: strings as they are, anything else as (quoted) JSON."""
    return value if isinstance(value, str) else shlex.quote(json.dumps(value))


def _frames_at(checkpoint: Path, out: Path) -> int | None:
    """The env frames a checkpoint was saved at (where the learning curve marks a change of settings)."""
    from onlinerec.training.checkpoint import peek_checkpoint

    try:
        return int(peek_checkpoint(checkpoint)["RolloutDataModule"]["frames"])
    except Exception:  # an older checkpoint's layout, or none readable: the last logged count instead
        frames = load_curve(out, "frames")[1]
        return int(max(frames)) if frames else None


def resume_point(cfg: ExperimentConfig, out: Path) -> Path | None:
    """The checkpoint to resume from (None: start fresh), after refusing what would mix or overwrite experiments."""
    from onlinerec.training.checkpoint import CorruptCheckpointError, verify_checkpoint_file

    last = out / "checkpoints" / "last.ckpt"
    if not last.exists():
        return None
    if not cfg.resume:
        raise FileExistsError(
            f"{out} already holds a run ({last.relative_to(out)}); --resume false would train from scratch and overwrite "
            "its results. Choose another --out_dir, or delete that folder to start this run again."
        )
    try:
        verify_checkpoint_file(last)
    except CorruptCheckpointError as err:
        what = str(err).split(". It cannot be resumed from", 1)[0]  # the file and what is wrong with it
        aside, k = out.with_name(f"{out.name}-damaged"), 1
        while aside.exists():  # a free name, so that mv renames the folder rather than moving it into another
            k += 1
            aside = out.with_name(f"{out.name}-damaged-{k}")
        raise CorruptCheckpointError(
            f"{what}: this run cannot be resumed from it. To start it over, move its folder aside and run the same "
            f"command again (mv {shlex.quote(str(out))} {shlex.quote(str(aside))}), or give the run a new --out_dir."
        ) from None
    stored = out / "config.json"
    if stored.exists():
        changes = config_changes(json.loads(stored.read_text()), cfg)
        reshaped = sorted(k for k in changes if k in _ARCHITECTURE or k.split(".")[0] in _ARCHITECTURE)
        if reshaped:  # refused with or without --allow_config_change: the checkpoint's weights cannot be loaded
            trained_with = " ".join(f"--{k} {_cli_value(changes[k][0])}" for k in reshaped)
            raise RunFolderError(
                f"{out} holds a run whose network differs from this one ({', '.join(reshaped)}): its checkpoint's "
                "weights do not fit, so it cannot be continued with these settings, not even with "
                "--allow_config_change (that is for training settings such as M, lr or total_frames). To continue "
                f"it, give back what it was trained with ({trained_with}); to start this run, give it its own "
                "--out_dir."
            )
        if changes and not cfg.allow_config_change:
            listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in ((k, *v) for k, v in changes.items()))
            raise RunFolderError(
                f"{out} holds a different experiment, so it is not resumed ({listed}). Give this run its own "
                "--out_dir (the default folder name already contains env, method, cell, M and seed), or pass "
                "--allow_config_change true to continue that run with the new settings."
            )
        if changes:
            log = out / "config_changes.json"
            history = json.loads(log.read_text()) if log.exists() else []
            history.append(
                {"frames": _frames_at(last, out), "changes": {k: {"was": a, "now": b} for k, (a, b) in changes.items()}}
            )
            log.write_text(json.dumps(history, indent=2, default=str))
    return last
