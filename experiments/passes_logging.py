"""What logging every pass cost R2AC's several-passes update, measured on the shipped POPGym config.

Lightning keeps a training step's last logged value, so R2AC logs only the last of its ``epochs x minibatches``
optimiser steps per segment (the same metrics; tests/rl/test_r2ac_passes.py checks it). This script trains the same
model twice per repetition from the same seed, once as R2AC does and once logging every pass (``R2AC.log_step``
swapped for the base class's), for each setting below, interleaved, and prints process CPU seconds per 1,000 agent
steps and the ratio ``every/last``:

- ``popgym.yaml``: 4 passes per segment of M = 4 steps;
- ``long``: ``long_segments.yaml``, the POPGym core with M 32 and 10 passes in 4 minibatches.

The figures in the CHANGELOG were measured when both configs had one shared network; both now have a network each
for the policy and the value (``separate_critic``), and ``long_segments.yaml`` also normalises its observations.

Usage::

    python experiments/passes_logging.py                # RepeatFirstEasy, 3 repetitions x 16,384 agent steps
    python experiments/passes_logging.py --steps 4096 --reps 1    # a quick look
    python experiments/passes_logging.py --quick        # smoke run: 512 steps, 1 repetition

Needs popgym: ``pip install -e ".[memory]"``. One torch thread (the config's ``threads: 1``).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "configs"
SETTINGS = {"popgym.yaml": CONFIGS / "popgym.yaml", "long": CONFIGS / "long_segments.yaml"}


def cpu_seconds_per_1k_steps(env: str, config: Path, steps: int, log_every_pass: bool) -> float:
    """Train for ``steps`` agent steps (seed 0, no logger, no checkpoints) and return process CPU s / 1,000 steps."""
    import lightning as L
    import torch

    from onlinerec.rl.experiment import parse_experiment
    from onlinerec.rl.r2ac import R2AC
    from onlinerec.rl.runner import build
    from onlinerec.training.module import OnlineRecurrentModule

    cfg = parse_experiment(["--config", str(config), "--env", env, "--total_frames", str(steps)])
    torch.set_num_threads(cfg.threads or 1)
    L.seed_everything(0, verbose=False)
    model, dm, strategy, updates = build(cfg)
    saved = R2AC.log_step
    if log_every_pass:
        R2AC.log_step = OnlineRecurrentModule.log_step  # logging every pass
    try:
        trainer = L.Trainer(
            strategy=strategy, max_steps=updates, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        start = time.process_time()
        trainer.fit(model, dm)
        seconds = time.process_time() - start
    finally:
        R2AC.log_step = saved
    return seconds / (dm.frames / 1000)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="popgym:RepeatFirstEasy")
    ap.add_argument("--steps", type=int, default=16_384, help="agent steps per run (default 16,384)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions, each running every setting both ways (default 3)")
    ap.add_argument("--quick", action="store_true", help="smoke run: --steps 512 --reps 1")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.reps = 512, 1
    if args.steps <= 0 or args.reps <= 0:
        ap.error("--steps and --reps must be positive")
    import lightning  # noqa: F401  (importing it sets its logger's level; quieten it after)

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no per-run banners between the timings
    times: dict[tuple[str, bool], list[float]] = {}
    for rep in range(args.reps):
        for name, config in SETTINGS.items():
            for every in (rep % 2 == 0, rep % 2 == 1):  # alternate which way runs first
                t = cpu_seconds_per_1k_steps(args.env, config, args.steps, every)
                times.setdefault((name, every), []).append(t)
                print(f"rep {rep} {name:12s} {'every pass' if every else 'last pass'}: {t:.3f} CPU s / 1k steps")
    print(f"\n{args.env}, {args.steps:,} agent steps per run, median of {args.reps} (process CPU time):")
    ratios = []
    for name in SETTINGS:
        last, every = statistics.median(times[name, False]), statistics.median(times[name, True])
        print(
            f"  {name:12s} last pass only {last:.3f} s / 1k steps, every pass {every:.3f}: every/last = {every / last:.2f}"
        )
        ratios.append(f"{name}={every / last:.2f}")
    print("ratios every/last " + " ".join(ratios))


if __name__ == "__main__":
    main()
