"""Every built-in cell name, and stacks of them, work wherever a cell is named: the demo (its config,
its command line and its module API) and the copy task's LightningCLI config. The RL runner's are in
tests/rl/test_runner_cells.py."""

from __future__ import annotations

import json
import re

import pytest
import torch
from rich.console import Console

from onlinerec.cells import CELLS, FullyRecurrentCell, LRUCell, Stack
from onlinerec.config import parse_config
from onlinerec.tasks.classifier import SequenceClassifier
from onlinerec.tasks.demo import QUICK, DemoConfig, run_demo, train_one
from tests.helpers import tiny_copy_task_fit

TINY = dict(
    delay=2, steps=2, seeds=1, hidden_size=4, num_streams=2, eval_size=4, curve_points=2, M=4
)  # a query per segment


def methods_for(name: str) -> list[str]:
    """RTRL and TBPTT for element-wise cells; SnAP-1 and TBPTT for fully recurrent ones (RTRL refuses them)."""
    return ["snap", "tbptt"] if issubclass(CELLS[name], FullyRecurrentCell) else ["rtrl", "tbptt"]


@pytest.mark.parametrize("name", sorted(CELLS))
def test_every_built_in_cell_trains_through_the_demo(name, tmp_path):
    torch.set_num_threads(1)
    cfg = DemoConfig(cell=name, methods=methods_for(name), out_dir=str(tmp_path), **TINY)
    model = SequenceClassifier(vocab_size=9, num_classes=4, hidden_size=4, **cfg.model_kwargs())
    assert isinstance(model.cell, CELLS[name])
    for method in cfg.methods:
        result = train_one(method, 0, cfg)
        assert result.method == method and 0.0 <= result.final_accuracy <= 1.0
        assert result.curve_steps and result.curve_steps[-1] == cfg.steps  # it made its updates


def test_a_stack_trains_through_the_demo_and_its_line_names_the_methods(tmp_path):
    torch.set_num_threads(1)
    cfg = DemoConfig(
        cell="lru",
        layers=2,
        cell_kwargs={"residual": True, "norm": "rms", "r_min": 0.9},
        embedding_dim=4,
        methods=["rtrl", "tbptt", "snap"],
        out_dir=str(tmp_path),
        **TINY,
    )
    model = SequenceClassifier(vocab_size=9, num_classes=4, hidden_size=4, embedding_dim=4, **cfg.model_kwargs())
    assert isinstance(model.cell, Stack) and model.cell.num_layers == 2
    assert all(isinstance(layer, LRUCell) for layer in model.cell.layers)
    summary = run_demo(cfg, Console(file=open("/dev/null", "w")))  # noqa: SIM115
    assert re.fullmatch(r"demo: rtrl=\d\.\d{3} tbptt=\d\.\d{3} snap=\d\.\d{3} M=4 delay=2 seeds=1", summary["line"])
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["config"]["layers"] == 2 and {r["method"] for r in record["runs"]} == {"rtrl", "tbptt", "snap"}
    assert "2 x LRU N=4" in cfg.describe_cell()


def test_the_demo_defaults_are_unchanged():
    cfg = DemoConfig()
    assert (cfg.cell, cfg.layers, cfg.methods, cfg.cell_kwargs, cfg.embedding_dim) == (
        "elstm",
        1,
        ["rtrl", "tbptt"],
        {},
        None,
    )
    assert cfg.model_kwargs() == {"cell": "elstm", "cell_kwargs": {"forget_bias": 3.0}}
    assert cfg.describe_cell() == "eLSTM N=32 (forget bias 3.0)"


def test_forget_bias_goes_only_to_cells_that_take_it_and_cell_kwargs_win():
    assert DemoConfig(cell="lstm", methods=["snap"]).model_kwargs()["cell_kwargs"] == {"forget_bias": 3.0}
    assert DemoConfig(cell="minlstm").model_kwargs()["cell_kwargs"] == {"forget_bias": 3.0}
    assert DemoConfig(cell="mingru", cell_kwargs={"update_bias": -3}).model_kwargs()["cell_kwargs"] == {
        "update_bias": -3
    }
    assert DemoConfig(cell="elstm", cell_kwargs={"forget_bias": 1}).model_kwargs()["cell_kwargs"] == {"forget_bias": 1}
    assert DemoConfig(cell="lru", layers=3).model_kwargs()["cell_kwargs"] == {"layers": 3}


def test_the_command_line_names_cells_layers_and_methods():
    cfg = parse_config(
        DemoConfig,
        [
            "--cell",
            "lru",
            "--layers",
            "2",
            "--cell_kwargs",
            "{residual: true, norm: rms}",
            "--methods",
            "[rtrl, snap]",
            "--embedding-dim",
            "8",
            "--quick",
        ],
        presets={"quick": QUICK},
    )
    assert (cfg.cell, cfg.layers, cfg.methods, cfg.embedding_dim) == ("lru", 2, ["rtrl", "snap"], 8)
    assert cfg.cell_kwargs == {"residual": True, "norm": "rms"} and cfg.M == QUICK["M"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cell": "lstm"}, r"fully recurrent.*--methods '\[snap, tbptt\]'"),
        ({"cell": "gru", "methods": ["tbptt", "rtrl"]}, r"GRUCell.*RTRL refuses"),
        ({"cell": "nope"}, r"nope"),
        ({"methods": ["rtrl", "nope"]}, r"nope"),
        ({"methods": []}, r"at least one"),
        ({"methods": ["rtrl", "rtrl"]}, r"twice"),
        ({"layers": 0}, r"--layers"),
        ({"layers": 2, "cell_kwargs": {"layers": 2}}, r"once"),
        ({"embedding_dim": 0}, r"--embedding_dim"),
    ],
)
def test_config_mistakes_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DemoConfig(**kwargs)


def test_the_copy_task_config_takes_a_cell_name_and_a_stack(tmp_path):
    """``--model.init_args.cell lru`` (a stack of two, through cell_kwargs) in the copy task's YAML, in-process."""
    from onlinerec.cli import lightning_cli

    common = tiny_copy_task_fit(tmp_path, steps=2, level=3, train_size=8, val_size=4)
    cli = lightning_cli(
        [*common, "--model.init_args.cell", "lru", "--model.init_args.cell_kwargs", "{layers: 2, residual: true}"]
    )
    assert isinstance(cli.model.cell, Stack) and cli.model.cell.num_layers == 2 and cli.trainer.global_step == 2
    assert all(isinstance(layer, LRUCell) for layer in cli.model.cell.layers)
