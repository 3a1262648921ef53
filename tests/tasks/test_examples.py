"""Tiny-budget subprocess runs of the supervised example, its YAML config through the CLI, and `onlinerec demo --quick`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO_LINE = re.compile(r"^demo: rtrl=(\d\.\d{3}) tbptt=(\d\.\d{3}) M=(\d+) delay=(\d+) seeds=(\d+)$")


def run(args: list[str], tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore", COLUMNS="120")
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def onlinerec_command() -> list[str]:
    """The installed console script when it sits next to this Python, else the same entry point via -m."""
    script = Path(sys.executable).parent / "onlinerec"
    return [str(script)] if script.exists() else [sys.executable, "-m", "onlinerec.cli"]


def test_copy_task_example_runs(tmp_path):
    proc = run(
        [
            sys.executable,
            str(ROOT / "examples" / "copy_task.py"),
            "--data.init_args.level",
            "4",
            "--trainer.max_steps",
            "6",
            "--trainer.val_check_interval",
            "3",
            "--data.init_args.num_streams",
            "4",
            "--model.init_args.hidden_size",
            "8",
            "--data.init_args.train_size",
            "20",
            "--data.init_args.val_size",
            "8",
            "--trainer.default_root_dir",
            str(tmp_path / "out"),
            "--trainer.enable_progress_bar",
            "false",
        ],
        tmp_path,
    )
    assert "after 6 updates" in proc.stdout and "val/print_acc" in proc.stdout
    assert list((tmp_path / "out").rglob("metrics.csv"))


def test_copy_task_yaml_through_the_cli(tmp_path):
    run(
        [
            *onlinerec_command(),
            "fit",
            "--config",
            str(ROOT / "examples" / "copy_task.yaml"),
            "--trainer.max_steps",
            "3",
            "--trainer.val_check_interval",
            "3",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--data.init_args.level",
            "4",
            "--data.init_args.val_size",
            "6",
            "--data.init_args.num_streams",
            "3",
            "--model.init_args.hidden_size",
            "8",
        ],
        tmp_path,
    )
    assert list(tmp_path.glob("**/metrics.csv")) or list(tmp_path.glob("**/config.yaml"))


def test_demo_quick_mode_prints_the_summary_line(tmp_path):
    out = tmp_path / "demo"
    proc = run([*onlinerec_command(), "demo", "--quick", "--seeds", "2", "--out-dir", str(out)], tmp_path)
    last = proc.stdout.strip().splitlines()[-1]
    match = DEMO_LINE.match(last)
    assert match, f"last line {last!r} does not have the demo format"
    rtrl, tbptt = float(match[1]), float(match[2])
    assert 0 <= rtrl <= 1 and 0 <= tbptt <= 1 and match[5] == "2"
    assert (out / "learning_curves.png").stat().st_size > 1000
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"]) == 4 and results["summary"]["rtrl"]["mean"] == rtrl_from(results, "rtrl")
    assert "RTRL" in proc.stdout and "TBPTT" in proc.stdout


def rtrl_from(results: dict, method: str) -> float:
    accs = [r["final_accuracy"] for r in results["runs"] if r["method"] == method]
    return sum(accs) / len(accs)


def test_the_console_shows_only_what_a_user_should_act_on(tmp_path):
    proc = run([*onlinerec_command(), "demo", "--quick", "--seeds", "1", "--out_dir", str(tmp_path / "d")], tmp_path)
    text = proc.stdout + proc.stderr
    for noise in ("Warning", "warn(", "Tip:", "v_num", "/-2", "weights_only"):
        assert noise not in text, f"{noise!r} in the demo's output:\n{text}"
