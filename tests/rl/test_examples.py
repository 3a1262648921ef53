"""Every RL example runs from the shell with a tiny budget (subprocess), and DMLab fails with a clear message."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import TINY_RL

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
STREAM_CONFIGS = sorted((EXAMPLES / "configs").glob("stream_*.yaml"))
"""The streaming agent's configs (``onlinerec stream``)."""
R2AC_CONFIGS = sorted(p for p in (EXAMPLES / "configs").glob("*.yaml") if p not in STREAM_CONFIGS)
"""R2AC's configs (``onlinerec rl``)."""
TINY = [*TINY_RL, "--checkpoint_every", "2", "--eval_envs", "1", "--log_every", "1"]


def run(script: str, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # also without pip install
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def check_outputs(out: Path, frames: int) -> dict:
    assert (out / "checkpoints" / "last.ckpt").exists()
    assert list(out.rglob("metrics.csv"))
    result = json.loads((out / "eval.json").read_text())
    assert result["frames"] == frames
    return result


def test_memory_example(tmp_path):
    out = tmp_path / "memory"
    proc = run(
        "memory.py",
        *TINY,
        "--out_dir",
        str(out),
        "--env_kwargs",
        '{"length": 3}',
        "--eval_episodes",
        "3",
        "--total_frames",
        "48",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = check_outputs(out, 48)  # 48 frames = 6 updates of M * B = 8 steps
    assert result["updates"] == 6 and len(result["eval"]["returns"]) == 3
    assert (out / "learning_curve.png").exists()


def test_example_plumbing_resumes_from_last_checkpoint(tmp_path):
    """The same command run again with a larger budget continues from last.ckpt (in-process, to stay fast)."""
    from onlinerec.rl.experiment import parse_experiment
    from onlinerec.rl.runner import run_experiment

    args = [
        *TINY,
        "--out_dir",
        str(tmp_path),
        "--env_kwargs",
        '{"length": 3}',
        "--eval_episodes",
        "0",
        "--env",
        "memory:tmaze",
        "--stem",
        "mlp",
    ]
    first = run_experiment(parse_experiment([*args, "--total_frames", "48"]))
    second = run_experiment(parse_experiment([*args, "--total_frames", "80"]))
    assert (first["updates"], first["frames"]) == (6, 48)
    assert (second["updates"], second["frames"]) == (10, 80)
    assert len(list(tmp_path.rglob("metrics.csv"))) == 2  # one CSV version per (resumed) run; curves join them


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="ale-py is not installed")
def test_atari_example(tmp_path):
    out = tmp_path / "atari"
    proc = run(
        "atari.py",
        "--game",
        "breakout",
        *TINY,
        "--stem",
        "nature",
        "--total_frames",
        "128",
        "--eval_episodes",
        "1",
        "--eval_max_steps",
        "10",
        "--out_dir",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_outputs(out, 128)  # 128 frames = 4 updates of M * B * 4 frames


@pytest.mark.skipif(importlib.util.find_spec("procgen") is None, reason="procgen (procgen-mirror) is not installed")
def test_procgen_example(tmp_path):
    out = tmp_path / "procgen"
    proc = run(
        "train_procgen.py",
        *TINY,
        "--stem",
        "nature",
        "--total_frames",
        "32",
        "--eval_episodes",
        "1",
        "--eval_max_steps",
        "10",
        "--out_dir",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_outputs(out, 32)


@pytest.mark.skipif(importlib.util.find_spec("deepmind_lab") is not None, reason="deepmind_lab is installed")
def test_dmlab_example_says_how_to_install(tmp_path):
    proc = run("dmlab.py", "--level", "rooms_watermaze", "--out_dir", str(tmp_path / "dmlab"), timeout=60)
    assert proc.returncode == 2
    assert "deepmind_lab" in proc.stderr and "Bazel" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_config_yaml_and_overrides(tmp_path):
    from onlinerec.rl.experiment import ExperimentConfig, parse_experiment
    from onlinerec.rl.r2ac_config import R2ACConfig

    cfg = parse_experiment(
        ["--M", "7", "--r2ac.lr", "0.01", "--env_kwargs", '{"length": 9}'], EXAMPLES / "configs" / "atari_breakout.yaml"
    )
    assert isinstance(cfg, ExperimentConfig) and isinstance(cfg.r2ac, R2ACConfig)
    assert cfg.env == "ALE/Breakout-v5" and cfg.M == 7 and cfg.num_envs == 32 and cfg.total_frames == 8e8
    assert cfg.r2ac.lr == 0.01 and cfg.r2ac.grad_clip == 40.0 and cfg.env_kwargs == {"length": 9}
    for path in R2AC_CONFIGS:  # every shipped config of onlinerec rl parses
        assert parse_experiment(["--config", str(path)]).total_frames > 0


def test_every_streaming_config_parses():
    from onlinerec.rl.streaming.experiment import parse_stream_experiment

    assert STREAM_CONFIGS
    for path in STREAM_CONFIGS:
        assert parse_stream_experiment(["--config", str(path)]).total_frames > 0


def test_the_cartpole_config_trains_its_stack_with_truncations_bootstrapped(tmp_path):
    """cartpole_novel.yaml as shipped, tiny: its two-layer core and its time-limit bootstrapping (a TimeLimit of 8
    steps, so that cuts happen within the budget) run end to end."""
    from onlinerec.rl.experiment import parse_experiment
    from onlinerec.rl.runner import run_experiment

    limit = "{wrappers: [{class_path: gymnasium.wrappers.TimeLimit, init_args: {max_episode_steps: 8}}]}"
    out = tmp_path / "cartpole"
    cfg = parse_experiment(
        ["--config", str(EXAMPLES / "configs" / "cartpole_novel.yaml"), "--num_envs", "2", "--total_frames", "64",
         "--eval_episodes", "2", "--eval_envs", "2", "--env_kwargs", limit, "--out_dir", str(out), "--progress", "false",
         "--log_every", "1"]
    )  # fmt: skip
    assert cfg.r2ac.bootstrap_truncation and cfg.cell == ["lru", "mingru"]
    run_experiment(cfg)
    result = check_outputs(out, 64)
    assert result["eval"]["lengths"] == [8, 8] and result["train_return"] <= 8  # every episode cut at 8 steps


def test_the_long_segments_config_trains_its_minibatched_passes_on_the_pendulum(tmp_path):
    """long_segments.yaml as shipped, tiny (4 streams, so each of its 4 minibatches holds one): continuous actions,
    10 passes over each segment in 4 minibatches, time-limit bootstrapping, a critic of its own and normalised
    observations, end to end."""
    pytest.importorskip("popgym")
    from onlinerec.rl.experiment import parse_experiment
    from onlinerec.rl.runner import run_experiment

    out = tmp_path / "long"
    cfg = parse_experiment(
        ["--config", str(EXAMPLES / "configs" / "long_segments.yaml"), "--num_envs", "4", "--M", "8",
         "--total_frames", "64", "--eval_episodes", "1", "--eval_envs", "1", "--out_dir", str(out), "--progress",
         "false", "--log_every", "1"]
    )  # fmt: skip
    assert cfg.r2ac.passes == 40 and cfg.r2ac.bootstrap_truncation and cfg.env == "popgym:PositionOnlyPendulumEasy"
    assert cfg.separate_critic and cfg.r2ac.obs_norm
    run_experiment(cfg)
    check_outputs(out, 64)


def test_learning_curve_plot(tmp_path):
    from onlinerec.rl.curves import load_curve, plot_learning_curves

    for k, run in enumerate(["a", "b"]):
        (tmp_path / run / "csv" / "version_0").mkdir(parents=True)
        rows = "".join(f"{f},{f / 100 + k},{i}\n" for i, f in enumerate([10.0, 20.0, 30.0]))
        (tmp_path / run / "csv" / "version_0" / "metrics.csv").write_text("frames,return,step\n" + rows + ",,4\n")
    assert load_curve(tmp_path / "a") == ([10.0, 20.0, 30.0], [0.1, 0.2, 0.3])
    png = plot_learning_curves({"x": [tmp_path / "a", tmp_path / "b"]}, tmp_path / "c.png", baseline=0.0)
    assert png.stat().st_size > 1000


def test_a_resume_continues_only_the_same_experiment(tmp_path, capsys):
    """Running the docstring's pair (rtrl, then tbptt) into one folder used to resume the RTRL run as "tbptt"."""
    from onlinerec.rl.experiment import parse_experiment
    from onlinerec.rl.runner import main, run_experiment
    from onlinerec.training.checkpoint import CorruptCheckpointError

    base = [*TINY, "--env_kwargs", '{"length": 3}', "--eval_episodes", "0", "--stem", "mlp", "--total_frames", "16"]
    shared = ["--out_dir", str(tmp_path / "one")]
    run_experiment(parse_experiment([*base, *shared, "--method", "rtrl"]))
    with pytest.raises(ValueError, match=r"holds a different experiment.*method: 'rtrl' -> 'tbptt'.*--out_dir"):
        run_experiment(parse_experiment([*base, *shared, "--method", "tbptt"]))
    assert json.loads((tmp_path / "one" / "config.json").read_text())["method"] == "rtrl"  # nothing was overwritten
    with pytest.raises(FileExistsError, match="would train from scratch and overwrite"):
        run_experiment(parse_experiment([*base, *shared, "--resume", "false"]))
    for mistake in (["--method", "tbptt"], ["--resume", "false"]):  # on the command line: a message, not a traceback
        assert main([*base, *shared, *mistake]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err and "--out_dir" in err

    trained_with = r"give back what it was trained with \(--core_norm false --hidden_size \d+\); .* own --out_dir"
    with pytest.raises(ValueError, match=r"network differs from this one \(core_norm, hidden_size\).*" + trained_with):
        run_experiment(
            parse_experiment(
                [*base, *shared, "--hidden_size", "5", "--core_norm", "true", "--allow_config_change", "true"]
            )
        )
    with pytest.raises(ValueError, match=r"network differs from this one \(r2ac.obs_norm, r2ac.reward_norm\)"):
        run_experiment(  # the normalisers' statistics are checkpointed buffers: they do not fit either
            parse_experiment(
                [
                    *base,
                    *shared,
                    "--r2ac.obs_norm",
                    "true",
                    "--r2ac.reward_norm",
                    "true",
                    "--allow_config_change",
                    "true",
                ]
            )
        )
    changed = run_experiment(parse_experiment([*base, *shared, "--M", "2", "--allow_config_change", "true"]))
    assert changed["updates"] > 0
    changes = json.loads((tmp_path / "one" / "config_changes.json").read_text())
    assert changes == [{"frames": int(base[-1]), "changes": {"M": {"was": 4, "now": 2}}}]  # the frames it resumed at

    (tmp_path / "one" / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 half a file")
    with pytest.raises(CorruptCheckpointError, match=r"last.ckpt is truncated.*move its folder aside.*new --out_dir"):
        run_experiment(parse_experiment([*base, *shared, "--M", "2"]))
    assert main([*base, *shared, "--M", "2"]) == 2 and "last.ckpt is truncated" in capsys.readouterr().err


def test_default_output_folders_differ_by_method_cell_M_and_seed():
    from onlinerec.rl.experiment import parse_experiment

    dirs = {
        parse_experiment(args).run_dir
        for args in (["--method", "rtrl"], ["--method", "tbptt"], ["--cell", "none"], ["--M", "7"], ["--seed", "1"])
    }
    assert len(dirs) == 5 and all(str(d).startswith("runs/memory_tmaze/") for d in dirs)
    assert parse_experiment(["--cell", "none"]).cell is None


def _commented(text: str, key: str) -> bool:
    """Whether the YAML line that sets ``key`` (at any indentation) carries a comment."""
    return any(re.match(rf"\s*{re.escape(key)}:.*#", line) for line in text.splitlines())


@pytest.mark.parametrize("path", [*R2AC_CONFIGS, *STREAM_CONFIGS], ids=lambda p: p.name)
def test_every_yaml_value_that_differs_from_the_default_says_why(path):
    import dataclasses

    import yaml

    if path in STREAM_CONFIGS:
        from onlinerec.rl.streaming.config import StreamACConfig as Nested
        from onlinerec.rl.streaming.experiment import StreamExperiment as Top

        nested_key = "stream"
    else:
        from onlinerec.rl.experiment import ExperimentConfig as Top
        from onlinerec.rl.r2ac_config import R2ACConfig as Nested

        nested_key = "r2ac"
    text = path.read_text()
    values = yaml.safe_load(text)
    defaults = {f.name: f.default for f in dataclasses.fields(Top)}
    nested_defaults = {f.name: f.default for f in dataclasses.fields(Nested)}
    unexplained = []
    for key, value in values.items():
        if key == "env":  # the point of the file, named in its header
            continue
        if key == nested_key:
            unexplained += [
                f"{nested_key}.{k}"
                for k, v in value.items()
                if v != nested_defaults[k]
                and not (_commented(text, nested_key) or _commented(text, k))  # flow or block
            ]
        elif value != defaults.get(key, dataclasses.MISSING) and not _commented(text, key):
            unexplained.append(key)
    assert not unexplained, f"{path.name} changes {unexplained} from the defaults without a comment saying why"


def test_the_copy_task_yaml_explains_what_differs_from_the_classes():
    import inspect

    import yaml

    from onlinerec.data import CopyTaskDataModule
    from onlinerec.tasks import CopyTaskModule

    path = ROOT / "examples" / "copy_task.yaml"
    text, values = path.read_text(), yaml.safe_load(path.read_text())
    for section, cls in (("model", CopyTaskModule), ("data", CopyTaskDataModule)):
        params = inspect.signature(cls).parameters
        for key, value in values[section]["init_args"].items():
            assert value == params[key].default or _commented(text, key), f"copy_task.yaml {section}.{key} has no why"


def test_settings_that_build_no_agent_are_a_one_line_error_and_write_nothing(tmp_path, capsys):
    pytest.importorskip("ale_py", reason="needs the atari extra")
    from onlinerec.rl.runner import main

    out = tmp_path / "pong"
    argv = ["--env", "ALE/Pong-v5", "--r2ac.obs_norm", "true", "--total_frames", "100", "--out_dir", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: R2ACConfig.obs_norm normalises flat vector observations") and "Traceback" not in err
    assert not out.exists()  # no config.json for a run that never started
