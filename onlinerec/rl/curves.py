"""Learning curves: a run's logged metric against env frames (:func:`load_curve`), and runs plotted together
(:func:`plot_learning_curves`), from the CSV logs every ``onlinerec rl`` run writes; with the random policy's return
where it is known (:func:`random_policy_return`) and a mark where a resumed run changed its settings
(:func:`setting_changes`, from ``config_changes.json``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["load_curve", "plot_learning_curves", "random_policy_return", "setting_changes"]


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
    baseline_label: str = "random policy",
    marks: Sequence[tuple[float, str]] = (),
) -> Path:
    """One curve per label (mean over its runs, with min-max band when there are several) of ``metric`` vs frames;
    ``baseline`` a dashed horizontal line, and each of ``marks`` (frames, text) a dotted vertical line with its text
    (where a run's settings changed: :func:`setting_changes`)."""
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
        ax.axhline(baseline, color="gray", linestyle="--", label=baseline_label)
    for frames, text in marks:
        ax.axvline(frames, color="black", linestyle=":", linewidth=1)
        ax.text(
            frames, 0.98, f" {text}", transform=ax.get_xaxis_transform(), rotation=90, va="top", ha="right", fontsize=8
        )
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


def setting_changes(run_dir: str | Path) -> list[tuple[float | None, dict[str, tuple[Any, Any]]]]:
    """Where a run resumed with other settings (``--allow_config_change``): (env frames at the change, or None where
    the run's ``config_changes.json`` did not record them, ``{setting: (was, now)}``), in order."""
    path = Path(run_dir) / "config_changes.json"
    if not path.exists():
        return []
    out = []
    for entry in json.loads(path.read_text()):
        changes = entry.get("changes", entry) if isinstance(entry, Mapping) else {}
        frames = entry.get("frames") if "changes" in entry else None
        out.append((frames, {k: (v.get("was"), v.get("now")) for k, v in changes.items()}))
    return out


def random_policy_return(env: str, env_kwargs: Mapping[str, Any] | None = None) -> float | None:
    """The mean episode return of uniformly random actions where it is known exactly, else None. The built-in T-maze
    (``memory:tmaze``): ``trials * (1 + (num_cues - 1) * wrong_reward) / num_cues``, chance (1 / num_cues) by default."""
    if str(env).lower() != "memory:tmaze":
        return None
    from onlinerec.rl.envs.memory import TMazeVectorEnv

    defaults = {k: p.default for k, p in inspect.signature(TMazeVectorEnv).parameters.items()}
    kw = {**defaults, **(env_kwargs or {})}
    cues = int(kw["num_cues"])
    return int(kw["trials"]) * (1 + (cues - 1) * float(kw["wrong_reward"])) / cues
