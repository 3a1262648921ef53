"""Peak memory of one core update: RTRL vs TBPTT (and, for the eLSTM, the hand-written reference), on the CPU or a GPU.

How it is measured on the CPU (which has no ``torch.cuda.max_memory_allocated``; tracemalloc does not see torch's
allocator):

- **allocator** (primary): the update runs under ``torch.profiler`` with ``profile_memory=True``. Every
  allocation and free made by torch's CPU allocator is then recorded with the running total of bytes
  allocated since profiling began; the peak of that running total is the memory the update needs on top
  of what was live before it (parameters, inputs, the carried state). Exact to the byte for tensors;
  it does not count Python objects or the allocator's own overhead.
- **rss** (cross-check, Linux): the peak resident set size of the process during the update (``VmHWM``
  after resetting it through ``/proc/self/clear_refs``) minus the resident size just before. The worker
  runs with ``MALLOC_MMAP_THRESHOLD_=65536`` so that glibc maps every block of 64 KiB or more afresh and
  returns it on free; the resident size then follows the live tensors instead of the allocator's cache.
  Counts pages (and Python, and allocator overhead), so it is coarser than the allocator figure.

On a GPU (``--device cuda``): ``torch.cuda.max_memory_allocated`` during the update minus
``torch.cuda.memory_allocated`` just before it, the peak statistics reset right before each measured update (the
tensors' bytes, as the allocator figure on the CPU; no rss column).

Every configuration runs in a fresh subprocess, after two untimed warm-up updates, so nothing one
configuration leaves behind (cached blocks, lazily built state) skews another. On a GPU they run in this process
(its allocator's statistics count live tensors only, whatever is cached); ``--in-process`` does so on the CPU too,
a shortcut for smoke runs.

"carried" is the state a method keeps between updates (c, and for RTRL the sensitivities); it is live
before the update starts, so the peak of the whole process during an update is about
``carried + peak above start``. RTRL runs as ``OnlineRecurrentModule`` runs it: each update gives up the old carry
(``unroll(..., donate=True)``), so at M = 1 the sensitivities of one-component cells are updated in place.

Cores: the eLSTM at the Atari (B 32, N 256, D 257, M 50) and DMLab (B 32, N 512, D 257, M 100) shapes, an LRUCell
(K = 2 components per unit) and a 4-layer LRU stack at the Atari shape (``--shapes`` picks). For each, the carried
sensitivity bytes are compared with the theory B * K * sum over the tracked parameters of |theta| * 4
(docs/rtrl.md#multi-component-units).

Usage::

    python benchmarks/memory.py            # every core, M = segment length and M = 1
    python benchmarks/memory.py --quick    # small shapes, TBPTT and RTRL only (smoke test)
    python benchmarks/memory.py --shapes lru,stack
    python benchmarks/memory.py --device cuda --kinds tbptt,rtrl

The last line reads ``memory atari_M50=<x> atari_M1=... lru_M50=... stack_M1=...``: RTRL's peak above the start of an
update minus TBPTT's, in units of the sensitivity bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def worker(kind: str, cell: str, b: int, n: int, d: int, m: int, threads: int, device: str = "cpu") -> dict:
    """Runs in the subprocess: warm up, then measure one update both ways (on a GPU: its allocator's peak only)."""
    import torch

    sys.path.insert(0, HERE)
    from rtrl_vs_tbptt import Runner, carried_sensitivity_bytes, make_cell, make_segments
    from scaling import peak_above_start

    torch.set_num_threads(threads)
    runner = Runner(kind, make_cell(n, d, torch.float32, 0, cell, device), b)
    segs = make_segments(4, m, b, d, torch.float32, 1, start=m > 1, device=device)
    for i in range(2):
        runner.step(*segs[i])

    def carried_bytes() -> int:
        c = runner.carry
        if isinstance(c, dict):
            return sum(t.numel() * t.element_size() for t in c.values())
        return c.nbytes()

    carried = carried_bytes()
    carried_sens = carried_sensitivity_bytes(runner)

    peak_alloc = peak_above_start(runner, segs[2], device)  # the allocator's running total during the update
    if torch.device(device).type != "cpu":
        return {"carried": carried, "carried_sens": carried_sens, "peak_alloc": peak_alloc, "rss_peak": None}

    # rss: peak resident size during one more update, minus the resident size before it
    runner.cell.zero_grad(set_to_none=True)
    rss_peak = None
    try:
        before = _rss_kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
        runner.step(*segs[3])
        rss_peak = (_rss_kib("VmHWM") - before) * 1024
    except (OSError, RuntimeError):
        pass
    return {"carried": carried, "carried_sens": carried_sens, "peak_alloc": peak_alloc, "rss_peak": rss_peak}


STACK_LAYERS = 4  # as benchmarks/rtrl_vs_tbptt.py


def sensitivity_bytes(b: int, n: int, d: int, itemsize: int = 4) -> int:
    """Theoretical RTRL state of the eLSTM core: per stream 2*N*D (input projection [Z; F]) + 2*N (its bias)
    + 2*N (recurrent weights w_z, w_f) numbers (docs/rtrl.md#complexity)."""
    return b * (2 * n * d + 4 * n) * itemsize


def theory_bytes(cell: str, b: int, n: int, d: int) -> int:
    """B * K * sum |theta| * 4 for the tracked parameters (the input projection, its bias, the per-unit parameters)."""
    if cell == "elstm":
        return sensitivity_bytes(b, n, d)
    lru = 2 * (2 * n * d + 3 * n)  # K = 2 times (B_re, B_im: 2 N D; nu, theta, gamma: 3 N), no input bias
    return b * lru * 4 * (STACK_LAYERS if cell == "stack" else 1)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small shapes (smoke test)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument(
        "--kinds", default=None, help="methods (default: tbptt,rtrl,reference,reference-inplace; quick: tbptt,rtrl)"
    )
    ap.add_argument("--shapes", default="atari,dmlab,lru,stack", help="comma-separated subset of atari,dmlab,lru,stack")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:index]: where the updates run")
    ap.add_argument(
        "--in-process", action="store_true", help="measure in this process (the default on a GPU; a smoke-run shortcut)"
    )
    ap.add_argument("--worker", nargs=6, metavar=("KIND", "CELL", "B", "N", "D", "M"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        kind, cell, *dims = args.worker
        print(json.dumps(worker(kind, cell, *map(int, dims), args.threads, args.device)))
        return

    sys.path.insert(0, HERE)
    from rtrl_vs_tbptt import QUICK_SHAPES, SHAPES, load, resolve_device

    in_process = args.in_process or resolve_device(args.device).type != "cpu"  # a clear error now, not in workers

    table = QUICK_SHAPES if args.quick else SHAPES
    names = [x for x in args.shapes.split(",") if x]
    for name in names:
        if name not in table:
            ap.error(f"unknown shape {name!r}; choose from {sorted(table)}")
    kinds = [
        k
        for k in (args.kinds or ("tbptt,rtrl" if args.quick else "tbptt,rtrl,reference,reference-inplace")).split(",")
        if k
    ]
    mib = lambda x: "-" if x is None else f"{x / 2**20:.1f}"  # noqa: E731
    print(load())
    print(f"device: {args.device}")
    print("peak memory of one update above what was live before it (MiB); carried = state kept between updates")
    print(
        f"{'shape':<7} {'M':>4} {'method':<18} {'carried':>8} {'peak(alloc)':>12} {'peak(rss)':>10} {'carried+peak':>13} {'sens':>6}"
    )
    verdicts, carried_sens = [], {}
    for name in names:
        cell, b, n, d, m_seg = table[name]
        sens = theory_bytes(cell, b, n, d)
        for m in (m_seg, 1):
            rows = {}
            for kind in kinds:
                if kind.startswith("reference") and cell != "elstm":
                    continue  # the hand-written references are for the eLSTM
                cmd = [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--threads",
                    str(args.threads),
                    "--device",
                    args.device,
                    "--worker",
                    kind,
                    cell,
                    str(b),
                    str(n),
                    str(d),
                    str(m),
                ]
                if in_process:
                    r = worker(kind, cell, b, n, d, m, args.threads, args.device)
                else:
                    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
                    out = subprocess.run(
                        cmd, check=True, capture_output=True, text=True, cwd=os.path.dirname(HERE), env=env
                    )
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                rows[kind] = r
                if kind == "rtrl":
                    carried_sens[name] = r["carried_sens"]
                total = r["carried"] + r["peak_alloc"]
                print(
                    f"{name:<7} {m:>4} {kind:<18} {mib(r['carried']):>8} {mib(r['peak_alloc']):>12} {mib(r['rss_peak']):>10} {mib(total):>13} {mib(sens):>6}"
                )
            if "rtrl" in rows and "tbptt" in rows:
                extra = (rows["rtrl"]["peak_alloc"] - rows["tbptt"]["peak_alloc"]) / sens
                extra_total = (
                    rows["rtrl"]["carried"]
                    + rows["rtrl"]["peak_alloc"]
                    - rows["tbptt"]["carried"]
                    - rows["tbptt"]["peak_alloc"]
                ) / sens
                verdicts.append((name, m, extra, extra_total))
    print(load())
    print()
    for name in names:
        cell, b, n, d, _ = table[name]
        theory = theory_bytes(cell, b, n, d)
        got = carried_sens.get(name)
        same = "" if got is None else (" = theory" if got == theory else f" != theory ({mib(got)} MiB carried)")
        print(
            f"sensitivity bytes {name} ({cell}): theory B*K*sum|theta|*4 = {theory / 2**20:.2f} MiB "
            f"({theory / b / 2**20:.3f} MiB per stream); carried by RTRL: {'-' if got is None else f'{got / 2**20:.2f} MiB'}{same}"
        )
    for name, m, extra, extra_total in verdicts:
        print(
            f"{name} M={m}: RTRL peak above start = TBPTT + {extra:.2f} x sensitivity bytes; with the carried state: TBPTT + {extra_total:.2f} x"
        )
    print("memory " + " ".join(f"{name}_M{m}={extra:.2f}" for name, m, extra, _ in verdicts))


if __name__ == "__main__":
    main()
