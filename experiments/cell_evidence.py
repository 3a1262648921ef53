"""Evidence for the built-in cells (docs/results.md, sections "Cells" and "Deep models"), on the demo's task.

Every run is one ``onlinerec demo`` run: :func:`onlinerec.tasks.demo.train_one` with a
:class:`~onlinerec.tasks.demo.DemoConfig`, so each row of the tables is reproduced, seeds and all, by the
``onlinerec demo ...`` command printed next to it. Three groups:

- ``cells``: delayed recall at the demo's settings (delay 100, M = 10, 800 updates, N = 32, B = 32, Adam 1e-2) for
  every built-in cell, RTRL vs TBPTT at the same M; the fully recurrent FELSTM, LSTM and GRU (which RTRL refuses)
  with SnAP-1 vs TBPTT. Each cell starts with long memory where it has an argument for it (see ``CELLS``).
- ``gates``: minGRU with the update-gate bias at 0 (the paper's) against -3 (the ``cells`` row), RTRL.
- ``deep``: a 1-layer and a 4-layer LRU stack (residual connections, one-hot tokens, N = 32 per layer, ring
  |lambda| in [0.99, 0.999]) on delayed recall with delay 200: RTRL at M = 10, TBPTT at M = 10, and full BPTT over
  whole sequences.

Full BPTT over whole sequences is TBPTT with M = delay + 2 = the sequence length. Every delayed-recall sequence has
that length and ``SequenceDataModule`` deals equal-length sequences round robin from step 0 of every stream, so each
segment is exactly one sequence per stream, starting with its reset (``check_bptt_alignment`` asserts it): one
update per batch of B whole sequences, with the exact gradient of each. It gets the same training sequences as the
online runs (its ``steps`` = ceil(online steps x M / (delay + 2)): the same data to within one update), so it makes
M / (delay + 2) as many updates.

One JSON per run in ``<out>/runs/<group>/<row>/<method>/seed<k>.json`` (skipped when it exists: resumable, and a
killed run is simply re-run); ``report`` writes ``<out>/cell_evidence.md`` (tables) and ``<out>/cells.png``,
``<out>/deep.png`` (curves).

Usage::

    python experiments/cell_evidence.py run --out runs/cell_evidence --jobs 2 [--groups cells gates deep] [--seeds 3]
    python experiments/cell_evidence.py report --out runs/cell_evidence
    python experiments/cell_evidence.py --quick            # seconds-long smoke run of every row (tests)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

GOAL = 0.9
"""'How fast': the first update at which the online training accuracy (a window of updates) reaches this."""


@dataclass
class Row:
    """One row of a table: a cell configuration and the methods it is trained with (each at its own M)."""

    group: str
    name: str
    cell: str
    methods: dict[str, int]  # label -> M; label "bptt" is TBPTT with M = the sequence length
    cell_kwargs: dict[str, Any] = field(default_factory=dict)
    layers: int = 1
    embedding_dim: int | None = None
    delay: int = 100
    steps: int | None = None  # updates of the online methods (default: the demo's 8 x delay)
    note: str = ""


RTRL_TBPTT = {"rtrl": 10, "tbptt": 10}
SNAP_TBPTT = {"snap": 10, "tbptt": 10}
LRU_LONG = {"r_min": 0.9, "r_max": 0.999}
LRU_SLOW = {"r_min": 0.99, "r_max": 0.999}
DEEP = {**LRU_SLOW, "residual": True}

ROWS = [
    Row("cells", "eLSTM", "elstm", RTRL_TBPTT, note="forget bias +3 (the demo's)"),
    Row("cells", "QRNN", "qrnn", RTRL_TBPTT, note="default init (no forget-bias argument)"),
    Row("cells", "SRU", "sru", RTRL_TBPTT, note="default init (no forget-bias argument)"),
    Row("cells", "LRU", "lru", RTRL_TBPTT, LRU_LONG, note="ring \\|λ\\| in [0.9, 0.999]"),
    Row("cells", "LRU (slower ring)", "lru", RTRL_TBPTT, LRU_SLOW, note="ring \\|λ\\| in [0.99, 0.999]"),
    Row("cells", "minGRU", "mingru", RTRL_TBPTT, {"update_bias": -3.0}, note="update bias -3"),
    Row("cells", "minLSTM", "minlstm", RTRL_TBPTT, note="forget bias +3, normalised gates (the paper's)"),
    Row("cells", "minLSTM (unnormalised)", "minlstm", RTRL_TBPTT, {"normalize": False}, note="forget bias +3"),
    Row("cells", "IndRNN", "indrnn", RTRL_TBPTT, note="default init (u uniform in [0, 1))"),
    Row("cells", "FELSTM", "felstm", SNAP_TBPTT, note="forget bias +3; fully recurrent"),
    Row("cells", "LSTM", "lstm", SNAP_TBPTT, note="forget bias +3; fully recurrent"),
    Row("cells", "GRU", "gru", SNAP_TBPTT, {"update_bias": 3.0}, note="update bias +3; fully recurrent"),
    Row("gates", "minGRU, update bias 0", "mingru", {"rtrl": 10}, {"update_bias": 0.0}, note="the paper's init"),
    Row("deep", "LRU, 1 layer", "lru", {"rtrl": 10, "tbptt": 10, "bptt": 0}, DEEP, 1, None, 200),
    Row("deep", "LRU, 4 layers", "lru", {"rtrl": 10, "tbptt": 10, "bptt": 0}, DEEP, 4, None, 200),
]

QUICK = {"delay": 6, "steps": 6, "hidden_size": 4, "num_streams": 4, "eval_size": 8, "curve_points": 3}


def seq_len(row: Row) -> int:
    return row.delay + 2


def demo_args(row: Row, label: str, seeds: int, quick: bool = False) -> dict[str, Any]:
    """The DemoConfig fields (and so the ``onlinerec demo`` options) of one method of one row."""
    delay = QUICK["delay"] if quick else row.delay
    steps = QUICK["steps"] if quick else (row.steps or 8 * delay)
    online_m = next((m for k, m in row.methods.items() if k != "bptt"), 10)
    args: dict[str, Any] = {"cell": row.cell, "delay": delay, "seeds": seeds}
    if label == "bptt":
        # Same training sequences as the online runs (their data module draws ceil(steps*M*B/L) + B of them).
        args |= {"methods": ["tbptt"], "M": delay + 2, "steps": math.ceil(steps * online_m / (delay + 2))}
    else:
        args |= {"methods": [label], "M": row.methods[label], "steps": steps}
    if row.layers > 1:
        args["layers"] = row.layers
    if row.cell_kwargs:
        args["cell_kwargs"] = dict(row.cell_kwargs)
    if row.embedding_dim:
        args["embedding_dim"] = row.embedding_dim
    if quick:
        args |= {k: v for k, v in QUICK.items() if k not in ("delay", "steps")}
        if row.embedding_dim:
            args["embedding_dim"] = 4
    return args


def command(args: dict[str, Any], defaults: dict[str, Any]) -> str:
    """``onlinerec demo ...`` with the options that differ from the demo's defaults."""
    parts = ["onlinerec demo"]
    for key, value in args.items():
        if key in defaults and defaults[key] == value:
            continue
        if isinstance(value, dict):
            text = (
                "{"
                + ", ".join(f"{k}: {json.dumps(v) if isinstance(v, str) else _yaml(v)}" for k, v in value.items())
                + "}"
            )
            parts.append(f"--{key} {shlex.quote(text)}")
        elif isinstance(value, list):
            parts.append(f"--{key} {shlex.quote('[' + ', '.join(value) + ']')}")
        else:
            parts.append(f"--{key} {value}")
    return " ".join(parts)


def _yaml(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)


def row_commands(row: Row, seeds: int) -> list[str]:
    """The ``onlinerec demo`` commands of a row: the online methods in one, full BPTT in another."""
    from onlinerec.tasks.demo import DemoConfig

    defaults = asdict(DemoConfig())
    defaults["steps"] = 8 * row.delay
    online = [k for k in row.methods if k != "bptt"]
    out = []
    if online:
        args = demo_args(row, online[0], seeds)
        if len(online) > 1 and len({row.methods[k] for k in online}) == 1:
            args["methods"] = online
            cmds = [command(args, defaults)]
        else:
            cmds = [command(demo_args(row, k, seeds), defaults) for k in online]
        out += cmds
    if "bptt" in row.methods:
        out.append(command(demo_args(row, "bptt", seeds), defaults))
    return out


def result_path(out: Path, row: Row, label: str, seed: int) -> Path:
    safe = "".join(c if c.isalnum() else "_" for c in row.name).strip("_")
    return out / "runs" / row.group / safe / label / f"seed{seed}.json"


def check_bptt_alignment(cfg: Any) -> None:
    """Assert that with M = delay + 2 every training segment is exactly one whole sequence per stream."""
    from onlinerec.data.delayed_recall import DelayedRecallDataModule

    length = cfg.delay + 2
    dm = DelayedRecallDataModule(delay=cfg.delay, train_size=3 * cfg.num_streams, num_streams=cfg.num_streams, M=length)
    dm.setup("fit")
    for segment in dm.train_dataloader():
        ids = segment.sequence_id
        assert bool(segment.reset[0].all()) and not bool(segment.reset[1:].any()), "a segment is not one sequence"
        assert bool((ids == ids[0]).all()), "a segment mixes sequences"


def run_job(row: Row, label: str, seed: int, seeds: int, quick: bool, path: str) -> dict[str, Any] | None:
    """Train one (row, method, seed) in this process (one torch thread) and write its JSON.

    Skipped (None) when its JSON exists or another process holds its lock file (younger than ``LOCK_AGE`` s), so that
    several ``run`` processes can share one output folder."""
    p = Path(path)
    lock = p.with_suffix(".lock")
    if p.exists() or (lock.exists() and time.time() - lock.stat().st_mtime < LOCK_AGE):
        return None
    p.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(str(os.getpid()))
    try:
        return _train_and_write(row, label, seed, seeds, quick, p)
    finally:
        lock.unlink(missing_ok=True)


LOCK_AGE = 4 * 3600


def _train_and_write(row: Row, label: str, seed: int, seeds: int, quick: bool, p: Path) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from onlinerec.tasks.demo import DemoConfig, _quiet_lightning, machine, train_one

    _quiet_lightning()
    args = demo_args(row, label, seeds, quick)
    cfg = DemoConfig(**args)
    if label == "bptt":
        check_bptt_alignment(cfg)
    start = time.perf_counter()
    cpu0 = time.process_time()
    result = train_one(cfg.methods[0], seed, cfg)
    record = {
        "group": row.group,
        "row": row.name,
        "label": label,
        "seed": seed,
        "M": cfg.M,
        "steps": cfg.steps,
        "config": asdict(cfg),
        "final_accuracy": result.final_accuracy,
        "curve_steps": result.curve_steps,
        "curve_accuracy": result.curve_accuracy,
        "sequences_per_update": cfg.M * cfg.num_streams / (cfg.delay + 2),
        "wall_s": time.perf_counter() - start,
        "cpu_s": time.process_time() - cpu0,
        "machine": machine(),
        "load_avg": os.getloadavg()[0],
    }
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(p)
    return record


def _init_worker() -> None:
    try:  # niceness 5 (the machine is shared), whatever the parent's
        os.nice(max(0, 5 - os.nice(0)))
    except OSError:
        pass


def run(out: Path, groups: list[str], seeds: int, jobs: int, quick: bool, reverse: bool = False) -> None:
    todo = []
    order = range(seeds - 1, -1, -1) if reverse else range(seeds)
    for seed in order:  # seed-major: every row gets its first seeds early
        for row in reversed(ROWS) if reverse else ROWS:
            if row.group not in groups:
                continue
            for label in row.methods:
                path = result_path(out, row, label, seed)
                if not path.exists():
                    todo.append((row, label, seed, path))
    print(f"{len(todo)} runs to do in {out}", flush=True)
    start = time.perf_counter()
    if jobs <= 1:
        for row, label, seed, path in todo:
            rec = run_job(row, label, seed, seeds, quick, str(path))
            _progress(rec, start)
        return
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker) as pool:
        futures = [pool.submit(run_job, row, label, seed, seeds, quick, str(path)) for row, label, seed, path in todo]
        for fut in concurrent.futures.as_completed(futures):
            _progress(fut.result(), start)


def _progress(rec: dict[str, Any] | None, start: float) -> None:
    if rec is None:  # done or running elsewhere
        return
    print(
        f"[{time.perf_counter() - start:7.0f}s] {rec['group']:5s} {rec['row']:24s} {rec['label']:5s} seed {rec['seed']}: "
        f"{rec['final_accuracy']:.3f}  ({rec['wall_s']:.0f} s, load {rec['load_avg']:.1f})",
        flush=True,
    )


def load(out: Path) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for path in sorted((out / "runs").rglob("seed*.json")):
        rec = json.loads(path.read_text())
        runs.setdefault((rec["group"], rec["row"], rec["label"]), []).append(rec)
    for recs in runs.values():
        recs.sort(key=lambda r: r["seed"])
    return runs


NAMES = {"rtrl": "RTRL", "tbptt": "TBPTT", "snap": "SnAP-1", "bptt": "full BPTT"}


def first_reach(rec: dict[str, Any], goal: float = GOAL) -> int | None:
    return next((s for s, a in zip(rec["curve_steps"], rec["curve_accuracy"]) if a >= goal), None)


def summary(recs: list[dict[str, Any]]) -> dict[str, Any]:
    accs = [r["final_accuracy"] for r in recs]
    reach = [first_reach(r) for r in recs]
    return {
        "mean": statistics.fmean(accs),
        "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
        "accs": accs,
        "reached": sum(x is not None for x in reach),
        "reach": [x for x in reach if x is not None],
        "wall": statistics.fmean(r["wall_s"] for r in recs),
        "cpu": statistics.fmean(r.get("cpu_s", math.nan) for r in recs),
        "seqs": [(r["steps"] * r["sequences_per_update"]) for r in recs],
    }


def _fmt_reach(s: dict[str, Any], n: int) -> str:
    if not s["reached"]:
        return "never"
    med = statistics.median(s["reach"])
    return f"{s['reached']}/{n} seeds, median {med:.0f}"


def report(out: Path) -> str:
    runs = load(out)
    seeds = max((len(v) for v in runs.values()), default=0)
    lines: list[str] = []
    for group, title in (("cells", "Cells"), ("gates", "Gate initialisation"), ("deep", "Deep models")):
        rows = [r for r in ROWS if r.group == group and any((group, r.name, k) in runs for k in r.methods)]
        if not rows:
            continue
        lines += [f"### {title}", ""]
        if group == "deep":
            lines += [
                "| model | method | M | updates | held-out accuracy (mean ± std) | per seed | of full BPTT's | "
                f"updates to {GOAL:.0%} online | s / run (wall, CPU) |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
        else:
            lines += [
                f"| cell | init | method (M) | held-out accuracy (mean ± std) | per seed | updates to {GOAL:.0%} online | "
                "s / run (wall, CPU) |",
                "|---|---|---|---|---|---|---|",
            ]
        for row in rows:
            ref = runs.get((group, row.name, "bptt"))
            ref_mean = summary(ref)["mean"] if ref else None
            for label in row.methods:
                recs = runs.get((group, row.name, label))
                if not recs:
                    continue
                s = summary(recs)
                per_seed = ", ".join(f"{a:.1%}" for a in s["accs"])
                acc = f"**{s['mean']:.1%} ± {s['std']:.1%}**"
                if group == "deep":
                    kept = "" if not ref_mean or label == "bptt" else f"{s['mean'] / ref_mean:.0%}"
                    lines.append(
                        f"| {row.name} | {NAMES[label]} | {recs[0]['M']} | {recs[0]['steps']} | {acc} | {per_seed} | "
                        f"{kept} | {_fmt_reach(s, len(recs))} | {s['wall']:.0f}, {s['cpu']:.0f} |"
                    )
                else:
                    lines.append(
                        f"| {row.name} | {row.note} | {NAMES[label]} ({recs[0]['M']}) | {acc} | {per_seed} | "
                        f"{_fmt_reach(s, len(recs))} | {s['wall']:.0f}, {s['cpu']:.0f} |"
                    )
        lines += ["", "Commands (each reproduces its rows, every seed):", "", "```bash"]
        for row in rows:
            lines += row_commands(row, seeds)
        lines += ["```", ""]
    total = sum(r["wall_s"] for recs in runs.values() for r in recs)
    cpu = sum(r.get("cpu_s", 0.0) for recs in runs.values() for r in recs)
    loads = [r["load_avg"] for recs in runs.values() for r in recs]
    any_rec = next(iter(runs.values()))[0] if runs else None
    if any_rec:
        lines += [
            f"{sum(len(v) for v in runs.values())} runs, {total / 3600:.2f} h of run time in all ({cpu / 3600:.2f} h CPU), "
            f"load average {min(loads):.1f}-{max(loads):.1f} at the runs' ends; machine: {any_rec['machine']}.",
            "",
        ]
    text = "\n".join(lines)
    (out / "cell_evidence.md").write_text(text)
    plot(runs, out)
    return text


def _curves(ax: Any, recs: list[dict[str, Any]], color: str, name: str, x_per_step: float = 1.0) -> None:
    n = min(len(r["curve_steps"]) for r in recs)
    if n == 0:
        return
    xs = [s * x_per_step for s in recs[0]["curve_steps"][:n]]
    cols = list(zip(*(r["curve_accuracy"][:n] for r in recs)))
    ax.plot(xs, [statistics.fmean(c) for c in cols], color=color, lw=1.8, label=name)
    ax.fill_between(xs, [min(c) for c in cols], [max(c) for c in cols], color=color, alpha=0.2, lw=0)


COLORS = {"rtrl": "tab:blue", "tbptt": "tab:orange", "snap": "tab:green", "bptt": "tab:red"}


def plot(runs: dict[tuple[str, str, str], list[dict[str, Any]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for group, fname in (("cells", "cells.png"), ("deep", "deep.png")):
        rows = [r for r in ROWS if r.group in ((group, "gates") if group == "cells" else (group,))]
        rows = [r for r in rows if any((r.group, r.name, k) in runs for k in r.methods)]
        if not rows:
            continue
        cols = 4 if group == "cells" else len(rows)
        nrows = math.ceil(len(rows) / cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(3.3 * cols, 2.6 * nrows), dpi=110, squeeze=False)
        for ax, row in zip(axes.flat, rows):
            for label in row.methods:
                recs = runs.get((row.group, row.name, label))
                if not recs:
                    continue
                if group == "deep":  # x: training sequences seen, the same data for every method
                    _curves(
                        ax, recs, COLORS[label], f"{NAMES[label]} (M={recs[0]['M']})", recs[0]["sequences_per_update"]
                    )
                else:
                    _curves(ax, recs, COLORS[label], f"{NAMES[label]} (M={recs[0]['M']})")
            ax.axhline(0.25, color="gray", ls="--", lw=0.8)
            ax.set_ylim(0, 1.02)
            ax.set_title(row.name if group == "deep" else f"{row.name}: {row.note}".replace("\\|", "|"), fontsize=7.5)
            ax.set_xlabel("training sequences seen" if group == "deep" else "weight updates", fontsize=7.5)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6.5, loc="upper left")
        for ax in list(axes.flat)[len(rows) :]:
            ax.axis("off")
        delay = rows[0].delay
        fig.suptitle(
            f"Delayed recall, delay {delay}: online training accuracy (mean over seeds, band min..max; chance dashed)",
            fontsize=9,
        )
        fig.tight_layout()
        fig.savefig(out / fname)
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", nargs="?", choices=["run", "report"], default="run")
    parser.add_argument("--out", default="runs/cell_evidence")
    parser.add_argument("--groups", nargs="+", default=["cells", "gates", "deep"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny runs of every row (smoke test), then the report")
    parser.add_argument(
        "--reverse",
        action="store_true",
        help="last seed and row first (a second process sharing --out meets the first)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.quick:
        if args.out == parser.get_default("out"):
            out = Path("runs/cell_evidence_quick")
        run(out, args.groups, 1, 1, True)
        text = report(out)
        print(text)
        print(f"rows={len({(g, r) for g, r, _ in load(out)})} out={out}")
        return 0
    if args.action == "run":
        run(out, args.groups, args.seeds, args.jobs, False, args.reverse)
    print(report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
