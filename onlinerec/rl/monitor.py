"""What an RL run reports while it trains, in one place: env frames, frames/s, episodes and their returns.

:class:`RolloutMonitor` logs them to the run's loggers. :class:`ProgressLines` writes them as plain lines, every few
seconds, for output that is not a terminal (a log file, a background job), where a live progress bar cannot draw;
:class:`ProgressLinesCallback` feeds it from a Lightning fit.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from onlinerec.rl.segment import RolloutSegment

__all__ = ["ProgressLines", "ProgressLinesCallback", "RolloutMonitor"]


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


class ProgressLines:
    """Plain progress lines: env frames (of the budget), frames per second, the mean episode return and the elapsed
    time, one line at the first update and then at most one every ``every`` seconds. Any training loop can feed it:
    call :meth:`update` after each update with the frames so far and the latest mean return.

        frames 12,288 / 300,000 (4%)  fps 1,530  return 0.620  elapsed 0:00:08

    Args:
        total_frames: the budget, shown with the frames (None: frames alone).
        every: seconds between lines.
        write: where a line goes (default: printed to stdout and flushed).
    """

    def __init__(
        self, total_frames: float | None = None, every: float = 10.0, write: Callable[[str], Any] | None = None
    ) -> None:
        if not every >= 0:
            raise ValueError(f"every must be a number of seconds >= 0, got {every!r}.")
        self.total_frames = total_frames
        self.every = every
        self.write = write if write is not None else lambda line: print(line, file=sys.stdout, flush=True)
        self._start: tuple[float, int] | None = None  # (time, frames) of the first update: fps counts from there
        self._last: float | None = None  # time of the last line

    @property
    def started(self) -> bool:
        """Whether :meth:`update` was called."""
        return self._start is not None

    def update(self, frames: int, mean_return: float | None, now: float | None = None, force: bool = False) -> bool:
        """Write a line if it is due (or ``force``); ``now``: the time (``time.perf_counter()`` if None). Returns
        whether it wrote one."""
        now = time.perf_counter() if now is None else now
        if self._start is None:
            self._start = (now, frames)
        if not force and self._last is not None and now - self._last < self.every:
            return False
        self._last = now
        self.write(self.line(frames, mean_return, now))
        return True

    def line(self, frames: int, mean_return: float | None, now: float) -> str:
        """The line for these numbers (the first :meth:`update` sets where elapsed time and fps count from)."""
        t0, f0 = self._start if self._start is not None else (now, frames)
        elapsed = now - t0
        shown = f"frames {frames:,}"
        if self.total_frames:
            shown += f" / {int(self.total_frames):,} ({frames / self.total_frames:.0%})"
        fps = f"{(frames - f0) / elapsed:,.0f}" if elapsed > 0 else "-"
        ret = f"{mean_return:.3f}" if mean_return is not None else "- (no episode finished yet)"
        return f"{shown}  fps {fps}  return {ret}  elapsed {datetime.timedelta(seconds=round(elapsed))}"


class ProgressLinesCallback(Callback):
    """:class:`ProgressLines` for a Lightning fit of R2AC: frames from each segment, the mean return from the fit's
    :class:`RolloutMonitor`, and a last line when training ends."""

    def __init__(self, total_frames: float | None = None, every: float = 10.0) -> None:
        self.lines = ProgressLines(total_frames, every)
        self._frames = 0

    def _mean_return(self, trainer: L.Trainer) -> float | None:
        monitor = next((cb for cb in trainer.callbacks if isinstance(cb, RolloutMonitor)), None)
        return sum(monitor.returns) / len(monitor.returns) if monitor is not None and monitor.returns else None

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if isinstance(batch, RolloutSegment) and trainer.is_global_zero:
            self._frames = int(batch.frames) * trainer.world_size
            self.lines.update(self._frames, self._mean_return(trainer))

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and self.lines.started:
            self.lines.update(self._frames, self._mean_return(trainer), force=True)
