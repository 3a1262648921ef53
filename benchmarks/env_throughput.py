"""Env throughput: onlinerec's adapters vs envpool (Atari and ProcGen), random actions.

procgen-mirror and envpool cannot share a Python environment (and procgen-mirror needs numpy<2), so every
measurement runs in a subprocess with the interpreter of the environment that has its backend:

    python benchmarks/env_throughput.py \
        --python-main .venv/bin/python \
        --python-procgen /tmp/procgen-venv/bin/python \
        --python-envpool /tmp/envpool-venv/bin/python

Backends (a backend whose interpreter is not given, or lacks the module, is skipped):
  ale        onlinerec make_vector_env("ALE/Breakout-v5")  (ale-py's native vector env + the SAME_STEP wrapper)
  ale-raw    ale_py.vector_env.AtariVectorEnv alone, same settings (shows the wrapper's cost)
  envpool-atari   envpool.make("Breakout-v5", env_type="gymnasium", episodic_life=True, reward_clip=False)
  procgen    onlinerec make_vector_env("procgen:chaser")  (procgen-mirror's gym3 env + adapter), hard mode
  gym3-raw   procgen.ProcgenGym3Env alone
  envpool-procgen envpool.make("ChaserHard-v0", env_type="gymnasium")

Runs are interleaved (round-robin over backends, ``--reps`` rounds) and summarised by medians. A "step" is one
call of ``step`` on the vector env, i.e. ``num_envs`` env steps (Atari: 4 frames each). The last line gives the
envpool/onlinerec ratios.

Measured 2026-11-21 on the 2-CPU development machine (under heavy load from other jobs: load average 6-8, so
single runs vary by up to 2x), 8 envs, 2000 steps, 5 interleaved runs, medians in env steps/s (vector steps x 8):

    ale 868 | ale-raw 805 | envpool-atari 878 | procgen 11 720 | gym3-raw 15 706 | envpool-procgen 10 871
    ratios: envpool-atari/ale = 1.01; envpool-procgen/procgen = 0.93; ale/ale-raw = 1.08; procgen/gym3-raw = 0.75

envpool does not clearly win for either family (and cannot share an environment with procgen-mirror, needs the
system Qt5 runtime for ProcGen and a 745 MB install), so onlinerec.rl.envs has no envpool backend.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BACKENDS = {
    # name: (interpreter key, family)
    "ale": ("main", "atari"),
    "ale-raw": ("main", "atari"),
    "envpool-atari": ("envpool", "atari"),
    "procgen": ("procgen", "procgen"),
    "gym3-raw": ("procgen", "procgen"),
    "envpool-procgen": ("envpool", "procgen"),
}


def _make(backend: str, num_envs: int, seed: int, game: str, procgen_game: str):
    """Returns (step_fn(actions), num_actions)."""
    import numpy as np

    if backend in ("ale", "procgen"):
        sys.path.insert(0, REPO)
        from onlinerec.rl.envs import make_vector_env

        env_id = f"ALE/{game}-v5" if backend == "ale" else f"procgen:{procgen_game}"
        env = make_vector_env(env_id, num_envs, seed)
        env.reset()
        return (lambda a: env.step(a)), int(env.single_action_space.n)
    if backend == "ale-raw":
        import re

        from ale_py.vector_env import AtariVectorEnv

        rom = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", game).lower()
        env = AtariVectorEnv(rom, num_envs, autoreset_mode="SameStep", life_loss_info=True, reward_clipping=False)
        env.reset(seed=seed)
        return (lambda a: env.step(a)), int(env.single_action_space.n)
    if backend == "envpool-atari":
        import envpool

        env = envpool.make(
            f"{game}-v5", env_type="gymnasium", num_envs=num_envs, seed=seed, episodic_life=True, reward_clip=False
        )
        env.reset()
        return (lambda a: env.step(a)), int(env.action_space.n)
    if backend == "envpool-procgen":
        import envpool

        env = envpool.make(f"{procgen_game.capitalize()}Hard-v0", env_type="gymnasium", num_envs=num_envs, seed=seed)
        env.reset()
        return (lambda a: env.step(a)), int(env.action_space.n)
    if backend == "gym3-raw":
        from procgen import ProcgenGym3Env

        env = ProcgenGym3Env(num=num_envs, env_name=procgen_game, distribution_mode="hard", rand_seed=seed)

        def step(a):
            env.act(a.astype(np.int32))
            return env.observe()

        return step, 15
    raise ValueError(backend)


def worker(args) -> None:
    import numpy as np

    step, n = _make(args.worker, args.num_envs, args.seed, args.game, args.procgen_game)
    rng = np.random.default_rng(args.seed)
    actions = rng.integers(n, size=(args.warmup + args.steps, args.num_envs)).astype(np.int64)
    for t in range(args.warmup):
        step(actions[t])
    t0 = time.perf_counter()
    for t in range(args.warmup, args.warmup + args.steps):
        step(actions[t])
    dt = time.perf_counter() - t0
    print(json.dumps({"steps_per_s": args.steps / dt}))


def _available(python: str, backend: str) -> bool:
    module = {"main": "ale_py", "procgen": "procgen", "envpool": "envpool"}[BACKENDS[backend][0]]
    r = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
    return r.returncode == 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python-main", default=sys.executable)
    p.add_argument("--python-procgen", default=None)
    p.add_argument("--python-envpool", default=None)
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=2000, help="timed vector steps per run")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--game", default="Breakout", help="Atari game (CamelCase)")
    p.add_argument("--procgen-game", default="chaser")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    pythons = {"main": args.python_main, "procgen": args.python_procgen, "envpool": args.python_envpool}
    backends = []
    for b in args.backends.split(","):
        py = pythons[BACKENDS[b][0]]
        if py is None or not _available(py, b):
            print(f"skip {b}: no interpreter with its module (--python-{BACKENDS[b][0]})")
            continue
        backends.append(b)

    results: dict[str, list[float]] = {b: [] for b in backends}
    for rep in range(args.reps):
        for b in backends:  # interleaved
            cmd = [pythons[BACKENDS[b][0]], os.path.abspath(__file__), "--worker", b]
            cmd += ["--num-envs", str(args.num_envs), "--steps", str(args.steps), "--warmup", str(args.warmup)]
            cmd += ["--seed", str(args.seed + rep), "--game", args.game, "--procgen-game", args.procgen_game]
            r = subprocess.run(cmd, capture_output=True, text=True)
            line = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
            if r.returncode != 0 or not line:
                print(f"{b} failed:\n{r.stderr[-2000:]}")
                continue
            sps = json.loads(line[-1])["steps_per_s"]
            results[b].append(sps)
            print(f"rep {rep} {b:16s} {sps:9.0f} vector steps/s  ({sps * args.num_envs:9.0f} env steps/s)", flush=True)

    med = {b: statistics.median(v) for b, v in results.items() if v}
    print(
        f"\nmedians over {args.reps} interleaved runs, {args.num_envs} envs, {args.steps} steps, {os.cpu_count()} CPUs:"
    )
    for b, m in med.items():
        lo, hi = min(results[b]), max(results[b])
        print(f"  {b:16s} {m:9.0f} vector steps/s  {m * args.num_envs:9.0f} env steps/s  (range {lo:.0f}-{hi:.0f})")
    ratios = []
    for a, b in (("envpool-atari", "ale"), ("envpool-procgen", "procgen"), ("ale", "ale-raw"), ("procgen", "gym3-raw")):
        if a in med and b in med:
            ratios.append(f"{a}/{b} = {med[a] / med[b]:.2f}")
    print("ratios: " + ("; ".join(ratios) if ratios else "n/a"))


if __name__ == "__main__":
    main()
