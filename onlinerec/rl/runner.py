"""``onlinerec rl``: build and run one R2AC experiment from its :class:`~onlinerec.rl.experiment.ExperimentConfig`.

:func:`build` makes the agent, the rollouts and the strategy; :func:`run_experiment` trains them with Lightning (rich
progress, CSV/TensorBoard and other loggers, checkpoints, resume), evaluates greedily and writes the learning curve;
:func:`main` is the command line. The packaged examples (``examples/atari.py`` ...) are thin scripts that pick a YAML
and call :func:`main`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from onlinerec.rl.curves import plot_learning_curves, random_policy_return, setting_changes
from onlinerec.rl.experiment import ConfigError, ExperimentConfig, parse_experiment
from onlinerec.rl.r2ac_config import R2ACConfig
from onlinerec.rl.resume import RunFolderError, resume_point

__all__ = [
    "build",
    "load_stem",
    "main",
    "make_logger",
    "missing_gymnasium",
    "plot_learning_curve",
    "run_experiment",
    "run_reporting_usage_errors",
]


def _strategy(cfg: ExperimentConfig):
    from onlinerec.training.strategies import make_strategy

    return make_strategy(cfg.method, M=cfg.M)


def build(cfg: ExperimentConfig):
    """(model, datamodule, strategy, number of optimiser steps) for a config: one step per segment, or
    ``r2ac.epochs * r2ac.minibatches`` (Lightning's ``max_steps`` and the LR schedule count optimiser steps)."""
    from onlinerec.rl.datamodule import RolloutDataModule
    from onlinerec.rl.r2ac import R2AC

    dm = RolloutDataModule(
        cfg.env, num_envs=cfg.num_envs, seed=cfg.seed, env_kwargs=cfg.env_kwargs, async_actor=cfg.async_actor
    )
    obs_space, action_space, repeat = dm.spaces()
    segments = max(1, math.ceil(float(cfg.total_frames) / (cfg.M * cfg.num_envs * repeat)))
    updates = segments * cfg.r2ac.passes
    r2ac = R2ACConfig(**{**asdict(cfg.r2ac), "total_updates": cfg.r2ac.total_updates or updates})
    cell_kwargs = dict(cfg.cell_kwargs)
    if cfg.layers is not None and cfg.cell is not None:  # make_cell builds the Stack (kept in the checkpoint's kwargs)
        cell_kwargs["layers"] = cfg.layers
    model = R2AC.from_spaces(
        obs_space,
        action_space,
        cell=cfg.cell,
        hidden_size=cfg.hidden_size,
        stem=cfg.stem,
        fc_size=cfg.fc_size,
        config=r2ac,
        cell_kwargs=cell_kwargs,
        head_sizes=cfg.head_sizes,
        core_norm=cfg.core_norm,
        separate_critic=cfg.separate_critic,
    )
    if cfg.stem_checkpoint:
        load_stem(model, cfg.stem_checkpoint)
    if cfg.freeze_stem:
        for stem in (model.stem, model.critic_stem):
            if stem is not None:
                stem.requires_grad_(False)
    return model, dm, _strategy(cfg), updates


def load_stem(model, path: str | Path) -> None:
    """Copy the ``stem.*`` weights of an R2AC checkpoint into ``model`` (paper: DMLab pre-trained vision stem)."""
    from onlinerec.training.checkpoint import load_checkpoint_file

    state = load_checkpoint_file(path, map_location="cpu")["state_dict"]  # weights only: a file cannot run code
    stem = {k[len("stem.") :]: v for k, v in state.items() if k.startswith("stem.")}
    if not stem:
        raise ValueError(f"{path} holds no stem.* weights.")
    model.stem.load_state_dict(stem)
    if model.critic_stem is not None:  # separate_critic: the critic's stem starts from the same weights
        model.critic_stem.load_state_dict(stem)


def run_experiment(cfg: ExperimentConfig) -> dict[str, Any]:
    """Train, evaluate greedily, write ``eval.json`` and ``learning_curve.png`` under ``cfg.out_dir``."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from onlinerec.rl.envs import make_vector_env, run_env_seed
    from onlinerec.rl.monitor import ProgressLinesCallback
    from onlinerec.training import StepProgressBar

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    L.seed_everything(cfg.seed, verbose=False)
    out = cfg.run_dir
    ckpt_path = resume_point(cfg, out)
    try:  # before anything is written: settings that build no agent for this env leave no folder behind
        model, dm, strategy, updates = build(cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2, default=str))

    loggers: list[Any] = [CSVLogger(out, name="csv")]  # csv/version_<k>/metrics.csv: one per (resumed) run
    if cfg.tensorboard:
        try:
            loggers.append(TensorBoardLogger(out, name="tensorboard"))
        except ModuleNotFoundError:
            pass
    loggers += [make_logger(spec, out) for spec in cfg.loggers]
    ckpt_dir = out / "checkpoints"
    callbacks: list[Any] = [
        ModelCheckpoint(
            dirpath=ckpt_dir,
            save_last=True,
            save_top_k=0,
            every_n_train_steps=cfg.checkpoint_every * cfg.r2ac.passes,  # global_step counts optimiser steps
        )
    ]
    bar = cfg.progress and sys.stdout.isatty()  # a live bar on a terminal; plain lines in a log file
    if bar:
        callbacks.append(StepProgressBar(f"R2AC {cfg.method}(M={cfg.M}) segments", leave=True))
    elif cfg.progress:
        callbacks.append(ProgressLinesCallback(total_frames=cfg.total_frames))
    trainer = L.Trainer(
        strategy=strategy,
        accelerator=cfg.accelerator,
        precision=cfg.precision,
        devices=cfg.devices,
        max_steps=updates,
        logger=loggers,
        callbacks=callbacks,
        log_every_n_steps=cfg.log_every,
        enable_progress_bar=bar,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    start = time.perf_counter()
    trainer.fit(model, dm, ckpt_path=None if ckpt_path is None else str(ckpt_path))
    trainer.save_checkpoint(ckpt_dir / "last.ckpt", weights_only=False)  # the full state, so that a resume continues
    result: dict[str, Any] = {
        "frames": dm.frames,
        "updates": trainer.global_step,
        "train_seconds": time.perf_counter() - start,
    }
    if "return" in trainer.callback_metrics:
        result["train_return"] = float(trainer.callback_metrics["return"])

    if cfg.eval_episodes > 0:
        eval_seed = run_env_seed(cfg.seed, purpose="eval")  # streams of their own, never the training ones
        env = make_vector_env(cfg.env, cfg.eval_envs, seed=eval_seed, **_eval_env_kwargs(cfg))
        try:
            result["eval"] = model.evaluate(
                env,
                cfg.eval_episodes,
                greedy=cfg.eval_greedy,
                max_steps=cfg.eval_max_steps,
                video=str(out / "eval.gif") if cfg.eval_video else None,
            )
        finally:
            env.close()
    (out / "eval.json").write_text(json.dumps(result, indent=2))
    try:
        plot_learning_curve(cfg, out)
        written = "logs, checkpoints and learning_curve.png"
    except ValueError:  # no return logged yet (no episode finished, or fewer segments than log_every): nothing to plot
        written = (
            f"logs and checkpoints (no learning_curve.png: no episode return was logged; lower --log_every, "
            f"{cfg.log_every} segments now, or train longer)"
        )
    summary = f"frames {result['frames']:,}  updates {result['updates']}"
    if "eval" in result:
        ev, kind = result["eval"], "greedy" if cfg.eval_greedy else "sampled"
        if ev["returns"]:
            summary += f"  {kind} eval over {len(ev['returns'])} episodes: {ev['mean']:.3f} ± {ev['std']:.3f}"
        if ev["truncated"]:
            summary += (
                f"\n{'no' if not ev['returns'] else 'only ' + str(len(ev['returns']))} evaluation episode(s) of "
                f"{cfg.eval_episodes} finished within eval_max_steps={cfg.eval_max_steps} agent steps: raise "
                "--eval_max_steps" + (" (or --eval_greedy false: a greedy policy can stall)" if cfg.eval_greedy else "")
            )
    print(summary, f"\n{written} in {out}", flush=True)
    return result


def plot_learning_curve(cfg: ExperimentConfig, out: Path) -> Path:
    """``learning_curve.png`` of the run in ``out``: its mean return against env frames, the random policy's return
    where it is known (chance on the T-maze), and a dotted line, with the change, where a resume changed the
    settings (``--allow_config_change``); the label names every method the run trained with."""
    changes = setting_changes(out)
    methods = [cfg.method]
    if any("method" in c for _, c in changes):
        methods = [next(c["method"][0] for _, c in changes if "method" in c)]
        methods += [c["method"][1] for _, c in changes if "method" in c]
    marks = [(f, ", ".join(f"{k}: {a} → {b}" for k, (a, b) in c.items())) for f, c in changes if f is not None]
    chance = random_policy_return(cfg.env, cfg.env_kwargs)
    return plot_learning_curves(
        {" → ".join(methods): [out]},
        out / "learning_curve.png",
        title=f"R2AC on {cfg.env}",
        baseline=chance,
        baseline_label=f"chance: random policy ({chance:.3g})" if chance is not None else "",
        marks=marks,
    )


def _eval_env_kwargs(cfg: ExperimentConfig) -> dict[str, Any]:
    """``env_kwargs`` with ``eval_env_kwargs`` over them; with ``eval_video``, gymnasium and MiniGrid ids also get
    ``render_mode="rgb_array"`` unless the config sets one."""
    kwargs = {**cfg.env_kwargs, **cfg.eval_env_kwargs}
    if cfg.eval_video and isinstance(cfg.env, str):
        from onlinerec.rl.envs import parse_env_id

        try:
            family = parse_env_id(cfg.env)[0].name
        except ValueError:
            family = ""
        if family in ("gymnasium", "minigrid"):
            kwargs.setdefault("render_mode", "rgb_array")
    return kwargs


def make_logger(spec: Any, save_dir: str | Path) -> Any:
    """A Lightning logger from ``{class_path, init_args}`` (LightningCLI's form) or a class path.

    A bare class name is looked up in ``lightning.pytorch.loggers``. Where the class takes ``save_dir`` and
    ``init_args`` do not set it, it is ``save_dir``; an MLflow logger given neither ``tracking_uri`` nor ``save_dir``
    writes to ``sqlite:///<save_dir>/mlflow.db`` (MLflow 3 refuses its old file store by default). Missing packages
    (``wandb``, ``mlflow``) raise the logger's own ``ModuleNotFoundError``, which names the install command.
    """
    import importlib
    import inspect

    from lightning.pytorch.loggers import Logger

    if isinstance(spec, str):
        spec = {"class_path": spec}
    if not isinstance(spec, dict) or "class_path" not in spec:
        raise ValueError(f"a logger is {{class_path: ..., init_args: {{...}}}} or a class path; got {spec!r}.")
    unknown = set(spec) - {"class_path", "init_args"}
    if unknown:
        raise ValueError(f"a logger spec has only class_path and init_args; got also {sorted(unknown)}.")
    path = str(spec["class_path"])
    module_name, _, name = path.rpartition(".")
    module = importlib.import_module(module_name or "lightning.pytorch.loggers")
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Logger)):
        raise ValueError(f"{path!r} is not a Lightning logger class (lightning.pytorch.loggers.Logger).")
    init_args = dict(spec.get("init_args") or {})
    params = inspect.signature(cls.__init__).parameters
    if "tracking_uri" in params and not {"tracking_uri", "save_dir"} & set(init_args):  # MLflow
        init_args["tracking_uri"] = f"sqlite:///{Path(save_dir).resolve() / 'mlflow.db'}"
    elif "save_dir" in params and "save_dir" not in init_args:
        init_args["save_dir"] = str(save_dir)
    return cls(**init_args)


EXTRAS = {
    "ALE/": ("atari", "Atari: gymnasium and ale-py"),
    "procgen:": ("procgen", "ProcGen: gymnasium and procgen-mirror"),
    "dmlab:": ("dmlab", "gymnasium; DeepMind Lab itself is built from source, see examples/dmlab.py"),
}
"""The extra that installs gymnasium with an env id's backend, by the id's start; any other id: ``memory``."""


def missing_gymnasium(env: Any) -> str:
    """What to install when gymnasium is missing, for the env id ``env``."""
    extra, what = next(
        (v for k, v in EXTRAS.items() if str(env).startswith(k)),
        ("memory", "gymnasium, POPGym and MiniGrid: the built-in T-maze, popgym:, MiniGrid and gymnasium ids"),
    )
    return (
        f"{env} needs gymnasium, which is not installed (`pip install -e .` installs no env backend): "
        f"pip install 'onlinerec[{extra}]' ({what})."
    )


def main(
    argv: Sequence[str] | None = None,
    default_config: str | Path | None = None,
    description: str = "",
    prog: str = "onlinerec rl",
) -> int:
    """``onlinerec rl``: parse (see :func:`onlinerec.config.parse_config`), run, and turn a missing env backend into a
    clear error. The examples call it with their YAML as ``default_config``."""
    cfg = parse_experiment(argv, default_config, description, prog)
    status, _ = run_reporting_usage_errors(prog, cfg.env, lambda: run_experiment(cfg))
    return status


def run_reporting_usage_errors(prog: str, env: Any, run: Callable[[], Any]) -> tuple[int, Any]:
    """``(0, run())``; or, for a missing env backend, settings that build no agent for the env, or a run folder in
    use, ``(2, None)`` with one line on stderr that says what to do (a command line's usage errors)."""
    try:
        import gymnasium  # noqa: F401  (every env family runs on it; `pip install -e .` leaves it out)
    except ModuleNotFoundError:
        print(f"{prog}: error: {missing_gymnasium(env)}", file=sys.stderr)
        return 2, None
    from onlinerec.rl.envs import MissingBackendError
    from onlinerec.training.checkpoint import CorruptCheckpointError

    try:
        return 0, run()
    except MissingBackendError as err:
        print(f"error: {env} needs a backend that is not installed.\n{err}", file=sys.stderr)
    except (ConfigError, RunFolderError, FileExistsError, CorruptCheckpointError) as err:  # settings or out_dir
        print(f"error: {err}", file=sys.stderr)
    return 2, None
