"""The settings of one ``onlinerec stream`` run: :class:`StreamExperiment`, and :func:`parse_stream_experiment`, which
fills it from YAML files and command-line options."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onlinerec.rl.streaming.config import StreamACConfig

__all__ = ["StreamExperiment", "parse_stream_experiment"]

DESCRIPTION = """``onlinerec stream``: the streaming actor-critic (stream AC(lambda) with a recurrent core learned by
exact RTRL) on one env stream: an update at every env step, no replay, no batches. Everything a run needs is a field
below; a YAML file sets any of them (``onlinerec stream --config examples/configs/stream_memory.yaml``) and later
options override it (``--stream.entropy_cost 0.001``). docs/streaming.md explains the agent.
"""

METHODS = ("rtrl", "tbptt")


@dataclass
class StreamExperiment:
    """One streaming run. Budgets count env steps (one update each)."""

    env: str = "memory:tmaze"
    """Env id for ``onlinerec.rl.envs.make_vector_env`` ("memory:tmaze", "popgym:RepeatFirstEasy",
    "gymnasium:CartPoleNoVel-v1", "factory:mypackage.envs.make_env", ...; docs/envs.md), with vector observations."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env family (e.g. ``length`` of the T-maze) and ``wrappers`` (docs/envs.md)."""
    eval_env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides of ``env_kwargs`` for the final evaluation."""
    method: str = "rtrl"
    """How the recurrent core's gradient is taken: "rtrl" (exact, through the carried sensitivities) or "tbptt"
    (one-step truncation: this step only; the baseline)."""
    cell: str | list[str] | None = "rtu"
    """The recurrent core of the actor's and the critic's network: a name in ``onlinerec.cells.CELLS``
    (element-wise: "rtu", "lru", "mingru", "elstm", ...), a class path, a list of them for a stack, or ``none`` for
    stream-x's feed-forward networks."""
    hidden_size: int = 64
    """N, the core's width (per layer for a stack)."""
    layers: int | None = None
    """Stacked layers of the cell (None: one)."""
    cell_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra cell arguments, e.g. ``{r_min: 0.9, r_max: 0.999}`` (the RTU's and LRU's ring of eigenvalues)."""
    total_frames: float = 1e6
    """Env steps to train for (an update each)."""
    stream: StreamACConfig = field(default_factory=StreamACConfig)
    """The algorithm's settings."""
    seed: int = 0
    """Seeds torch and the env streams (0 to 2**32 - 1); training and evaluation use streams of their own."""
    eval_episodes: int = 20
    """Episodes of the final evaluation (0: none)."""
    eval_envs: int = 4
    """Parallel envs of the final evaluation."""
    eval_greedy: bool = True
    """Evaluate with the policy's most likely action (False: sampled)."""
    eval_max_steps: int | None = None
    """Cap on evaluation steps per env (None: none)."""
    out_dir: str = "runs/stream/{env}/{method}-{cell}-seed{seed}"
    """The run's folder (logs, checkpoints, learning curve, config.json, eval.json); ``{field}`` placeholders take
    the config's values."""
    checkpoint_every: int = 50_000
    """Env steps between checkpoints, each written at the next episode end (a resumed run continues from it bit for
    bit)."""
    resume: bool = True
    """Continue the run in ``out_dir`` from its last checkpoint if it is the same experiment; False refuses a folder
    that already holds a run."""
    log_every: int = 1000
    """Env steps between logged rows (the curve's resolution)."""
    return_window: int = 100
    """The logged return is the mean over the last this many finished episodes."""
    progress: bool = True
    """Print a line of progress (steps, steps/s, mean return) every 10 seconds."""
    threads: int | None = 1
    """torch.set_num_threads (one is fastest at batch size 1; None: torch's default)."""
    tensorboard: bool = False
    """Also log to TensorBoard (if installed)."""

    @property
    def run_dir(self) -> Path:
        """``out_dir`` with its placeholders filled in."""
        values = {k: getattr(self, k) for k in self.__dataclass_fields__}
        values["env"] = str(self.env).replace("/", "_").replace(":", "_")
        cells = [] if self.cell is None else [self.cell] if isinstance(self.cell, str) else self.cell
        values["cell"] = "+".join(str(c).rsplit(".", 1)[-1] for c in cells) or "none"
        try:
            return Path(self.out_dir.format(**values))
        except (KeyError, IndexError) as err:
            raise ValueError(
                f"out_dir {self.out_dir!r} names an unknown field {err}; fields: {sorted(values)}."
            ) from None

    def __post_init__(self) -> None:
        if isinstance(self.cell, str) and self.cell.lower() in ("none", "null", ""):
            self.cell = None
        if self.method not in METHODS:
            raise ValueError(
                f"method must be one of {list(METHODS)} (the streaming agent's core learns by exact RTRL or, as the "
                f"baseline, one-step TBPTT), got {self.method!r}."
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be an int from 0 to 2**32 - 1, got {self.seed!r}.")
        if not isinstance(self.total_frames, (int, float)) or isinstance(self.total_frames, bool):
            raise ValueError(f"total_frames must be a number of env steps > 0, got {self.total_frames!r}.")
        if not math.isfinite(self.total_frames) or self.total_frames < 1:
            raise ValueError(f"total_frames must be a number of env steps >= 1, got {self.total_frames!r}.")
        for name, low in (
            ("hidden_size", 1),
            ("eval_episodes", 0),
            ("eval_envs", 1),
            ("checkpoint_every", 1),
            ("log_every", 1),
            ("return_window", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}.")
        for name in ("layers", "eval_max_steps", "threads"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 or null, got {value!r}.")
        if self.cell is not None:  # a cell these kwargs do not fit, or the method cannot train: a usage error now
            from onlinerec.rl.experiment import check_core

            check_core(self, in_features=1, methods=METHODS)


def parse_stream_experiment(
    argv: Sequence[str] | None = None, default_config: str | Path | None = None
) -> StreamExperiment:
    """A :class:`StreamExperiment` from options and YAML files, as ``onlinerec stream`` reads it."""
    from onlinerec.config import parse_config
    from onlinerec.rl.experiment import check_core_options

    args = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_config(
        StreamExperiment, args, prog="onlinerec stream", description=DESCRIPTION, default_config=default_config
    )
    if cfg.cell is None:
        check_core_options(cfg, args, default_config, "onlinerec stream")
    return cfg
