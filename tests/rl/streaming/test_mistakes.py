"""``onlinerec stream`` turns a user's mistake into one line on stderr (exit status 2, no traceback, no run folder)
whose advice works when followed: a config's env or cell kwargs carried to an env or cell that does not take them, a
cell the method cannot train, a missing gymnasium."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("gymnasium")
from onlinerec.rl.streaming.runner import main  # noqa: E402

CONFIG = str(Path(__file__).resolve().parents[3] / "examples" / "configs" / "stream_memory.yaml")
TINY = ["--config", CONFIG, "--hidden_size", "4", "--stream.width", "8", "--total_frames", "60", "--eval_episodes", "0",
        "--progress", "false"]  # fmt: skip


def usage_error(args: list[str], capsys) -> str:
    """The one-line error ``onlinerec stream args`` ends in, checked: status 2, no traceback."""
    try:
        status = main(args)
    except SystemExit as exit_:  # an error found while parsing
        status = exit_.code
    assert status == 2
    err = capsys.readouterr().err
    assert "error: " in err and "Traceback" not in err
    return err


def test_the_configs_env_kwargs_on_another_env_are_named_and_replacing_them_works(tmp_path, capsys):
    out = tmp_path / "run"
    err = usage_error([*TINY, "--env", "popgym:RepeatFirstEasy", "--out_dir", str(out)], capsys)
    assert "does not take env_kwargs ['length']" in err and "--env_kwargs '{}'" in err
    assert not out.exists()  # refused before the folder is written
    assert main([*TINY, "--env", "popgym:RepeatFirstEasy", "--env_kwargs", "{}", "--out_dir", str(out)]) == 0


def test_the_configs_cell_kwargs_on_another_cell_and_a_refused_method_lead_to_a_run(tmp_path, capsys):
    out = str(tmp_path / "run")
    err = usage_error([*TINY, "--cell", "lstm", "--out_dir", out], capsys)
    assert "unexpected keyword argument 'r_min'" in err and "--cell_kwargs '{}'" in err
    err = usage_error([*TINY, "--cell", "lstm", "--cell_kwargs", "{}", "--out_dir", out], capsys)
    assert "exact RTRL refuses it. Train it with --method tbptt" in err and "snap" not in err.lower()
    assert main([*TINY, "--cell", "lstm", "--cell_kwargs", "{}", "--method", "tbptt", "--out_dir", out]) == 0


def test_a_missing_gymnasium_names_the_extra_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)  # `import gymnasium` now fails as if it were not installed
    err = usage_error([*TINY, "--out_dir", str(tmp_path / "run")], capsys)
    assert "needs gymnasium, which is not installed" in err and "pip install 'onlinerec[memory]'" in err
