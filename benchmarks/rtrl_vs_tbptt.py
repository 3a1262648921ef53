"""Time one update of an eLSTM core: TBPTT vs onlinerec's RTRL vs a reference of the paper's RTRL scheme.

One update = forward over a segment of M steps from B streams, a loss on the readout (output gate)
outputs, backward, and the carry to the next segment; every cell parameter ends with its gradient in
``.grad``. Methods:

- ``tbptt``: onlinerec's TBPTT (backprop within the segment only).
- ``rtrl``: onlinerec's RTRL (exact; autograd surrogate for the carried sensitivities, batched carry).
- ``reference``: the paper's scheme written out for the eLSTM (docs/rtrl.md#sensitivity-recursions), as in the official code:
  the core parameters are excluded from autograd, the state runs without a graph, the loss is
  backpropagated into a retained tensor of states to get the top gradient e_t, then the sensitivities
  are updated step by step under no_grad (out of place, outer product by bmm) and the core gradients
  are accumulated by hand as sum_b e_t[b] S_t[b].
- ``reference-inplace``: the same scheme with in-place sensitivity updates and a cache-friendly
  gradient accumulation (a tuned hand-written implementation, for comparison).

Before timing, each reference's gradients are checked against onlinerec's RTRL (float64, several
segments with resets; rel. err <= 1e-10) and at the benchmark shape (float32, from a non-zero carry);
the script exits with an error if they differ.

Usage::

    python benchmarks/rtrl_vs_tbptt.py                 # full run (Atari and DMLab core shapes, M=1 step)
    python benchmarks/rtrl_vs_tbptt.py --quick         # small shapes, few repetitions (smoke test)
    python benchmarks/rtrl_vs_tbptt.py --threads 1 --reps 11

The last line reads ``ratios rtrl/tbptt atari=<x> dmlab=<y> online_speedup=<z>`` with z = reference
M=1 step time / RTRL M=1 step time at the Atari shape.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from onlinerec.cells import ELSTMCell
from onlinerec.gradients import RTRL, TBPTT

SHAPES = {  # name: (B, N, D, M)
    "atari": (32, 256, 257, 50),
    "dmlab": (32, 512, 257, 100),
}
QUICK_SHAPES = {"atari": (8, 64, 65, 10), "dmlab": (8, 128, 65, 20)}


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
            "W": torch.zeros(2, n, d, dtype=inputs.dtype),
            "b": torch.zeros(2, n, dtype=inputs.dtype),
            "w": torch.zeros(2, n, dtype=inputs.dtype),
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
def loss_fn(cell: ELSTMCell):
    """Sum of squares of the readout (output gate) outputs h_t = sigmoid(W_o [x_t; c_t] + b_o) * c_t."""
    return lambda states, inputs: cell.readout(states, inputs).pow(2).sum()


class Runner:
    """Holds a method, its cell and its carry; ``step(inputs, reset)`` runs one update."""

    def __init__(self, kind: str, cell: ELSTMCell, batch_size: int) -> None:
        self.kind, self.cell = kind, cell
        self.loss = loss_fn(cell)
        if kind in ("tbptt", "rtrl"):
            self.method = TBPTT() if kind == "tbptt" else RTRL()
            self.carry = self.method.init_carry(cell, batch_size)
        else:
            self.method = ReferenceRTRL(cell, inplace=kind == "reference-inplace")
            self.carry = self.method.init_carry(batch_size)

    def step(self, inputs: torch.Tensor, reset: torch.Tensor) -> None:
        self.cell.zero_grad(set_to_none=True)
        if isinstance(self.method, ReferenceRTRL):
            self.carry = self.method.update(inputs, reset, self.carry, self.loss)
        else:
            states, self.carry = self.method.unroll(self.cell, inputs, reset, self.carry)
            self.loss(states, inputs).backward()


def make_cell(n: int, d: int, dtype: torch.dtype, seed: int) -> ELSTMCell:
    torch.manual_seed(seed)
    return ELSTMCell(d, n).to(dtype)


def make_segments(count: int, m: int, b: int, d: int, dtype: torch.dtype, seed: int, reset_prob: float = 0.01):
    gen = torch.Generator().manual_seed(seed)
    segs = []
    for i in range(count):
        x = torch.randn(m, b, d, generator=gen).to(dtype)
        reset = torch.rand(m, b, generator=gen) < reset_prob
        if i == 0:
            reset[0] = True
        segs.append((x, reset))
    return segs


# ----------------------------------------------------------------------------------------------
# Correctness gate: the references must give onlinerec's RTRL gradients
# ----------------------------------------------------------------------------------------------
def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def compare(kind: str, n: int, d: int, b: int, m: int, segments: int, dtype: torch.dtype, tol: float) -> float:
    """Run onlinerec's RTRL and a reference over the same segments from the same weights; max rel. error
    of the gradients (every segment) and of the final state."""
    cells = [make_cell(n, d, dtype, seed=3) for _ in range(2)]
    runners = [Runner("rtrl", cells[0], b), Runner(kind, cells[1], b)]
    worst = 0.0
    for x, reset in make_segments(segments, m, b, d, dtype, seed=4, reset_prob=0.1):
        for r in runners:
            r.step(x, reset)
        g0 = dict(cells[0].named_parameters())
        for name, p in cells[1].named_parameters():
            worst = max(worst, rel_err(p.grad, g0[name].grad))
    worst = max(worst, rel_err(runners[1].carry["c"], runners[0].carry.c))
    if not worst <= tol:
        sys.exit(
            f"FAIL: {kind} gradients differ from onlinerec's RTRL (max rel. err {worst:.3g} > {tol:g}, {dtype}, N={n} D={d} B={b} M={m})"
        )
    return worst


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------
@dataclass
class Timing:
    median_ms: float  # wall clock
    min_ms: float
    cpu_ms: float  # median process CPU time (all threads): robust to waiting for a shared CPU
    reps: int


def time_methods(
    kinds: list[str], shape: tuple[int, int, int, int], reps: int, warmup: int, seed: int
) -> dict[str, Timing]:
    """Interleaved repetitions (the order rotates every round), after ``warmup`` untimed updates each."""
    b, n, d, m = shape
    runners = {k: Runner(k, make_cell(n, d, torch.float32, seed), b) for k in kinds}
    segs = make_segments(4, m, b, d, torch.float32, seed + 1)
    for k, r in runners.items():
        for i in range(warmup):
            r.step(*segs[i % len(segs)])
    times: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for rep in range(reps):
        order = kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]
        for k in order:
            x, reset = segs[rep % len(segs)]
            t0, c0 = time.perf_counter(), time.process_time()
            runners[k].step(x, reset)
            times[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return {
        k: Timing(statistics.median(v) * 1e3, min(v) * 1e3, statistics.median(cpu[k]) * 1e3, len(v))
        for k, v in times.items()
    }


def sensitivity_bytes(b: int, n: int, d: int, itemsize: int = 4) -> int:
    """Theoretical RTRL state for the eLSTM core per update: B * (2*N*D + 2*N + 2*N) floats (docs/rtrl.md#complexity)."""
    return b * (2 * n * d + 4 * n) * itemsize


def machine() -> str:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads, python {platform.python_version()}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per method (default 9, quick: 3)")
    ap.add_argument(
        "--online-reps", type=int, default=None, help="timed repetitions of the M=1 step (default 31, quick: 5)"
    )
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small shapes and few repetitions (smoke test)")
    ap.add_argument("--shapes", default="atari,dmlab", help="comma-separated subset of: " + ",".join(SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    reps = args.reps or (3 if args.quick else 9)
    online_reps = args.online_reps or (5 if args.quick else 31)
    names = [s for s in args.shapes.split(",") if s]
    for s in names:
        if s not in shapes:
            ap.error(f"unknown shape {s!r}; choose from {sorted(shapes)}")
    print(f"machine: {machine()}")

    # correctness gate
    for kind in ("reference", "reference-inplace"):
        e64 = compare(kind, n=7, d=5, b=4, m=6, segments=4, dtype=torch.float64, tol=1e-10)
        bb, nn_, dd, mm = shapes[names[0]] if names else QUICK_SHAPES["atari"]
        e32 = compare(kind, n=nn_, d=dd, b=bb, m=mm, segments=2, dtype=torch.float32, tol=1e-4)
        print(
            f"check: {kind} gradients = onlinerec RTRL (float64 rel. err {e64:.1e}; float32 at {names[0] if names else 'quick'} shape {e32:.1e})"
        )

    header = f"{'shape':<7} {'B':>3} {'N':>4} {'D':>4} {'M':>4}  {'method':<18} {'median ms':>10} {'min ms':>9} {'cpu ms':>9} {'/tbptt':>7} {'cpu/tbptt':>9}"
    print()
    print(
        "one update (forward + backward + carry), medians of interleaved repetitions (wall clock; cpu = process CPU time)"
    )
    print(header)
    ratios = {}
    for s in names:
        b, n, d, m = shapes[s]
        res = time_methods(
            ["tbptt", "rtrl", "reference", "reference-inplace"], (b, n, d, m), reps, args.warmup, args.seed
        )
        base, base_cpu = res["tbptt"].median_ms, res["tbptt"].cpu_ms
        for k, t in res.items():
            print(
                f"{s:<7} {b:>3} {n:>4} {d:>4} {m:>4}  {k:<18} {t.median_ms:>10.2f} {t.min_ms:>9.2f} {t.cpu_ms:>9.2f} {t.median_ms / base:>7.2f} {t.cpu_ms / base_cpu:>9.2f}"
            )
        ratios[s] = res["rtrl"].median_ms / base

    print()
    print(
        "M = 1 online step (forward + backward + carry), medians of interleaved repetitions (wall clock; cpu = process CPU time)"
    )
    print(
        f"{'shape':<7} {'B':>3} {'N':>4} {'D':>4}  {'method':<18} {'median ms':>10} {'min ms':>9} {'cpu ms':>9} {'ref/this':>9} {'cpu ref/this':>12}"
    )
    online = {}
    for s in names:
        b, n, d, _ = shapes[s]
        res = time_methods(
            ["rtrl", "reference", "reference-inplace", "tbptt"],
            (b, n, d, 1),
            online_reps,
            max(args.warmup, 3),
            args.seed,
        )
        ref, ref_cpu = res["reference"].median_ms, res["reference"].cpu_ms
        for k, t in res.items():
            print(
                f"{s:<7} {b:>3} {n:>4} {d:>4}  {k:<18} {t.median_ms:>10.3f} {t.min_ms:>9.3f} {t.cpu_ms:>9.3f} {ref / t.median_ms:>9.2f} {ref_cpu / t.cpu_ms:>12.2f}"
            )
        online[s] = ref / res["rtrl"].median_ms
        print(f"{s:<7} RTRL vs reference-inplace: {res['reference-inplace'].median_ms / res['rtrl'].median_ms:.2f}x")

    print()
    print(
        "sensitivity state (theoretical, fp32): "
        + ", ".join(f"{s} {sensitivity_bytes(*shapes[s][:3]) / 2**20:.1f} MiB" for s in names)
    )
    fmt = lambda v: "nan" if v is None else f"{v:.2f}"  # noqa: E731
    first = "atari" if "atari" in online else (names[0] if names else None)
    print(
        f"ratios rtrl/tbptt atari={fmt(ratios.get('atari'))} dmlab={fmt(ratios.get('dmlab'))} online_speedup={fmt(online.get(first) if first else None)}"
    )


if __name__ == "__main__":
    main()
