"""Smoke runs of experiments/' timing and evidence scripts: each runs with --quick and ends with its summary line (no
timing asserted)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import helpers

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
NUMBER = r"(\d+(\.\d+)?|nan)"


def run_quick(script: str, *args: str, timeout: int = 300):
    return helpers.run_quick(f"experiments/{script}", *args, timeout=timeout)


def test_passes_logging_quick():
    """Both settings, both ways of logging: one timing line each, then the ratios line."""
    pytest.importorskip("popgym")
    proc = run_quick("passes_logging.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert sum(" CPU s / 1k steps" in line for line in lines) == 4, proc.stdout
    assert re.fullmatch(f"ratios every/last popgym.yaml={NUMBER} long={NUMBER}", lines[-1]), lines[-1]


def test_fused_update_quick():
    """The fused-kernel prototype: its ratios line where numba is installed, else a clear message (exit 2)."""
    proc = run_quick("fused_update.py", "--threads", "1")
    try:
        import numba  # noqa: F401
    except ImportError:
        assert proc.returncode == 2 and "needs numba" in proc.stderr and "pip install numba" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(f"ratios torch/copy={NUMBER} numba/copy={NUMBER} torch/numba={NUMBER}", last), last
    proc = run_quick("fused_update.py", "--threads", "1", "--compile")  # torch.compile's version too (needs g++)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        f"ratios torch/copy={NUMBER} numba/copy={NUMBER} torch/numba={NUMBER} torch/compiled={NUMBER}", last
    ), last


def test_cell_evidence_quick(tmp_path):
    """Every row of the cells' evidence, tiny, then its report: the tables and both figures."""
    proc = run_quick("cell_evidence.py", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"rows=\d+ out={re.escape(str(tmp_path))}", last), last
    assert (tmp_path / "cell_evidence.md").is_file()
    assert (tmp_path / "cells.png").stat().st_size > 0 and (tmp_path / "deep.png").stat().st_size > 0
