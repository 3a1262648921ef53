"""The streaming agent on POPGym: the results table (markdown rows) and its learning curves, one panel a task.

    python experiments/streaming/popgym.py runs/stream_evidence --plot docs/img/stream_popgym.png
    python experiments/streaming/popgym.py runs/stream_evidence --configs wired mingru   # other configurations

A run folder is <root>/<task>/<configuration>-seed<s>; ``--configs`` names the configurations (default: rtrl), a row
each per task, and the figure draws them in colours of their own.

Rows: the training return (the mean of the last 100 episodes) at 100,000, 300,000 and 1,000,000 frames, mean ± std over
the seeds that reached it, with Farr et al.'s normalised score (R + 1) / 2 in brackets (POPGym's returns lie in [-1, 1]); beside
it R2AC's and RecurrentPPO's return at 100,000 frames (docs/results.md: the memory suite and the held-out table,
`popgym.yaml` and RecurrentPPO's better setting), Farr et al.'s normalised score at 10 M frames on the three tasks
whose score we quote (their envs are JAX ports of POPGym's), and the verdict against R2AC at 100,000 frames: a win
or a loss only when the means differ by more than max(the larger std, 0.02), as in docs/results.md. Then, where
RecurrentPPO's CPU time is known, the return the streaming runs reach in that time (at their own logged speed), and
the greedy evaluation of the finished runs (the policy's most likely action, on env streams of its own).
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from summarize import finished, read_run, return_at  # this folder's run reader (the script's folder is on sys.path)

# task: (the random policy's return as docs/results.md writes it, (R2AC mean, std), (RecurrentPPO mean, std), Farr et al.'s normalised score at 10 M or None)
TASKS = {
    "RepeatPreviousEasy": ("−0.50", (0.999, 0.000), (0.998, 0.001), 0.99),
    "RepeatFirstEasy": ("−0.50", (0.673, 0.510), (0.510, 0.485), 0.48),
    "CountRecallEasy": ("−0.93", (-0.558, 0.028), (-0.564, 0.064), 0.23),
    "AutoencodeEasy": ("−0.50", (-0.492, 0.008), (-0.481, 0.011), None),
    "HigherLowerEasy": ("0.006", (0.492, 0.015), (0.501, 0.004), None),
    "ConcentrationEasy": ("−0.198", (-0.160, 0.008), (-0.213, 0.012), None),
}


RECURRENT_PPO_MINUTES = {"RepeatPreviousEasy": 2.5, "RepeatFirstEasy": 2.5}
"""RecurrentPPO's CPU minutes for 100,000 frames of these tasks (docs/results.md: 2.4-2.6)."""


def reached(rows_of_runs: list[list[dict]], frames: float) -> list[float]:
    """Each run's logged return at ``frames``, for the runs that have reached it."""
    return [return_at(rows, frames) for rows in rows_of_runs if rows[-1]["frames"] >= frames]


def verdict(ours: tuple[float, float], theirs: tuple[float, float]) -> str:
    diff = ours[0] - theirs[0]
    if abs(diff) <= max(ours[1], theirs[1], 0.02):
        return "tie"
    return "**win**" if diff > 0 else "**loss**"


def num(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}".replace("-", "−")  # the docs' minus sign


def cell(values: list[float]) -> str:
    if not values:
        return "–"
    mean, std = statistics.fmean(values), statistics.pstdev(values)
    spread = f" ± {num(std)}" if len(values) > 1 else ""
    return f"{num(mean)}{spread} ({num((mean + 1) / 2, 2)}; {len(values)} seed{'s' if len(values) > 1 else ''})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--plot", type=Path, default=None, help="also draw the learning curves here")
    parser.add_argument("--configs", nargs="+", default=["rtrl"], help="configurations (folder name prefixes)")
    args = parser.parse_args(argv)
    runs = {
        (task, config): [data for run in sorted((args.root / task).glob(f"{config}-seed*")) if (data := read_run(run))]
        for config in args.configs
        for task in TASKS
    }
    curves = {key: [data["rows"] for data in found] for key, found in runs.items()}
    if not any(curves.values()):
        raise SystemExit(
            f"no POPGym runs under {args.root}: expected <root>/<task>/<configuration>-seed<s>/metrics.csv"
        )
    for config in args.configs:
        for task, (random, r2ac, ppo, farr) in TASKS.items():
            early, late, longest = (reached(curves[task, config], frames) for frames in (1e5, 3e5, 1e6))
            ours = (statistics.fmean(early), statistics.pstdev(early)) if early else None
            print(
                f"| {task} ({random}) | {config} | {cell(early)} | "
                f"{num(r2ac[0])} ± {num(r2ac[1])} | {num(ppo[0])} ± {num(ppo[1])} | "
                f"{cell(late)} | {cell(longest)} | {'–' if farr is None else farr} | "
                f"{verdict(ours, r2ac) if ours else '–'} |"
            )
    for config in args.configs:
        for task, minutes in RECURRENT_PPO_MINUTES.items():
            # the frames each run makes in RecurrentPPO's minutes, at the run's own logged speed (runs that got there)
            found = runs[task, config]
            frames = {id(d): minutes * d["total"] / d["minutes"] for d in found if math.isfinite(d["minutes"])}
            there = [d for d in found if id(d) in frames and d["rows"][-1]["frames"] >= frames[id(d)]]
            if there:
                at = [return_at(d["rows"], frames[id(d)]) for d in there]
                mean_frames = statistics.fmean(frames[id(d)] for d in there)
                print(f"{task}, {config}, in {minutes} minutes (about {mean_frames:,.0f} frames): {cell(at)}")
    for config in args.configs:
        for task in TASKS:
            done = [d for d in runs[task, config] if finished(d)]
            if done:
                at = int(statistics.fmean(d["total"] for d in done))
                greedy = cell([d["eval"]["mean"] for d in done])
                print(f"{task}, {config}, greedy evaluation after {at:,} frames: {greedy}")
    if args.plot:
        plot(curves, args.configs, args.plot)


def plot(curves: dict[tuple[str, str], list], configs: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = dict(zip(configs, ["tab:blue", "tab:purple", "tab:red", "tab:brown", "tab:olive"]))
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    for ax, (task, (random, r2ac, ppo, _)) in zip(axes.flat, TASKS.items()):
        for config in configs:
            for rows in curves[task, config]:
                logged = [r for r in rows if math.isfinite(r.get("return", math.nan))]
                ax.plot([r["frames"] for r in logged], [r["return"] for r in logged], lw=1, color=colours[config],
                        alpha=0.8)  # fmt: skip
        ax.axhline(float(random.replace("−", "-")), color="grey", ls=":", lw=1, label="random policy")
        ax.errorbar([1e5], [r2ac[0]], [r2ac[1]], fmt="o", color="tab:green", capsize=3, label="R2AC at 100k")
        ax.errorbar([1e5], [ppo[0]], [ppo[1]], fmt="s", color="tab:orange", capsize=3, label="RecurrentPPO at 100k")
        seeds = ", ".join(f"{len(curves[task, c])} {c}" for c in configs)
        ax.set_title(f"{task} ({seeds})", fontsize=9)
        ax.set_xlabel("frames")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    for config in configs:
        axes.flat[0].plot([], [], color=colours[config], label=f"streaming, {config} (a line a seed)")
    axes.flat[0].legend(fontsize=7, loc="lower right")
    axes.flat[0].set_ylabel("return (mean of the last 100 episodes)")
    fig.suptitle("POPGym: the streaming agent's training return against frames")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
