"""What a run shows and draws: plain progress lines when its output is a file, a learning curve that marks where a
resumed run changed its settings, the chance line of the T-maze, and the T-maze example's budget and time as the
results page and the README state them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from onlinerec.rl.curves import plot_learning_curves, random_policy_return, setting_changes
from onlinerec.rl.experiment import parse_experiment
from onlinerec.rl.monitor import ProgressLines
from onlinerec.rl.runner import run_experiment
from tests.helpers import TINY_RL

ROOT = Path(__file__).resolve().parents[2]
TMAZE = ROOT / "examples" / "configs" / "memory_tmaze.yaml"
TINY = [*TINY_RL, "--env", "memory:tmaze", "--env_kwargs", '{"length": 3}', "--stem", "mlp", "--eval_episodes", "0"]
LINE = re.compile(r"^frames [\d,]+ / [\d,]+ \(\d+%\)  fps \S+  return \S+.*  elapsed \d+:\d\d:\d\d$", re.M)


# -- progress in a log file ------------------------------------------------------------------------------------------
def test_progress_lines_come_every_few_seconds_with_frames_fps_return_and_time():
    written: list[str] = []
    lines = ProgressLines(total_frames=1000, every=10.0, write=written.append)
    assert lines.update(100, None, now=0.0)  # the first update: a line at once
    assert not lines.update(200, 0.25, now=5.0)  # not yet due
    assert lines.update(600, 0.5, now=10.0)
    assert lines.update(650, 0.75, now=11.0, force=True)  # the last one, whenever it comes
    assert len(written) == 3 and all(LINE.match(line) for line in written)
    assert written[0].startswith("frames 100 / 1,000 (10%)") and "no episode finished yet" in written[0]
    assert written[1] == "frames 600 / 1,000 (60%)  fps 50  return 0.500  elapsed 0:00:10"


def test_a_run_whose_output_is_a_file_prints_plain_progress_lines(tmp_path):
    """With stdout redirected a run printed nothing between its start and its end (the rich bar needs a terminal)."""
    log = tmp_path / "run.log"
    args = [*TINY, "--progress", "true", "--total_frames", "64", "--out_dir", str(tmp_path / "run")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    with open(log, "w") as out:
        code = subprocess.run(
            [sys.executable, "-m", "onlinerec.cli", "rl", *args], stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=ROOT, timeout=120, check=False,
        ).returncode  # fmt: skip
    text = log.read_text()
    assert code == 0, text[-2000:]
    found = LINE.findall(text)
    assert len(found) >= 2, text  # one after the first segment, one at the end
    assert found[-1].startswith("frames 64 / 64 (100%)")
    assert "━" not in text  # no rich bar


# -- a resumed run whose settings changed ----------------------------------------------------------------------------
def test_the_learning_curve_marks_where_a_resumed_run_changed_its_method(tmp_path, monkeypatch):
    """--allow_config_change stitched RTRL and TBPTT under the one label "tbptt (1 run)", with no mark."""
    import onlinerec.rl.runner as runner

    drawn: list[dict] = []

    def recording(runs, path, **kw):
        drawn.append({"runs": dict(runs), **kw})
        return plot_learning_curves(runs, path, **kw)

    monkeypatch.setattr(runner, "plot_learning_curves", recording)
    args = [*TINY, "--log_every", "1", "--out_dir", str(tmp_path)]
    first = run_experiment(parse_experiment([*args, "--total_frames", "48"]))
    run_experiment(parse_experiment([*args, "--total_frames", "96", "--method", "tbptt", "--allow_config_change", "true"]))  # fmt: skip
    changes = json.loads((tmp_path / "config_changes.json").read_text())
    assert changes == [{"frames": first["frames"], "changes": {"method": {"was": "rtrl", "now": "tbptt"}}}]
    assert setting_changes(tmp_path) == [(first["frames"], {"method": ("rtrl", "tbptt")})]
    last = drawn[-1]
    assert list(last["runs"]) == ["rtrl → tbptt"]  # not one method's name
    assert last["marks"] == [(first["frames"], "method: rtrl → tbptt")]
    assert (tmp_path / "learning_curve.png").exists()


def test_a_mark_is_a_vertical_line_with_its_text(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    seen: list[tuple[str, tuple]] = []

    def recorder(name):
        original = getattr(Axes, name)

        def call(self, *args, **kwargs):
            seen.append((name, args))
            return original(self, *args, **kwargs)

        return call

    for name in ("axvline", "text"):
        monkeypatch.setattr(Axes, name, recorder(name))
    run = tmp_path / "run" / "csv" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("frames,return\n10,0.1\n20,0.2\n30,0.3\n")
    plot_learning_curves({"x": [tmp_path / "run"]}, tmp_path / "c.png", marks=[(20.0, "M: 4 → 2")])
    assert ("axvline", (20.0,)) in seen
    assert any(name == "text" and args[0] == 20.0 and "M: 4 → 2" in args[2] for name, args in seen)


def test_changes_recorded_before_their_frames_were_still_read(tmp_path):
    (tmp_path / "config_changes.json").write_text(json.dumps([{"M": {"was": 4, "now": 2}}]))
    assert setting_changes(tmp_path) == [(None, {"M": (4, 2)})]
    assert setting_changes(tmp_path / "nothing") == []


# -- the T-maze's chance line, budget and time -----------------------------------------------------------------------
def test_the_t_maze_curve_draws_chance_and_other_envs_draw_none(tmp_path, monkeypatch):
    import onlinerec.rl.runner as runner

    drawn: list[dict] = []
    monkeypatch.setattr(runner, "plot_learning_curves", lambda runs, path, **kw: drawn.append(kw) or Path(path))
    cues = 3
    cfg = parse_experiment([*TINY, "--env_kwargs", f'{{"length": 3, "num_cues": {cues}}}', "--log_every", "1",
                            "--total_frames", "16", "--out_dir", str(tmp_path)])  # fmt: skip
    run_experiment(cfg)
    assert drawn[-1]["baseline"] == pytest.approx(1 / cues) and "chance" in drawn[-1]["baseline_label"]
    assert random_policy_return("memory:tmaze") == pytest.approx(1 / 2)  # the env's default: two cues
    assert random_policy_return("popgym:RepeatPreviousEasy") is None  # not known exactly: no line


def test_the_t_maze_example_trains_for_the_budget_the_results_page_solves_it_in():
    """The example's default budget was several times what the T-maze needs, and its advertised time was not true."""
    results = (ROOT / "docs" / "results.md").read_text()
    section = results[results.index("## T-maze") :]
    budget = int(re.search(r"corridor 6 with M = 2\s+\(([\d,]+) steps\)", section).group(1).replace(",", ""))
    cfg = parse_experiment([], TMAZE)
    assert cfg.total_frames == budget and cfg.env_kwargs["length"] == 6 and cfg.M == 2
    said = re.compile(r"about (\d+) CPU-minutes")
    where = {
        "README.md": next(line for line in (ROOT / "README.md").read_text().splitlines() if "memory_tmaze" in line),
        "memory_tmaze.yaml": TMAZE.read_text(),
        "examples/memory.py": (ROOT / "examples" / "memory.py").read_text(),
    }
    minutes = {name: said.findall(text) for name, text in where.items()}
    assert all(len(m) == 1 for m in minutes.values()) and len({m[0] for m in minutes.values()}) == 1, minutes
