"""Copy task, pattern length 50: fully online RTRL (M = 1, an update at every token, as the paper's
copy experiments) against TBPTT at a few M and against full-sequence BPTT, with the fixed vocabulary, on the
held-out (test) set, several seeds. CPU-sized: eLSTM N = 128, B = 32 streams, Adam lr 1e-3 (docs/copy_task.md).

Every method sees the same training sequences in the same order (data seed = run seed) for the same number of tokens;
the methods differ in how the gradient is cut and how often the weights move:

- ``rtrl-M1``: ``RTRLStrategy(M=1)`` on the streams of whole sequences (one update per token, exact gradient of the
  past through the carried sensitivities);
- ``tbptt-M<k>``: ``TBPTTStrategy(M=k)`` on the same streams (one update per k tokens, gradient cut at segment starts);
- ``bptt-full``: full-sequence BPTT, one update per batch of B whole sequences: every sequence is padded with blank
  inputs and ignored targets to 2T = 100 steps, so that ``TBPTTStrategy(M=100)`` segments are exactly the sequences.

One JSON per run in ``<out>/<method>/seed<k>.json`` (skipped when it exists: resumable); ``report`` writes the table.

Usage::

    python benchmarks/copy_task_suite.py run --out runs/copy_suite --tokens 200000 --seeds 0 1 2 --jobs 2
    python benchmarks/copy_task_suite.py report --out runs/copy_suite
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

METHODS = ["rtrl-M1", "tbptt-M1", "tbptt-M10", "tbptt-M50", "bptt-full"]
LEVEL = 50


def run_one(name, seed, tokens, hidden, streams, lr, test_size, forget_bias):
    import lightning as L
    import torch

    from onlinerec import RTRLStrategy, TBPTTStrategy
    from onlinerec.data.copy_task import BLANK, CopyTaskDataModule
    from onlinerec.data.sequences import IGNORE_INDEX
    from onlinerec.tasks import CopyTaskModule

    torch.set_num_threads(1)
    L.seed_everything(seed, verbose=False)
    method, _, m = name.partition("-")
    full = method == "bptt"
    M = 2 * LEVEL if full else int(m[1:])

    class Padded:
        """Each sequence padded to 2T steps (blank inputs, ignored targets): TBPTT(M = 2T) = full-sequence BPTT."""

        def __init__(self, data):
            self.data = data

        def __len__(self):
            return len(self.data)

        def __getitem__(self, i):
            x, y = self.data[i]
            pad = 2 * LEVEL - x.shape[0]
            return torch.cat([x, torch.full((pad,), BLANK)]), torch.cat([y, torch.full((pad,), IGNORE_INDEX)])

        def lengths(self):
            return [2 * LEVEL] * len(self.data)

    dm = CopyTaskDataModule(
        level=LEVEL, seed=seed, num_streams=streams, val_size=test_size, test_size=test_size, eval_M=100
    )
    if full:
        dm.train_set = Padded(dm.train_set)
    steps_per_update = M * streams
    updates = max(1, tokens // steps_per_update)
    model = CopyTaskModule(hidden_size=hidden, lr=lr, cell_kwargs={"forget_bias": forget_bias})
    strategy = RTRLStrategy(M=M) if method == "rtrl" else TBPTTStrategy(M=M)
    trainer = L.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_steps=updates,
        limit_val_batches=0,
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    start = time.perf_counter()
    trainer.fit(model, dm)
    train_seconds = time.perf_counter() - start
    test = trainer.test(model, dm, verbose=False)[0]
    return {
        "method": name,
        "seed": seed,
        "M": M,
        "updates": int(trainer.global_step),
        "tokens_per_stream_step": steps_per_update,
        "train_tokens": int(trainer.global_step) * steps_per_update,
        "hidden_size": hidden,
        "streams": streams,
        "lr": lr,
        "forget_bias": forget_bias,
        "train_seconds": train_seconds,
        "test": {k.split("/")[-1]: float(v) for k, v in test.items()},
    }


def job(method, seed, args):
    path = Path(args.out) / method / f"seed{seed}.json"
    if path.exists():
        return json.loads(path.read_text()), True
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "one", "--method", method, "--seed", str(seed),
           "--tokens", str(args.tokens), "--hidden", str(args.hidden), "--streams", str(args.streams),
           "--lr", str(args.lr), "--test-size", str(args.test_size), "--forget-bias", str(args.forget_bias),
           "--json", str(path)]  # fmt: skip
    start = time.perf_counter()
    with open(path.with_suffix(".log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode  # noqa: S603
    if rc != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({rc}); see {path.with_suffix('.log')}")
    rec = json.loads(path.read_text())
    rec["wall_s"] = time.perf_counter() - start
    rec["command"] = shlex.join(["python", "benchmarks/copy_task_suite.py", "one", *cmd[3:]])
    path.write_text(json.dumps(rec, indent=1))
    return rec, False


def report(out: Path) -> None:
    rows = ["| method | M | updates | seeds | test sequence acc. | test print acc. | test no-op acc. | CPU-min / run |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for method in METHODS:
        recs = [json.loads(p.read_text()) for p in sorted((out / method).glob("seed*.json"))]
        if not recs:
            continue

        def ms(key, recs=recs):
            v = np.array([r["test"][key] for r in recs]) * 100
            return f"{v.mean():.1f} % ± {v.std():.1f}" + f" ({', '.join(f'{x:.1f}' for x in v)})"

        rows.append(
            f"| {method} | {recs[0]['M']} | {recs[0]['updates']:,} | {len(recs)} | {ms('seq_acc')} | {ms('print_acc')} "
            f"| {ms('noop_acc')} | {np.mean([r['train_seconds'] for r in recs]) / 60:.1f} |"
        )
    (out / "table.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("run", "one"):
        s = sub.add_parser(name)
        s.add_argument("--tokens", type=int, default=200_000, help="training tokens per stream x streams")
        s.add_argument("--hidden", type=int, default=128)
        s.add_argument("--streams", type=int, default=32)
        s.add_argument("--lr", type=float, default=1e-3)
        s.add_argument("--test-size", type=int, default=500)
        s.add_argument("--forget-bias", type=float, default=0.0, help="eLSTM forget-gate bias at initialisation")
        if name == "run":
            s.add_argument("--out", default="runs/copy_suite")
            s.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
            s.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
            s.add_argument("--jobs", type=int, default=2)
        else:
            s.add_argument("--method", required=True, choices=METHODS)
            s.add_argument("--seed", type=int, required=True)
            s.add_argument("--json", required=True)
    r = sub.add_parser("report")
    r.add_argument("--out", default="runs/copy_suite")
    args = p.parse_args(argv)
    if args.command == "report":
        report(Path(args.out))
    elif args.command == "one":
        rec = run_one(
            args.method, args.seed, args.tokens, args.hidden, args.streams, args.lr, args.test_size, args.forget_bias
        )
        Path(args.json).write_text(json.dumps(rec, indent=1))
    else:
        todo = [(a, s) for s in args.seeds for a in args.methods]
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = {pool.submit(job, a, s, args): (a, s) for a, s in todo}
            for k, f in enumerate(concurrent.futures.as_completed(futures), 1):
                a, s = futures[f]
                try:
                    rec, skipped = f.result()
                    t = rec["test"]
                    print(f"[{k}/{len(todo)}] {a} seed {s}: seq_acc {t['seq_acc']:.3f} print_acc {t['print_acc']:.3f}"
                          f"{' (done before)' if skipped else ''}", flush=True)  # fmt: skip
                except Exception as err:  # noqa: BLE001 - report and go on
                    print(f"[{k}/{len(todo)}] {a} seed {s}: FAILED {err}", flush=True)
        report(Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
