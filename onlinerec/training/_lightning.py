"""The only places where onlinerec reaches into Lightning's non-public API, and why (checked by a test).

Lightning offers no public switch for these, so each is named here once; ``tests/training/test_lightning_private.py``
fails loudly if a Lightning release moves any of them.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

__all__ = ["PRIVATE_HOOKS", "StepProgressBar", "complete_checkpoint_io", "keep_loader_order"]

PRIVATE_HOOKS = {
    "lightning.pytorch.strategies.DDPStrategy._configure_launcher": "one process: no launcher, so notebooks work",
    "lightning.pytorch.strategies.DDPStrategy._setup_model": "one process: no DistributedDataParallel wrapper",
    "lightning.pytorch.Trainer._accelerator_connector.use_distributed_sampler": "never inject a (shuffling) sampler",
    "lightning.pytorch.plugins.io.wrapper._WrappingCheckpointIO": "an AsyncCheckpointIO wraps the atomic writer",
    "lightning.pytorch.callbacks.RichProgressBar._get_train_description": "no 'Epoch 0/-2' in step-budgeted runs",
}
"""Every private Lightning name onlinerec uses, with the reason."""


def keep_loader_order(trainer: Any) -> None:
    """Stop Lightning from injecting a DistributedSampler into map-style training loaders.

    As a DDPStrategy (even on one device) the strategy would make Lightning put a sampler into every map-style
    DataLoader, a shuffling one for training; the public switch is ``Trainer(use_distributed_sampler=False)``, which
    users would have to remember. Segments must come in stream order, and under DDP every rank serves its own streams.
    """
    connector = getattr(trainer, "_accelerator_connector", None)
    if connector is not None:
        connector.use_distributed_sampler = False


def complete_checkpoint_io(io: CheckpointIO | None, default: CheckpointIO) -> CheckpointIO:
    """``io``, or ``default`` where there is none, also inside a wrapper (``AsyncCheckpointIO()``) given without one."""
    if io is None:
        return default
    if isinstance(io, _WrappingCheckpointIO) and io.checkpoint_io is None:
        io.checkpoint_io = default
    return io


class StepProgressBar(RichProgressBar):
    """Lightning's rich progress bar for runs budgeted in steps (``max_steps``, ``max_epochs=-1``): the bar is named
    ``description`` instead of "Epoch 0/-2", and the logger's version number (``v_num``) is not shown."""

    def __init__(self, description: str = "training", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.description = description

    def _get_train_description(self, current_epoch: int) -> str:
        return self.description

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


class _NoAdvertisements(logging.Filter):
    """Drops Lightning's "💡 Tip: ... try installing ..." lines (product advice, nothing a user must act on)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
    logging.getLogger(_name).addFilter(_NoAdvertisements())
