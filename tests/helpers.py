"""What several test modules share: a relative error, the boring model, a quiet trainer."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from onlinerec import ELSTMCell, OnlineRecurrentModule


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (b = 0 counts as a tiny norm, so equal zeros give 0)."""
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


class Regressor(OnlineRecurrentModule):
    """The boring model: a cell (eLSTM 2 -> 5 by default), a linear head, mean-squared error on ``segment.targets``."""

    def __init__(self, cell: Any = None, lr: float = 1e-2, **kwargs: Any) -> None:
        super().__init__(cell if cell is not None else ELSTMCell(2, 5), lr=lr, **kwargs)
        self.head = torch.nn.Linear(self.cell.output_size, 1)

    def segment_loss(self, outputs, segment):
        return torch.nn.functional.mse_loss(self.head(outputs), segment.targets)


def quiet_trainer(strategy: Any = "rtrl", **kwargs: Any) -> L.Trainer:
    """A CPU trainer with no logger, checkpoints, progress bar or summary unless asked for."""
    defaults = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    return L.Trainer(strategy=strategy, **{**defaults, **kwargs})


TINY_RL = ["--num_envs", "2", "--M", "4", "--hidden_size", "8", "--fc_size", "16"]
TINY_RL += ["--progress", "false", "--tensorboard", "false", "--threads", "1"]
"""``onlinerec rl`` options for an agent small enough for a test: 2 streams, M 4, 8 units, no progress bar or
TensorBoard, one thread."""
