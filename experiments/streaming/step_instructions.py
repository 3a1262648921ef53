"""Instructions, cache and branch misses of one streaming agent step against the hand-written step of
``benchmarks/streaming.py``, counted by valgrind's callgrind (repeatable whatever else the machine runs).

    python experiments/streaming/step_instructions.py            # N = 64, 200 steps each (about 4 minutes)
    python experiments/streaming/step_instructions.py --steps 400

Each closure is warmed up, then callgrind counts only the measured steps (instrumentation is switched on and off
around them with ``callgrind_control``). Prints per step: instructions (Ir), simulated L1 data misses (D1mr + D1mw)
and mispredicted branches (Bcm + Bim), and the agent/hand ratio of each. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def measured(which: str, steps: int) -> None:
    """Run inside valgrind: warm ``which`` up, count ``steps`` steps of it."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import streaming

    torch.set_num_threads(1)
    step = streaming.agent_step(streaming.make_agent(64)) if which == "agent" else streaming.hand_step(64)
    for _ in range(200):
        step()
    instrument("on")
    for _ in range(steps):
        step()
    instrument("off")


def instrument(state: str) -> None:
    """Switch callgrind's instrumentation of this process ``on`` or ``off``."""
    subprocess.run(["callgrind_control", f"--instr={state}", str(os.getpid())], capture_output=True, check=True)


def counts(which: str, steps: int) -> dict[str, float]:
    """Per-step event counts of ``which`` under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--cache-sim=yes", "--branch-sim=yes", "--instr-atstart=no",
               f"--callgrind-out-file={out}", sys.executable, __file__, "--child", which, "--steps", str(steps)]  # fmt: skip
        subprocess.run(cmd, capture_output=True, check=True)
        text = out.read_text()
    names = re.search(r"^events: (.+)$", text, re.M).group(1).split()
    totals = [int(v) for v in re.search(r"^totals: (.+)$", text, re.M).group(1).split()]
    return {k: v / steps for k, v in zip(names, totals)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--child", choices=["agent", "hand"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measured(args.child, args.steps)
        return 0
    got = {which: counts(which, args.steps) for which in ("agent", "hand")}
    rows = {"instructions": ("Ir",), "L1 data misses": ("D1mr", "D1mw"), "mispredicted branches": ("Bcm", "Bim")}
    for label, keys in rows.items():
        agent, hand = (sum(got[w][k] for k in keys) for w in ("agent", "hand"))
        print(f"{label:22s} agent {agent:12,.0f}  hand {hand:12,.0f}  agent/hand {agent / hand:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
