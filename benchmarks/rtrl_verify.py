"""What RTRL's runtime verification of the element-wise premise costs: RTRL(verify="off" | "sampled" | "always").

For a few cells and sizes it times a training segment (unroll + backward, CPU, one thread) without verification, one
sampled verification (one step, all streams: a Jacobian-vector product of the recurrence) and a segment with every
step verified, and prints

    <cell> D=.. N=.. B=.. M=..: segment X ms, one sampled check Y ms -> sampled(every=100) +P %, always +Q %

where "sampled" is Y / (100 X), the share of training time that the default RTRL() spends verifying, and "always"
the measured extra time of a segment verified at every step. It ends with the line
``rtrl_verify: sampled_max=P% always_max=Q%``.

    python benchmarks/rtrl_verify.py [--quick] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from onlinerec import RTRL
from onlinerec.cells import make_cell

CONFIGS = [  # name, D, N, B, M
    ("elstm", 32, 64, 16, 1),
    ("elstm", 32, 64, 16, 10),
    ("elstm", 64, 256, 32, 50),
    ("lru", 32, 64, 16, 10),
    ("minlstm", 64, 256, 32, 10),
]


def segment_time(cell, method: RTRL, m: int, b: int, segments: int) -> float:
    carry = method.init_carry(cell, b)
    x = torch.randn(segments + 2, m, b, cell.input_size)
    reset = torch.zeros(m, b, dtype=torch.bool)
    for s in range(2):  # warm-up
        states, carry = method.unroll(cell, x[s], reset, carry)
        states.sum().backward()
    start = time.perf_counter()
    for s in range(2, segments + 2):
        states, carry = method.unroll(cell, x[s], reset, carry)
        states.sum().backward()
    return (time.perf_counter() - start) / segments


def sampled_check_time(cell, m: int, b: int, calls: int) -> float:
    """One verification of one step of a live segment, as RTRL(verify="sampled") runs it."""
    method = RTRL(verify="off")
    carry = method.init_carry(cell, b)
    x = torch.randn(m, b, cell.input_size)
    reset = torch.zeros(m, b, dtype=torch.bool)
    gates = cell.input_proj(x).unflatten(-1, (cell.num_gates, cell.hidden_size)).detach()
    keep = (~reset).to(x.dtype)
    params = dict(cell.named_parameters())
    names = method.unit_parameters(cell)
    checker = RTRL(verify="sampled")
    with torch.no_grad():
        states, lin = method.linearized_scan(cell, params, gates, carry.c, keep)
    one = range(m - 1, m)
    checker._segments[id(cell)] = 1
    start = time.perf_counter()
    for _ in range(calls):
        checker._verify(cell, names, params, gates, carry.c, keep, states, lin, one)
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two small configurations, few segments (a smoke test)")
    parser.add_argument("--repeats", type=int, default=5, help="median over this many interleaved runs")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    configs = [c for c in CONFIGS if c[4] <= 10][:2] if args.quick else CONFIGS
    repeats = 1 if args.quick else args.repeats
    sampled_max = always_max = 0.0
    for name, d, n, b, m in configs:
        torch.manual_seed(0)
        cell = make_cell(name, d, n)
        segments = 5 if args.quick else (100 if m <= 10 else 30)
        off, always, check = [], [], []
        for _ in range(repeats):
            off.append(segment_time(cell, RTRL(verify="off"), m, b, segments))
            always.append(segment_time(cell, RTRL(verify="always"), m, b, segments))
            check.append(sampled_check_time(cell, m, b, segments))
        t_off, t_always, t_check = (statistics.median(v) for v in (off, always, check))
        sampled = 100 * t_check / (100 * t_off)
        extra = 100 * (t_always / t_off - 1)
        sampled_max, always_max = max(sampled_max, sampled), max(always_max, extra)
        print(
            f"{name} D={d} N={n} B={b} M={m}: segment {1e3 * t_off:.2f} ms, one sampled check {1e3 * t_check:.2f} ms "
            f"-> sampled(every=100) +{sampled:.3f} %, always {extra:+.0f} %",
            flush=True,
        )
    print(f"rtrl_verify: sampled_max={sampled_max:.3f}% always_max={always_max:.0f}%")


if __name__ == "__main__":
    main()
