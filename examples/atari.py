"""R2AC on Atari (paper settings, docs/r2ac.md#per-environment-settings): Breakout, Gravitar, MsPacman, Qbert, Seaquest.

    python examples/atari.py --game qbert                         # the paper's run: 200 M steps, M=50, IMPALA stem
    python examples/atari.py --game breakout --method tbptt       # the TBPTT baseline (--cell none: feed-forward)
    python examples/atari.py --game pong --total_frames 4e5 --stem nature --num_envs 16 --M 20   # a CPU-sized run

This script's own option:
  --game NAME   breakout, gravitar, mspacman, qbert or seaquest (the paper's configs in examples/configs/), or any
                other ALE game name with the paper's Atari settings (default: qbert)

Every other option is `onlinerec rl`'s (below): any field of the experiment config, e.g. --r2ac.lr 1e-3, or --config
x.yaml for a whole file. Logs (CSV, TensorBoard), checkpoints and learning_curve.png go to --out_dir.
Needs ale-py (pip install 'onlinerec[atari]').
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from onlinerec.rl.runner import main

CONFIGS = Path(__file__).resolve().parent / "configs"
GAMES = ("breakout", "gravitar", "mspacman", "qbert", "seaquest")

if __name__ == "__main__":
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--game", default="qbert")
    known, rest = pre.parse_known_args()
    key = known.game.lower().replace("_", "").replace("-", "")
    prog = "examples/atari.py"
    if key in GAMES:
        sys.exit(main(rest, CONFIGS / f"atari_{key}.yaml", description=__doc__, prog=prog))
    # any other game: the paper's Atari settings with that game's env id
    args = ["--env", f"ALE/{known.game}-v5", *rest]
    sys.exit(main(args, CONFIGS / "atari_breakout.yaml", description=__doc__, prog=prog))
