"""The ``onlinerec`` command: its usage names every subcommand, an unknown one is a usage error, ``demo``, ``rl`` and
``stream`` print their options with ``--help`` (and start nothing), and a strategy named by alias keeps the config's M."""

from __future__ import annotations

import re

import pytest

from onlinerec.cli import main
from tests.tasks.test_examples import ROOT, onlinerec_command, run


def test_no_command_prints_the_usage_and_fails_and_help_succeeds(capsys):
    assert main([]) == 2
    usage = capsys.readouterr().out
    assert usage.startswith("usage: onlinerec demo")
    for command in ("demo", "rl", "stream"):
        assert re.search(rf"^  {command} +\S", usage, re.M), command  # each subcommand with its line of help
    assert "fit, validate, test, predict" in usage
    for flag in ("--help", "-h"):
        assert main([flag]) == 0
        assert capsys.readouterr().out == usage


def test_an_unknown_command_is_a_usage_error_that_names_it_and_every_command(capsys):
    assert main(["strem"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'strem'" in err and "did you mean 'stream'?" in err
    assert all(name in err for name in ("demo", "rl", "stream", "fit", "validate", "test", "predict"))


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("demo", ["--M", "--delay", "--cell", "--methods", "--out_dir"]),
        ("rl", ["--env", "--num_envs", "--M", "--total_frames", "--r2ac.lr", "--out_dir"]),
        ("stream", ["--env", "--method", "--cell", "--total_frames", "--stream.lr", "--out_dir"]),
    ],
)
def test_each_subcommands_help_prints_its_options_and_starts_nothing(command, options, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: onlinerec {command} [--config CONFIG]")
    for option in options:
        assert re.search(rf"^  {re.escape(option)} ", out, re.M), option
    assert not any(tmp_path.iterdir())  # no run folder, no log


def test_cli_usage_names_demo_and_lightning_subcommands(tmp_path):
    proc = run([*onlinerec_command(), "--help"], tmp_path)
    assert "demo" in proc.stdout and "fit" in proc.stdout


def test_naming_the_strategy_by_alias_keeps_the_configs_M(tmp_path):
    """`--trainer.strategy tbptt` on a config with RTRLStrategy(M=1) used to reset M to 50 without a word."""
    from onlinerec.cli import strategy_by_class_path

    args = ["--config", "x.yaml", "--trainer.strategy", "tbptt", "--trainer.strategy=SnAP", "--trainer.strategy", "ddp"]
    assert strategy_by_class_path(args) == [
        "--config",
        "x.yaml",
        "--trainer.strategy.class_path",
        "onlinerec.TBPTTStrategy",
        "--trainer.strategy.class_path",
        "onlinerec.SnAPStrategy",
        "--trainer.strategy",
        "ddp",
    ]
    proc = run(
        [
            *onlinerec_command(),
            "fit",
            "--config",
            str(ROOT / "examples" / "copy_task.yaml"),
            "--trainer.strategy",
            "tbptt",
            "--print_config",
        ],
        tmp_path,
    )
    assert re.search(r"class_path: onlinerec.TBPTTStrategy\s+init_args:\s+M: 1\b", proc.stdout), proc.stdout
