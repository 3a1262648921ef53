"""onlinerec's few uses of Lightning's non-public API (onlinerec/training/_lightning.py) still exist in the installed
Lightning. If one of these fails after a Lightning upgrade, the hook it names moved: adapt _lightning.py."""

from __future__ import annotations

import inspect

import lightning as L
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
from lightning.pytorch.strategies import DDPStrategy

from onlinerec import AtomicCheckpointIO, RTRLStrategy
from onlinerec.training._lightning import PRIVATE_HOOKS


def test_every_private_hook_is_listed_with_a_reason():
    assert len(PRIVATE_HOOKS) == 5 and all(reason for reason in PRIVATE_HOOKS.values())


def test_ddp_strategy_still_has_the_overridden_hooks():
    for name in ("_configure_launcher", "_setup_model"):
        assert callable(getattr(DDPStrategy, name, None)), f"DDPStrategy.{name} is gone"
    assert list(inspect.signature(DDPStrategy._setup_model).parameters) == ["self", "model"]


def test_trainer_still_has_the_distributed_sampler_switch():
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, strategy=RTRLStrategy(M=2)
    )
    assert isinstance(trainer._accelerator_connector.use_distributed_sampler, bool)


def test_the_step_progress_bar_still_names_its_bar_through_the_overridden_hook():
    from lightning.pytorch.callbacks import RichProgressBar

    from onlinerec.training import StepProgressBar

    assert callable(getattr(RichProgressBar, "_get_train_description", None))
    assert StepProgressBar("R2AC updates")._get_train_description(0) == "R2AC updates"


def test_a_wrapping_checkpoint_io_gets_the_atomic_writer():
    wrapper = AsyncCheckpointIO()
    strategy = RTRLStrategy(M=2, checkpoint_io=wrapper)
    assert strategy.checkpoint_io is wrapper and isinstance(wrapper.checkpoint_io, AtomicCheckpointIO)
    mine = AsyncCheckpointIO(TorchCheckpointIO())
    assert type(RTRLStrategy(M=2, checkpoint_io=mine).checkpoint_io.checkpoint_io) is TorchCheckpointIO
