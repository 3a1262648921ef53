"""Check and draw docs/results.md's table of the shipped POPGym config on every other POPGym env.

The table (section "Every other POPGym env" of the memory suite) is written by hand from the runs of
``benchmarks/memory_suite.py``: for each POPGym env outside the suite's three, ``popgym.yaml``'s final return and
the better of RecurrentPPO's two settings, mean and population std of 3 seeds, and a verdict. This script reads the
table back, recomputes every verdict by the rule the page states (a win or a loss only when the two means differ by
more than max(the larger population std, 0.02); otherwise a tie), checks the verdicts and the tally under the table
against it, and can draw the table as a figure.

    python experiments/heldout_table.py                        # check; prints the tallies, exits 1 on a mismatch
    python experiments/heldout_table.py --plot docs/img/heldout_glance.png
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"
HEADING = "### Every other POPGym env"
FLOOR = 0.02  # gaps of 0.02 or less are ties whatever the spreads
NUM = r"([−-]?\d+(?:\.\d+)?)"


@dataclass(frozen=True)
class Row:
    """One env: the shipped config's and RecurrentPPO's final return, mean and population std of 3 seeds."""

    env: str
    control: bool  # POPGym's partially observed control (CartPoles, pendulums), not a memory game
    seen: bool  # marked †: its results chose popgym.yaml's critic of its own
    random: float  # the uniform random policy's return
    ours: tuple[float, float]
    theirs: tuple[float, float]
    verdict: str  # as written in the table


def number(text: str) -> float:
    return float(text.replace("−", "-"))


def verdict(ours: tuple[float, float], theirs: tuple[float, float]) -> str:
    """win / tie / loss of ``ours`` against ``theirs``: a win or a loss only past max(the larger std, FLOOR)."""
    gap, tolerance = ours[0] - theirs[0], max(ours[1], theirs[1], FLOOR)
    return "win" if gap > tolerance else "loss" if gap < -tolerance else "tie"


def section(text: str, source: Path = RESULTS) -> str:
    """The table's section, up to the next heading."""
    start = text.find(HEADING + "\n")
    if start < 0:
        raise SystemExit(f"{source}: no heading starting {HEADING!r} (give the results file with --results)")
    end = text.find("\n### ", start + len(HEADING))
    return text[start : end if end > 0 else len(text)]


def read_rows(text: str, source: Path = RESULTS) -> list[Row]:
    rows = []
    pattern = re.compile(
        rf"^\| (\w+)( \(control\))?( †)? \({NUM}\) \| {NUM} ± {NUM} \| {NUM} ± {NUM} \((?:defaults|recipe)\) \| "
        r"\**(win|tie|loss)\** \|"
    )
    for line in section(text, source).splitlines():
        if not line.startswith("| ") or line.startswith("| env ") or line.startswith("|---"):
            continue
        match = pattern.match(line)
        if match is None:
            raise SystemExit(f"{source}: a row of the table does not parse:\n{line}")
        env, control, seen, rnd, om, os_, tm, ts, said = match.groups()
        rows.append(
            Row(env, bool(control), bool(seen), number(rnd), (number(om), number(os_)), (number(tm), number(ts)), said)
        )
    return rows


def tallies(rows: list[Row]) -> dict[str, Counter]:
    counts: dict[str, Counter] = {
        "all": Counter(),
        "memory": Counter(),
        "unseen memory": Counter(),
        "control": Counter(),
    }
    for row in rows:
        v = verdict(row.ours, row.theirs)
        counts["all"][v] += 1
        counts["control" if row.control else "memory"][v] += 1
        if not row.control and not row.seen:
            counts["unseen memory"][v] += 1
    return counts


def phrase(count: Counter) -> str:
    words = (("win", "wins"), ("tie", "ties"), ("loss", "losses"))
    return ", ".join(f"{count[one]} {one if count[one] == 1 else many}" for one, many in words)


def check(text: str, source: Path = RESULTS) -> list[str]:
    """Every way the table disagrees with the rule or with its tally paragraph, as messages (empty: consistent)."""
    rows, problems = read_rows(text, source), []
    for row in rows:
        if verdict(row.ours, row.theirs) != row.verdict:
            problems.append(f"{row.env}: the table says {row.verdict}, the rule gives {verdict(row.ours, row.theirs)}")
    names = [row.env for row in rows]
    problems += [f"{env}: listed twice" for env, n in Counter(names).items() if n > 1]
    counts = tallies(rows)
    prose = " ".join(section(text, source).split())  # the tally's sentences, whatever their line breaks
    expected = {
        "all": f"**Tally: {phrase(counts['all'])}** over the {len(rows)} envs",
        "memory": f"Memory games ({sum(counts['memory'].values())}): {phrase(counts['memory'])}",
        "unseen memory": f"on the {sum(counts['unseen memory'].values())} that no choice saw: "
        f"{phrase(counts['unseen memory'])}",
        "control": f"Partially observed control ({sum(counts['control'].values())}): {phrase(counts['control'])}",
    }
    for kind, sentence in expected.items():
        if sentence not in prose:
            problems.append(f"the {kind} tally should read: {sentence}")
    return problems


def plot(rows: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"win": "#d9f0d3", "loss": "#f4cccc", "tie": "white"}
    fig, ax = plt.subplots(figsize=(8, 0.24 * len(rows) + 1.2))
    for y, row in enumerate(rows):
        ax.axhspan(y - 0.5, y + 0.5, color=colours[verdict(row.ours, row.theirs)], zorder=0)
        ax.plot(row.random, y, "|", color="0.4", markersize=9, zorder=2)
        ax.errorbar(row.theirs[0], y + 0.15, xerr=row.theirs[1], fmt="s", color="tab:orange", ms=4, capsize=2)
        ax.errorbar(row.ours[0], y - 0.15, xerr=row.ours[1], fmt="o", color="tab:blue", ms=4, capsize=2)
    ax.set_yticks(range(len(rows)), [row.env + (" †" if row.seen else "") for row in rows], fontsize=7)
    ax.set_xlim(-1.05, 1.05)
    ax.invert_yaxis()
    ax.set_ylim(len(rows) - 0.5, -0.5)
    first_control = next((y for y, row in enumerate(rows) if row.control), None)
    if first_control:  # memory games above the line, partially observed control below
        ax.axhline(first_control - 0.5, color="black", lw=0.8)
        ax.text(1.0, first_control - 0.4, "partially observed control", transform=ax.get_yaxis_transform(),
                ha="right", va="top", fontsize=7, style="italic")  # fmt: skip
        ax.text(1.0, first_control - 0.6, "memory games", transform=ax.get_yaxis_transform(), ha="right",
                va="bottom", fontsize=7, style="italic")  # fmt: skip
    ax.set_xlabel("final return (last 100 training episodes; 32-50 on long ones)\nmean ± std of 3 seeds, 100,000 steps")
    ax.grid(axis="x", alpha=0.3)
    handles = [
        plt.Line2D([], [], marker="o", ls="", color="tab:blue", label="popgym.yaml (R2AC-RTRL)"),
        plt.Line2D([], [], marker="s", ls="", color="tab:orange", label="RecurrentPPO, better of two settings"),
        plt.Line2D([], [], marker="|", ls="", color="0.4", markersize=9, label="random policy"),
        plt.Rectangle((0, 0), 1, 1, color=colours["win"], label="win"),
        plt.Rectangle((0, 0), 1, 1, color=colours["loss"], label="loss"),
    ]
    ax.legend(handles=handles, fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, frameon=False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    from PIL import Image  # matplotlib's own dependency

    with Image.open(out) as image:  # a palette PNG: a third of the size, the same picture
        image.convert("RGB").quantize(colors=64).save(out, optimize=True)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results file holding the table")
    parser.add_argument("--plot", type=Path, help="also draw the table to this PNG")
    args = parser.parse_args(argv)
    text = args.results.read_text()
    rows = read_rows(text, args.results)
    for kind, count in tallies(rows).items():
        print(f"{kind}: {phrase(count)} ({sum(count.values())} envs)")
    problems = check(text, args.results)
    for problem in problems:
        print("MISMATCH", problem)
    if args.plot:
        plot(rows, args.plot)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
