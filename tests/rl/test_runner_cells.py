"""The RL runner takes every cell and stacks: ``onlinerec rl --cell lru --layers 2`` (or
``--cell_kwargs '{layers: 2}'``) trains, checkpoints every layer's carry and resumes."""

from __future__ import annotations

import pytest
import torch

from onlinerec.cells import LRUCell, MinGRUCell, Stack, cell_spec
from onlinerec.rl.experiment import parse_experiment
from onlinerec.rl.resume import RunFolderError
from onlinerec.rl.runner import build, run_experiment
from tests.helpers import TINY_RL

TINY = [*TINY_RL, "--env", "memory:tmaze", "--env_kwargs", '{"length": 3}', "--stem", "mlp", "--eval_episodes", "0"]


def test_a_stack_of_lru_layers_trains_checkpoints_and_resumes(tmp_path):
    args = [*TINY, "--cell", "lru", "--layers", "2", "--cell_kwargs", "{residual: true, norm: rms}"]
    args += ["--out_dir", str(tmp_path)]
    cfg = parse_experiment([*args, "--total_frames", "16"])
    model, *_ = build(cfg)
    assert isinstance(model.cell, Stack) and model.cell.num_layers == 2
    assert all(isinstance(layer, LRUCell) for layer in model.cell.layers) and model.cell.residual
    first = run_experiment(cfg)
    assert first["updates"] == 2
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert any(".layers.1." in key for key in ckpt["state_dict"])  # every layer's weights
    second = run_experiment(parse_experiment([*args, "--total_frames", "32"]))  # the same experiment, resumed
    assert second["updates"] == 4


@pytest.mark.parametrize("method", ["rtrl", "tbptt", "snap"])
def test_layers_in_cell_kwargs_work_too(method, tmp_path):
    cfg = parse_experiment(
        [*TINY, "--cell", "mingru", "--cell_kwargs", "{layers: 2}", "--method", method, "--total_frames", "8"]
        + ["--out_dir", str(tmp_path)]
    )
    model, *_ = build(cfg)
    assert isinstance(model.cell, Stack) and all(isinstance(layer, MinGRUCell) for layer in model.cell.layers)
    assert run_experiment(cfg)["updates"] == 1


def test_layers_mistakes_are_named():
    with pytest.raises(SystemExit):  # parse_config turns the ValueError into usage + exit 2
        parse_experiment([*TINY, "--cell", "lru", "--layers", "2", "--cell_kwargs", "{layers: 2}"])
    with pytest.raises(SystemExit):
        parse_experiment([*TINY, "--cell", "none", "--layers", "2"])
    with pytest.raises(SystemExit):
        parse_experiment([*TINY, "--layers", "0"])
    assert parse_experiment(TINY).layers is None  # a run's stored config from before the option still resumes


def test_the_runner_trains_in_bf16_mixed_precision(tmp_path):
    """``onlinerec rl --precision bf16-mixed`` reaches the Trainer; the carried sensitivities stay float32."""
    cfg = parse_experiment([*TINY, "--precision", "bf16-mixed", "--total_frames", "16", "--out_dir", str(tmp_path)])
    assert run_experiment(cfg)["updates"] == 2
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    sens = ckpt["onlinerec"]["carries"]["train"]["sensitivities"]
    assert sens and all(v.dtype == torch.float32 for v in sens.values())


def test_head_sizes_reach_the_agent_and_mistakes_are_named(tmp_path, capsys):
    cfg = parse_experiment([*TINY, "--head_sizes", "[6, 5]", "--out_dir", str(tmp_path)])
    model, *_ = build(cfg)
    assert [m.out_features for m in model.policy_mlp if hasattr(m, "out_features")] == [6, 5]
    assert parse_experiment(TINY).head_sizes == []  # the paper's linear heads by default
    with pytest.raises(SystemExit):
        parse_experiment([*TINY, "--head_sizes", "[64, 0]"])
    assert "head_sizes must be a list of positive layer widths" in capsys.readouterr().err


def test_minibatches_that_do_not_divide_the_streams_are_refused_before_any_run(tmp_path, capsys):
    """Before, the mistake surfaced as a traceback from the first update, after the run folder was written."""
    with pytest.raises(SystemExit):
        parse_experiment([*TINY, "--num_envs", "6", "--r2ac.minibatches", "4", "--out_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert "r2ac.minibatches = 4 does not divide num_envs = 6" in err and "among [1, 2, 3, 6]" in err
    assert not (tmp_path / "run").exists()
    assert parse_experiment([*TINY, "--num_envs", "6", "--r2ac.minibatches", "3"]).r2ac.minibatches == 3


def test_a_negative_seed_is_refused_before_any_run(tmp_path, capsys):
    """Before, it surfaced as Lightning's seed_everything traceback, after the run folder was written."""
    with pytest.raises(SystemExit):
        parse_experiment([*TINY, "--seed", "-1", "--out_dir", str(tmp_path / "run")])
    assert "seed must be an int from 0 to 2**32 - 1" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert parse_experiment([*TINY, "--seed", "11"]).seed == 11


def test_core_norm_reaches_the_agent(tmp_path):
    assert isinstance(build(parse_experiment(TINY))[0].core_norm, torch.nn.Identity)  # the paper's heads by default
    model, *_ = build(parse_experiment([*TINY, "--core_norm", "true", "--out_dir", str(tmp_path)]))
    assert isinstance(model.core_norm, torch.nn.LayerNorm)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [("{slow_fraction: 2}", "0 <= slow_fraction <= 1"), ("{bogus: 1}", "unexpected keyword argument 'bogus'")],
)
def test_a_wrong_cell_argument_is_a_usage_error_that_names_it(kwargs, says, capsys):
    with pytest.raises(SystemExit) as info:
        parse_experiment([*TINY, "--cell", "lru", "--cell_kwargs", kwargs])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--cell lru --cell_kwargs" in err and says in err and "Traceback" not in err


def test_a_stack_of_different_cells_trains_resumes_and_names_its_run_dir(tmp_path):
    """``--cell '[lru, mingru]'``: one layer per name, each with its own ``layer_kwargs``; checkpoint and resume."""
    kwargs = "{residual: true, norm: layer, layer_kwargs: [{slow_fraction: 0.5}, {}]}"
    args = [*TINY, "--cell", "[lru, mingru]", "--cell_kwargs", kwargs, "--out_dir", str(tmp_path / "{cell}")]
    args += ["--hidden_size", "8", "--fc_size", "7"]  # 7 + the reward: both layers 8 wide, both residuals apply
    cfg = parse_experiment([*args, "--total_frames", "16"])
    assert cfg.run_dir == tmp_path / "lru+mingru"
    model, *_ = build(cfg)
    lru, mingru = model.cell.layers
    assert isinstance(lru, LRUCell) and isinstance(mingru, MinGRUCell)
    assert cell_spec(lru)["init_args"]["slow_fraction"] == 0.5
    assert run_experiment(cfg)["updates"] == 2
    assert run_experiment(parse_experiment([*args, "--total_frames", "32"]))["updates"] == 4  # resumed


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cell_kwargs", "{slow_fraction: 0.5}"], "give each its own in layer_kwargs"),
        (["--cell_kwargs", "{layer_kwargs: [{}]}"], "layer_kwargs must be a list of 2 mappings"),
        (["--layers", "2"], "already names the layers"),
        (["--cell_kwargs", "{layer_kwargs: [{slow_fraction: 2}, {}]}"], "layer 0 ('lru')"),
    ],
)
def test_mistakes_with_a_list_of_cells_are_usage_errors_that_name_them(args, says, capsys):
    with pytest.raises(SystemExit) as info:
        parse_experiment([*TINY, "--cell", "[lru, mingru]", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_a_residual_that_the_widths_drop_is_a_warning_that_names_the_fix():
    base = [*TINY, "--cell", "[lru, mingru]", "--hidden_size", "8"]
    base += ["--cell_kwargs", "{residual: true, layer_kwargs: [{}, {}]}"]
    with pytest.warns(UserWarning, match=r"layers \[1\] get no residual.*--fc_size 7"):
        parse_experiment([*base, "--fc_size", "8"])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parse_experiment([*base, "--fc_size", "7"])  # 7 + the reward = 8: every layer keeps the width


def test_separate_critic_trains_checkpoints_both_cores_and_resumes(tmp_path):
    """``--separate_critic true``: a Parallel core (the actor's stack and the critic's), both carries in the checkpoint,
    and the run resumes (exactly: tests/rl/test_r2ac_passes.py); turning the option off on resume is refused (the
    weights would not fit)."""
    kwargs = "{residual: true, norm: layer, layer_kwargs: [{slow_fraction: 0.5}, {}]}"
    args = [*TINY, "--cell", "[lru, mingru]", "--cell_kwargs", kwargs, "--hidden_size", "8", "--fc_size", "7"]
    args += ["--separate_critic", "true", "--core_norm", "true", "--out_dir", str(tmp_path)]
    model, *_ = build(parse_experiment(args))
    assert type(model.cell).__name__ == "Parallel" and [type(b).__name__ for b in model.cell.layers] == ["Stack"] * 2
    assert model.hparams["hidden_size"] == 8 and model.cell.output_size == 16
    assert not build(parse_experiment(TINY))[0].hparams["separate_critic"]  # the paper's shared core by default
    assert run_experiment(parse_experiment([*args, "--total_frames", "16"]))["updates"] == 2
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    branches = ckpt["onlinerec"]["carries"]["train"]["layers"]
    assert len(branches) == 2 and all(len(b["layers"]) == 2 for b in branches)  # two cores of two layers each
    assert run_experiment(parse_experiment([*args, "--total_frames", "32"]))["updates"] == 4
    off = [a for a in args if a not in ("--separate_critic", "true")]
    with pytest.raises(RunFolderError, match=r"network differs from this one \(separate_critic\)"):
        run_experiment(parse_experiment([*off, "--total_frames", "48"]))


def test_the_closing_line_names_only_what_was_written(tmp_path, capsys):
    """A run shorter than ``log_every`` segments logs no return, so it has no learning curve: the runner says so and
    how to get one, instead of pointing at a file that is not there."""
    short = parse_experiment([*TINY, "--total_frames", "16", "--log_every", "10", "--out_dir", str(tmp_path / "short")])
    run_experiment(short)
    said = capsys.readouterr().out
    assert not (tmp_path / "short" / "learning_curve.png").exists()
    assert "no learning_curve.png" in said and "--log_every" in said
    long = parse_experiment([*TINY, "--total_frames", "256", "--log_every", "1", "--out_dir", str(tmp_path / "long")])
    run_experiment(long)
    said = capsys.readouterr().out
    assert (tmp_path / "long" / "learning_curve.png").exists()
    assert "logs, checkpoints and learning_curve.png in" in said
