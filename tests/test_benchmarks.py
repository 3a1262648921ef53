"""Smoke tests of the benchmark scripts: each runs with --quick and ends with its ratios line (no timing asserted).

Peers (sample-factory, cleanrl) are never CI dependencies: their test runs only where ``ONLINEREC_PEERS`` names a
folder with their virtualenvs (benchmarks/README.md#peers) and skips otherwise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import helpers

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def run_quick(script: str, *args: str, timeout: int = 300):
    return helpers.run_quick(f"benchmarks/{script}", *args, timeout=timeout)


NUMBER = r"(\d+(\.\d+)?|nan)"
PEER_RATIOS = rf"( r2ac/sample_factory={NUMBER})?( r2ac/cleanrl={NUMBER})?( r2ac/cleanrl_shipped={NUMBER})?"


def test_r2ac_throughput_quick():
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install -e '.[atari]'")
    pytest.importorskip("sb3_contrib", reason="needs the bench extra: pip install -e '.[bench]'")
    proc = run_quick("r2ac_throughput.py", "--threads", "1", "--peers", "")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "onlinerec Atari env: native" in proc.stdout, proc.stdout  # ale-py's C++ vector env, as the docstring says
    last = proc.stdout.strip().splitlines()[-1]
    number = r"\d+(\.\d+)?"
    assert re.fullmatch(
        rf"ratios r2ac/recurrentppo={number} rtrl/tbptt_e2e={number} env_overhead={number} "
        rf"async/plain={number} r2ac_async/recurrentppo={number}",
        last,
    ), last


def test_r2ac_throughput_quick_variants():
    """The channels-first (NCHW) stem and the background actor run (only ale-py needed), on the paper's Python env
    stack."""
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install -e '.[atari]'")
    proc = run_quick(
        "r2ac_throughput.py",
        "--threads",
        "1",
        "--peers",
        "",
        "--configs",
        "env,r2ac-rtrl,r2ac-rtrl-nchw,r2ac-rtrl-async",
        "--atari-backend",
        "torchbeast",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "onlinerec Atari env: torchbeast" in proc.stdout, proc.stdout
    assert re.search(r"^r2ac-rtrl-nchw +\d+", proc.stdout, re.M), proc.stdout
    assert re.search(r"^r2ac-rtrl-async +\d+", proc.stdout, re.M), proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"ratios r2ac/recurrentppo=nan rtrl/tbptt_e2e=nan env_overhead={NUMBER} async/plain={NUMBER}", last
    ), last


def installed_peers() -> tuple[str, list[str]]:
    """The peers' folder ($ONLINEREC_PEERS, see benchmarks/README.md#peers) and the peer configurations it has."""
    root = os.environ.get("ONLINEREC_PEERS", "")
    configs = []
    if root and (Path(root) / "sf-venv" / "bin" / "python").exists():
        configs += ["sample-factory", "env-sf"]
    if (
        root
        and (Path(root) / "cleanrl-venv" / "bin" / "python").exists()
        and (Path(root) / "cleanrl" / "cleanrl").exists()
    ):
        configs += ["cleanrl-matched", "cleanrl", "env-cleanrl"]
    return root, configs


def test_r2ac_throughput_quick_peers():
    """sample-factory and cleanrl next to R2AC, each peer only where it is installed (never in CI)."""
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install -e '.[atari]'")
    root, peers = installed_peers()
    if not peers:
        pytest.skip("no peer installed: set ONLINEREC_PEERS to a folder with sf-venv/, cleanrl-venv/, cleanrl/")
    configs = ",".join(["env", "r2ac-rtrl", *peers])
    proc = run_quick("r2ac_throughput.py", "--threads", "1", "--peers", root, "--configs", configs, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "not like for like" in out
    assert re.search(r"env-subtracted CPU s per 1k frames .*r2ac-rtrl=", out), out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(rf"ratios r2ac/recurrentppo=nan rtrl/tbptt_e2e=nan env_overhead={NUMBER}{PEER_RATIOS}", last), (
        last
    )
    if "sample-factory" in peers:
        assert "r2ac/sample_factory=" in last and "r2ac/sample_factory=nan" not in last
    if "cleanrl-matched" in peers:
        assert "r2ac/cleanrl=" in last and "r2ac/cleanrl=nan" not in last


def test_scaling_quick(tmp_path):
    png = tmp_path / "scaling.png"
    proc = run_quick("scaling.py", "--threads", "1", "--reps", "2", "--sweeps", "N,M", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    fit = r"-?\d+\.\d+"
    pattern = " ".join(f"{k}_{q} N={fit} M={fit}" for k in ("rtrl", "tbptt") for q in ("time", "mem"))
    assert re.fullmatch(f"exponents {pattern}", last), last
    assert png.stat().st_size > 10_000


def test_streaming_quick(tmp_path):
    png = tmp_path / "streaming_scaling.png"
    proc = run_quick("streaming.py", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    ratio = r"\d+\.\d\d"
    pattern = " ".join(
        f"{k}={ratio}" for k in ("agent/hand", "agent/ff", "wired/agent", "lightning/plain", "fabric/plain")
    )
    assert re.fullmatch(rf"ratios {pattern} steps_per_s_N64=\d+", last), last
    assert "scaling fit:" in proc.stdout and png.stat().st_size > 10_000


def test_rtrl_vs_tbptt_quick():
    """Every core (eLSTM at two shapes, LRU, a 4-layer stack), both thread counts, the M = 1 table with the copy."""
    proc = run_quick("rtrl_vs_tbptt.py", "--threads", "1,2", "--reps", "2", "--online-reps", "3", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "check: donated (in-place) M = 1 step = functional one" in out
    assert re.search(r"^atari +8 +64 +65 +copy +\d", out, re.M), out
    assert re.search(r"^stack +stack +8 +64 +65 +10 +rtrl +\d", out, re.M), out
    assert re.search(r"sensitivity state .*lru [\d.]+ MiB = theory, stack [\d.]+ MiB = theory", out), out
    last = out.strip().splitlines()[-1]
    fields = " ".join(
        f"{k}={NUMBER}"
        for k in (
            "atari",
            "dmlab",
            "lru",
            "stack",
            "online_speedup",
            "inplace_ratio",
            "bandwidth_multiple",
            "bandwidth_floor",
            "sensitivity_multiple",
        )
    )
    assert re.fullmatch(f"ratios rtrl/tbptt {fields}", last), last
    assert "nan" not in last


def test_memory_quick():
    # one single-component core and the multi-component stack: the other two shapes run the same code (test time)
    proc = run_quick("memory.py", "--threads", "1", "--shapes", "atari,stack", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for name in ("atari", "stack"):
        assert re.search(rf"^sensitivity bytes {name} .* = theory$", out, re.M), out
    last = out.strip().splitlines()[-1]
    keys = [f"{s}_M{m}" for s, m in (("atari", 10), ("atari", 1), ("stack", 10), ("stack", 1))]
    assert re.fullmatch("memory " + " ".join(rf"{k}=-?\d+\.\d+" for k in keys), last), last


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")
def test_children_cpu_counts_live_worker_processes():
    """``--atari-backend torchbeast-async`` steps the envs in worker processes: their CPU time must count."""
    import importlib.util
    import time

    spec = importlib.util.spec_from_file_location("r2ac_throughput", BENCHMARKS / "r2ac_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.modules[spec.name]
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\ntime.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        deadline = time.monotonic() + 30
        while bench.tree_cpu_seconds() - time.process_time() < 0.45:
            assert time.monotonic() < deadline, "the worker's 0.5 CPU-s never showed in tree_cpu_seconds()"
            time.sleep(0.2)
    finally:
        child.kill()
        child.wait()


def test_gpu_check_tiny_runs_the_whole_pipeline_on_the_cpu(tmp_path):
    """``python benchmarks/gpu_check.py --device cpu --tiny``: every part (the device tests, the exactness check, the
    three benchmarks, R2AC) runs at tiny shapes and the last line has the form a GPU run prints (timings unchecked)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_check.py"), "--device", "cpu", "--tiny"],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    signed = r"(-?\d+\.\d+|nan)"
    assert re.fullmatch(
        rf"gpu_check device=cpu tests_passed=[1-9]\d* tests_failed=0 rtrl_equals_bptt_max_rel_err=\d\.\de-\d+ "
        rf"rtrl_tbptt_max={NUMBER} online_step_vs_copy={NUMBER} memory_rtrl_minus_tbptt_max={signed} "
        rf"rtrl_time_exponent_B={signed} r2ac_fps_gpu_over_cpu={NUMBER} over_budget=(none|[a-z_,0-9]+)",
        last,
    ), proc.stdout[-3000:]
    assert float(re.search(r"rtrl_equals_bptt_max_rel_err=(\S+)", last).group(1)) < 1e-10
    assert "nan" not in last.split("r2ac_fps")[0], last  # every part but R2AC (which needs ale-py) measured
