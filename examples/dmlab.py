"""R2AC on DeepMind Lab memory levels (docs/r2ac.md#per-environment-settings): rooms_watermaze and
rooms_select_nonmatching_object.

    python examples/dmlab.py --level rooms_watermaze --M 50
    python examples/dmlab.py --level rooms_select_nonmatching_object --M 10 --method tbptt
    python examples/dmlab.py --level rooms_watermaze --stem_checkpoint pretrained.ckpt --freeze_stem true

This script's own option:
  --level NAME  rooms_watermaze (default) or rooms_select_nonmatching_object (the paper's configs in examples/configs/)

Every other option is `onlinerec rl`'s (below). Paper settings: N = 512, B = 32, action repeat 4, 9 actions, 96x72 RGB; the vision stem (conv + fc) comes from one
TBPTT model pre-trained on the task and is frozen (``--stem_checkpoint``, ``--freeze_stem``). Budgets: 30 M steps
(select_nonmatching) / 100 M steps (watermaze) after pre-training. Final test: greedy episodes (3 x 100 in [P]).

DeepMind Lab's ``deepmind_lab`` module is not on PyPI: build it from source with Bazel
(https://github.com/google-deepmind/lab). Without it this example stops with a message saying so.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "configs"
LEVELS = ("rooms_watermaze", "rooms_select_nonmatching_object")

if __name__ == "__main__":
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--level", default="rooms_watermaze", choices=LEVELS)
    known, rest = pre.parse_known_args()
    if importlib.util.find_spec("deepmind_lab") is None and not {"-h", "--help"} & set(rest):
        from onlinerec.rl.envs.dmlab import INSTALL_HINT

        print(f"error: examples/dmlab.py needs DeepMind Lab, which is not installed.\n{INSTALL_HINT}", file=sys.stderr)
        sys.exit(2)
    from onlinerec.rl.runner import main

    sys.exit(main(rest, CONFIGS / f"dmlab_{known.level}.yaml", description=__doc__, prog="examples/dmlab.py"))
