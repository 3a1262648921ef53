"""The streaming agent's POPGym learning curves, one panel a task: every seed's training return (the mean of the last
100 episodes) against frames, beside R2AC's and RecurrentPPO's return at 100,000 frames and the random policy's.

    python experiments/streaming/popgym_curves.py runs/stream_evidence --plot docs/img/stream_popgym.png

The reference returns are those of docs/results.md (the memory suite and the held-out table: `popgym.yaml` and
RecurrentPPO's better setting, 100,000 frames, mean of the last 100 training episodes).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

TASKS = {  # task: (random policy, R2AC popgym.yaml, RecurrentPPO's better setting), docs/results.md
    "RepeatPreviousEasy": (-0.50, 0.999, 0.998),
    "RepeatFirstEasy": (-0.50, 0.673, 0.510),
    "CountRecallEasy": (-0.93, -0.558, -0.564),
    "AutoencodeEasy": (-0.50, -0.492, -0.481),
    "HigherLowerEasy": (0.006, 0.492, 0.501),
    "ConcentrationEasy": (-0.198, -0.160, -0.213),
}


def curve(run: Path) -> tuple[list[float], list[float]]:
    with (run / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["return"] not in ("", "nan")]
    return [float(r["frames"]) for r in rows], [float(r["return"]) for r in rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--plot", type=Path, required=True)
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    for ax, (task, (random, r2ac, ppo)) in zip(axes.flat, TASKS.items()):
        runs = [run for run in sorted((args.root / task).glob("rtrl-seed*")) if (run / "metrics.csv").exists()]
        for run in runs:
            ax.plot(*curve(run), lw=1, color="tab:blue", alpha=0.8)
        ax.axhline(random, color="grey", ls=":", lw=1, label="random policy")
        ax.plot([1e5], [r2ac], "o", color="tab:green", label="R2AC at 100k")
        ax.plot([1e5], [ppo], "s", color="tab:orange", label="RecurrentPPO at 100k")
        ax.set_title(f"{task} ({len(runs)} seeds)", fontsize=10)
        ax.set_xlabel("frames")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    axes.flat[0].plot([], [], color="tab:blue", label="streaming, exact RTRL (a line a seed)")
    axes.flat[0].legend(fontsize=7, loc="lower right")
    axes.flat[0].set_ylabel("return (mean of the last 100 episodes)")
    fig.suptitle("POPGym: the streaming agent's training return against frames")
    fig.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=90)
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
