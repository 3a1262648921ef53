"""R2AC on a memory task: RTRL's untruncated gradient against TBPTT with the same (short) M.

    python examples/memory.py                                   # built-in T-maze (configs/memory_tmaze.yaml), RTRL
    python examples/memory.py --method tbptt                    # same settings, truncated gradients
    python examples/memory.py --cell none                       # the feed-forward baseline
    python examples/memory.py --env popgym:RepeatFirstEasy --env_kwargs '{}'    # an installable POPGym task
    python examples/memory.py --env MiniGrid-MemoryS7-v0 --env_kwargs '{}' --stem nature

The built-in passive T-maze ("memory:tmaze") shows a cue only at the first step of a trial and rewards the matching
choice ``length`` steps later. With ``length`` > M + 1 the cue and the reward never share a TBPTT window, so TBPTT(M)
stays at chance (0.5 with two cues, the dashed line of learning_curve.png) while RTRL(M) learns it: the default run,
300,000 frames, takes about 2 CPU-minutes. Needs gymnasium, and POPGym and MiniGrid for their envs:
``pip install 'onlinerec[memory]'`` installs all three. The same as
``onlinerec rl --config examples/configs/memory_tmaze.yaml``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from onlinerec.rl.runner import main

if __name__ == "__main__":
    config = Path(__file__).resolve().parent / "configs" / "memory_tmaze.yaml"
    sys.exit(main(sys.argv[1:], config, description=__doc__, prog="examples/memory.py"))
