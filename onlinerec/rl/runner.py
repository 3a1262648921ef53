"""``onlinerec rl``: one R2AC experiment from a typed config: the Lightning run (rich progress, CSV/TensorBoard logs,
checkpoints, resume), greedy evaluation and learning curves.

Everything a run needs is a field of :class:`ExperimentConfig`; a YAML file sets any of them (``onlinerec rl --config
examples/configs/memory_tmaze.yaml``) and later options override it (``--r2ac.lr 1e-3``). The packaged examples
(``examples/atari.py`` ...) are thin scripts that pick a YAML and call :func:`main`.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from onlinerec.gradients import METHODS
from onlinerec.rl.r2ac import R2ACConfig

__all__ = [
    "ExperimentConfig",
    "load_curve",
    "main",
    "make_logger",
    "parse_experiment",
    "plot_learning_curves",
    "run_experiment",
]


@dataclass
class ExperimentConfig:
    """One R2AC training run. Frame budgets count env frames (agent steps x action repeat; docs/r2ac.md#the-papers-settings)."""

    env: str = "memory:tmaze"
    """Env id for ``onlinerec.rl.envs.make_vector_env`` ("ALE/Breakout-v5", "procgen:chaser", "dmlab:rooms_watermaze",
    "gymnasium:CartPoleNoVel-v1", "factory:mypackage.envs.make_env", ...; docs/envs.md)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env family (e.g. ``distribution_mode``, ``length``), and ``wrappers`` /
    ``vector_wrappers``: lists of ``{class_path: ..., init_args: {...}}`` applied to each env / to the vector env."""
    eval_env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides of ``env_kwargs`` for the final evaluation (e.g. ProcGen test levels)."""
    num_envs: int = 32
    """B: env streams, i.e. the learner's batch (32 in the paper)."""
    method: str = "rtrl"
    """Gradient method of the recurrent core: a name in ``onlinerec.gradients.METHODS`` ("rtrl", "tbptt", "snap")."""
    M: int = 50
    """Unroll length: TD horizon, update period and BPTT span (docs/r2ac.md#the-algorithm)."""
    total_frames: float = 1e6
    """Training budget in env frames; training runs ``total_frames / (M * num_envs * action_repeat)`` segments, each one
    update (``r2ac.epochs * r2ac.minibatches`` optimiser steps with several passes per segment)."""
    cell: str | list[str] | None = "elstm"
    """Recurrent cell: a name in ``onlinerec.cells.CELLS`` (element-wise, for every method: "elstm", "qrnn", "sru",
    "lru", "mingru", "minlstm", "indrnn"; fully recurrent, for snap and tbptt only: "felstm", "lstm", "gru") or a class
    path; a list of them for a stack of different cells, bottom first (``--cell '[lru, mingru]'``, each layer's
    arguments in ``cell_kwargs``' ``layer_kwargs``); ``none`` (null) for the feed-forward baseline (no recurrent core)."""
    layers: int | None = None
    """Stacked layers of the cell (``onlinerec.cells.Stack``, each with its own carry; docs/concepts.md#stacked-layers);
    None: one layer. ``residual`` and ``norm`` of the stack go in ``cell_kwargs``."""
    hidden_size: int = 256
    """N, the cell's width (256 Atari/ProcGen, 512 DMLab); per layer for a stack."""
    cell_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra cell arguments (every layer of a stack gets them), e.g. ``{forget_bias: 1.0}``; for a stack also
    ``{residual: true, norm: rms}`` (``--layers 4 --cell_kwargs '{residual: true, norm: rms}'``); for a list of cells
    one mapping per layer in ``layer_kwargs`` (``{norm: layer, layer_kwargs: [{slow_fraction: 0.5}, {}]}``)."""
    stem: str = "impala"
    """Vision stem: "impala" (paper), "nature" (cheaper on CPU), "mlp" (vector observations), "grid" (MiniGrid's
    symbolic view, each cell's object, colour and state one-hot), "auto"."""
    fc_size: int = 256
    """Width of the stem's output (the core reads fc_size + 1 with the reward)."""
    head_sizes: list[int] = field(default_factory=list)
    """Widths of a tanh MLP before the policy head and of another before the value head (sb3's recurrent policies:
    [64, 64]); [] (the paper's): linear heads on the core's output."""
    core_norm: bool = False
    """LayerNorm (with its affine parameters) on the core's output before both heads. For linear-recurrent cells (LRU,
    minGRU, ...): their outputs are unbounded and can grow until the policy is deterministic; False: the paper's."""
    separate_critic: bool = False
    """The value head reads a core of its own, with its own stem, built like the policy's (RecurrentPPO's default: an
    LSTM each); both learn by the run's gradient method. The value loss then shapes no parameter of the policy, so
    ``r2ac.baseline_cost`` weighs the critic alone. False: the paper's shared core."""
    stem_checkpoint: str | None = None
    """Load the stem's weights from this R2AC checkpoint (the paper's pre-trained DMLab stem) ..."""
    freeze_stem: bool = False
    """... and keep them fixed."""
    r2ac: R2ACConfig = field(default_factory=R2ACConfig)
    """Losses and optimiser (the paper's defaults)."""
    seed: int = 0
    """Seeds torch/numpy and the envs (0 to 2**32 - 1): training and evaluation streams are derived from it with
    ``numpy.random.SeedSequence`` (``onlinerec.rl.envs.run_env_seed``), so runs with different seeds share no stream."""
    eval_episodes: int = 10
    """Greedy evaluation episodes after training (0: none)."""
    eval_envs: int = 4
    """Parallel envs for the evaluation."""
    eval_greedy: bool = True
    """Evaluate with argmax actions (the paper's protocol); false: sample from the policy. A greedy policy can loop
    forever in a deterministic game (Atari without sticky actions), which sampling avoids."""
    eval_max_steps: int | None = None
    """Cap on evaluation agent steps (per env); the episodes finished by then are reported."""
    out_dir: str = "runs/{env}/{method}-{cell}-M{M}-seed{seed}"
    """Where logs (CSV, TensorBoard), checkpoints, the learning curve, config.json and eval.json go. ``{field}``
    placeholders take the config's values (``{env}`` with ``/`` and ``:`` as ``_``, ``{cell}`` "none" for the
    feed-forward baseline), so runs that differ in them never share a folder."""
    checkpoint_every: int = 1000
    """Save ``last.ckpt`` every this many segments (updates of the paper's one-pass R2AC; and at the end)."""
    resume: bool = True
    """Continue the run in ``out_dir`` from its ``checkpoints/last.ckpt`` if there is one, provided it is the same
    experiment (config.json: only budgets and reporting may change). False refuses a folder that already holds a run,
    rather than overwriting it."""
    allow_config_change: bool = False
    """Resume even though settings that define the experiment changed (recorded in config_changes.json)."""
    log_every: int = 10
    """Log metrics every this many segments."""
    async_actor: bool = False
    """Act on a background thread: collect the next segment while the learner updates on the current one, with a copy
    of the weights one update old (V-trace corrects for the lag; ``RolloutDataModule(async_actor=True)``). About 1.5x
    frames/s on an idle 2-core machine with Atari, none when other jobs hold the cores; off: the paper's R2AC."""
    threads: int | None = None
    """torch.set_num_threads (None: the strategy's "auto": 1 thread on machines with at most 4 cores, else torch's
    default)."""
    progress: bool = True
    """Rich progress bar (frames/s, mean return)."""
    tensorboard: bool = True
    """Also log to TensorBoard (if installed)."""
    loggers: list[Any] = field(default_factory=list)
    """More Lightning loggers, each ``{class_path: ..., init_args: {...}}`` as in LightningCLI, or just a class path;
    a bare class name is looked up in ``lightning.pytorch.loggers`` (``WandbLogger``, ``MLFlowLogger``, ...).
    ``save_dir``, where the logger takes one and it is not given, is the run's folder (MLflow without
    ``tracking_uri``: the SQLite store ``mlflow.db`` there). The CSV logger is always on (the learning curves read it) and TensorBoard follows ``tensorboard``."""
    eval_video: bool = False
    """Save the final evaluation's episodes of stream 0 as ``eval.gif`` in the run's folder: the env's frames
    (gymnasium and MiniGrid ids get ``render_mode: rgb_array``), else its image observations."""
    accelerator: str = "auto"
    """Lightning accelerator ("cpu", "gpu", "auto")."""
    precision: str | None = None
    """Lightning precision, e.g. "bf16-mixed" (CPU and recent GPUs) or "16-mixed" (GPU); None: the Trainer's default,
    32-bit. Autocast covers the stem, core and heads; the carried sensitivities keep their dtype (docs/r2ac.md)."""

    @property
    def run_dir(self) -> Path:
        """``out_dir`` with its ``{field}`` placeholders filled in."""
        values = {k: getattr(self, k) for k in self.__dataclass_fields__}
        values["env"] = str(self.env).replace("/", "_").replace(":", "_")
        cells = [] if self.cell is None else [self.cell] if isinstance(self.cell, str) else self.cell
        values["cell"] = "+".join(str(c).rsplit(".", 1)[-1] for c in cells) or "none"  # a stack: "lru+mingru"
        try:
            return Path(self.out_dir.format(**values))
        except (KeyError, IndexError) as err:
            raise ValueError(
                f"out_dir {self.out_dir!r} names an unknown field {err}; fields: {sorted(values)}."
            ) from None

    def __post_init__(self) -> None:
        if isinstance(self.cell, str) and self.cell.lower() in ("none", "null", ""):
            self.cell = None
        if self.method == "feedforward":
            raise ValueError(
                "the feed-forward baseline is chosen with the cell, not the method: --cell none (cell: null in YAML); "
                "the method (rtrl/tbptt/snap) then only sets M for the rollouts."
            )
        METHODS.resolve(self.method)  # an unknown name fails here, listing the choices
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be an int from 0 to 2**32 - 1 (numpy's seed range), got {self.seed!r}.")
        if self.layers is not None:
            if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 1:
                raise ValueError(f"layers must be an int >= 1 (or null for one layer), got {self.layers!r}.")
            if "layers" in self.cell_kwargs:
                raise ValueError("give the number of layers once: --layers or layers in --cell_kwargs, not both.")
            if self.cell is None and self.layers > 1:
                raise ValueError(f"layers={self.layers} needs a cell to stack (--cell none: no recurrent core).")
            if isinstance(self.cell, list):
                raise ValueError(
                    f"--cell {self.cell} already names the layers, one cell each: leave --layers out (got {self.layers})."
                )
        if self.num_envs > 0 and self.num_envs % self.r2ac.minibatches:  # else it fails only once training starts
            divisors = [d for d in range(1, self.num_envs + 1) if self.num_envs % d == 0]
            raise ValueError(
                f"r2ac.minibatches = {self.r2ac.minibatches} does not divide num_envs = {self.num_envs} (each minibatch "
                f"takes an equal share of the streams): choose --r2ac.minibatches among {divisors}, or --num_envs a "
                f"multiple of {self.r2ac.minibatches}."
            )
        if any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in self.head_sizes):
            raise ValueError(
                f"head_sizes must be a list of positive layer widths (e.g. --head_sizes '[64, 64]'; [] for the "
                f"paper's linear heads), got {self.head_sizes!r}."
            )
        if isinstance(self.cell, (str, list)):  # a wrong cell argument is a usage error now, not a traceback later
            from onlinerec.cells import Stack, make_cell

            kwargs = {**self.cell_kwargs, **({"layers": self.layers} if self.layers is not None else {})}
            try:
                core = make_cell(self.cell, self.fc_size + 1, self.hidden_size, **kwargs)  # as R2AC builds it
            except (TypeError, ValueError) as err:
                raise ValueError(f"--cell {self.cell} --cell_kwargs {dict(self.cell_kwargs)}: {err}") from err
            if isinstance(core, Stack) and core.residual and len(core.residual_layers) < core.num_layers:
                skipped = [i for i in range(core.num_layers) if i not in core.residual_layers]
                warnings.warn(  # a width change silently drops a residual the config asked for
                    f"--cell {self.cell}: layers {skipped} get no residual, as their output width differs from their "
                    f"input's (fc_size + 1 = {self.fc_size + 1} features reach the core, hidden_size = "
                    f"{self.hidden_size}); for a residual around every layer set fc_size to hidden_size - 1 "
                    f"(--fc_size {self.hidden_size - 1}).",
                    stacklevel=2,
                )


def _strategy(cfg: ExperimentConfig):
    from onlinerec.training.strategies import make_strategy

    return make_strategy(cfg.method, M=cfg.M)


def build(cfg: ExperimentConfig):
    """(model, datamodule, strategy, number of optimiser steps) for a config: one step per segment, or
    ``r2ac.epochs * r2ac.minibatches`` (Lightning's ``max_steps`` and the LR schedule count optimiser steps)."""
    from onlinerec.rl.r2ac import R2AC
    from onlinerec.rl.rollout import RolloutDataModule

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
        "loggers",
        "eval_video",
    }
)
"""Fields a resumed run may change (its budget and its reporting); every other field defines the experiment."""


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and key == "r2ac":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(stored: dict[str, Any], cfg: ExperimentConfig) -> dict[str, tuple[Any, Any]]:
    """``{field: (stored value, new value)}`` for the fields that define the experiment and differ.
    (``r2ac.total_updates`` follows ``total_frames``, which may change, so it is not compared.) A field the stored
    config lacks was added since that run started, which therefore ran with its default (every new field's default
    keeps the old behaviour)."""

    def flat(config: Any) -> dict[str, Any]:
        return _flat(json.loads(json.dumps(config, default=str)))

    old, new = {**flat(asdict(ExperimentConfig())), **flat(stored)}, flat(asdict(cfg))
    skip = RESUMABLE_CHANGES | {"r2ac.total_updates"}
    return {
        k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if k not in skip and old.get(k) != new.get(k)
    }


class ConfigError(ValueError):
    """The settings build no agent for this env (e.g. ``obs_norm`` with image observations); the message says why."""


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


def resume_point(cfg: ExperimentConfig, out: Path) -> Path | None:
    """The checkpoint to resume from (None: start fresh), after refusing what would mix or overwrite experiments."""
    from onlinerec.training.checkpoint import verify_checkpoint_file

    last = out / "checkpoints" / "last.ckpt"
    if not last.exists():
        return None
    if not cfg.resume:
        raise FileExistsError(
            f"{out} already holds a run ({last.relative_to(out)}); --resume false would train from scratch and overwrite "
            "its results. Choose another --out_dir, or delete that folder to start this run again."
        )
    verify_checkpoint_file(last)
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
            history.append({k: {"was": a, "now": b} for k, (a, b) in changes.items()})
            log.write_text(json.dumps(history, indent=2, default=str))
    return last


def run_experiment(cfg: ExperimentConfig) -> dict[str, Any]:
    """Train, evaluate greedily, write ``eval.json`` and ``learning_curve.png`` under ``cfg.out_dir``."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from onlinerec.rl.envs import make_vector_env, run_env_seed
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
    if cfg.progress:
        callbacks.append(StepProgressBar(f"R2AC {cfg.method}(M={cfg.M}) segments", leave=True))
    trainer = L.Trainer(
        strategy=strategy,
        accelerator=cfg.accelerator,
        precision=cfg.precision,
        devices=1,
        max_steps=updates,
        logger=loggers,
        callbacks=callbacks,
        log_every_n_steps=cfg.log_every,
        enable_progress_bar=cfg.progress,
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
        plot_learning_curves({cfg.method: [out]}, out / "learning_curve.png", title=f"R2AC on {cfg.env}")
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


def parse_experiment(
    argv: Sequence[str] | None = None,
    default_config: str | Path | None = None,
    description: str = "",
    prog: str = "onlinerec rl",
) -> ExperimentConfig:
    """An :class:`ExperimentConfig` from options and YAML files (``default_config`` first), as ``onlinerec rl`` reads it."""
    from onlinerec.config import parse_config

    return parse_config(
        ExperimentConfig, argv, prog=prog, description=description or __doc__, default_config=default_config
    )


def main(
    argv: Sequence[str] | None = None,
    default_config: str | Path | None = None,
    description: str = "",
    prog: str = "onlinerec rl",
) -> int:
    """``onlinerec rl``: parse (see :func:`onlinerec.config.parse_config`), run, and turn a missing env backend into a
    clear error. The examples call it with their YAML as ``default_config``."""
    from onlinerec.rl.envs import MissingBackendError
    from onlinerec.training.checkpoint import CorruptCheckpointError

    cfg = parse_experiment(argv, default_config, description, prog)
    try:
        run_experiment(cfg)
    except MissingBackendError as err:
        print(f"error: {cfg.env} needs a backend that is not installed.\n{err}", file=sys.stderr)
        return 2
    except (ConfigError, RunFolderError, FileExistsError, CorruptCheckpointError) as err:  # settings or out_dir
        print(f"error: {err}", file=sys.stderr)
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
