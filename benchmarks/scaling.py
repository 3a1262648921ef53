"""How RTRL's and TBPTT's update time and peak memory grow with N, D, M and B (eLSTM core), with fitted exponents.

One update is what ``benchmarks/rtrl_vs_tbptt.py`` times: forward over a segment of M steps from B streams, the loss
``sum(readout(c_t, x_t)**2)``, backward, and the carry to the next segment, with ``onlinerec.gradients.RTRL`` /
``TBPTT`` on an ``onlinerec.cells.ELSTMCell`` of N units and D inputs. Each sweep varies one of N, D, M, B around a
base shape (default B 16, N 128, D 129, M 32) and keeps the others at the base.

- **time**: medians of interleaved repetitions (RTRL and TBPTT alternate, the order flips every round), after
  warm-up updates; process CPU time alongside.
- **memory**: the peak of torch's CPU allocator during one update above what was live before it (``torch.profiler``
  memory events, as in ``benchmarks/memory.py``), plus the state the method carries between updates (RTRL's
  sensitivities; TBPTT carries only c): "peak" = carried + peak above start, the memory an update needs besides
  the weights and the inputs.

``--device cuda`` runs the sweeps on a GPU: each update is timed by CUDA events after ``torch.cuda.synchronize()``
(the fits then use that time: ``--time wall`` is the default there), and the peak above start is
``torch.cuda.max_memory_allocated`` with its statistics reset before the update; the points are measured in this
process (``--in-process``, which on the CPU is a shortcut for smoke runs).

The fitted exponent of each curve is the least-squares slope of log(value) against log(swept size). The theory
(docs/rtrl.md#complexity; eLSTM: 2 gates, element-wise recurrence): RTRL costs O(N*D) per step per stream, i.e.
time ~ B*M*N*D per update (the input projection's FLOPs, the same order as TBPTT's forward and backward), carried
sensitivities B*2*N*D numbers whatever M (the old and the new carry are both live during an update); both methods keep
the segment's activations for backward, ~ B*M*(N + D) (the eLSTM's read-out saves its input [x_t; c_t]), so the peak
of an update grows with M for RTRL too, and RTRL's total ~ 2*B*N*D + B*M*(N + D). Every exponent is 1 asymptotically;
at finite sizes a term that does not depend on the swept size (fixed per-call overheads, the other terms of the sum)
pulls the fitted slope below 1, so the fits are over the points at or above the base value of each sweep as well as
over all points.

Usage::

    python benchmarks/scaling.py                       # sweeps, table, fitted exponents, docs/img/scaling.png
    python benchmarks/scaling.py --threads 1 --reps 9
    python benchmarks/scaling.py --quick               # smoke run: small sweeps, no figure unless --plot is given
    python benchmarks/scaling.py --device cuda --sweeps B,N --plot scaling_gpu.png

The last line reads ``exponents rtrl_time N=<a> D=<b> M=<c> B=<d> rtrl_mem N=... tbptt_time ... tbptt_mem ...``
(fits over the points at or above the base).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from rtrl_vs_tbptt import Runner, machine, make_cell, make_segments, resolve_device, timed  # noqa: E402

BASE = {"B": 16, "N": 128, "D": 129, "M": 32}
SWEEPS = {
    "N": [32, 64, 128, 256, 512, 1024],
    "D": [17, 33, 65, 129, 257, 513, 1025],
    "M": [1, 2, 4, 8, 16, 32, 64, 128],
    "B": [2, 4, 8, 16, 32, 64, 128],
}
QUICK_BASE = {"B": 4, "N": 32, "D": 33, "M": 8}
QUICK_SWEEPS = {"N": [16, 32, 64], "D": [17, 33, 65], "M": [2, 8, 16], "B": [2, 4, 8]}
# asymptotic exponent of each quantity in each size, from the complexity analysis (see the module docstring); RTRL's
# carried sensitivities alone: N 1, D 1, B 1 and M 0 (the dashed curve in the figure)
THEORY = {
    ("rtrl", "time"): {"N": 1, "D": 1, "M": 1, "B": 1},
    ("tbptt", "time"): {"N": 1, "D": 1, "M": 1, "B": 1},
    ("rtrl", "mem"): {"N": 1, "D": 1, "M": 1, "B": 1},
    ("tbptt", "mem"): {"N": 1, "D": 1, "M": 1, "B": 1},
}
METHODS = ("rtrl", "tbptt")


@dataclass
class Point:
    sweep: str
    size: int
    shape: dict[str, int]
    time_ms: dict[str, float]  # median per method: CPU or wall-clock time (--time), what the fits and figure use
    cpu_ms: dict[str, float]  # process CPU time median per method
    mem_mib: dict[str, float]  # carried + peak above start, per method
    carried_mib: dict[str, float]


def carried_bytes(runner: Runner) -> int:
    return runner.carry.nbytes()


@contextlib.contextmanager
def quiet_stderr():
    """Silences file descriptor 2 (the profiler's start/stop lines come from C++)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_above_start(runner: Runner, seg, device: torch.device | str = "cpu") -> int:
    """Peak of the allocator's running total during one update above what was allocated before it (bytes): from
    torch.profiler's memory events on the CPU, from ``torch.cuda.max_memory_allocated`` (its peak reset right before
    the update) on a GPU."""
    from torch.profiler import ProfilerActivity, profile

    runner.cell.zero_grad(set_to_none=True)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        runner.step(*seg)
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before)
    with tempfile.TemporaryDirectory() as tmp:
        with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            runner.step(*seg)
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as fh:
            events = json.load(fh)["traceEvents"]
    totals = [
        e["args"]["Total Allocated"]
        for e in events
        if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {})
    ]
    return max([0, *totals])


def measure(
    shape: dict[str, int], reps: int, warmup: int, seed: int, device: str = "cpu"
) -> tuple[dict, dict, dict, dict]:
    b, n, d, m = shape["B"], shape["N"], shape["D"], shape["M"]
    runners = {k: Runner(k, make_cell(n, d, torch.float32, seed, device=device), b) for k in METHODS}
    segs = make_segments(4, m, b, d, torch.float32, seed + 1, device=device)
    for r in runners.values():
        for i in range(warmup):
            r.step(*segs[i % len(segs)])
    times: dict[str, list[float]] = {k: [] for k in METHODS}
    cpu: dict[str, list[float]] = {k: [] for k in METHODS}
    for rep in range(reps):
        for k in METHODS if rep % 2 == 0 else METHODS[::-1]:
            seg = segs[rep % len(segs)]
            wall, process = timed(lambda: runners[k].step(*seg), device)
            times[k].append(wall)
            cpu[k].append(process)
    mem, carried = {}, {}
    for k, r in runners.items():
        carried[k] = carried_bytes(r) / 2**20
        mem[k] = carried[k] + peak_above_start(r, segs[0], device) / 2**20
    med = statistics.median
    return (
        {k: 1e3 * med(v) for k, v in times.items()},
        {k: 1e3 * med(v) for k, v in cpu.items()},
        mem,
        carried,
    )


def measure_in_subprocess(shape: dict[str, int], reps: int, warmup: int, seed: int, threads: int, device: str = "cpu"):
    """:func:`measure` in a fresh process, so that nothing an earlier point left (cached blocks, objects awaiting the
    garbage collector) shows in the allocator's totals or the timings."""
    job = json.dumps([shape, reps, warmup, seed, threads, device])
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", job]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=REPO)
    if out.returncode != 0:
        sys.exit(f"FAIL: the worker for {shape} exited with {out.returncode}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(x)."""
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-12)) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    den = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly)) / den if den > 0 else float("nan")


def fits(points: list[Point], base: dict[str, int]) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(method, quantity, sweep) -> (exponent over the points >= base, exponent over all points)."""
    out = {}
    for sweep in {p.sweep for p in points}:
        pts = sorted((p for p in points if p.sweep == sweep), key=lambda p: p.size)
        upper = [p for p in pts if p.size >= base[sweep]]
        if len(upper) < 2:
            upper = pts[-2:]
        for k in METHODS:
            for q, get in (("time", lambda p, k=k: p.time_ms[k]), ("mem", lambda p, k=k: p.mem_mib[k])):
                out[(k, q, sweep)] = (
                    slope([p.size for p in upper], [get(p) for p in upper]),
                    slope([p.size for p in pts], [get(p) for p in pts]),
                )
    return out


def plot(points: list[Point], base: dict[str, int], fit: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = [s for s in ("N", "D", "M", "B") if any(p.sweep == s for p in points)]
    fig, axes = plt.subplots(2, len(sweeps), figsize=(3.6 * len(sweeps), 6.4), squeeze=False)
    colors = {"rtrl": "tab:blue", "tbptt": "tab:orange"}
    for j, sweep in enumerate(sweeps):
        pts = sorted((p for p in points if p.sweep == sweep), key=lambda p: p.size)
        xs = [p.size for p in pts]
        for i, (q, unit) in enumerate((("time", "update time (ms)"), ("mem", "carried + peak (MiB)"))):
            ax = axes[i][j]
            if q == "mem":
                ax.plot(xs, [p.carried_mib["rtrl"] for p in pts], "--", color=colors["rtrl"], label="RTRL carried only")
            for k in METHODS:
                ys = [p.time_ms[k] if q == "time" else p.mem_mib[k] for p in pts]
                e = fit[(k, q, sweep)][0]
                ax.plot(xs, ys, "o-", color=colors[k], label=f"{k.upper()} (slope {e:.2f})")
                # theory slope through the base point
                at = next((p for p in pts if p.size == base[sweep]), pts[len(pts) // 2])
                y0 = at.time_ms[k] if q == "time" else at.mem_mib[k]
                t = THEORY[(k, q)][sweep]
                ax.plot(xs, [y0 * (x / at.size) ** t for x in xs], ":", color=colors[k], alpha=0.6, label=f"theory {t}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            others = ", ".join(f"{k} {v}" for k, v in base.items() if k != sweep)
            ax.set_xlabel(f"{sweep}  ({others})", fontsize=8)
            if j == 0:
                ax.set_ylabel(unit)
            ax.legend(fontsize=7)
            ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)")
    ap.add_argument(
        "--reps", type=int, default=None, help="timed repetitions per method and point (default 7, quick: 3)"
    )
    ap.add_argument("--warmup", type=int, default=2, help="untimed updates per method and point first (default 2)")
    ap.add_argument("--sweeps", default="N,D,M,B", help="comma-separated subset of N,D,M,B (default all)")
    ap.add_argument("--base", default=None, help="base shape as B,N,D,M (default 16,128,129,32; quick: 4,32,33,8)")
    ap.add_argument(
        "--plot",
        default=None,
        metavar="PNG",
        help="where to write the figure (default docs/img/scaling.png; quick: no figure unless given)",
    )
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the measurements as JSON")
    ap.add_argument("--quick", action="store_true", help="smoke run: small shapes, 3 repetitions")
    ap.add_argument(
        "--time",
        choices=("cpu", "wall"),
        default=None,
        help="what the figure and the fits use: process CPU time (default on the CPU; with 1 thread the work itself, "
        "robust to waiting for a shared core) or wall-clock time (default on a GPU: CUDA events' time)",
    )
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:index]: where the updates run")
    ap.add_argument(
        "--in-process", action="store_true", help="measure in this process (the default on a GPU; a smoke-run shortcut)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--replot",
        default=None,
        metavar="JSON",
        help="redraw the figure and the fits from a --json file, measuring nothing",
    )
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        shape, reps, warmup, seed, threads, device = json.loads(args.worker)
        torch.set_num_threads(threads)
        print(json.dumps(measure(shape, reps, warmup, seed, device)))
        return
    device = resolve_device(args.device)
    in_process = args.in_process or device.type != "cpu"
    if args.time is None:
        args.time = "cpu" if device.type == "cpu" else "wall"
    torch.set_num_threads(args.threads)
    base = dict(QUICK_BASE if args.quick else BASE)
    if args.base:
        try:
            base = dict(zip(("B", "N", "D", "M"), (int(v) for v in args.base.split(",")), strict=True))
        except ValueError:
            ap.error(f"--base takes four integers B,N,D,M, got {args.base!r}")
    sweeps_all = QUICK_SWEEPS if args.quick else SWEEPS
    names = [s for s in args.sweeps.split(",") if s]
    for s in names:
        if s not in sweeps_all:
            ap.error(f"unknown sweep {s!r}; choose from N,D,M,B")
    reps = args.reps or (3 if args.quick else 7)
    plot_path = args.plot if (args.plot or args.quick) else os.path.join(REPO, "docs", "img", "scaling.png")

    print(f"machine: {machine(device)}")
    print(f"device: {device}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"base shape: {' '.join(f'{k} {v}' for k, v in base.items())}; {reps} interleaved repetitions per point")
    print()
    print(
        "one update (forward + backward + carry), medians; ms = wall clock, cpu = process CPU time (ms); rtrl/tbptt and "
        f"us/step/stream from {args.time} time; peak MiB = carried state + allocator peak above start; "
        + ("all points in this process" if in_process else "one process per point")
    )
    print(
        f"{'sweep':<5} {'size':>5} {'B':>4} {'N':>5} {'D':>5} {'M':>4} {'rtrl ms':>9} {'tbptt ms':>9} {'rtrl/tbptt':>10} "
        f"{'rtrl cpu':>9} {'tbptt cpu':>9} {'rtrl MiB':>9} {'(carried)':>9} {'tbptt MiB':>9} {'rtrl us/step/stream':>19}"
    )
    points: list[Point] = []
    if args.replot:
        with open(args.replot) as fh:
            points = [Point(**p) for p in json.load(fh)]
        names = [s for s in names if any(p.sweep == s for p in points)]
    for sweep in names if not args.replot else []:
        for size in sweeps_all[sweep]:
            shape = {**base, sweep: size}
            if in_process:
                wall, c, mem, carried = measure(shape, reps, args.warmup, args.seed, str(device))
            else:
                wall, c, mem, carried = measure_in_subprocess(
                    shape, reps, args.warmup, args.seed, args.threads, str(device)
                )
            t = c if args.time == "cpu" else wall
            p = Point(sweep, size, shape, t, c, mem, carried)
            points.append(p)
            per = 1e3 * t["rtrl"] / (shape["B"] * shape["M"])
            print(
                f"{sweep:<5} {size:>5} {shape['B']:>4} {shape['N']:>5} {shape['D']:>5} {shape['M']:>4} "
                f"{wall['rtrl']:>9.2f} {wall['tbptt']:>9.2f} {t['rtrl'] / t['tbptt']:>10.2f} {c['rtrl']:>9.2f} {c['tbptt']:>9.2f} "
                f"{mem['rtrl']:>9.2f} {carried['rtrl']:>9.2f} {mem['tbptt']:>9.2f} {per:>19.3f}",
                flush=True,
            )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    fit = fits(points, base)
    print()
    print("fitted exponents (slope of log value vs log size; points >= base / all points) against the theory")
    print(f"{'quantity':<12} " + " ".join(f"{s:>16}" for s in names))
    for k in METHODS:
        for q in ("time", "mem"):
            cells = []
            for s in names:
                up, al = fit[(k, q, s)]
                cells.append(f"{up:>5.2f}/{al:>5.2f} (th {THEORY[(k, q)][s]})")
            print(f"{k + ' ' + q:<12} " + " ".join(f"{c:>16}" for c in cells))
    if plot_path:
        where = f"{args.threads} thread(s)" if device.type == "cpu" else torch.cuda.get_device_name(device)
        title = (
            f"eLSTM core update (forward + backward + carry), {where}, "
            f"{'process CPU' if args.time == 'cpu' else 'wall-clock'} time\ndotted: theory slope through the base "
            "point; slopes fitted over the points at or above the base; python benchmarks/scaling.py"
        )
        plot(points, base, fit, plot_path, title)
        print(f"figure: {plot_path}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([p.__dict__ for p in points], fh, indent=1)
    print(
        "exponents "
        + " ".join(
            f"{k}_{q} " + " ".join(f"{s}={fit[(k, q, s)][0]:.2f}" for s in names)
            for k in METHODS
            for q in ("time", "mem")
        )
    )


if __name__ == "__main__":
    main()
