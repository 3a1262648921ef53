"""Learning curves: a run's logged metric against env frames (:func:`load_curve`), and runs plotted together
(:func:`plot_learning_curves`), from the CSV logs every ``onlinerec rl`` run writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["load_curve", "plot_learning_curves"]


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
