"""``onlinerec rl`` turns a user's mistake into a usage error (exit status 2, no traceback, no run folder) whose advice
works when followed: integer settings out of range, a budget of no frames, a cell the gradient method refuses, a
damaged checkpoint, a missing gymnasium, and core options the feed-forward baseline would ignore."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from onlinerec.cells import ElementwiseCell
from onlinerec.rl.experiment import parse_experiment
from onlinerec.rl.runner import main, run_experiment
from tests.helpers import TINY_RL

ROOT = Path(__file__).resolve().parents[2]
TMAZE = ROOT / "examples" / "configs" / "memory_tmaze.yaml"
TINY = [*TINY_RL, "--env", "memory:tmaze", "--env_kwargs", '{"length": 3}', "--stem", "mlp", "--eval_episodes", "0"]


class NeighbourCell(ElementwiseCell):
    """A cell of a user's own whose recurrence reads its left neighbour: not element-wise, not fully recurrent."""

    num_gates = 2

    def recurrence(self, gates, c_prev):
        return 0.5 * c_prev + gates[..., 0, :] + torch.sigmoid(gates[..., 1, :]) * c_prev.roll(1, -1)


NEIGHBOUR = f"{__name__}.NeighbourCell"


def cli(*args: str, hide_gymnasium: bool = False, tmp_path: Path | None = None) -> subprocess.CompletedProcess:
    """``onlinerec ...`` in a subprocess (the console script's module), optionally with gymnasium hidden."""
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    if hide_gymnasium:
        assert tmp_path is not None
        (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['gymnasium'] = None\n")
        paths.insert(0, str(tmp_path))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    return subprocess.run(
        [sys.executable, *args], check=False, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )


def refused(args: list[str], capsys) -> str:
    """The usage error that parsing ``args`` ends in (exit status 2), checked to be one without a traceback."""
    with pytest.raises(SystemExit) as info:
        parse_experiment(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: " in err and "Traceback" not in err
    return err


# -- integer settings and the budget -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--M", "0", "--M must be an int >= 1"),
        ("--num_envs", "0", "--num_envs must be an int >= 1"),
        ("--hidden_size", "0", "--hidden_size must be an int >= 1"),
        ("--fc_size", "-3", "--fc_size must be an int >= 1"),
        ("--eval_envs", "0", "--eval_envs must be an int >= 1"),
        ("--eval_max_steps", "0", "--eval_max_steps must be an int >= 1 (or null: no cap)"),
        ("--checkpoint_every", "0", "--checkpoint_every must be an int >= 1"),
        ("--log_every", "0", "--log_every must be an int >= 1"),
        ("--threads", "0", "--threads must be an int >= 1"),
        ("--r2ac.return_window", "0", "--r2ac.return_window must be an int >= 1"),
        ("--r2ac.total_updates", "0", "--r2ac.total_updates must be an int >= 1"),
        ("--eval_episodes", "-1", "--eval_episodes must be an int >= 0, got -1: the greedy evaluation episodes after "
         "training; 0 for none"),
        ("--total_frames", "0", "--total_frames must be a number > 0"),
        ("--total_frames", "-5", "--total_frames must be a number > 0"),
    ],
)  # fmt: skip
def test_a_setting_out_of_range_is_a_usage_error_that_names_the_range(option, value, says, tmp_path, capsys):
    out = tmp_path / "run"
    err = refused([*TINY, option, value, "--out_dir", str(out)], capsys)
    assert says in err
    assert not out.exists()


def test_M_0_from_the_shell_is_a_usage_error_like_a_negative_M(tmp_path):
    """It ended in a ZeroDivisionError traceback while --M -2 got a clean message."""
    for value in ("0", "-2"):
        proc = cli("-m", "onlinerec.cli", "rl", "--config", str(TMAZE), "--M", value, "--out_dir", str(tmp_path / "x"))
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "--M must be an int >= 1" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


def test_the_smallest_settings_still_run(tmp_path):
    """The lower bounds are the least values that run: one stream, M = 1, no evaluation."""
    args = [*TINY, "--num_envs", "1", "--M", "1", "--log_every", "1", "--checkpoint_every", "1"]
    assert run_experiment(parse_experiment([*args, "--total_frames", "1", "--out_dir", str(tmp_path)]))["updates"] == 1


# -- a cell the method refuses --------------------------------------------------------------------------------------
def test_a_fully_recurrent_cell_under_rtrl_is_refused_in_the_command_lines_terms(tmp_path, capsys):
    """It was a NotElementwiseError traceback naming Python classes, after config.json and csv/ were written."""
    out = tmp_path / "lstm"
    err = refused([*TINY, "--cell", "lstm", "--out_dir", str(out)], capsys)
    assert "LSTMCell is fully recurrent" in err
    assert "--method snap or --method tbptt" in err and "--cell elstm" in err
    assert "Strategy" not in err  # no Python class names
    assert not out.exists()
    for advice in (["--method", "snap"], ["--method", "tbptt"], ["--cell", "elstm"]):  # each piece of advice runs
        cfg = parse_experiment([*TINY, "--cell", "lstm", *advice, "--total_frames", "8", "--out_dir", str(out)])
        assert run_experiment(cfg)["updates"] == 1
        shutil.rmtree(out)


@pytest.mark.parametrize("method", ["rtrl", "snap"])
def test_a_users_mixing_cell_is_told_the_method_that_trains_it(method, tmp_path, capsys):
    """SnAP-1 refuses a mixing ElementwiseCell too, so the advice is TBPTT (or an element-wise recurrence)."""
    out = tmp_path / "mix"
    err = refused([*TINY, "--cell", NEIGHBOUR, "--method", method, "--out_dir", str(out)], capsys)
    assert "NeighbourCell.recurrence is not element-wise" in err
    advice = err.split("cannot train it.", 1)[1]
    assert advice.startswith(" Train it with --method tbptt") and "--method snap" not in advice
    assert "element-wise" in err and "docs/custom_cell.md" in err
    assert not out.exists()
    cfg = parse_experiment([*TINY, "--cell", NEIGHBOUR, "--method", "tbptt", "--total_frames", "8"] + ["--out_dir", str(out)])  # fmt: skip
    assert run_experiment(cfg)["updates"] == 1


def test_the_demo_gives_the_same_advice_for_a_mixing_cell():
    from onlinerec.tasks.demo import DemoConfig

    with pytest.raises(ValueError, match=r"not element-wise.*Train it with --methods '\[tbptt\]'"):
        DemoConfig(cell=NEIGHBOUR)
    assert DemoConfig(cell=NEIGHBOUR, methods=["tbptt"]).methods == ["tbptt"]


# -- a damaged checkpoint --------------------------------------------------------------------------------------------
def test_a_damaged_checkpoint_names_a_way_to_start_over_that_works(tmp_path, capsys):
    """Each way out the message names works when followed; --resume false, which would refuse the folder in turn, is
    not one of them."""
    out = tmp_path / "run"
    args = [*TINY, "--total_frames", "16", "--out_dir", str(out)]
    assert main(args) == 0
    (out / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 half a file")
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "last.ckpt is truncated" in err and "--resume false" not in err and "Traceback" not in err
    assert main([*args, "--resume", "false"]) == 2  # what the old advice said: still refused
    capsys.readouterr()
    assert main([*args[:-1], str(tmp_path / "new")]) == 0  # a new --out_dir works
    move = re.search(r"\(mv (.+?)\)", err)
    assert move, err
    source, target = shlex.split(move.group(1))
    shutil.move(source, target)  # follow it: move the folder aside, then the same command again
    capsys.readouterr()
    assert main(args) == 0
    assert (out / "checkpoints" / "last.ckpt").exists() and (Path(target) / "config.json").exists()


# -- gymnasium missing -----------------------------------------------------------------------------------------------
def test_help_works_without_gymnasium_and_a_run_names_the_extra(tmp_path):
    """After `pip install -e .` (no gymnasium) --help and a run crashed with ModuleNotFoundError."""
    for args in (["examples/memory.py", "--help"], ["-m", "onlinerec.cli", "rl", "--help"]):
        proc = cli(*args, hide_gymnasium=True, tmp_path=tmp_path)
        assert proc.returncode == 0 and "--total_frames" in proc.stdout, proc.stderr[-2000:]
    for args, extra in (
        (["examples/memory.py"], "memory"),
        (["-m", "onlinerec.cli", "rl", "--config", str(TMAZE)], "memory"),
        (["-m", "onlinerec.cli", "rl", "--env", "ALE/Pong-v5", "--stem", "nature"], "atari"),
    ):
        proc = cli(*args, "--out_dir", str(tmp_path / "run"), hide_gymnasium=True, tmp_path=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert "needs gymnasium" in proc.stderr and f"pip install 'onlinerec[{extra}]'" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_every_install_hint_names_an_extra_that_installs_what_it_needs():
    """One form everywhere (pip install 'onlinerec[extra]'); a config of a POPGym env names the extra with POPGym."""
    import yaml

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    files = sorted((ROOT / "examples").glob("*.py")) + sorted((ROOT / "examples" / "configs").glob("*.yaml"))
    for path in files:
        text = path.read_text()
        hints = re.findall(r"pip install ('[^']*'|\S+)", text)
        for hint in hints:
            match = re.fullmatch(r"'onlinerec\[(\w+)\]'", hint)
            assert match and match.group(1) in extras, f"{path.name}: pip install {hint}"
        if path.suffix == ".yaml" and str(yaml.safe_load(text).get("env", "")).startswith("popgym:"):
            assert hints and all("[memory]" in h for h in hints), path.name
            assert any(d.startswith("popgym") for d in extras["memory"])


# -- the feed-forward baseline ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", ["memory_tmaze.yaml", "popgym.yaml"])
def test_a_shipped_config_with_cell_none_warns_once_naming_what_it_ignores(config, capsys):
    cfg = parse_experiment(["--config", str(ROOT / "examples" / "configs" / config), "--cell", "none"])
    assert cfg.cell is None
    err = capsys.readouterr().err
    assert err.count("warning:") == 1
    assert "no recurrent core: it ignores hidden_size:" in err and "cell_kwargs:" in err and config in err


def test_core_options_given_with_cell_none_are_a_usage_error(tmp_path, capsys):
    i = TINY.index("--hidden_size")
    ff = [*TINY[:i], *TINY[i + 2 :], "--cell", "none", "--out_dir", str(tmp_path / "ff")]
    err = refused([*ff, "--hidden_size", "64"], capsys)
    assert "--cell none trains the feed-forward baseline" in err and "--hidden_size 64 would be ignored" in err
    err = refused([*ff, "--cell_kwargs", '{"forget_bias": 2.0}'], capsys)
    assert '--cell_kwargs {"forget_bias": 2.0} would be ignored' in err
    assert not (tmp_path / "ff").exists()
    cfg = parse_experiment([*ff, "--total_frames", "8"])  # nothing ignored, nothing said: the baseline trains
    assert capsys.readouterr().err == "" and run_experiment(cfg)["updates"] == 1
