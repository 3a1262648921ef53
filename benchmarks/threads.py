"""How many torch threads to use on a CPU: typical onlinerec workloads timed with 1 thread and with torch's default.

    python benchmarks/threads.py             # 3 interleaved rounds of each workload
    python benchmarks/threads.py --quick     # a smoke run (seconds)

Workloads, each a short Lightning fit on the CPU:
- ``script``: a user's script: an eLSTM (N = 64) regressor, B = 32 streams, RTRL with M = 10.
- ``demo``: the demo's delayed-recall classifier (eLSTM N = 32, B = 32, M = 10), RTRL.
- ``r2ac``: R2AC on the built-in T-maze with the paper's IMPALA-sized core (N = 256, MLP stem), M = 20, B = 16.

Each round runs every workload once per thread count, in alternating order, each in a fresh subprocess (thread
pools cannot be shrunk reliably inside one process). The last line is
``threads: default=<n> script=<t1/tn> demo=<t1/tn> r2ac=<t1/tn> load=<1-min load average>`` where each ratio is the
median time with one thread divided by the median time with torch's default: below 1 means one thread is faster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

WORKLOADS = ("script", "demo", "r2ac")


def run_workload(name: str, quick: bool) -> None:
    """Run one workload in this process (called in a subprocess by :func:`main`)."""
    import warnings

    import lightning as L
    import torch

    warnings.filterwarnings("ignore")
    from onlinerec import ELSTMCell, OnlineRecurrentModule, RTRLStrategy, Segment, SegmentStream

    steps = 5 if quick else 60
    trainer = L.Trainer(
        strategy=RTRLStrategy(M=10 if name != "r2ac" else 20),
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    if name == "script":

        class Regressor(OnlineRecurrentModule):
            def __init__(self) -> None:
                super().__init__(ELSTMCell(8, 64), lr=1e-3)
                self.head = torch.nn.Linear(64, 1)

            def segment_loss(self, outputs, segment):
                return torch.nn.functional.mse_loss(self.head(outputs), segment.targets)

        def segments(epoch: int):
            gen = torch.Generator().manual_seed(epoch)
            for _ in range(steps):
                x = torch.randn(10, 32, 8, generator=gen)
                yield Segment(x, torch.zeros(10, 32, dtype=torch.bool), x.sum(-1, keepdim=True))

        trainer.fit(Regressor(), SegmentStream(segments))
    elif name == "demo":
        from onlinerec.data import DelayedRecallDataModule
        from onlinerec.tasks import SequenceClassifier

        data = DelayedRecallDataModule(delay=100, train_size=400, val_size=8, num_streams=32)
        trainer.fit(SequenceClassifier(9, 4, hidden_size=32, lr=1e-2), data)
    else:
        from onlinerec.rl import R2AC, RolloutDataModule

        model = R2AC(2, (4,), cell="elstm", hidden_size=256, stem="mlp", fc_size=256)
        trainer.fit(model, RolloutDataModule("memory:tmaze", num_envs=16, env_kwargs={"length": 10}))


def time_subprocess(name: str, threads: int | None, quick: bool) -> float:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("OMP_NUM_THREADS", None)
    code = (
        "import sys, time, torch\n"
        f"{'torch.set_num_threads(%d)' % threads if threads else ''}\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from threads import run_workload\n"
        "t = time.perf_counter(); run_workload(sys.argv[2], sys.argv[3] == '1'); print(time.perf_counter() - t)\n"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", code, here, name, "1" if quick else "0"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, a few steps")
    args = parser.parse_args(argv)
    import torch

    default = torch.get_num_threads()
    rounds = 1 if args.quick else args.rounds
    times: dict[tuple[str, int | None], list[float]] = {(w, t): [] for w in WORKLOADS for t in (1, None)}
    for r in range(rounds):
        for w in WORKLOADS:
            order = (1, None) if r % 2 == 0 else (None, 1)
            for t in order:
                times[(w, t)].append(time_subprocess(w, t, args.quick))
                print(f"round {r + 1}/{rounds} {w:<6} threads={t or default}: {times[(w, t)][-1]:.2f} s", flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    ratios = " ".join(
        f"{w}={statistics.median(times[(w, 1)]) / statistics.median(times[(w, None)]):.2f}" for w in WORKLOADS
    )
    print(f"threads: default={default} {ratios} load={load:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
