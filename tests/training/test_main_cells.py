"""A cell class defined in the training script (``__main__``): saving warns, and a checkpoint that names it loads in
another process with ``load_from_checkpoint(path, cell=...)``; without it, the error says so."""

from __future__ import annotations

import sys
import warnings

import lightning as L
import pytest
import torch

from onlinerec import ElementwiseCell, OnlineRecurrentModule, RTRLStrategy, Segment
from onlinerec.data.stream import SegmentStream
from onlinerec.training import module as module_mod

M = 2


class InMain(ElementwiseCell):
    num_gates = 1

    def __init__(self, input_size: int, hidden_size: int, leak: float = 0.5) -> None:
        super().__init__(input_size, hidden_size)
        self.leak = leak

    def recurrence(self, gates, c_prev):
        return self.leak * c_prev + torch.tanh(gates[..., 0, :])


InMain.__module__ = "__main__"  # as if defined in the script being run: no other process can import it


class Importable(InMain):
    """The same cell where the loading process can reach it."""


Importable.__module__ = __name__


class Saving(OnlineRecurrentModule):
    """A user's model that stores its arguments, the cell among them."""

    def __init__(self, cell: ElementwiseCell, lr: float = 1e-2) -> None:
        super().__init__(cell, lr=lr)
        self.save_hyperparameters()
        self.head = torch.nn.Linear(cell.output_size, 1)

    def segment_loss(self, outputs, segment):
        return torch.nn.functional.mse_loss(self.head(outputs), segment.targets)


class NotSaving(Saving):
    """A user's model that stores none of its arguments."""

    def __init__(self, cell: ElementwiseCell, lr: float = 1e-2) -> None:
        OnlineRecurrentModule.__init__(self, cell, lr=lr)
        self.head = torch.nn.Linear(cell.output_size, 1)


def segments(epoch: int):
    gen = torch.Generator().manual_seed(epoch)
    for i in range(2):
        x = torch.randn(M, 3, 2, generator=gen)
        reset = torch.zeros(M, 3, dtype=torch.bool)
        reset[0] |= i == 0
        yield Segment(x, reset, x.cumsum(0)[..., :1])


@pytest.fixture
def another_process(monkeypatch):
    """The saving process has InMain in its __main__ (so Lightning can keep it among the hyper-parameters); calling
    the fixture's value makes this one the loading process, whose __main__ has no InMain."""
    monkeypatch.setattr(sys.modules["__main__"], "InMain", InMain, raising=False)
    return lambda: monkeypatch.delattr(sys.modules["__main__"], "InMain")


def trained(model: L.LightningModule, path) -> L.LightningModule:
    trainer = L.Trainer(
        strategy=RTRLStrategy(M=M),
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, SegmentStream(segments))
    trainer.save_checkpoint(path)
    return model


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def test_saving_a_cell_class_from_main_warns_once_naming_the_fixes(tmp_path, monkeypatch, another_process):
    monkeypatch.setattr(module_mod, "_WARNED_MAIN_CELLS", set())
    with pytest.warns(UserWarning) as record:
        trained(Saving(InMain(2, 5)), tmp_path / "a.ckpt")
    messages = [str(w.message) for w in record if "__main__" in str(w.message)]
    assert len(messages) == 1
    assert "The cell class InMain is defined in __main__" in messages[0]
    assert "Define InMain in an importable module" in messages[0]
    assert "load_from_checkpoint(path, cell=InMain(...))" in messages[0]
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        trained(Saving(InMain(2, 5)), tmp_path / "b.ckpt")
    assert not [w for w in again if "__main__" in str(w.message)]  # once per class: a second checkpoint says nothing


@pytest.mark.filterwarnings("ignore:The cell class InMain")
def test_loading_without_the_cell_names_the_cell_argument(tmp_path, another_process):
    trained(Saving(InMain(2, 5, leak=0.25)), tmp_path / "a.ckpt")
    another_process()
    with pytest.raises(ValueError) as info:
        Saving.load_from_checkpoint(tmp_path / "a.ckpt")
    message = str(info.value)
    assert "'__main__.InMain' names a cell class defined in the script that saved this checkpoint" in message
    assert "load_from_checkpoint(path, cell=InMain(...))" in message
    assert "InMain(input_size=2, hidden_size=5, leak=0.25)" in message


@pytest.mark.filterwarnings("ignore:The cell class InMain")
@pytest.mark.parametrize("model_cls", [Saving, NotSaving])
def test_passing_the_cell_loads_the_checkpoint(tmp_path, model_cls, another_process):
    model = trained(model_cls(InMain(2, 5, leak=0.25)), tmp_path / "a.ckpt")
    another_process()
    loaded = model_cls.load_from_checkpoint(tmp_path / "a.ckpt", cell=Importable(2, 5, leak=0.25))
    assert type(loaded.cell) is Importable and loaded.cell.leak == 0.25
    same_weights(loaded, model)


@pytest.mark.filterwarnings("ignore:The cell class InMain")
def test_a_saved_cell_argument_is_stored_as_its_spec_and_rebuilt(tmp_path):
    model = trained(Saving(Importable(2, 5, leak=0.75)), tmp_path / "a.ckpt")
    stored = torch.load(tmp_path / "a.ckpt", weights_only=True)["hyper_parameters"]["cell"]  # plain data, no module
    assert stored == {
        "class_path": f"{__name__}.Importable",
        "init_args": {"input_size": 2, "hidden_size": 5, "leak": 0.75},
    }
    loaded = Saving.load_from_checkpoint(tmp_path / "a.ckpt")
    assert type(loaded.cell) is Importable and loaded.cell.leak == 0.75
    same_weights(loaded, model)


@pytest.mark.filterwarnings("ignore:The cell class InMain")
def test_the_built_in_models_load_a_main_cell_given_as_cell(tmp_path, another_process):
    from onlinerec.tasks import SequenceClassifier

    model = SequenceClassifier(3, 3, hidden_size=4, cell=InMain(3, 4, leak=0.25))
    assert model.hparams["cell"]["class_path"] == "__main__.InMain"
    model.trainer = None
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, strategy=RTRLStrategy(M=M))
    trainer.strategy.connect(model)
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    another_process()
    with pytest.raises(ValueError, match=r"load_from_checkpoint\(path, cell=InMain\(\.\.\.\)\)"):
        SequenceClassifier.load_from_checkpoint(tmp_path / "c.ckpt")
    loaded = SequenceClassifier.load_from_checkpoint(tmp_path / "c.ckpt", cell=Importable(3, 4, leak=0.25))
    assert type(loaded.cell) is Importable
    same_weights(loaded, model)


@pytest.mark.filterwarnings("ignore:The cell class InMain")
def test_r2ac_loads_a_main_cell_given_as_cell(tmp_path, another_process):
    from onlinerec.rl import R2AC, RolloutDataModule

    data = RolloutDataModule("memory:tmaze", num_envs=2, seed=0)
    obs_shape, num_actions, _ = data.env_spaces()
    model = R2AC(num_actions, obs_shape, cell=InMain(9, 4), hidden_size=4, stem="mlp", fc_size=8)
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, strategy=RTRLStrategy(M=M))
    trainer.strategy.connect(model)
    trainer.save_checkpoint(tmp_path / "r.ckpt")
    another_process()
    with pytest.raises(ValueError, match=r"load_from_checkpoint\(path, cell=InMain\(\.\.\.\)\)"):
        R2AC.load_from_checkpoint(tmp_path / "r.ckpt")
    loaded = R2AC.load_from_checkpoint(tmp_path / "r.ckpt", cell=Importable(9, 4))
    assert type(loaded.cell) is Importable
    same_weights(loaded, model)
