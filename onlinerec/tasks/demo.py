"""``onlinerec demo``: exact RTRL versus truncated BPTT on a memory task whose span is much longer than M.

The task is delayed recall (:mod:`onlinerec.data.delayed_recall`): a cue, ``delay`` distractors, then a query
whose answer is the cue. Both methods train the same eLSTM with weight updates every M steps (M much smaller
than the delay), on the same data, seeds and optimiser; only the strategy differs:
``Trainer(strategy=RTRLStrategy(M))`` versus ``Trainer(strategy=TBPTTStrategy(M))``. RTRL's gradient reaches the
cue through the carried sensitivities; TBPTT's is cut after M steps and never links the answer to the cue.

Any built-in cell (``--cell lru``, ``--cell mingru --cell_kwargs '{update_bias: -3}'``), a class path, a stack
(``--layers 4``, with ``residual``/``norm`` in ``cell_kwargs``) and any gradient methods (``--methods '[snap, tbptt]'``
for the fully recurrent ``lstm``, ``gru`` and ``felstm``, which RTRL refuses) can take the eLSTM's place.

The demo prints a table of final accuracy on held-out sequences (mean ± std over seeds), writes learning
curves (``learning_curves.png``) and every number (``results.json``) to the output directory, and ends with one
line ``demo: rtrl=<acc> tbptt=<acc> M=<M> delay=<steps> seeds=<k>`` (one ``<method>=<acc>`` per compared method,
accuracies as fractions, means over seeds).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from onlinerec.cells import CELLS, make_cell
from onlinerec.data.delayed_recall import DelayedRecallDataModule
from onlinerec.gradients import METHODS
from onlinerec.tasks.classifier import SequenceClassifier
from onlinerec.training.cell_methods import method_refusal
from onlinerec.training.strategies import make_strategy

COMPARED = ("rtrl", "tbptt")
"""The gradient methods the demo compares by default (names in :data:`onlinerec.gradients.METHODS`)."""
LABELS = {"rtrl": "RTRL", "tbptt": "TBPTT", "snap": "SnAP-1"}
CELL_LABELS = {
    "elstm": "eLSTM",
    "felstm": "FELSTM",
    "qrnn": "QRNN",
    "sru": "SRU",
    "lru": "LRU",
    "rtu": "RTU",
    "mingru": "minGRU",
    "minlstm": "minLSTM",
    "indrnn": "IndRNN",
    "lstm": "LSTM",
    "gru": "GRU",
}


def label(method: str) -> str:
    """How tables and plots name a method ("RTRL", "SnAP-1", or the name as given)."""
    return LABELS.get(method.lower(), method)


@dataclass
class DemoConfig:
    """Settings of ``onlinerec demo`` (each is also a command-line option)."""

    M: int = 10
    """Steps between weight updates (segment length), for both methods."""
    delay: int = 100
    """Distractor steps between the cue and the query: the credit-assignment span."""
    steps: int | None = None
    """Weight updates per run, each covering M steps of every stream (default: 8 x delay)."""
    seeds: int = 3
    """Runs per method, with seeds 0 .. seeds-1 (model init and data)."""
    num_symbols: int = 4
    """Cue classes K; chance accuracy is 1/K."""
    cell: str = "elstm"
    """Recurrent cell: a name in ``onlinerec.cells.CELLS`` (element-wise: "elstm", "qrnn", "sru", "lru", "mingru",
    "minlstm", "indrnn"; fully recurrent, for SnAP-1 and TBPTT only: "felstm", "lstm", "gru") or a class path."""
    layers: int = 1
    """Stacked layers of the cell (``onlinerec.cells.Stack``; its ``residual`` and ``norm`` go in ``cell_kwargs``,
    e.g. ``{residual: true, norm: rms}``)."""
    cell_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra cell arguments (every layer gets them), e.g. ``{update_bias: -3}`` for minGRU, ``{r_min: 0.9}`` for
    LRU; ``forget_bias`` here overrides the option below."""
    methods: list[str] = field(default_factory=lambda: list(COMPARED))
    """Gradient methods to compare, each trained from the same seeds (names in ``onlinerec.gradients.METHODS``:
    "rtrl", "tbptt", "snap"); e.g. ``'[snap, tbptt]'`` for a fully recurrent cell."""
    hidden_size: int = 32
    """Cell width N (per layer)."""
    embedding_dim: int | None = None
    """Feed a learned token embedding of this width to the cell; None (default): one-hot tokens."""
    num_streams: int = 32
    """Parallel training streams B."""
    lr: float = 1e-2
    """Adam learning rate (gradient norm clipped at 1)."""
    forget_bias: float | None = None
    """Added to the forget-gate bias so that memory (and RTRL's gradient) outlasts the delay; default
    3 + log2(delay / 100), at least 1: 3 (forget gate 0.95) for delay 100, 4 (0.98) for delay 200. Goes to cells
    that take a ``forget_bias`` argument (eLSTM, FELSTM, minLSTM, LSTM); others keep their own initialisation
    unless ``cell_kwargs`` sets it (minGRU's ``update_bias``, GRU's ``update_bias``, LRU's ``r_min``/``r_max``)."""
    eval_size: int = 500
    """Held-out sequences that score each trained model."""
    curve_points: int = 20
    """Points of each learning curve (online training accuracy over consecutive windows of updates)."""
    out_dir: str = "runs/demo"
    """Where learning_curves.png and results.json go."""
    quick: bool = False
    """A seconds-long smoke run (tiny task and budget) for tests; not a meaningful comparison."""

    def __post_init__(self) -> None:
        if self.steps is None:
            self.steps = 8 * max(self.delay, 1)
        if self.forget_bias is None:
            self.forget_bias = max(1.0, 3.0 + math.log2(max(self.delay, 1) / 100))
        for name in ("M", "steps", "seeds", "num_symbols", "hidden_size", "num_streams", "eval_size", "curve_points"):
            least = 2 if name == "num_symbols" else 1
            if getattr(self, name) < least:
                raise ValueError(f"--{name} must be at least {least}, got {getattr(self, name)}.")
        if self.delay < 0:
            raise ValueError(f"--delay must be >= 0, got {self.delay}.")
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 1:
            raise ValueError(f"--layers must be an int >= 1, got {self.layers!r}.")
        if self.layers > 1 and "layers" in self.cell_kwargs:
            raise ValueError("give the number of layers once: --layers or layers in --cell_kwargs, not both.")
        if self.embedding_dim is not None and self.embedding_dim < 1:
            raise ValueError(f"--embedding_dim must be at least 1 (or null for one-hot), got {self.embedding_dim}.")
        self.methods = [str(m) for m in self.methods]
        if not self.methods:
            raise ValueError("--methods needs at least one gradient method, e.g. '[rtrl, tbptt]'.")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"--methods names a method twice: {self.methods}.")
        for method in self.methods:
            METHODS.resolve(method)  # an unknown name fails here, listing the choices
        CELLS.resolve(self.cell)  # likewise for the cell
        inputs = self.embedding_dim or 2 * self.num_symbols + 1  # as SequenceClassifier feeds it
        core = make_cell(self.cell, inputs, self.hidden_size, **self.model_kwargs()["cell_kwargs"])
        for method in self.methods:
            refusal = method_refusal(core, method, lambda methods: f"--methods '[{', '.join(methods)}]'")
            if refusal:
                raise ValueError(f"--cell {self.cell}: {refusal}")

    def model_kwargs(self) -> dict[str, Any]:
        """``cell`` and ``cell_kwargs`` of the :class:`SequenceClassifier` (``forget_bias`` and ``layers`` folded in)."""
        kwargs = dict(self.cell_kwargs)
        if "forget_bias" in inspect.signature(CELLS.resolve(self.cell)).parameters:
            kwargs.setdefault("forget_bias", self.forget_bias)
        if self.layers > 1:
            kwargs["layers"] = self.layers
        return {"cell": self.cell, "cell_kwargs": kwargs}

    def describe_cell(self) -> str:
        """The model in words, for the header and the plot: "eLSTM N=32 (forget bias 3.0)", "4 x LRU N=32 (r_min=0.9)"."""
        name = CELL_LABELS.get(str(self.cell).lower(), str(self.cell).rsplit(".", 1)[-1])
        kwargs = self.model_kwargs()["cell_kwargs"]
        kwargs.pop("layers", None)
        extras = [f"forget bias {kwargs.pop('forget_bias'):.1f}"] if "forget_bias" in kwargs else []
        extras += [f"{k}={v}" for k, v in kwargs.items()]
        depth = f"{self.layers} x " if self.layers > 1 else ""
        return f"{depth}{name} N={self.hidden_size}" + (f" ({', '.join(extras)})" if extras else "")


QUICK = {
    "M": 4,
    "delay": 12,
    "steps": 24,
    "seeds": 2,
    "hidden_size": 8,
    "num_streams": 8,
    "eval_size": 32,
    "curve_points": 4,
}
"""What ``--quick`` changes (options given explicitly still win)."""


@dataclass
class RunResult:
    method: str
    seed: int
    final_accuracy: float
    curve_steps: list[int] = field(default_factory=list)
    curve_accuracy: list[float] = field(default_factory=list)
    seconds: float = 0.0


class _OnlineAccuracy(Callback):
    """Online training accuracy (queries answered right as they stream by) over windows of ``every`` updates."""

    def __init__(self, every: int, report: Callable[[int, float | None], None]) -> None:
        self.every, self.report = every, report
        self.correct = self.count = 0
        self.steps: list[int] = []
        self.accuracy: list[float] = []

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.correct += int(outputs["correct"])
        self.count += int(outputs["count"])
        step = trainer.global_step
        if step % self.every == 0 and self.count:
            self.steps.append(step)
            self.accuracy.append(self.correct / self.count)
            self.correct = self.count = 0
        self.report(step, self.accuracy[-1] if self.accuracy else None)


def _quiet_lightning() -> None:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"lightning(\..*)?")
    warnings.filterwarnings("ignore", message=r".*(does not have many workers|GPU available|LeafSpec).*")


def _trainer(**kwargs: Any) -> L.Trainer:
    base = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    return L.Trainer(**(base | kwargs))


def train_one(
    method: str, seed: int, cfg: DemoConfig, report: Callable[[int, float | None], None] = lambda s, a: None
) -> RunResult:
    """Train one model (``cfg``'s cell) with ``method`` ("rtrl", "tbptt", ...) on delayed recall and score it on
    held-out sequences."""
    start = time.perf_counter()
    L.seed_everything(seed, verbose=False)
    length = cfg.delay + 2
    train_size = math.ceil(cfg.steps * cfg.M * cfg.num_streams / length) + cfg.num_streams  # fresh sequences throughout
    data = DelayedRecallDataModule(
        delay=cfg.delay,
        num_symbols=cfg.num_symbols,
        train_size=train_size,
        val_size=cfg.eval_size,
        seed=seed,
        num_streams=cfg.num_streams,
        eval_streams=min(cfg.eval_size, 100),
        eval_M=length,
    )
    model = SequenceClassifier(
        vocab_size=2 * cfg.num_symbols + 1,
        num_classes=cfg.num_symbols,
        hidden_size=cfg.hidden_size,
        embedding_dim=cfg.embedding_dim,
        lr=cfg.lr,
        **cfg.model_kwargs(),
    )
    curve = _OnlineAccuracy(max(1, cfg.steps // cfg.curve_points), report)
    trainer = _trainer(
        strategy=make_strategy(method, M=cfg.M),
        max_steps=cfg.steps,
        gradient_clip_val=1.0,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[curve],
    )
    trainer.fit(model, data)
    # Scoring needs no gradient method: the eval streams carry state without sensitivities.
    (scores,) = _trainer().test(model, datamodule=data, verbose=False)
    return RunResult(method, seed, float(scores["test/acc"]), curve.steps, curve.accuracy, time.perf_counter() - start)


def _summary(results: list[RunResult], method: str) -> tuple[float, float, list[float]]:
    accs = [r.final_accuracy for r in results if r.method == method]
    return statistics.fmean(accs), (statistics.stdev(accs) if len(accs) > 1 else 0.0), accs


def plot_curves(results: list[RunResult], cfg: DemoConfig, path: Path) -> None:
    """Online training accuracy versus weight updates: mean over seeds (line) and min..max (band), chance dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    palette = {"rtrl": "tab:blue", "tbptt": "tab:orange", "snap": "tab:green"}
    others = iter(["tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"])
    colors = {m: palette.get(m.lower()) or next(others, "tab:gray") for m in cfg.methods}
    for method in cfg.methods:
        runs = [r for r in results if r.method == method and r.curve_steps]
        if not runs:
            continue
        n = min(len(r.curve_steps) for r in runs)
        xs = runs[0].curve_steps[:n]
        cols = list(zip(*(r.curve_accuracy[:n] for r in runs)))
        mean = [statistics.fmean(c) for c in cols]
        final, _, _ = _summary(results, method)
        ax.plot(
            xs, mean, color=colors[method], lw=2, label=f"{label(method)}(M={cfg.M}): held-out accuracy {final:.1%}"
        )
        ax.fill_between(xs, [min(c) for c in cols], [max(c) for c in cols], color=colors[method], alpha=0.2, lw=0)
    ax.axhline(1 / cfg.num_symbols, color="gray", ls="--", lw=1, label=f"chance (1/{cfg.num_symbols})")
    ax.set_xlabel(f"weight updates (each = M = {cfg.M} steps of {cfg.num_streams} streams)")
    ax.set_ylabel("online training accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"Delayed recall, delay {cfg.delay} steps: {cfg.describe_cell()}, {cfg.seeds} seeds (band: min..max)")
    ax.title.set_fontsize(10)
    ax.legend(loc="upper left", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def machine() -> str:
    """One line naming the CPU, core count, Python and torch versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions = f"Python {platform.python_version()}, torch {torch.__version__}"
    return f"{cpu}, {os.cpu_count()} cores, {versions}, {torch.get_num_threads()} thread(s)"


def run_demo(cfg: DemoConfig, console: Console | None = None) -> dict[str, Any]:
    """Train every (method, seed), print the table, write the plot and results.json; return the summary."""
    console = console or Console()
    _quiet_lightning()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest, and runs are reproducible
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    console.print(
        f"[bold]onlinerec demo[/]: delayed recall (cue, {cfg.delay} distractors, query; {cfg.num_symbols} classes), "
        f"{cfg.describe_cell()}, {cfg.num_streams} streams, weight update every M={cfg.M} steps, "
        f"{cfg.steps} updates per run, {cfg.seeds} seed(s) per method."
    )
    results: list[RunResult] = []
    columns = (
        TextColumn("{task.description:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("online acc {task.fields[acc]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        jobs = [(method, seed) for seed in range(cfg.seeds) for method in cfg.methods]
        tasks = {
            job: progress.add_task(f"{label(job[0])} seed {job[1]}", total=cfg.steps, acc="  -  ", start=False)
            for job in jobs
        }
        for job in jobs:
            task = tasks[job]
            progress.start_task(task)

            def report(step: int, acc: float | None, task: Any = task) -> None:
                progress.update(task, completed=step, acc="  -  " if acc is None else f"{acc:5.1%}")

            result = train_one(*job, cfg, report)
            progress.update(
                task, completed=cfg.steps, acc=f"{result.curve_accuracy[-1]:5.1%}" if result.curve_accuracy else "  -  "
            )
            progress.stop_task(task)
            results.append(result)

    table = Table(
        title=f"Held-out accuracy after {cfg.steps} updates (delay {cfg.delay}, M = {cfg.M}; chance {1 / cfg.num_symbols:.0%})"
    )
    table.add_column("method")
    table.add_column("accuracy (mean ± std)", justify="right")
    table.add_column("per seed", justify="right")
    table.add_column("s / run", justify="right")
    summary: dict[str, Any] = {}
    for method in cfg.methods:
        mean, std, accs = _summary(results, method)
        secs = statistics.fmean(r.seconds for r in results if r.method == method)
        table.add_row(
            f"{label(method)}(M={cfg.M})",
            f"{mean:.1%} ± {std:.1%}",
            "  ".join(f"{a:.1%}" for a in accs),
            f"{secs:.1f}",
        )
        summary[method] = {"mean": mean, "std": std, "per_seed": accs, "seconds_per_run": secs}
    console.print(table)

    png, js = out / "learning_curves.png", out / "results.json"
    plot_curves(results, cfg, png)
    record = {"config": asdict(cfg), "machine": machine(), "summary": summary, "runs": [asdict(r) for r in results]}
    js.write_text(json.dumps(record, indent=2))
    console.print(f"learning curves: {png}\nall numbers: {js}")
    accuracies = " ".join(f"{method}={summary[method]['mean']:.3f}" for method in cfg.methods)
    summary["line"] = f"demo: {accuracies} M={cfg.M} delay={cfg.delay} seeds={cfg.seeds}"
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """``onlinerec demo [options]``: parse (see :func:`onlinerec.config.parse_config`), run, print the summary line."""
    from onlinerec.config import parse_config

    cfg = parse_config(DemoConfig, argv, prog="onlinerec demo", description=DESCRIPTION, presets={"quick": QUICK})
    summary = run_demo(cfg)
    print(summary["line"], flush=True)
    return 0


DESCRIPTION = """Train an eLSTM with exact RTRL and with truncated BPTT (same M) on delayed recall, on CPU, and compare.

  onlinerec demo                                             the eLSTM, RTRL vs TBPTT (M = 10, delay 100, 3 seeds)
  onlinerec demo --cell lru --cell_kwargs '{r_min: 0.9}'     another cell (any name in onlinerec.cells.CELLS)
  onlinerec demo --cell lru --layers 4 --cell_kwargs '{residual: true, norm: rms}' --embedding_dim 32
  onlinerec demo --cell lstm --methods '[snap, tbptt]'       a fully recurrent cell (RTRL refuses it)"""
