"""One prepared command for a GPU machine: onlinerec's device tests on CUDA, the benchmarks at the Atari, DMLab and LRU
shapes, R2AC on Breakout, and one last line of ratios. It installs nothing.

Usage::

    python benchmarks/gpu_check.py                        # on the first CUDA device (under ten minutes on one GPU)
    python benchmarks/gpu_check.py --device cpu --tiny    # the same pipeline on the CPU at tiny shapes (smoke test)
    python benchmarks/gpu_check.py --out gpu_logs         # keep every part's full output there

Each part runs as a subprocess with a budget in seconds; a part that runs over it is stopped, its figures read nan and
the last line names it under ``over_budget``. The budgets add up to eight minutes; every part's output is written to
``<out>/<part>.log`` (``--out``, default a temporary folder, named at the end).

- ``tests`` (150 s): ``python -m pytest -m cuda``, every test's CUDA case: the float64 gradients of every cell and
  method, the in-place M = 1 step, the streaming agent's traces, resume between the CPU and the GPU, a short R2AC
  training. With ``--device cpu``: the in-place step's CPU cases.
- ``exact`` (30 s): RTRL's gradient against full BPTT in float64 on the device, for every built-in element-wise cell
  (:func:`onlinerec.check_gradients`).
- ``rtrl_vs_tbptt`` (90 s): ``benchmarks/rtrl_vs_tbptt.py`` at the Atari, DMLab and LRU shapes: one update of each
  method timed by CUDA events, and the M = 1 step against a copy of the sensitivity bytes in device memory.
- ``memory`` (50 s): ``benchmarks/memory.py`` at the same shapes, TBPTT and RTRL, peaks from
  ``torch.cuda.max_memory_allocated``.
- ``scaling`` (40 s): ``benchmarks/scaling.py``, the sweep over B (streams), the GPU's dimension.
- ``r2ac_device``, ``r2ac_cpu`` (60 s each): ``benchmarks/r2ac_throughput.py --configs r2ac-rtrl`` on Breakout
  (8 envs, M = 32, 8 timed updates) on the device and on the CPU (with ``--device cpu`` one run serves both). Needs
  ale-py; without it these figures read nan.

The last line reads ``gpu_check device=<name> tests_passed=<p> tests_failed=<f> rtrl_equals_bptt_max_rel_err=<e>
rtrl_tbptt_max=<x> online_step_vs_copy=<c> memory_rtrl_minus_tbptt_max=<m> rtrl_time_exponent_B=<s>
r2ac_fps_gpu_over_cpu=<r> over_budget=<parts or none>``: e = the largest relative error of RTRL's float64 gradient
against full BPTT over the cells; x = the largest RTRL/TBPTT update-time ratio over the Atari, DMLab and LRU shapes;
c = the M = 1 step's time over the copy's (its bandwidth multiple on that device); m = RTRL's peak above the start of
an update minus TBPTT's, in sensitivity bytes, the largest over the shapes and M; s = the fitted exponent of RTRL's
update time in B; r = R2AC-RTRL's frames/s on the device over its frames/s on the CPU.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
NUMBER = r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?|nan)"

BUDGETS = {
    "tests": 150,
    "exact": 30,
    "rtrl_vs_tbptt": 90,
    "memory": 50,
    "scaling": 40,
    "r2ac_device": 60,
    "r2ac_cpu": 60,
}
"""Seconds each part may take (480 in all)."""


@dataclass
class Part:
    name: str
    cmd: list[str]
    budget: float
    env: dict[str, str] = field(default_factory=dict)
    output: str = ""
    seconds: float = 0.0
    returncode: int | None = None
    over_budget: bool = False


def script(name: str) -> str:
    return os.path.join(HERE, name)


def parts(device: str, tiny: bool, out: str) -> list[Part]:
    """The commands, in order: full settings on a GPU, tiny ones with ``tiny``."""
    py = sys.executable
    threads = ["--threads", "1"] if tiny else []
    on = ["--device", device]
    tests = (
        ["-m", "not cuda and not slow", "-k", "cpu", "tests/gradients/test_inplace.py"]
        if device == "cpu"
        else ["-m", "cuda", "tests"]
    )
    rtrl = ["--shapes", "atari,dmlab,lru"] + (["--quick", "--reps", "2", "--online-reps", "3"] if tiny else [])
    memory = ["--kinds", "tbptt,rtrl"] + (
        ["--quick", "--shapes", "atari", "--in-process"] if tiny else ["--shapes", "atari,dmlab,lru"]
    )
    scaling = ["--sweeps", "B", "--plot", os.path.join(out, "scaling.png")] + (
        ["--quick", "--reps", "2", "--in-process"] if tiny else ["--reps", "5"]
    )
    r2ac = ["--configs", "r2ac-rtrl", "--peers", "", "--reps", "1", "--in-process"]
    r2ac += (
        ["--quick", "--num-envs", "2"] if tiny else ["--num-envs", "8", "--M", "32", "--warmup", "2", "--updates", "8"]
    )
    listed = [
        Part("tests", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], BUDGETS["tests"]),
        Part("exact", [py, os.path.abspath(__file__), "--part", "exact", *on], BUDGETS["exact"]),
        Part("rtrl_vs_tbptt", [py, script("rtrl_vs_tbptt.py"), *on, *rtrl, *threads], BUDGETS["rtrl_vs_tbptt"]),
        Part("memory", [py, script("memory.py"), *on, *memory, *threads], BUDGETS["memory"]),
        Part("scaling", [py, script("scaling.py"), *on, *scaling, *threads], BUDGETS["scaling"]),
        Part("r2ac_device", [py, script("r2ac_throughput.py"), *on, *r2ac, *threads], BUDGETS["r2ac_device"]),
    ]
    if device != "cpu":
        cpu_threads = threads or ["--threads", str(os.cpu_count() or 1)]
        cmd = [py, script("r2ac_throughput.py"), "--device", "cpu", *r2ac, *cpu_threads]
        listed.append(Part("r2ac_cpu", cmd, BUDGETS["r2ac_cpu"]))
    if tiny:  # one torch thread, as the tests run
        for part in listed:
            part.env["OMP_NUM_THREADS"] = "1"
    return listed


def run(part: Part, out: str) -> None:
    """Run ``part`` in a session of its own (so that a part stopped at its budget takes its workers with it) and keep
    its output in ``<out>/<name>.log``."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **part.env}
    start = time.perf_counter()
    proc = subprocess.Popen(
        part.cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        part.output, _ = proc.communicate(timeout=part.budget)
        part.returncode = proc.returncode
    except subprocess.TimeoutExpired:
        part.over_budget = True
        os.killpg(proc.pid, signal.SIGKILL)
        part.output, _ = proc.communicate()
    part.seconds = time.perf_counter() - start
    with open(os.path.join(out, f"{part.name}.log"), "w") as fh:
        fh.write(" ".join(part.cmd) + "\n\n" + (part.output or ""))


def last_line(output: str, prefix: str) -> str:
    lines = [ln for ln in (output or "").splitlines() if ln.startswith(prefix)]
    return lines[-1] if lines else ""


def value(line: str, key: str) -> float:
    """The number after ``key=`` in ``line`` (nan if absent)."""
    match = re.search(rf"(?:^| ){re.escape(key)}={NUMBER}(?= |$)", line)
    return float(match.group(1)) if match else math.nan


def largest(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return max(finite) if finite else math.nan


def r2ac_fps(output: str) -> float:
    match = re.search(r"^r2ac-rtrl +(\d+(?:\.\d+)?) ", output or "", re.M)
    return float(match.group(1)) if match else math.nan


def summarise(done: dict[str, Part], device_name: str) -> str:
    """The last line (see the module docstring)."""
    tests = done["tests"].output or ""
    counts = {kind: sum(int(n) for n in re.findall(rf"(\d+) {kind}", tests)) for kind in ("passed", "failed", "error")}
    exact = value(last_line(done["exact"].output, "rtrl_equals_bptt_max_rel_err="), "rtrl_equals_bptt_max_rel_err")
    ratios = last_line(done["rtrl_vs_tbptt"].output, "ratios rtrl/tbptt ")
    memory = last_line(done["memory"].output, "memory ")
    memory_values = [float(v) for v in re.findall(rf"\w+_M\d+={NUMBER}", memory)]
    scaling = last_line(done["scaling"].output, "exponents ")
    exponent = re.search(rf"rtrl_time B={NUMBER}", scaling)
    fps_device = r2ac_fps(done["r2ac_device"].output)
    fps_cpu = r2ac_fps(done["r2ac_cpu"].output) if "r2ac_cpu" in done else fps_device
    over = [p.name for p in done.values() if p.over_budget]
    fmt = lambda v, spec=".2f": "nan" if math.isnan(v) else format(v, spec)  # noqa: E731
    return (
        f"gpu_check device={device_name} tests_passed={counts['passed']} "
        f"tests_failed={counts['failed'] + counts['error']} rtrl_equals_bptt_max_rel_err={fmt(exact, '.1e')} "
        f"rtrl_tbptt_max={fmt(largest([value(ratios, k) for k in ('atari', 'dmlab', 'lru')]))} "
        f"online_step_vs_copy={fmt(value(ratios, 'bandwidth_multiple'))} "
        f"memory_rtrl_minus_tbptt_max={fmt(largest(memory_values))} "
        f"rtrl_time_exponent_B={fmt(float(exponent.group(1)) if exponent else math.nan)} "
        f"r2ac_fps_gpu_over_cpu={fmt(fps_device / fps_cpu if fps_cpu else math.nan)} "
        f"over_budget={','.join(over) or 'none'}"
    )


def exact_part(device: str) -> None:
    """``--part exact``: RTRL against full BPTT in float64 for every built-in cell that RTRL trains."""
    import torch

    from onlinerec import RTRL, check_gradients
    from onlinerec.cells import CELLS, make_cell
    from onlinerec.gradients import NotElementwiseError

    torch.set_num_threads(1)
    worst = 0.0
    for name in sorted(CELLS):
        cell = make_cell(name, 3, 5).to(device)
        try:
            RTRL().check_cell(cell)
        except NotElementwiseError:
            continue  # fully recurrent: RTRL refuses it (SnAP and TBPTT train it)
        err = max(check_gradients(cell).values())
        print(f"{name}: RTRL vs full BPTT, float64 on {device}: max rel. err {err:.1e}", flush=True)
        worst = max(worst, err)
    print(f"rtrl_equals_bptt_max_rel_err={worst:.3e}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda", help="cuda[:index] (default) or cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and few repetitions: a smoke run of the pipeline")
    ap.add_argument("--out", default=None, help="folder for every part's output (default: a temporary folder)")
    ap.add_argument("--part", choices=("exact",), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.part == "exact":
        exact_part(args.device)
        return 0

    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu_check: torch {torch.__version__} sees no CUDA device here; on a CPU run "
            "`python benchmarks/gpu_check.py --device cpu --tiny`.",
            file=sys.stderr,
        )
        return 2
    if device.type not in ("cpu", "cuda"):
        ap.error(f"--device takes cuda[:index] or cpu, got {args.device!r}")
    name = "cpu" if device.type == "cpu" else torch.cuda.get_device_name(device).replace(" ", "_")
    out = args.out or tempfile.mkdtemp(prefix="gpu_check_")
    os.makedirs(out, exist_ok=True)
    listed = parts(str(device), args.tiny, out)
    print(f"gpu_check on {name} ({'tiny shapes' if args.tiny else 'full shapes'}); output of every part in {out}")
    done: dict[str, Part] = {}
    for part in listed:
        run(part, out)
        done[part.name] = part
        status = "over budget, stopped" if part.over_budget else f"exit {part.returncode}"
        print(f"  {part.name:<14} {part.seconds:6.1f} s of {part.budget:.0f}  {status}", flush=True)
    print(summarise(done, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
