"""Shared plumbing of the packaged RL examples: a typed experiment config, a YAML/command-line parser, the
Lightning run (rich progress, CSV/TensorBoard logs, checkpoints, resume), greedy evaluation and learning curves.

``python examples/atari.py --game breakout --total_frames 2e5`` and friends are thin wrappers around
:func:`main`. Everything an example needs is a field of :class:`ExperimentConfig`; a YAML file sets any of them
(``--config file.yaml``) and later command-line flags override it (``--r2ac.lr 1e-3``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from onlinerec.rl.r2ac import R2ACConfig

__all__ = ["ExperimentConfig", "load_curve", "main", "parse_config", "plot_learning_curves", "run_experiment"]

METHODS = ("rtrl", "tbptt", "snap", "feedforward")


@dataclass
class ExperimentConfig:
    """One R2AC training run. Frame budgets count env frames (agent steps x action repeat, spec §5.2)."""

    env: str = "memory:tmaze"
    """Env id for ``onlinerec.rl.envs.make_vector_env`` ("ALE/Breakout-v5", "procgen:chaser", "dmlab:rooms_watermaze", ...)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env family (e.g. ``distribution_mode``, ``length``)."""
    eval_env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides of ``env_kwargs`` for the final evaluation (e.g. ProcGen test levels)."""
    num_envs: int = 32
    """B: env streams, i.e. the learner's batch (32 in the paper)."""
    method: str = "rtrl"
    """Gradient method of the core: "rtrl", "tbptt", "snap", or "feedforward" (no recurrent core)."""
    M: int = 50
    """Unroll length: TD horizon, update period and BPTT span (spec §5.1)."""
    total_frames: float = 1e6
    """Training budget in env frames; training runs ``total_frames / (M * num_envs * action_repeat)`` updates."""
    cell: str = "elstm"
    """Cell alias ("elstm", "qrnn", "sru", "felstm")."""
    hidden_size: int = 256
    """N, the cell's width (256 Atari/ProcGen, 512 DMLab)."""
    cell_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra cell arguments, e.g. ``{forget_bias: 1.0}``."""
    stem: str = "impala"
    """Vision stem: "impala" (paper), "nature" (cheaper on CPU), "mlp" (vector observations), "auto"."""
    fc_size: int = 256
    """Width of the stem's output (the core reads fc_size + 1 with the reward)."""
    stem_checkpoint: str | None = None
    """Load the stem's weights from this R2AC checkpoint (the paper's pre-trained DMLab stem) ..."""
    freeze_stem: bool = False
    """... and keep them fixed."""
    r2ac: R2ACConfig = field(default_factory=R2ACConfig)
    """Losses and optimiser (the paper's defaults)."""
    seed: int = 0
    """Seeds torch/numpy and the envs (stream i gets seed + i)."""
    eval_episodes: int = 10
    """Greedy evaluation episodes after training (0: none)."""
    eval_envs: int = 4
    """Parallel envs for the evaluation."""
    eval_greedy: bool = True
    """Evaluate with argmax actions (the paper's protocol); false: sample from the policy. A greedy policy can loop
    forever in a deterministic game (Atari without sticky actions), which sampling avoids."""
    eval_max_steps: int | None = None
    """Cap on evaluation agent steps (per env); the episodes finished by then are reported."""
    out_dir: str = "runs/r2ac"
    """Where logs (CSV, TensorBoard), checkpoints, the learning curve and eval.json go."""
    checkpoint_every: int = 1000
    """Save ``last.ckpt`` every this many updates (and at the end)."""
    resume: bool = True
    """Resume from ``out_dir/checkpoints/last.ckpt`` if it exists."""
    log_every: int = 10
    """Log metrics every this many updates."""
    threads: int | None = None
    """torch.set_num_threads (None: leave torch's default)."""
    progress: bool = True
    """Rich progress bar (frames/s, mean return)."""
    tensorboard: bool = True
    """Also log to TensorBoard (if installed)."""
    accelerator: str = "auto"
    """Lightning accelerator ("cpu", "gpu", "auto")."""


def parse_config(
    argv: Sequence[str] | None = None, default_config: str | Path | None = None, description: str = ""
) -> ExperimentConfig:
    """Parse ``--config file.yaml`` plus field overrides (``--M 5 --r2ac.lr 1e-3``) into an ExperimentConfig."""
    from jsonargparse import ActionConfigFile, ArgumentParser, set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # --help shows each config field's docstring

    parser = ArgumentParser(
        description=description, default_config_files=[str(default_config)] if default_config else None
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML file with any of the fields below.")
    parser.add_class_arguments(ExperimentConfig, as_group=False)
    cfg = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    objs = parser.instantiate_classes(cfg)
    values = {k: v for k, v in vars(objs).items() if k in ExperimentConfig.__dataclass_fields__}
    r2ac = values.get("r2ac")
    if isinstance(r2ac, dict) or r2ac is None:
        values["r2ac"] = R2ACConfig(**(r2ac or {}))
    elif hasattr(r2ac, "__dict__") and not isinstance(r2ac, R2ACConfig):
        values["r2ac"] = R2ACConfig(**vars(r2ac))
    return ExperimentConfig(**values)


def _strategy(cfg: ExperimentConfig):
    from onlinerec import RTRLStrategy, SnAPStrategy, TBPTTStrategy

    if cfg.method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {cfg.method!r}.")
    return {"rtrl": RTRLStrategy, "snap": SnAPStrategy}.get(cfg.method, TBPTTStrategy)(M=cfg.M)


def build(cfg: ExperimentConfig):
    """(model, datamodule, strategy, number of updates) for a config."""
    from onlinerec.rl.r2ac import R2AC
    from onlinerec.rl.rollout import RolloutDataModule

    dm = RolloutDataModule(cfg.env, num_envs=cfg.num_envs, seed=cfg.seed, env_kwargs=cfg.env_kwargs)
    obs_shape, num_actions, repeat = dm.env_spaces()
    updates = max(1, math.ceil(float(cfg.total_frames) / (cfg.M * cfg.num_envs * repeat)))
    r2ac = R2ACConfig(**{**asdict(cfg.r2ac), "total_updates": cfg.r2ac.total_updates or updates})
    model = R2AC(
        num_actions,
        obs_shape,
        cell=None if cfg.method == "feedforward" else cfg.cell,
        hidden_size=cfg.hidden_size,
        stem=cfg.stem,
        fc_size=cfg.fc_size,
        config=r2ac,
        cell_kwargs=cfg.cell_kwargs,
    )
    if cfg.stem_checkpoint:
        load_stem(model, cfg.stem_checkpoint)
    if cfg.freeze_stem:
        model.stem.requires_grad_(False)
    return model, dm, _strategy(cfg), updates


def load_stem(model, path: str | Path) -> None:
    """Copy the ``stem.*`` weights of an R2AC checkpoint into ``model`` (paper: DMLab pre-trained vision stem)."""
    from onlinerec.training.checkpoint import load_checkpoint_file

    state = load_checkpoint_file(path, map_location="cpu")["state_dict"]  # weights only: a file cannot run code
    stem = {k[len("stem.") :]: v for k, v in state.items() if k.startswith("stem.")}
    if not stem:
        raise ValueError(f"{path} holds no stem.* weights.")
    model.stem.load_state_dict(stem)


def run_experiment(cfg: ExperimentConfig) -> dict[str, Any]:
    """Train, evaluate greedily, write ``eval.json`` and ``learning_curve.png`` under ``cfg.out_dir``."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar, TQDMProgressBar
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from onlinerec.rl.envs import make_vector_env

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    for noise in (
        ".*IterableDataset. has .__len__. defined.*",
        ".*defined a .validation_step. but have no .val_dataloader.*",
    ):
        warnings.filterwarnings("ignore", message=noise)  # the rollout loader is sized on purpose (no prefetch)
    L.seed_everything(cfg.seed, verbose=False)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2, default=str))
    model, dm, strategy, updates = build(cfg)

    loggers: list[Any] = [CSVLogger(out, name="csv")]  # csv/version_<k>/metrics.csv: one per (resumed) run
    if cfg.tensorboard:
        try:
            loggers.append(TensorBoardLogger(out, name="tensorboard"))
        except ModuleNotFoundError:
            pass
    ckpt_dir = out / "checkpoints"
    callbacks: list[Any] = [
        ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=0, every_n_train_steps=cfg.checkpoint_every)
    ]
    if cfg.progress:
        try:
            callbacks.append(RichProgressBar(leave=True))
        except ModuleNotFoundError:
            callbacks.append(TQDMProgressBar())
    trainer = L.Trainer(
        strategy=strategy,
        accelerator=cfg.accelerator,
        devices=1,
        max_steps=updates,
        logger=loggers,
        callbacks=callbacks,
        log_every_n_steps=cfg.log_every,
        enable_progress_bar=cfg.progress,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    last = ckpt_dir / "last.ckpt"
    start = time.perf_counter()
    trainer.fit(model, dm, ckpt_path=str(last) if cfg.resume and last.exists() else None)
    trainer.save_checkpoint(last)
    result: dict[str, Any] = {
        "frames": model.frames,
        "updates": trainer.global_step,
        "train_seconds": time.perf_counter() - start,
    }
    if "return" in trainer.callback_metrics:
        result["train_return"] = float(trainer.callback_metrics["return"])

    if cfg.eval_episodes > 0:
        env = make_vector_env(
            cfg.env, cfg.eval_envs, seed=cfg.seed + 10_000, **{**cfg.env_kwargs, **cfg.eval_env_kwargs}
        )
        try:
            result["eval"] = model.evaluate(
                env, cfg.eval_episodes, greedy=cfg.eval_greedy, max_steps=cfg.eval_max_steps
            )
        finally:
            env.close()
    (out / "eval.json").write_text(json.dumps(result, indent=2))
    try:
        plot_learning_curves({cfg.method: [out]}, out / "learning_curve.png", title=f"R2AC on {cfg.env}")
    except ValueError:
        pass  # no episode finished yet: nothing to plot
    summary = f"frames {result['frames']:,}  updates {result['updates']}"
    if "eval" in result:
        ev = result["eval"]
        summary += f"  {'greedy' if cfg.eval_greedy else 'sampled'} eval over {len(ev['returns'])} episodes: {ev['mean']:.3f} ± {ev['std']:.3f}"
    print(summary, f"\nlogs, checkpoints and learning_curve.png in {out}", flush=True)
    return result


def main(argv: Sequence[str] | None = None, default_config: str | Path | None = None, description: str = "") -> int:
    """Entry point of the examples: parse, run, and turn a missing env backend into a clear error."""
    from onlinerec.rl.envs import MissingBackendError

    cfg = parse_config(argv, default_config, description)
    try:
        run_experiment(cfg)
    except MissingBackendError as err:
        print(f"error: {cfg.env} needs a backend that is not installed.\n{err}", file=sys.stderr)
        return 2
    return 0


# -- learning curves ---------------------------------------------------------------------------------------
def load_curve(run_dir: str | Path, metric: str = "return") -> tuple[list[float], list[float]]:
    """(frames, metric) pairs logged by a run's CSVLogger (every ``metrics.csv`` under ``run_dir``: a resumed run
    adds a new version), sorted by frames."""
    import csv

    pairs = []
    for path in sorted(Path(run_dir).rglob("metrics.csv")):
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                f, v = row.get("frames", ""), row.get(metric, "")
                if f not in ("", None) and v not in ("", None):
                    pairs.append((float(f), float(v)))
    pairs.sort()
    return [f for f, _ in pairs], [v for _, v in pairs]


def plot_learning_curves(
    runs: dict[str, Sequence[str | Path]],
    path: str | Path,
    title: str = "",
    metric: str = "return",
    baseline: float | None = None,
) -> Path:
    """One curve per label (mean over its runs, with min-max band when there are several) of ``metric`` vs frames."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    plotted = False
    for label, dirs in runs.items():
        curves = [load_curve(d, metric) for d in dirs]
        curves = [(np.asarray(f), np.asarray(v)) for f, v in curves if len(f)]
        if not curves:
            continue
        grid = np.linspace(max(c[0][0] for c in curves), min(c[0][-1] for c in curves), 200)
        ys = np.stack([np.interp(grid, f, v) for f, v in curves])
        line = ax.plot(grid, ys.mean(0), label=f"{label} ({len(curves)} run{'s' if len(curves) > 1 else ''})")[0]
        if len(curves) > 1:
            ax.fill_between(grid, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2)
        plotted = True
    if not plotted:
        plt.close(fig)
        raise ValueError("no run has logged episode returns yet")
    if baseline is not None:
        ax.axhline(baseline, color="gray", linestyle="--", label="random policy")
    ax.set_xlabel("env frames")
    ax.set_ylabel(f"mean episode {metric}")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
