"""R2AC on ProcGen Chaser, hard mode (docs/r2ac.md#per-environment-settings): 200 M steps from scratch, M = 5 or 50,
N = 256. (Named train_procgen.py so that it does not shadow the `procgen` package.)

    python examples/train_procgen.py --M 5                        # configs/procgen_chaser_m5.yaml (RTRL)
    python examples/train_procgen.py --M 50 --method tbptt        # configs/procgen_chaser_m50.yaml, TBPTT baseline
    python examples/train_procgen.py --M 5 --total_frames 2e5 --stem nature --num_envs 16      # a CPU-sized run

The script picks its YAML from --M (5 and 50 have the paper's configs; other values start from the M = 5 one); every
other option is `onlinerec rl`'s (below). Training levels 0..499; the final greedy evaluation plays test levels
(start 1000, 200 levels; docs/r2ac.md#procgen). Needs ``pip install 'onlinerec[procgen]'`` (procgen-mirror).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from onlinerec.rl.runner import main

CONFIGS = Path(__file__).resolve().parent / "configs"

if __name__ == "__main__":
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--M", type=int, default=5, help="unroll length; 5 and 50 have paper configs")
    known, rest = pre.parse_known_args()
    config = CONFIGS / ("procgen_chaser_m50.yaml" if known.M == 50 else "procgen_chaser_m5.yaml")
    sys.exit(main([*rest, "--M", str(known.M)], config, description=__doc__, prog="examples/train_procgen.py"))
