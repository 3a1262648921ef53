"""Time one update of a recurrent core: TBPTT vs onlinerec's RTRL vs a reference of the paper's RTRL scheme.

One update = forward over a segment of M steps from B streams, a loss on the readout outputs, backward, and the
carry to the next segment; every cell parameter ends with its gradient in ``.grad``. Methods:

- ``tbptt``: onlinerec's TBPTT (backprop within the segment only).
- ``rtrl``: onlinerec's RTRL as ``OnlineRecurrentModule`` trains with it: each segment's old carry is given up
  (``unroll(..., donate=True)``), so the fully online step (M = 1) updates the sensitivities in place.
- ``rtrl-keep``: the functional default, ``unroll(...)`` without ``donate``: the old carry stays intact, the new
  sensitivities are a new tensor (M = 1 table only; at M > 1 the two are the same code).
- ``reference``: the paper's scheme written out for the eLSTM (docs/rtrl.md#sensitivity-recursions), as in the
  official code: the core parameters are excluded from autograd, the state runs without a graph, the loss is
  backpropagated into a retained tensor of states to get the top gradient e_t, then the sensitivities
  are updated step by step under no_grad (out of place, outer product by bmm) and the core gradients
  are accumulated by hand as sum_b e_t[b] S_t[b].
- ``reference-inplace``: the same scheme with in-place sensitivity updates and a cache-friendly
  gradient accumulation (a tuned hand-written implementation, for comparison).
- ``copy`` (M = 1 table): a STREAM-like copy of as many bytes as the eLSTM's sensitivities (two preallocated
  buffers, ``dst.copy_(src)``), interleaved with the steps: the memory bandwidth of this run. An in-place M = 1 step
  must read the old sensitivities and write the new ones at least once, the bytes the copy moves, so
  ``bandwidth_multiple`` = RTRL's M = 1 step time / copy time says how far the step is from the memory limit.

Cores (``--shapes``): ``atari`` (eLSTM, B 32, N 256, D 257, M 50), ``dmlab`` (eLSTM, B 32, N 512, D 257, M 100),
``lru`` (LRUCell, K = 2 components per unit, at the Atari shape) and ``stack`` (4 LRU layers, residual with
LayerNorm, the LRU paper's block, at the Atari shape; every layer carries its own sensitivities). The references
exist for the eLSTM only; the M = 1 table runs the eLSTM shapes.

Before timing, each reference's gradients are checked against onlinerec's RTRL (float64, several
segments with resets, M > 1 and M = 1; rel. err <= 1e-10) and at the benchmark shape (float32, from a non-zero
carry), and the donated M = 1 step against the functional one; the script exits with an error if they differ.

``--device cuda`` runs everything on the GPU (checks included). Each update is then timed by CUDA events recorded
around it after ``torch.cuda.synchronize()``, and the copy is a copy in device memory, so ``bandwidth_multiple`` is
the M = 1 step against that device's bandwidth. On the CPU (the default) the timing is the wall clock and the process
CPU time.

Usage::

    python benchmarks/rtrl_vs_tbptt.py                     # full run at all cores (every shape, then the M = 1 step)
    python benchmarks/rtrl_vs_tbptt.py --threads 1,2       # both thread counts in one run (one after the other)
    python benchmarks/rtrl_vs_tbptt.py --quick             # small shapes, few repetitions (smoke test)
    python benchmarks/rtrl_vs_tbptt.py --threads 1 --reps 11 --online-reps 41
    python benchmarks/rtrl_vs_tbptt.py --device cuda       # on a GPU

The last line reads ``ratios rtrl/tbptt atari=<x> dmlab=<y> lru=<l> stack=<s> online_speedup=<z>
inplace_ratio=<i> bandwidth_multiple=<w>``: the RTRL/TBPTT update-time ratios per core; z = the paper-style
reference's M = 1 step time / RTRL's; i = RTRL's M = 1 step time / the tuned in-place reference's (<= 1: RTRL is as
fast); w = RTRL's M = 1 step time / the copy's. The line ends ``bandwidth_floor=<f> sensitivity_multiple=<e>``: f =
(TBPTT's M = 1 step + the copy) / the copy, the least w any RTRL step could reach here (the network's own forward and
backward, then one fused pass over the sensitivities); e = (RTRL's M = 1 step - TBPTT's) / the copy, the sensitivity
work alone in copies (1.0: one fused read-and-write pass; 1.5: an in-place update, then a read-out). Each is the
worst over the thread counts (and, for z, i, w, f and e, over the eLSTM shapes) of the run: the largest ratio, the
smallest speedup. Every section prints the load average.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from onlinerec.cells import ELSTMCell, LRUCell, Stack
from onlinerec.gradients import RTRL, TBPTT

SHAPES = {  # name: (cell, B, N, D, M)
    "atari": ("elstm", 32, 256, 257, 50),
    "dmlab": ("elstm", 32, 512, 257, 100),
    "lru": ("lru", 32, 256, 257, 50),
    "stack": ("stack", 32, 256, 257, 50),
}
QUICK_SHAPES = {
    "atari": ("elstm", 8, 64, 65, 10),
    "dmlab": ("elstm", 8, 128, 65, 20),
    "lru": ("lru", 8, 64, 65, 10),
    "stack": ("stack", 8, 64, 65, 10),
}
STACK_LAYERS = 4
REFERENCES = ("reference", "reference-inplace")  # hand-written, eLSTM only


# ----------------------------------------------------------------------------------------------
# Reference: the paper's RTRL scheme for the eLSTM, written out by hand (docs/rtrl.md#sensitivity-recursions).
# ----------------------------------------------------------------------------------------------
class ReferenceRTRL:
    """Step-by-step sensitivity recursion with hand-accumulated gradients, for :class:`ELSTMCell`.

    Sensitivity layout per stream: S_W (B, 2, N, D) for the input projection [Z; F], s_b (B, 2, N) for
    its bias [b_z; b_f], s_w (B, 2, N) for the element-wise recurrent weights [w_z; w_f].
    ``inplace=False`` mirrors the official code's out-of-place formulation; ``inplace=True`` updates the
    sensitivities in place and accumulates the weight gradient with a per-stream multiply-add loop.
    """

    def __init__(self, cell: ELSTMCell, inplace: bool = False) -> None:
        self.cell = cell
        self.inplace = inplace

    def init_carry(self, batch_size: int):
        cell = self.cell
        ref = cell.input_proj.weight
        n, d = cell.hidden_size, cell.input_size
        z = lambda *s: torch.zeros(*s, dtype=ref.dtype, device=ref.device)  # noqa: E731
        return {
            "c": z(batch_size, n),
            "S_W": z(batch_size, 2, n, d),
            "s_b": z(batch_size, 2, n),
            "s_w": z(batch_size, 2, n),
        }

    def update(self, inputs: torch.Tensor, reset: torch.Tensor, carry: dict, loss_fn) -> dict:
        """One segment: forward, loss_fn(states, inputs).backward(), RTRL grads into .grad; returns the carry."""
        cell = self.cell
        m, b, d = inputs.shape
        n = cell.hidden_size
        keep = (~reset).to(inputs.dtype)
        # core parameters are excluded from autograd
        w_in = cell.input_proj.weight.detach()
        b_in = cell.input_proj.bias.detach()
        w_rec = cell.recurrent_weight.detach()  # (2, N): [w_z; w_f]
        with torch.no_grad():
            gx = F.linear(inputs, w_in, b_in).view(m, b, 2, n)
            c = carry["c"]
            c_prev, zs, fs, states = [], [], [], []
            for t in range(m):
                c = c * keep[t, :, None]  # reset before the step
                a = gx[t] + w_rec * c.unsqueeze(1)
                z, f = torch.tanh(a[:, 0]), torch.sigmoid(a[:, 1])
                c_prev.append(c)
                zs.append(z)
                fs.append(f)
                c = f * c + (1.0 - f) * z
                states.append(c)
        # the top gradient e_t = dL/dc_t through non-recurrent paths, read from a retained tensor
        core_output = torch.stack(states).requires_grad_(True)
        loss_fn(core_output, inputs).backward()
        e = core_output.grad

        grads = {
            "W": torch.zeros(2, n, d, dtype=inputs.dtype, device=inputs.device),
            "b": torch.zeros(2, n, dtype=inputs.dtype, device=inputs.device),
            "w": torch.zeros(2, n, dtype=inputs.dtype, device=inputs.device),
        }
        S_W, s_b, s_w = carry["S_W"], carry["s_b"], carry["s_w"]
        with torch.no_grad():
            for t in range(m):
                z, f, cp, x = zs[t], fs[t], c_prev[t], inputs[t]
                zhat = (1.0 - f) * (1.0 - z * z)  # dc/da^z
                fhat = (cp - z) * f * (1.0 - f)  # dc/da^f
                j = (f + w_rec[0] * zhat + w_rec[1] * fhat) * keep[t, :, None]  # reset zeroes S first
                v = torch.stack([zhat, fhat], dim=1)  # (B, 2, N)
                if self.inplace:
                    S_W.mul_(j[:, None, :, None]).addcmul_(v.unsqueeze(-1), x[:, None, None, :])
                else:
                    outer = torch.bmm(v.reshape(b, 2 * n, 1), x.unsqueeze(1)).view(b, 2, n, d)
                    S_W = j[:, None, :, None] * S_W + outer
                s_b = j[:, None, :] * s_b + v
                s_w = j[:, None, :] * s_w + v * cp[:, None, :]
                et = e[t]
                if self.inplace:
                    for i in range(b):
                        grads["W"].addcmul_(S_W[i], et[i, None, :, None])
                else:
                    grads["W"] += (et[:, None, :, None] * S_W).sum(0)
                grads["b"] += (et[:, None, :] * s_b).sum(0)
                grads["w"] += (et[:, None, :] * s_w).sum(0)
        for p, g in (
            (cell.input_proj.weight, grads["W"].view(2 * n, d)),
            (cell.input_proj.bias, grads["b"].view(2 * n)),
            (cell.recurrent_weight, grads["w"]),
        ):
            p.grad = g.to(p.dtype) if p.grad is None else p.grad + g
        return {"c": c, "S_W": S_W, "s_b": s_b, "s_w": s_w}


# ----------------------------------------------------------------------------------------------
# One update per method
# ----------------------------------------------------------------------------------------------
def loss_fn(cell: ELSTMCell | LRUCell | Stack):
    """Sum of squares of the readout outputs: the eLSTM's output gate h_t = sigmoid(W_o [x_t; c_t] + b_o) * c_t, the
    LRU's Re(C h_t) + D x_t; a stack's unroll already returns its output."""
    if isinstance(cell, Stack):
        return lambda outputs, inputs: outputs.pow(2).sum()
    return lambda states, inputs: cell.readout(states, inputs).pow(2).sum()


class Runner:
    """Holds a method, its cell and its carry; ``step(inputs, reset)`` runs one update."""

    def __init__(self, kind: str, cell: ELSTMCell | LRUCell | Stack, batch_size: int) -> None:
        self.kind, self.cell = kind, cell
        self.loss = loss_fn(cell)
        self.donate = kind == "rtrl"  # as OnlineRecurrentModule's training streams; "rtrl-keep": the functional default
        if kind in ("tbptt", "rtrl", "rtrl-keep"):
            self.method = TBPTT() if kind == "tbptt" else RTRL()
            self.carry = self.method.init_carry(cell, batch_size)
        elif kind in REFERENCES:
            self.method = ReferenceRTRL(cell, inplace=kind == "reference-inplace")
            self.carry = self.method.init_carry(batch_size)
        else:
            raise ValueError(f"unknown method {kind!r}")

    def step(self, inputs: torch.Tensor, reset: torch.Tensor) -> None:
        self.cell.zero_grad(set_to_none=True)
        if isinstance(self.method, ReferenceRTRL):
            self.carry = self.method.update(inputs, reset, self.carry, self.loss)
        else:
            states, self.carry = self.method.unroll(self.cell, inputs, reset, self.carry, donate=self.donate)
            self.loss(states, inputs).backward()


class CopyRunner:
    """The STREAM-like copy: ``nbytes`` bytes from one preallocated (and touched) buffer into another."""

    kind = "copy"

    def __init__(self, nbytes: int, device: torch.device | str = "cpu") -> None:
        self.src = torch.randn(nbytes // 4, device=device)
        self.dst = torch.empty_like(self.src).copy_(self.src)
        self.nbytes = self.src.numel() * 4

    def step(self, inputs: torch.Tensor, reset: torch.Tensor) -> None:
        self.dst.copy_(self.src)


def make_cell(
    n: int, d: int, dtype: torch.dtype, seed: int, kind: str = "elstm", device: torch.device | str = "cpu"
) -> ELSTMCell | LRUCell | Stack:
    """The core: ``"elstm"`` (the default), ``"lru"`` or ``"stack"`` (``STACK_LAYERS`` LRU layers, residual + LayerNorm),
    on ``device`` (initialised on the CPU, so every device times the same weights)."""
    torch.manual_seed(seed)
    if kind == "elstm":
        cell = ELSTMCell(d, n)
    elif kind == "lru":
        cell = LRUCell(d, n)
    elif kind == "stack":
        cell = Stack([LRUCell(d, n) for _ in range(STACK_LAYERS)], residual=True, norm="layer")
    else:
        raise ValueError(f"unknown cell {kind!r}")
    return cell.to(dtype=dtype, device=device)


def make_segments(
    count: int,
    m: int,
    b: int,
    d: int,
    dtype: torch.dtype,
    seed: int,
    reset_prob: float = 0.01,
    start: bool = True,
    device: torch.device | str = "cpu",
):
    """``count`` random segments with a ``reset_prob`` chance of an episode reset per stream and step; with ``start``
    the first segment begins every stream (all reset at its first step). Drawn on the CPU, placed on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    segs = []
    for i in range(count):
        x = torch.randn(m, b, d, generator=gen).to(dtype)
        reset = torch.rand(m, b, generator=gen) < reset_prob
        if i == 0 and start:
            reset[0] = True
        segs.append((x.to(device), reset.to(device)))
    return segs


def carried_sensitivity_bytes(runner: Runner) -> int:
    """Bytes of the sensitivities a runner carries (a lazy scale, (B, N), not counted)."""
    carry = runner.carry
    if isinstance(carry, dict):  # the hand-written references
        return sum(v.numel() * v.element_size() for k, v in carry.items() if k != "c")
    layers = getattr(carry, "layers", [carry])
    return sum(t.numel() * t.element_size() for layer in layers for t in layer.raw_sensitivities()[0].values())


# ----------------------------------------------------------------------------------------------
# Correctness gate: the references must give onlinerec's RTRL gradients
# ----------------------------------------------------------------------------------------------
def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def compare(
    kind: str,
    n: int,
    d: int,
    b: int,
    m: int,
    segments: int,
    dtype: torch.dtype,
    tol: float,
    against: str = "rtrl",
    device: torch.device | str = "cpu",
) -> float:
    """Run onlinerec's RTRL (``against``) and another method over the same segments from the same weights; max rel.
    error of the gradients (every segment) and of the final state."""
    cells = [make_cell(n, d, dtype, seed=3, device=device) for _ in range(2)]
    runners = [Runner(against, cells[0], b), Runner(kind, cells[1], b)]
    worst = 0.0
    for x, reset in make_segments(segments, m, b, d, dtype, seed=4, reset_prob=0.1, device=device):
        for r in runners:
            r.step(x, reset)
        g0 = dict(cells[0].named_parameters())
        for name, p in cells[1].named_parameters():
            worst = max(worst, rel_err(p.grad, g0[name].grad))
    last = runners[1].carry
    worst = max(worst, rel_err(last["c"] if isinstance(last, dict) else last.c, runners[0].carry.c))
    if not worst <= tol:
        sys.exit(
            f"FAIL: {kind} gradients differ from onlinerec's {against} (max rel. err {worst:.3g} > {tol:g}, {dtype}, "
            f"N={n} D={d} B={b} M={m}, {device})"
        )
    return worst


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------
@dataclass
class Timing:
    median_ms: float  # wall clock (CUDA: the device's time between events recorded around the update)
    min_ms: float
    cpu_ms: float  # median process CPU time (all threads): robust to waiting for a shared CPU
    reps: int


def resolve_device(name: str) -> torch.device:
    """``--device``: "cpu", "cuda" or "cuda:<index>"; SystemExit if torch sees no such device."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"--device {name}: torch sees no CUDA device here (torch {torch.__version__}).")
    if device.type not in ("cpu", "cuda"):
        sys.exit(f"--device takes cpu or cuda[:index], got {name!r}.")
    return device


def timed(call: Callable[[], object], device: torch.device | str = "cpu") -> tuple[float, float]:
    """(seconds, process CPU seconds) of ``call()``. On CUDA the device first finishes what is queued
    (``torch.cuda.synchronize``) and the seconds are those between CUDA events recorded before and after the call; on
    the CPU, the wall clock."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        c0 = time.process_time()
        start.record()
        call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - t0, time.process_time() - c0


def time_methods(
    kinds: list[str],
    shape: tuple[int, int, int, int],
    reps: int,
    warmup: int,
    seed: int,
    cell: str = "elstm",
    copy_bytes: int | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, Timing]:
    """Interleaved repetitions (the order rotates every round), after ``warmup`` untimed updates each. ``"copy"`` among
    ``kinds`` times a copy of ``copy_bytes`` bytes. At M = 1 the segments are a stream's steps after its start (a 1 %
    reset chance per stream and step); at M > 1 one of the four segments starts every stream. Each update is timed
    by :func:`timed` on ``device``."""
    b, n, d, m = shape
    runners: dict[str, Runner | CopyRunner] = {}
    for k in kinds:
        runners[k] = (
            CopyRunner(copy_bytes or 0, device)
            if k == "copy"
            else Runner(k, make_cell(n, d, torch.float32, seed, cell, device), b)
        )
    segs = make_segments(4, m, b, d, torch.float32, seed + 1, start=m > 1, device=device)
    for k, r in runners.items():
        for i in range(warmup):
            r.step(*segs[i % len(segs)])
    times: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for rep in range(reps):
        order = kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]
        for k in order:
            x, reset = segs[rep % len(segs)]
            wall, process = timed(lambda: runners[k].step(x, reset), device)
            times[k].append(wall)
            cpu[k].append(process)
    return {
        k: Timing(statistics.median(v) * 1e3, min(v) * 1e3, statistics.median(cpu[k]) * 1e3, len(v))
        for k, v in times.items()
    }


def sensitivity_bytes(b: int, n: int, d: int, itemsize: int = 4) -> int:
    """Theoretical RTRL state for the eLSTM core per update: B * (2*N*D + 2*N + 2*N) floats (docs/rtrl.md#complexity)."""
    return b * (2 * n * d + 4 * n) * itemsize


def theory_sensitivity_bytes(cell: ELSTMCell | LRUCell | Stack, b: int, itemsize: int = 4) -> int:
    """B * K * sum over the tracked parameters theta of |theta| * sizeof(dtype) (docs/rtrl.md#multi-component-units),
    summed over the layers of a stack. The tracked parameters are the input projection (and its bias) and every
    per-unit parameter the recurrence reads."""
    if isinstance(cell, Stack):
        return sum(theory_sensitivity_bytes(layer, b, itemsize) for layer in cell.layers)
    params = dict(cell.named_parameters())
    tracked = [k for k in params if k.startswith("input_proj.")] + list(RTRL().unit_parameters(cell))
    return b * cell.num_components * sum(params[k].numel() for k in tracked) * itemsize


def load() -> str:
    try:
        return "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "load average ?"


def machine(device: torch.device | str = "cpu") -> str:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = ""
    if torch.device(device).type == "cuda":
        gpu = f"; {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return (
        f"{model}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"python {platform.python_version()}{gpu}"
    )


def check_all(shapes: dict, names: list[str], device: torch.device | str = "cpu") -> None:
    """The correctness gates (see the module docstring), on ``device``."""
    elstm = [s for s in names if shapes[s][0] == "elstm"]
    first = elstm[0] if elstm else None
    _, bb, nn_, dd, mm = shapes[first] if first else QUICK_SHAPES["atari"]
    on = {"device": device}
    for kind in REFERENCES:
        e64 = compare(kind, n=7, d=5, b=4, m=6, segments=4, dtype=torch.float64, tol=1e-10, **on)
        e64_1 = compare(kind, n=7, d=5, b=4, m=1, segments=12, dtype=torch.float64, tol=1e-10, **on)
        e32 = compare(kind, n=nn_, d=dd, b=bb, m=mm, segments=2, dtype=torch.float32, tol=1e-4, **on)
        e32_1 = compare(kind, n=nn_, d=dd, b=bb, m=1, segments=6, dtype=torch.float32, tol=1e-4, **on)
        print(
            f"check: {kind} gradients = onlinerec RTRL (float64 rel. err {e64:.1e}, M = 1 {e64_1:.1e}; float32 at "
            f"{first or 'quick atari'} shape {e32:.1e}, M = 1 {e32_1:.1e})"
        )
    e64 = compare("rtrl-keep", n=7, d=5, b=4, m=1, segments=12, dtype=torch.float64, tol=1e-12, **on)
    e32 = compare("rtrl-keep", n=nn_, d=dd, b=bb, m=1, segments=6, dtype=torch.float32, tol=1e-5, **on)
    print(f"check: donated (in-place) M = 1 step = functional one (float64 rel. err {e64:.1e}; float32 {e32:.1e})")


def segment_table(names: list[str], shapes: dict, nthreads: int, reps: int, args, ratios: dict[str, float]) -> None:
    """One update at each shape's M: the table, and the RTRL/TBPTT ratio of each shape (the worst so far) in ratios."""
    print()
    print(
        f"[{nthreads} thread{'s' if nthreads > 1 else ''}] one update (forward + backward + carry), medians of "
        "interleaved repetitions (wall clock; cpu = process CPU time)"
    )
    print(load())
    print(
        f"{'shape':<7} {'cell':<6} {'B':>3} {'N':>4} {'D':>4} {'M':>4}  {'method':<18} {'median ms':>10} {'min ms':>9} "
        f"{'cpu ms':>9} {'/tbptt':>7} {'cpu/tbptt':>9}"
    )
    for s in names:
        cell, b, n, d, m = shapes[s]
        kinds = ["tbptt", "rtrl", *(REFERENCES if cell == "elstm" else ())]
        res = time_methods(kinds, (b, n, d, m), reps, args.warmup, args.seed, cell, device=args.device)
        base, base_cpu = res["tbptt"].median_ms, res["tbptt"].cpu_ms
        for k, t in res.items():
            print(
                f"{s:<7} {cell:<6} {b:>3} {n:>4} {d:>4} {m:>4}  {k:<18} {t.median_ms:>10.2f} {t.min_ms:>9.2f} "
                f"{t.cpu_ms:>9.2f} {t.median_ms / base:>7.2f} {t.cpu_ms / base_cpu:>9.2f}"
            )
        ratios[s] = max(ratios.get(s, 0.0), res["rtrl"].median_ms / base)
    print(load())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--threads",
        default=str(os.cpu_count()),
        help="torch.set_num_threads; a comma-separated list runs each in turn (default: all cores)",
    )
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per method (default 9, quick: 3)")
    ap.add_argument(
        "--online-reps", type=int, default=None, help="timed repetitions of the M=1 step (default 31, quick: 5)"
    )
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small shapes and few repetitions (smoke test)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of: " + ",".join(SHAPES))
    ap.add_argument(
        "--sections",
        default="segment,online",
        help="what to time: segment (one update at each shape's M), online (the M = 1 step); default both",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:index]: where the cores run and are timed")
    args = ap.parse_args(argv)
    args.device = resolve_device(args.device)

    threads = [int(t) for t in str(args.threads).split(",") if t]
    shapes = QUICK_SHAPES if args.quick else SHAPES
    reps = args.reps or (3 if args.quick else 9)
    online_reps = args.online_reps or (5 if args.quick else 31)
    names = [s for s in args.shapes.split(",") if s]
    sections = {s for s in args.sections.split(",") if s}
    if not sections <= {"segment", "online"}:
        ap.error(f"--sections takes segment and/or online, got {args.sections!r}")
    for s in names:
        if s not in shapes:
            ap.error(f"unknown shape {s!r}; choose from {sorted(shapes)}")
    torch.set_num_threads(threads[0])
    print(f"machine: {machine(args.device)}")
    print(f"device: {args.device}")
    print(load())
    check_all(shapes, names, args.device)

    ratios: dict[str, float] = {}
    online: dict[str, list[float]] = {"speedup": [], "inplace": [], "bandwidth": [], "floor": [], "extra": []}
    for nthreads in threads:
        torch.set_num_threads(nthreads)
        if "segment" in sections:
            segment_table(names, shapes, nthreads, reps, args, ratios)
        online_names = [s for s in names if shapes[s][0] == "elstm"]
        if "online" not in sections or not online_names:
            continue
        print()
        print(
            f"[{nthreads} thread{'s' if nthreads > 1 else ''}] M = 1 online step (forward + backward + carry), medians of "
            "interleaved repetitions; copy = a copy of the sensitivity bytes"
        )
        print(load())
        print(
            f"{'shape':<7} {'B':>3} {'N':>4} {'D':>4}  {'method':<18} {'median ms':>10} {'min ms':>9} {'cpu ms':>9} "
            f"{'ref/this':>9} {'cpu ref/this':>12} {'/copy':>7}"
        )
        for s in online_names:
            _, b, n, d, _ = shapes[s]
            nbytes = sensitivity_bytes(b, n, d)
            kinds = ["rtrl", "rtrl-keep", "reference", "reference-inplace", "tbptt", "copy"]
            res = time_methods(
                kinds, (b, n, d, 1), online_reps, max(args.warmup, 3), args.seed, copy_bytes=nbytes, device=args.device
            )
            ref, ref_cpu, cp = res["reference"].median_ms, res["reference"].cpu_ms, res["copy"].median_ms
            for k, t in res.items():
                print(
                    f"{s:<7} {b:>3} {n:>4} {d:>4}  {k:<18} {t.median_ms:>10.3f} {t.min_ms:>9.3f} {t.cpu_ms:>9.3f} "
                    f"{ref / t.median_ms:>9.2f} {ref_cpu / t.cpu_ms:>12.2f} {t.median_ms / cp:>7.2f}"
                )
            rtrl = res["rtrl"].median_ms
            speedup, inplace, multiple = ref / rtrl, rtrl / res["reference-inplace"].median_ms, rtrl / cp
            # the step can be no faster than the network's own step (TBPTT at M = 1, no sensitivities) plus one
            # pass over S; what RTRL adds to TBPTT, in copies, is the sensitivity work alone (1.0: one fused pass)
            tb = res["tbptt"].median_ms
            floor, extra = (tb + cp) / cp, (rtrl - tb) / cp
            gbps = 2 * nbytes / (cp * 1e-3) / 1e9
            print(
                f"{s} threads={nthreads}: online_speedup={speedup:.2f} inplace_ratio={inplace:.2f} "
                f"bandwidth_multiple={multiple:.2f} bandwidth_floor={floor:.2f} sensitivity_multiple={extra:.2f} "
                f"(copy of {nbytes / 2**20:.1f} MiB: {cp:.3f} ms = {gbps:.1f} GB/s "
                f"read + write; cpu: inplace_ratio={res['rtrl'].cpu_ms / res['reference-inplace'].cpu_ms:.2f} "
                f"bandwidth_multiple={res['rtrl'].cpu_ms / res['copy'].cpu_ms:.2f}; donated vs kept carry: "
                f"{res['rtrl-keep'].median_ms / rtrl:.2f}x)"
            )
            online["speedup"].append(speedup)
            online["inplace"].append(inplace)
            online["bandwidth"].append(multiple)
            online["floor"].append(floor)
            online["extra"].append(extra)
        print(load())

    print()
    sens = []
    for s in names:
        cell, b, n, d, _ = shapes[s]
        runner = Runner("rtrl", make_cell(n, d, torch.float32, 0, cell, args.device), b)
        carried, theory = carried_sensitivity_bytes(runner), theory_sensitivity_bytes(runner.cell, b)
        sens.append(
            f"{s} {carried / 2**20:.2f} MiB{' = theory' if carried == theory else f' != theory {theory / 2**20:.2f}'}"
        )
    print("sensitivity state (fp32, carried; theory B*K*sum|theta|*4): " + ", ".join(sens))
    fmt = lambda v: "nan" if v is None else f"{v:.2f}"  # noqa: E731
    worst = lambda key, pick: pick(online[key]) if online[key] else None  # noqa: E731
    print(
        f"ratios rtrl/tbptt atari={fmt(ratios.get('atari'))} dmlab={fmt(ratios.get('dmlab'))} "
        f"lru={fmt(ratios.get('lru'))} stack={fmt(ratios.get('stack'))} "
        f"online_speedup={fmt(worst('speedup', min))} inplace_ratio={fmt(worst('inplace', max))} "
        f"bandwidth_multiple={fmt(worst('bandwidth', max))} bandwidth_floor={fmt(worst('floor', max))} "
        f"sensitivity_multiple={fmt(worst('extra', max))}"
    )


if __name__ == "__main__":
    main()
