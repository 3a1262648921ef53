"""Smoke tests of the benchmark scripts: each runs with --quick and ends with its ratios line (no timing asserted)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def run_quick(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def test_r2ac_throughput_quick():
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install -e '.[atari]'")
    pytest.importorskip("sb3_contrib", reason="needs the bench extra: pip install -e '.[bench]'")
    proc = run_quick("r2ac_throughput.py", "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    number = r"\d+(\.\d+)?"
    assert re.fullmatch(rf"ratios r2ac/recurrentppo={number} rtrl/tbptt_e2e={number} env_overhead={number}", last), last
