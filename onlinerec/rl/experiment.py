"""The experiment's settings: :class:`ExperimentConfig`, every field of an ``onlinerec rl`` run, and
:func:`parse_experiment`, which fills it from YAML files and command-line options.

A YAML file sets any field (``onlinerec rl --config examples/configs/memory_tmaze.yaml``) and later options override it
(``--r2ac.lr 1e-3``). A file or option that sets a removed field of R2AC's settings
(:data:`~onlinerec.rl.r2ac_config.REMOVED_FIELDS`) is refused with what replaces it.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

from onlinerec.gradients import METHODS
from onlinerec.rl.r2ac_config import REMOVED_FIELDS, R2ACConfig, removed_field_error

__all__ = [
    "DESCRIPTION",
    "ConfigError",
    "ExperimentConfig",
    "check_core_options",
    "parse_experiment",
    "removed_options",
]

DESCRIPTION = """``onlinerec rl``: one R2AC experiment from a typed config: the Lightning run (rich progress, CSV/TensorBoard logs,
checkpoints, resume), greedy evaluation and learning curves.

Everything a run needs is a field of :class:`ExperimentConfig`; a YAML file sets any of them (``onlinerec rl --config
examples/configs/memory_tmaze.yaml``) and later options override it (``--r2ac.lr 1e-3``). The packaged examples
(``examples/atari.py`` ...) are thin scripts that pick a YAML and call :func:`main`.
"""
"""``onlinerec rl --help``'s description."""

AT_LEAST: dict[str, tuple[int, str]] = {
    "num_envs": (1, "the env streams the learner reads"),
    "M": (1, "the steps between weight updates; 1 is fully online learning"),
    "hidden_size": (1, "the width of the recurrent cell"),
    "fc_size": (1, "the width of the stem's output"),
    "eval_episodes": (0, "the greedy evaluation episodes after training; 0 for none"),
    "eval_envs": (1, "the parallel envs of the evaluation"),
    "eval_max_steps": (1, "the cap on evaluation steps per env"),
    "checkpoint_every": (1, "the segments between checkpoints"),
    "log_every": (1, "the segments between logged metrics"),
    "threads": (1, "torch's CPU threads"),
    "r2ac.total_updates": (1, "the updates over which the learning rate decays"),
    "r2ac.return_window": (1, "the finished episodes that the logged return averages"),
}
"""The least value of each integer setting (``layers``, ``seed``, ``head_sizes`` and ``r2ac.epochs`` /
``r2ac.minibatches`` are checked with their own messages), and what it counts."""

MAY_BE_NONE = {
    "eval_max_steps": "no cap",
    "threads": "the strategy's choice",
    "r2ac.total_updates": "the run's number of updates",
}
"""Integer settings that may also be None, and what None means."""

CORE_ONLY = ("hidden_size", "layers", "cell_kwargs")
"""Settings that only shape the recurrent core: the feed-forward baseline (``cell: null``) has none to shape."""


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
    """Resume even though settings that define the experiment changed (recorded in config_changes.json with the frames
    they took effect at; learning_curve.png marks each change)."""
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
    """Show progress: a rich bar on a terminal; where stdout is not one (a log file, a background job), a plain line
    every 10 seconds with frames, frames/s, the mean return and the elapsed time."""
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
    """Lightning accelerator ("cpu", "gpu", "auto"). On a GPU the envs still step on the CPU: each agent step moves one
    batch of observations to the device and the actions back."""
    devices: int | str = 1
    """Lightning devices: how many of the accelerator's devices (or which, "0,1"; "auto"). More than one trains under
    DDP, one process per device, each acting in envs of its own."""
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
        for name, (least, meaning) in AT_LEAST.items():  # before anything divides by them or runs zero updates
            value = getattr(self.r2ac, name[len("r2ac.") :]) if name.startswith("r2ac.") else getattr(self, name)
            if value is None and name in MAY_BE_NONE:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                none = f" (or null: {MAY_BE_NONE[name]})" if name in MAY_BE_NONE else ""
                raise ValueError(f"--{name} must be an int >= {least}{none}, got {value!r}: {meaning}.")
        frames = self.total_frames
        if isinstance(frames, bool) or not isinstance(frames, (int, float)):
            raise ValueError(f"--total_frames must be a number (env frames, e.g. 3e5), got {frames!r}.")
        if not 0 < frames < math.inf:
            raise ValueError(
                f"--total_frames must be a number > 0 (the training budget in env frames, e.g. 3e5), got {frames:g}."
            )
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
            from onlinerec.cells import Stack

            core = check_core(self, self.fc_size + 1)  # as R2AC builds it
            if isinstance(core, Stack) and core.residual and len(core.residual_layers) < core.num_layers:
                skipped = [i for i in range(core.num_layers) if i not in core.residual_layers]
                warnings.warn(  # a width change silently drops a residual the config asked for
                    f"--cell {self.cell}: layers {skipped} get no residual, as their output width differs from their "
                    f"input's (fc_size + 1 = {self.fc_size + 1} features reach the core, hidden_size = "
                    f"{self.hidden_size}); for a residual around every layer set fc_size to hidden_size - 1 "
                    f"(--fc_size {self.hidden_size - 1}).",
                    stacklevel=2,
                )


def check_core(cfg: Any, in_features: int, methods: Sequence[str] | None = None) -> Any:
    """The recurrent core that ``cfg``'s ``cell``, ``cell_kwargs``, ``layers``, ``hidden_size`` and ``method`` build,
    checked before any run folder is written: a cell that these kwargs do not fit, or that the method cannot train,
    is a ValueError in the command line's terms. ``methods``: the methods the command offers (None: all)."""
    from onlinerec.cells import make_cell
    from onlinerec.training.cell_methods import method_refusal

    kwargs = {**cfg.cell_kwargs, **({"layers": cfg.layers} if cfg.layers is not None else {})}
    try:
        core = make_cell(cfg.cell, in_features, cfg.hidden_size, **kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"--cell {cfg.cell} --cell_kwargs {dict(cfg.cell_kwargs)}: {err} (on the command line, --cell_kwargs '{{}}' "
            "replaces a config file's)"
        ) from err

    refusal = method_refusal(
        core, cfg.method, lambda names: " or ".join(f"--method {m}" for m in names), offered=methods
    )
    if refusal:
        raise ValueError(f"--cell {cfg.cell} --method {cfg.method}: {refusal}")
    return core


class ConfigError(ValueError):
    """The settings build no agent for this env (e.g. ``obs_norm`` with image observations); the message says why."""


def parse_experiment(
    argv: Sequence[str] | None = None,
    default_config: str | Path | None = None,
    description: str = "",
    prog: str = "onlinerec rl",
) -> ExperimentConfig:
    """An :class:`ExperimentConfig` from options and YAML files (``default_config`` first), as ``onlinerec rl`` reads it.

    An option or a YAML file that sets a removed field of ``r2ac`` exits (status 2) with what replaces it."""
    from onlinerec.config import parse_config

    args = list(sys.argv[1:] if argv is None else argv)
    removed = removed_options(args, default_config)
    if removed:
        print(f"{prog}: error: " + " ".join(removed_field_error(name) for name in removed), file=sys.stderr)
        raise SystemExit(2)
    cfg = parse_config(
        ExperimentConfig, args, prog=prog, description=description or DESCRIPTION, default_config=default_config
    )
    if cfg.cell is None:
        check_core_options(cfg, args, default_config, prog)
    return cfg


def check_core_options(cfg: Any, args: Sequence[str], default_config: str | Path | None, prog: str) -> None:
    """The feed-forward baseline (no recurrent core) ignores :data:`CORE_ONLY`: refuse those set on the command line;
    warn once about those a YAML file sets (a shipped config run with ``--cell none`` stays the baseline). ``cfg`` is
    any run's config dataclass with those fields (``onlinerec rl``'s and ``onlinerec stream``'s)."""
    import yaml

    defaults = type(cfg).__dataclass_fields__
    unused = {}
    for name in CORE_ONLY:
        value, field_ = getattr(cfg, name), defaults[name]
        default = field_.default_factory() if field_.default_factory is not MISSING else field_.default
        if value != default:
            unused[name] = value
    if not unused:
        return
    given = [name for name in unused if name in _option_names(args)]
    if given:
        listed = " ".join(f"--{name} {_shown(unused[name])}" for name in given)
        print(
            f"{prog}: error: --cell none trains the feed-forward baseline, which has no recurrent core, so {listed} "
            f"would be ignored: leave {'it' if len(given) == 1 else 'them'} out, or give the core a cell "
            "(--cell elstm).",
            file=sys.stderr,
        )
        raise SystemExit(2)
    files = [p for p in _config_files(args, default_config) if _yaml_keys(p, yaml) & set(unused)]
    listed = " and ".join(f"{name}: {_shown(value)}" for name, value in unused.items())
    print(
        f"warning: the feed-forward baseline (--cell none) has no recurrent core: it ignores {listed}"
        + (f" from {' and '.join(files)}." if files else "."),
        file=sys.stderr,
    )


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _option_names(args: Sequence[str]) -> set[str]:
    """The fields that command-line ``args`` set (``--cell_kwargs.x`` sets ``cell_kwargs``)."""
    return {a[2:].partition("=")[0].replace("-", "_").split(".")[0] for a in args if a.startswith("--")}


def _config_files(args: Sequence[str], default_config: str | Path | None) -> list[str]:
    """``default_config`` and every ``--config`` file, in the order they apply."""
    files = [str(default_config)] if default_config else []
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name == "--config":
            files.append(value if eq else (args[i + 1] if i + 1 < len(args) else ""))
    return files


def _yaml_keys(path: str, yaml: Any) -> set[str]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return set()
    return set(data) if isinstance(data, Mapping) else set()


def removed_options(args: Sequence[str], default_config: str | Path | None = None) -> list[str]:
    """The removed R2ACConfig fields (:data:`~onlinerec.rl.r2ac_config.REMOVED_FIELDS`) that command-line ``args`` or
    the YAML files they name (``--config``, and ``default_config``) set, in the order found, each once."""
    import yaml

    found: list[str] = []
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, eq, value = arg[2:].partition("=")
        name = name.replace("-", "_")
        value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        if name.startswith("r2ac.") and name[len("r2ac.") :] in REMOVED_FIELDS:
            found.append(name[len("r2ac.") :])
        elif name == "r2ac":  # the whole group as a YAML mapping: --r2ac '{lr: 1e-3}'
            found += _removed_in({"r2ac": _yaml(value, yaml)})
    for path in _config_files(args, default_config):
        try:
            found += _removed_in(yaml.safe_load(Path(path).read_text()))
        except (OSError, yaml.YAMLError):
            continue  # jsonargparse reports a missing or broken file itself
    return list(dict.fromkeys(found))


def _yaml(text: str, yaml: Any) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def _removed_in(data: Any) -> list[str]:
    """The removed fields that a config file's ``r2ac`` mapping sets."""
    r2ac = data.get("r2ac") if isinstance(data, Mapping) else None
    return [name for name in r2ac if name in REMOVED_FIELDS] if isinstance(r2ac, Mapping) else []
