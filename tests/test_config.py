"""``onlinerec.config.parse_config``: a dataclass filled from a default YAML, ``--config`` files and options, in that
order; ``--some-name`` and bare bool flags; presets; a field's own check as a usage error; ``--help`` with every
field's docstring; and an option that a later config file overrides is named, not silently dropped."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from onlinerec.config import config_to_dict, parse_config
from onlinerec.rl.experiment import parse_experiment


@dataclass
class Inner:
    lr: float = 0.1
    """The inner learning rate."""
    steps: int = 3
    """Steps per update."""


@dataclass
class Run:
    name: str = "base"
    """What the run is called."""
    out_dir: str = "runs"
    """Where the run writes."""
    quick: bool = False
    """A short run."""
    size: int = 4
    """How many streams."""
    inner: Inner = field(default_factory=Inner)
    """The inner settings."""

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"--size must be an int >= 1, got {self.size!r}")


def test_the_default_yaml_then_config_files_then_options_in_the_order_given(tmp_path):
    default = tmp_path / "default.yaml"
    default.write_text("name: from-default\nsize: 5\n")
    config = tmp_path / "run.yaml"
    config.write_text("size: 7\ninner:\n  lr: 0.5\n")
    assert parse_config(Run, [], default_config=default) == Run(name="from-default", size=5)
    cfg = parse_config(Run, ["--config", str(config), "--inner.steps", "5", "--name", "cli"], default_config=default)
    assert cfg == Run(name="cli", size=7, inner=Inner(lr=0.5, steps=5))  # the file over the default, options over both
    assert parse_config(Run, ["--size", "2", "--config", str(config)]).size == 7  # a later file wins over an option


def test_dashes_in_option_names_and_a_bare_bool_flag():
    assert parse_config(Run, ["--out-dir", "elsewhere", "--quick"]) == Run(out_dir="elsewhere", quick=True)
    assert parse_config(Run, ["--quick", "--size", "2"]) == Run(quick=True, size=2)
    assert parse_config(Run, ["--quick", "false"]).quick is False


def test_a_preset_sets_defaults_that_options_still_override():
    presets = {"quick": {"size": 1, "name": "smoke"}}
    assert parse_config(Run, ["--quick"], presets=presets) == Run(quick=True, size=1, name="smoke")
    assert parse_config(Run, ["--quick", "--size", "2"], presets=presets) == Run(quick=True, size=2, name="smoke")
    assert parse_config(Run, ["--size", "2"], presets=presets) == Run(size=2)  # the flag off: no preset


def test_a_fields_own_check_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        parse_config(Run, ["--size", "0"], prog="run")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: run") and "error: --size must be an int >= 1, got 0" in err
    assert "Traceback" not in err


def test_help_lists_every_option_with_its_docstring_and_keeps_the_descriptions_lines(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as info:
        parse_config(Run, ["--help"], prog="run", description="Train a run.\n  run --quick   a short one")
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: run") and "Train a run.\n  run --quick   a short one\n" in out
    assert "A YAML file with any of the options below." in out
    for option, doc in [
        ("--name", "What the run is called."),
        ("--out_dir", "Where the run writes."),
        ("--quick", "A short run."),
        ("--size", "How many streams."),
        ("--inner.lr", "The inner learning rate."),
        ("--inner.steps", "Steps per update."),
    ]:
        line = next((line for line in out.splitlines() if line.lstrip().startswith(option + " ")), "")
        assert doc in line, (option, out)


def test_config_to_dict_gives_plain_nested_data():
    assert config_to_dict(Run(inner=Inner(lr=0.2))) == {
        "name": "base",
        "out_dir": "runs",
        "quick": False,
        "size": 4,
        "inner": {"lr": 0.2, "steps": 3},
    }


def test_an_option_before_a_config_file_that_sets_it_is_named_not_silently_dropped(tmp_path, capsys):
    """jsonargparse applies --config and options left to right, so a file after an option overrides it: the run keeps
    that order, and says which options the file overrode (nested keys too) and how to override the file."""
    config = tmp_path / "c.yaml"
    config.write_text("env: memory:tmaze\nseed: 4\nr2ac:\n  lr: 0.002\n")
    cfg = parse_experiment(["--env", "popgym:CountRecallEasy", "--r2ac.lr=0.01", "--M", "3", "--config", str(config)])
    assert (cfg.env, cfg.r2ac.lr, cfg.M, cfg.seed) == ("memory:tmaze", 0.002, 3, 4)  # M: the file does not set it
    err = capsys.readouterr().err
    assert f"--env popgym:CountRecallEasy is overridden by --config {config}" in err and "'memory:tmaze' is used" in err
    assert "--r2ac.lr 0.01 is overridden" in err and "0.002 is used" in err and "--M" not in err
    assert "Options override a config file only when they come after it" in err
    cfg = parse_experiment(["--config", str(config), "--env", "popgym:CountRecallEasy"])  # after it: the option wins
    assert cfg.env == "popgym:CountRecallEasy" and capsys.readouterr().err == ""


def test_a_mistyped_option_is_refused_with_the_name_it_most_likely_means(capsys):
    for typo, meant in [("--inner.stpes", "--inner.steps"), ("--out_dri=x", "--out_dir"), ("--sise", "--size")]:
        with pytest.raises(SystemExit) as info:
            parse_config(Run, [typo, "3"], prog="run")
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert f"error: unrecognized option {typo.split('=')[0]}: did you mean {meant}?" in err, err
    with pytest.raises(SystemExit):  # close to nothing: jsonargparse's own message
        parse_config(Run, ["--zzzzzz", "3"], prog="run")
    assert "did you mean" not in capsys.readouterr().err
    assert parse_config(Run, ["--inner.steps", "5", "--size=2"]) == Run(size=2, inner=Inner(steps=5))
