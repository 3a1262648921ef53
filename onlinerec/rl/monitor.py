"""What an RL run reports while it trains, in one place: env frames, frames/s, episodes and their returns."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from onlinerec.rl.segment import RolloutSegment

__all__ = ["RolloutMonitor"]


class RolloutMonitor(Callback):
    """Logs, after every training segment, what the rollouts did (R2AC adds it to every fit).

    Logged (on this process; ``frames`` counts every process): ``frames`` (env frames so far: agent steps x action
    repeat), ``fps`` (frames per second of wall time since this fit started, learning included), ``episodes``
    (real episodes finished), ``return`` (mean undiscounted return of the last ``window`` finished episodes) and
    ``env_restarts`` (crashed env workers replaced). The frame counter itself lives in the
    :class:`~onlinerec.rl.datamodule.RolloutDataModule` (each segment carries it); the episode window is this
    callback's state, checkpointed with it.

    Args:
        window: how many of the latest finished episodes the logged ``return`` averages over.
    """

    def __init__(self, window: int = 100) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}.")
        self.window = window
        self.returns: deque[float] = deque(maxlen=window)
        self.episodes = 0
        self._clock: tuple[float, int] | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(window=self.window)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._clock = None  # frames/s counts from this fit's first segment (a resume starts a new clock)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(batch, RolloutSegment):
            return
        frames = int(batch.frames) * trainer.world_size
        returns, _ = batch.completed_episodes()
        self.returns.extend(float(r) for r in returns.tolist())
        self.episodes += len(returns)
        now = time.perf_counter()
        if self._clock is None:
            self._clock = (now, frames)
        t0, f0 = self._clock
        fps = (frames - f0) / (now - t0) if now > t0 else 0.0
        pl_module.log("frames", float(frames), batch_size=1)
        pl_module.log("fps", fps, prog_bar=True, batch_size=1)
        pl_module.log("env_restarts", float(batch.env_restarts), batch_size=1)
        if self.episodes:
            pl_module.log("return", sum(self.returns) / len(self.returns), prog_bar=True, batch_size=1)
            pl_module.log("episodes", float(self.episodes), batch_size=1)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "returns": list(self.returns)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.episodes = int(state_dict.get("episodes", 0))
        self.returns = deque((float(r) for r in state_dict.get("returns", [])), maxlen=self.window)
