"""The Trainer's strategy names ("rtrl", "tbptt", "snap") exist after importing any onlinerec module, with M = 50, and
every strategy shows its M."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from onlinerec import RTRLStrategy, SnAPStrategy, TBPTTStrategy
from tests.helpers import ROOT

PROBE = """
import lightning as L
trainer = L.Trainer(strategy="{name}", accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
print(repr(trainer.strategy))
"""


@pytest.mark.parametrize(
    "first_import", ["import onlinerec.cells", "from onlinerec.training import OnlineRecurrentModule"]
)
def test_the_strategy_names_exist_after_importing_any_onlinerec_module(first_import):
    """A fresh process that imports one onlinerec submodule (never the package by name) can ask for strategy='rtrl'."""
    code = first_import + "\n" + "\n".join(PROBE.format(name=n) for n in ("rtrl", "tbptt"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-2:] == ["RTRLStrategy(M=50, method=RTRL())", "TBPTTStrategy(M=50, method=TBPTT())"]


def test_every_strategy_shows_its_m():
    assert repr(RTRLStrategy(M=7)).startswith("RTRLStrategy(M=7, ")
    assert repr(TBPTTStrategy()).startswith("TBPTTStrategy(M=50, ")
    assert repr(SnAPStrategy(M=3)).startswith("SnAPStrategy(M=3, method=SnAP(")
