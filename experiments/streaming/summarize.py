"""Tables of the streaming evidence runs: one row per task and configuration, mean ± std over the seeds that finished.

    python experiments/streaming/summarize.py runs/stream_evidence            # every task
    python experiments/streaming/summarize.py runs/stream_evidence --at 100000 # also the training return at 100k frames
    python experiments/streaming/summarize.py runs/stream_evidence --at 40000 100000 300000 --popgym  # POPGym's table

A run folder is <root>/<task>/<configuration>-seed<s> (what queue.txt writes). Columns: seeds finished (and running),
the training return over the last 10 % of frames (T-maze: the fraction of right turns; "solved" counts seeds at
>= 0.9), the greedy evaluation's mean return, and the minutes each run took (one torch thread; wall time with two runs
on two cores, which is their CPU time within a few per cent). ``--popgym``: POPGym tasks only, each return also as
Farr et al.'s normalised score (0 = the minimum return, 1 = optimal: (R + 1) / 2, POPGym's returns lying in [-1, 1]).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
from pathlib import Path


def read_run(run: Path) -> dict | None:
    """What one run folder holds: its metrics rows, the evaluation (if finished) and its minutes so far."""
    metrics = run / "metrics.csv"
    if not metrics.exists():
        return None
    with metrics.open() as f:
        rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    if not rows:
        return None
    config = json.loads((run / "config.json").read_text())
    log = (run / "run.log").read_text() if (run / "run.log").exists() else ""
    evaluation = json.loads((run / "eval.json").read_text()) if (run / "eval.json").exists() else None
    total = float(config["total_frames"])
    return dict(rows=rows, total=total, eval=evaluation, minutes=minutes_for(log, total))


def minutes_for(log: str, total: float) -> float:
    """The minutes ``total`` frames take at the run's logged speed. A resumed run logs a segment per start (each from
    ``elapsed 0:00:00``) and replays the frames since its checkpoint, so the segments' minutes are not simply added."""
    segments: list[list[float]] = []  # [first frames, last frames, last minutes] per start
    for n, h, m, s in re.findall(r"frames ([\d,]+) /.*elapsed (\d+):(\d\d):(\d\d)", log):
        frames, minutes = float(n.replace(",", "")), 60 * int(h) + int(m) + int(s) / 60
        if not segments or minutes == 0.0:
            segments.append([frames, frames, minutes])
        segments[-1][1:] = [frames, minutes]
    frames = sum(last - first for first, last, _ in segments)
    return total * sum(minutes for *_, minutes in segments) / frames if frames else float("nan")


def finished(run: dict) -> bool:
    """Evaluated at its total frames (a run being extended still holds the evaluation of its shorter budget)."""
    return run["eval"] is not None and run["rows"][-1]["frames"] >= run["total"]


def tail_return(rows: list[dict], total: float, fraction: float = 0.1) -> float:
    """The mean of the logged return (a running mean of the last episodes) over the last ``fraction`` of the frames."""
    tail = [r["return"] for r in rows if r["frames"] >= (1 - fraction) * total and "return" in r]
    return statistics.fmean(tail) if tail else float("nan")


def return_at(rows: list[dict], frames: float) -> float:
    """The logged return at the first row at or after ``frames``."""
    for r in rows:
        if r["frames"] >= frames:
            return r.get("return", float("nan"))
    return float("nan")


def mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.pstdev(values):.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument(
        "--at", type=float, nargs="*", default=[], help="also report the training return at these frames"
    )
    parser.add_argument("--popgym", action="store_true", help="POPGym tasks only, with the normalised score")
    args = parser.parse_args(argv)
    fmt = (
        (lambda values: f"{mean_std(values)} ({mean_std([(v + 1) / 2 for v in values])})") if args.popgym else mean_std
    )
    groups: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for run in sorted(args.root.glob("*/*-seed*")):
        if args.popgym and not run.parent.name.endswith(("Easy", "Medium", "Hard")):
            continue
        name, _, seed = run.name.rpartition("-seed")
        data = read_run(run)
        if data is not None:
            groups.setdefault((run.parent.name, name), []).append((int(seed), data))
    if not groups:
        raise SystemExit(f"no runs under {args.root}: expected <root>/<task>/<configuration>-seed<s>/metrics.csv")
    header = "| task | configuration | seeds done (running) | last 10 % of training | solved (≥ 0.9) | greedy eval |"
    header += "".join(f" at {at:,.0f} frames (seeds) |" for at in args.at)
    print(header + " minutes a run |")
    print("|---" * (header.count("|") - 1 + 1) + "|")
    for (task, name), runs in sorted(groups.items()):
        done = [(s, d) for s, d in runs if finished(d)]
        running = [s for s, d in runs if not finished(d)]
        tails = [tail_return(d["rows"], d["total"]) for _, d in done]
        evals = [d["eval"]["mean"] for _, d in done]
        solved = sum(t >= 0.9 for t in tails)
        seeds = ",".join(str(s) for s, _ in done) or "–"
        seeds += f" ({','.join(map(str, running))})" if running else ""
        line = f"| {task} | {name} | {seeds} | {fmt(tails)} | {solved}/{len(done)} | {fmt(evals)} |"
        for at in args.at:
            reached = [return_at(d["rows"], at) for _, d in runs if d["rows"][-1]["frames"] >= at]
            line += f" {fmt(reached)} ({len(reached)}) |"
        minutes = [d["minutes"] for _, d in done]
        line += f" {min(minutes):.0f}–{max(minutes):.0f} |" if minutes else " – |"
        print(line)


if __name__ == "__main__":
    main()
