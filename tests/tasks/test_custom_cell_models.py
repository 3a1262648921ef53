"""A user's own cell in the built-in models, on the command line and through checkpoints.

A cell is given as an instance (``SequenceClassifier(9, 4, hidden_size=32, cell=MinGRUCell(9, 32))``), a registered
name or a class path, and checkpoints store a name, a class path or a :func:`~onlinerec.cells.cell_spec` (class path
and constructor arguments), never the module itself, which a weights-only checkpoint cannot rebuild; no process has to
write into ``CELLS`` before ``load_from_checkpoint``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

from onlinerec import RTRLStrategy
from onlinerec.cells import CELLS, LRUCell, MinGRUCell, Stack, cell_reference, cell_spec, make_cell
from onlinerec.data import CopyTaskDataModule
from onlinerec.tasks import CopyTaskModule, SequenceClassifier
from tests.helpers import tiny_copy_task_fit

ROOT = Path(__file__).resolve().parents[2]

USER_MODULE = """
import torch
from torch import nn

from onlinerec.cells import ElementwiseCell


class LeakyCell(ElementwiseCell):
    num_gates = 2

    def __init__(self, input_size, hidden_size, leak=0.5, *, gain=1.0):
        super().__init__(input_size, hidden_size)
        self.leak, self.gain = leak, gain
        self.peephole = nn.Parameter(0.1 * torch.randn(hidden_size))

    def recurrence(self, gates, c_prev):
        u = torch.sigmoid(gates[..., 0, :] + self.peephole * c_prev)
        return self.leak * u * c_prev + (1 - u) * torch.tanh(self.gain * gates[..., 1, :])
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A cell class in a module file of its own (``user_cells_mod.LeakyCell``), importable here and in subprocesses
    that put ``tmp_path`` on their PYTHONPATH."""
    (tmp_path / "user_cells_mod.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("user_cells_mod", None)
    import user_cells_mod

    yield user_cells_mod
    sys.modules.pop("user_cells_mod", None)


def _no_modules(value) -> bool:
    if isinstance(value, nn.Module):
        return False
    if isinstance(value, dict):
        return all(_no_modules(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_no_modules(v) for v in value)
    return True


def test_a_cell_instance_is_taken_and_stored_as_its_spec():
    model = SequenceClassifier(9, 4, hidden_size=32, cell=MinGRUCell(9, 32, update_bias=-3.0))
    assert isinstance(model.cell, MinGRUCell)
    assert model.hparams["cell"] == {
        "class_path": "mingru",
        "init_args": {"input_size": 9, "hidden_size": 32, "update_bias": -3.0},
    }
    assert _no_modules(dict(model.hparams))
    rebuilt = SequenceClassifier(**model.hparams)  # what load_from_checkpoint does with them
    assert isinstance(rebuilt.cell, MinGRUCell) and rebuilt.hparams == model.hparams
    assert rebuilt.cell.input_proj.bias[:32].max() < -2  # built with update_bias=-3 again


def test_names_and_class_paths_are_stored_so_that_any_process_can_rebuild_them(user_module):
    by_path = SequenceClassifier(9, 4, hidden_size=8, cell="user_cells_mod.LeakyCell", cell_kwargs={"leak": 0.2})
    assert by_path.hparams["cell"] == "user_cells_mod.LeakyCell" and by_path.cell.leak == 0.2
    assert SequenceClassifier(9, 4, hidden_size=8, cell="lru").hparams["cell"] == "lru"
    by_class = SequenceClassifier(9, 4, hidden_size=8, cell=user_module.LeakyCell)
    assert by_class.hparams["cell"] == "user_cells_mod.LeakyCell"
    CELLS.register("leaky_for_this_test", user_module.LeakyCell)
    try:  # a name registered only in this process is stored as the class path (no registration needed elsewhere)
        assert cell_reference("leaky_for_this_test") == "user_cells_mod.LeakyCell"
    finally:
        CELLS._entries.pop("leaky_for_this_test")


def test_cell_spec_records_constructor_arguments_and_nests_stacks(user_module):
    leaky = user_module.LeakyCell(4, 6, 0.3, gain=2.0)
    spec = cell_spec(leaky)
    assert spec == {
        "class_path": "user_cells_mod.LeakyCell",
        "init_args": {"input_size": 4, "hidden_size": 6, "leak": 0.3, "gain": 2.0},
    }
    rebuilt = make_cell(spec, 4, 6)
    assert type(rebuilt) is user_module.LeakyCell and (rebuilt.leak, rebuilt.gain) == (0.3, 2.0)
    stack = Stack([LRUCell(4, 6, r_min=0.5), user_module.LeakyCell(4, 6)], residual=True, norm="rms")
    spec = cell_spec(stack)
    assert spec["class_path"] == "onlinerec.cells.stack.Stack"
    assert spec["init_args"]["cells"][0] == {
        "class_path": "lru",
        "init_args": {"input_size": 4, "hidden_size": 6, "r_min": 0.5},
    }
    assert json.loads(json.dumps(spec)) == spec  # plain data: YAML, JSON and weights-only checkpoints keep it
    again = make_cell(spec, 4, 6)
    assert isinstance(again, Stack) and [type(c) for c in again.layers] == [LRUCell, user_module.LeakyCell]
    assert again.residual and again.norm == "rms"


def test_cell_spec_names_what_it_cannot_record():
    class Local(MinGRUCell):
        pass

    with pytest.raises(ValueError, match=r"Local is defined inside a function.*define Local at the top level"):
        cell_spec(Local(2, 3))
    with pytest.raises(ValueError, match=r"MinGRUCell argument 'update_bias' is a Tensor: a checkpoint can keep only"):
        cell_spec(MinGRUCell(2, 3, update_bias=torch.tensor(1.0)))
    with pytest.raises(ValueError, match=r"a cell given as a mapping must be a cell_spec"):
        make_cell({"cell": "lru"}, 2, 3)


def test_copy_task_module_stores_a_spec_for_an_instance(user_module):
    model = CopyTaskModule(hidden_size=8, cell=user_module.LeakyCell(3, 8, 0.7))
    assert model.hparams["cell"]["class_path"] == "user_cells_mod.LeakyCell" and _no_modules(dict(model.hparams))
    rebuilt = CopyTaskModule(**model.hparams)
    assert type(rebuilt.cell) is user_module.LeakyCell and rebuilt.cell.leak == 0.7


RELOAD = """
import json, sys, torch
from onlinerec.tasks import SequenceClassifier

model = SequenceClassifier.load_from_checkpoint(sys.argv[1])
cell = model.cell
print(json.dumps({
    "cell": type(cell).__module__ + "." + type(cell).__qualname__,
    "layers": [type(c).__module__ + "." + type(c).__qualname__ for c in getattr(cell, "layers", [])],
    "leak": getattr(cell.layers[1], "leak", None) if hasattr(cell, "layers") else getattr(cell, "leak", None),
    "state": {k: v.double().sum().item() for k, v in model.state_dict().items()},
}))
"""


@pytest.mark.parametrize("stacked", [False, True])
def test_a_checkpoint_of_a_user_cell_reloads_in_a_fresh_process_without_registering(user_module, tmp_path, stacked):
    L.seed_everything(0, verbose=False)
    if stacked:
        cell = Stack([user_module.LeakyCell(3, 8, 0.25), user_module.LeakyCell(8, 8, 0.75)], residual=True)
    else:
        cell = user_module.LeakyCell(3, 8, 0.25, gain=1.5)
    model = SequenceClassifier(3, 3, hidden_size=8, cell=cell, lr=1e-2)
    trainer = L.Trainer(
        strategy=RTRLStrategy(M=2),
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, CopyTaskDataModule(level=2, train_size=6, val_size=2, test_size=2, num_streams=2))
    path = tmp_path / "user.ckpt"
    trainer.save_checkpoint(path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RELOAD), str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    if stacked:
        assert loaded["cell"] == "onlinerec.cells.stack.Stack"
        assert loaded["layers"] == ["user_cells_mod.LeakyCell"] * 2 and loaded["leak"] == 0.75
    else:
        assert loaded["cell"] == "user_cells_mod.LeakyCell" and loaded["leak"] == 0.25
    expected = {k: v.double().sum().item() for k, v in model.state_dict().items()}
    assert loaded["state"] == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_the_command_line_takes_a_class_path(user_module, tmp_path):
    from onlinerec.cli import lightning_cli

    args = tiny_copy_task_fit(tmp_path, steps=1, level=2, train_size=4, val_size=2)
    cli = lightning_cli([*args, "--model.cell", "user_cells_mod.LeakyCell", "--model.cell_kwargs", "{leak: 0.3}"])
    assert type(cli.model.cell) is user_module.LeakyCell and cli.model.cell.leak == 0.3
    assert cli.model.hparams["cell"] == "user_cells_mod.LeakyCell" and cli.trainer.global_step == 1
