"""Would a fused kernel speed up the M = 1 step? The in-place sensitivity pass of onlinerec's online step against a
one-pass numba kernel that does the same work, and a copy of the same bytes.

The pass under test is the part of the fully online step that touches the big tensor S (B, P, N, D), lazily scaled:

    S~ += u (x) x          (u: (B, P, N), x: (B, D); the outer product added in place)
    g[p, n, :] = sum_b lam[b, n] * S~[b, p, n, :]     (the gradient read-out)

- ``torch``: what onlinerec runs, ``addcmul_`` then the batched read-out (``_contract``): S is read, written, read.
- ``numba``: one kernel that adds the outer product and accumulates the read-out while each row is in cache: S is
  read and written once (a parallel loop over the P x N rows; each row's gradient has one writer).
- ``copy``: ``dst.copy_(src)`` of as many bytes, the memory-bandwidth yardstick of ``benchmarks/rtrl_vs_tbptt.py``.
- ``compiled`` (with ``--compile``): the same one-pass formula written for ``torch.compile`` (inductor's CPU code,
  built with the machine's C++ compiler on first call): the new S written back with ``copy_`` and the read-out
  reduced from the same expression, which inductor may fuse into one loop.

The two are checked to give the same S and g (float32, relative error <= 1e-5) before timing. The methods are
interleaved (their order rotates every round) and each is timed as a median of ``--reps`` calls per round; the
figure is the median over rounds. The last line reads ``ratios torch/copy=<a> numba/copy=<b> torch/numba=<c>``, the
worst (largest a and b, smallest c) over the shapes and thread counts of the run; with ``--compile`` it ends
``torch/compiled=<d>`` (the smallest).

Needs ``numba`` (``pip install numba``; not a dependency of onlinerec: see docs/performance.md for why it is not
used). Shapes: ``atari`` (B 32, N 256, D 257) and ``dmlab`` (B 32, N 512, D 257), P = 2 weight rows per unit (the
eLSTM's input projection).

Usage::

    python experiments/fused_update.py --threads 1,2
    python experiments/fused_update.py --threads 1,2 --compile   # also torch.compile's fused pass
    python experiments/fused_update.py --quick       # small shapes (smoke test)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from onlinerec.gradients.sensitivity import _contract

SHAPES = {"atari": (32, 2, 256, 257), "dmlab": (32, 2, 512, 257)}
QUICK_SHAPES = {"atari": (8, 2, 64, 65), "dmlab": (8, 2, 128, 65)}


def fused_kernel():
    """The one-pass kernel, compiled on first call (numba's LLVM JIT: no C compiler needed)."""
    from numba import njit, prange

    @njit(parallel=True, fastmath=True, cache=False)
    def update_and_read_out(s, u, x, lam, g):  # pragma: no cover - runs compiled
        b_size, p_size, n_size, d_size = s.shape
        for row in prange(p_size * n_size):
            p, n = row // n_size, row % n_size
            acc = g[p, n]
            acc[:] = 0.0
            for b in range(b_size):
                ub, lb, xb, srow = u[b, p, n], lam[b, n], x[b], s[b, p, n]
                for d in range(d_size):
                    v = srow[d] + ub * xb[d]
                    srow[d] = v
                    acc[d] += lb * v

    return update_and_read_out


def torch_pass(s: torch.Tensor, u: torch.Tensor, x: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    s.addcmul_(u.unsqueeze(-1), x[:, None, None, :])
    return _contract(lam, s)


def compiled_pass():
    """The one-pass formula for ``torch.compile``: S~ + u (x) x written back, and the read-out of that same value."""

    def update_and_read_out(s: torch.Tensor, u: torch.Tensor, x: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        new = s + u.unsqueeze(-1) * x[:, None, None, :]
        s.copy_(new)
        return (lam[:, None, :, None] * new).sum(0)

    return torch.compile(update_and_read_out, dynamic=False)


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1", help="comma-separated thread counts, e.g. 1,2")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of: " + ",".join(SHAPES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--quick", action="store_true", help="small shapes, one round of 3 calls (a smoke test)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile's version of the fused pass")
    args = ap.parse_args(argv)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.quick:
        args.rounds, args.reps = 1, 3
    try:
        import numba
    except ImportError:
        ap.exit(2, "fused_update.py needs numba, which onlinerec does not install: pip install numba\n")
    kernel = fused_kernel()
    compiled = compiled_pass() if args.compile else None
    worst = {"torch/copy": 0.0, "numba/copy": 0.0, "torch/numba": float("inf")}
    if compiled is not None:
        worst["torch/compiled"] = float("inf")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        numba.set_num_threads(threads)
        for name in args.shapes.split(","):
            if name not in shapes:
                ap.error(f"unknown shape {name!r}; choose from {sorted(shapes)}")
            b, p, n, d = shapes[name]
            gen = torch.Generator().manual_seed(0)
            s = torch.randn(b, p, n, d, generator=gen)
            u, x, lam = torch.randn(b, p, n, generator=gen) * 1e-3, torch.randn(b, d, generator=gen), torch.randn(b, n)
            g = torch.empty(p, n, d)
            s_torch, s_numba = s.clone(), s.clone()
            g_torch = torch_pass(s_torch, u, x, lam)
            kernel(s_numba.numpy(), u.numpy(), x.numpy(), lam.numpy(), g.numpy())
            err = max((s_torch - s_numba).abs().max() / s_torch.abs().max(), (g_torch - g).abs().max() / g.abs().max())
            if not err <= 1e-5:
                sys.exit(f"the numba kernel disagrees with the torch pass (relative error {err:.1e}); not timing")
            if compiled is not None:
                s_comp = s.clone()
                g_comp = compiled(s_comp, u, x, lam)
                err = max(
                    (s_torch - s_comp).abs().max() / s_torch.abs().max(), (g_torch - g_comp).abs().max() / g.abs().max()
                )
                if not err <= 1e-5:
                    sys.exit(f"the compiled pass disagrees with the torch pass (relative error {err:.1e}); not timing")
            dst = torch.empty_like(s)
            fns = {
                "torch": lambda: torch_pass(s, u, x, lam),
                "numba": lambda: kernel(s.numpy(), u.numpy(), x.numpy(), lam.numpy(), g.numpy()),
                "copy": lambda: dst.copy_(s),
            }
            if compiled is not None:
                fns["compiled"] = lambda: compiled(s, u, x, lam)
            results: dict[str, list[float]] = {k: [] for k in fns}
            for r in range(args.rounds):
                order = list(fns)[r % len(fns) :] + list(fns)[: r % len(fns)]
                for k in order:
                    results[k].append(timed(fns[k], args.reps))
            ms = {k: statistics.median(v) for k, v in results.items()}
            ratios = {
                "torch/copy": ms["torch"] / ms["copy"],
                "numba/copy": ms["numba"] / ms["copy"],
                "torch/numba": ms["torch"] / ms["numba"],
            }
            if compiled is not None:
                ratios["torch/compiled"] = ms["torch"] / ms["compiled"]
            print(
                f"{name} threads={threads} (S {s.numel() * 4 / 2**20:.1f} MiB): torch {ms['torch']:.2f} ms, numba "
                f"{ms['numba']:.2f} ms, "
                + (f"compiled {ms['compiled']:.2f} ms, " if compiled is not None else "")
                + f"copy {ms['copy']:.2f} ms; "
                + " ".join(f"{k}={v:.2f}" for k, v in ratios.items())
            )
            for k, v in ratios.items():
                worst[k] = min(worst[k], v) if k.startswith("torch/") and k != "torch/copy" else max(worst[k], v)
    print("ratios " + " ".join(f"{k}={v:.2f}" for k, v in worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
