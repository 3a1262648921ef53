"""The RL data module: :class:`RolloutDataModule` streams :class:`~onlinerec.rl.segment.RolloutSegment` s to the
learner, acting in the envs with the module's current weights (:mod:`onlinerec.rl.actor`).

It makes the envs (seeded by run, DDP rank and resume), counts env frames (checkpointed), reads M from the trainer's
strategy and serves the segments through a loader that Lightning neither prefetches from nor needs to restore.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from onlinerec.rl.actor import Actor, BackgroundActor, RolloutStream, actor_copy
from onlinerec.rl.envs.base import ensure_contract, run_env_seed
from onlinerec.rl.segment import RolloutSegment

# The rollout dataset is sized on purpose (so that Lightning does not prefetch a segment collected with stale
# weights) and never runs in loader workers, so Lightning's warning about sized IterableDatasets does not apply.
warnings.filterwarnings("ignore", message=r".*`IterableDataset` has `__len__` defined.*")

__all__ = ["RolloutDataModule", "default_action_repeat"]


def default_action_repeat(env_id: str) -> int:
    """Frames per agent step by env family: 4 for Atari and DMLab (docs/r2ac.md#per-environment-settings), else 1."""
    return 4 if env_id.startswith(("ALE/", "dmlab:")) else 1


EnvFactory = Callable[[int, int], Any]
"""``factory(num_envs, seed) -> gymnasium.vector.VectorEnv``: any autoreset mode (NEXT_STEP/DISABLED envs are adapted,
:func:`~onlinerec.rl.envs.base.ensure_contract`); ``seed`` is the env seed of :func:`~onlinerec.rl.envs.run_env_seed`
— seed stream ``i`` with ``stream_seed(seed, i)``, or return an unseeded env and let the adapter do it."""


class _SegmentDataset(IterableDataset):
    """Endless segments from one persistent :class:`RolloutStream`; sized so Lightning does not prefetch
    (a prefetched segment would be collected with weights one update old; ``async_actor`` does that on purpose, with an
    actor copy whose weights are refreshed between optimiser steps)."""

    def __init__(self, datamodule: RolloutDataModule, length: int) -> None:
        self.datamodule = datamodule
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[RolloutSegment]:
        dm = self.datamodule
        for _ in range(self.length):
            yield dm.next_segment()


class _RolloutLoader(DataLoader):
    """The training loader, resumable in Lightning's sense (it has ``state_dict`` / ``load_state_dict``), so a run
    resumed mid-epoch gets no "dataloader is not resumable" warning. Its position needs no restoring: a resumed run
    starts its env streams afresh on seeds of their own (an env's state cannot be saved; docs/envs.md#seeds), and the
    frame count comes from :meth:`RolloutDataModule.load_state_dict`."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class RolloutDataModule(L.LightningDataModule):
    """Streams :class:`RolloutSegment` s of M + 1 entries from ``num_envs`` env streams, acting in the training
    process with the module's current weights (the timing and carry conventions: :mod:`onlinerec.rl.segment`,
    :mod:`onlinerec.rl.actor`).

    M is read from the trainer's strategy (``trainer.strategy.M``, one source of truth). The agent is the
    trainer's LightningModule, which must implement :class:`Actor`. The data loader runs in the main process
    (``num_workers=0``, ``batch_size=None``); the envs may run their own workers.

    Args:
        env: an env id for :func:`onlinerec.rl.envs.make_vector_env` ("ALE/Qbert-v5", "procgen:chaser",
            "dmlab:rooms_watermaze", "memory:tmaze", ...) or a factory ``(num_envs, seed) -> VectorEnv``.
        num_envs: B, the number of streams on this process.
        seed: the run's seed. The envs get ``run_env_seed(seed, purpose="train", rank=rank, restart=k)`` (DDP rank
            ``rank``, k-th resume of this run), and stream ``i`` of it ``stream_seed(that, i)``: different seeds,
            ranks and resumes share no env stream (``onlinerec.rl.envs`` documents the convention).
        action_repeat: frames per agent step for the frame counter; None: the env's ``metadata["frames_per_step"]``,
            else 4 for Atari/DMLab ids and 1 otherwise.
        env_kwargs: extra keyword arguments for ``make_vector_env``.
        segments_per_epoch: segments in one Lightning epoch; None: the segments the trainer's ``max_steps`` allows if
            set (``max_steps`` / the module's ``config.passes`` optimiser steps per segment, 1 if it has none), else
            1000.
        async_actor: collect segment k + 1 on a background thread while the learner updates on segment k, so that acting
            and env steps run beside the learner's forward, backward and optimiser step. The actor is then a copy of
            the agent whose parameters and buffers are refreshed from the learner's before each segment: it acts with
            weights one update old (V-trace's importance weights correct for that, as they do for IMPALA's actors),
            and the learner's carry, computed with the newer weights, is no longer equal to the actor's state. Off by
            default (the paper's R2AC acts with the current weights). Measured: ~1.5x frames/s on an idle 2-core
            machine, no gain when other jobs hold the cores (docs/performance.md#overlapping-acting-with-learning).
    """

    def __init__(
        self,
        env: str | EnvFactory,
        num_envs: int = 32,
        seed: int = 0,
        action_repeat: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        segments_per_epoch: int | None = None,
        async_actor: bool = False,
    ) -> None:
        super().__init__()
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}.")
        self.env = env
        self.num_envs = int(num_envs)
        self.seed = int(seed)
        self.env_kwargs = dict(env_kwargs or {})
        self.action_repeat = None if action_repeat is None else int(action_repeat)
        self.segments_per_epoch = segments_per_epoch
        self.async_actor = bool(async_actor)
        self.stream: RolloutStream | None = None
        self._frames = 0
        self._background: BackgroundActor | None = None  # async_actor: the actor copy and the segment in flight
        self._restarts = 0  # resumes so far: each re-seeds the envs so that resumed runs do not replay episodes

    # -- envs -----------------------------------------------------------------------------------
    def make_env(self, num_envs: int, seed: int) -> Any:
        """A vector env for ``num_envs`` streams under env seed ``seed`` (stream ``i``: ``stream_seed(seed, i)``),
        adapted to the SAME_STEP contract if it is not (a factory may return any gymnasium vector env)."""
        from onlinerec.rl.envs import make_vector_env

        return ensure_contract(make_vector_env(self.env, num_envs, seed=seed, **self.env_kwargs), seed=seed)

    def spaces(self) -> tuple[Any, Any, int]:
        """(observation space, action space, frames per agent step) of one stream, from a throwaway env."""
        env = self.make_env(1, self.seed)
        try:
            return env.single_observation_space, env.single_action_space, self.resolve_action_repeat(env)
        finally:
            getattr(env, "close", lambda: None)()

    def env_spaces(self) -> tuple[tuple[int, ...], int, int]:
        """(observation shape, number of actions, frames per agent step) of one stream, for a Discrete-action env with
        array observations; :meth:`spaces` gives the spaces themselves (Box actions, Dict/Tuple observations)."""
        obs_space, act_space, repeat = self.spaces()
        if not hasattr(act_space, "n") or obs_space.shape is None:
            raise ValueError(
                f"env_spaces() describes Discrete actions and array observations; this env has {act_space} and "
                f"{obs_space}: use spaces(), which returns (observation_space, action_space, frames per step)."
            )
        return tuple(obs_space.shape), int(act_space.n), repeat

    def resolve_action_repeat(self, env: Any) -> int:
        """Frames per agent step: the argument, else the env's metadata, else the id's family default."""
        if self.action_repeat is not None:
            return self.action_repeat
        meta = getattr(env, "metadata", None) or {}
        if meta.get("frames_per_step"):
            return int(meta["frames_per_step"])
        return default_action_repeat(self.env) if isinstance(self.env, str) else 1

    @property
    def unroll_length(self) -> int:
        """M, from the trainer's strategy."""
        trainer = self.trainer
        m = getattr(getattr(trainer, "strategy", None), "M", None)
        if m is None:
            raise RuntimeError(
                "RolloutDataModule reads M from the trainer's strategy: use Trainer(strategy=RTRLStrategy(M=...)) "
                "(or TBPTTStrategy / SnAPStrategy, also for a feed-forward agent)."
            )
        return int(m)

    @property
    def frames(self) -> int:
        """Env frames on this process so far (agent steps x action repeat) in the segments handed to the learner (with
        ``async_actor``, the segment still being collected is not counted: a checkpoint does not hold it)."""
        if self._background is not None:
            return self._background.handed_frames
        return self.stream.frames if self.stream is not None else self._frames

    def next_segment(self) -> RolloutSegment:
        """The learner's next segment of M = ``unroll_length`` steps (with ``async_actor``, the one collected in the
        background; the next is started at once)."""
        if self._background is not None:
            return self._background.next_segment(self.unroll_length)
        return self.stream.next_segment(self.unroll_length)

    # -- Lightning hooks ----------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        if self.stream is None:
            agent = trainer.lightning_module
            if not isinstance(agent, Actor):
                raise TypeError(
                    f"{type(agent).__name__} has no act(obs, reward, reset) step; RolloutDataModule needs one (see onlinerec.rl.Actor)."
                )
            seed = run_env_seed(self.seed, purpose="train", rank=trainer.global_rank, restart=self._restarts)
            env = self.make_env(self.num_envs, seed)
            actor = actor_copy(agent) if self.async_actor else agent
            try:
                self.stream = RolloutStream(
                    env, actor, self.resolve_action_repeat(env), agent.device, frames=self._frames
                )
            except BaseException:
                getattr(env, "close", lambda: None)()  # e.g. an agent built for another action count
                raise
            if self.async_actor:
                self._background = BackgroundActor(self.stream, agent, self._frames)
        length = self.segments_per_epoch
        if length is None and trainer.max_steps and trainer.max_steps > 0:
            # max_steps counts optimiser steps; a module with several per segment (R2AC's epochs) needs fewer segments,
            # and the progress bar's total is this length
            passes = getattr(getattr(trainer.lightning_module, "config", None), "passes", 1)
            length = math.ceil(trainer.max_steps / passes)
        length = 1000 if length is None else length
        return _RolloutLoader(_SegmentDataset(self, int(length)), batch_size=None, num_workers=0)

    def teardown(self, stage: str) -> None:
        if self.stream is not None:
            self._frames = self.frames
            if self._background is not None:  # the env may close only once the thread has finished with it
                self._background.close()
                self._background = None
            self.stream.close()
            self.stream = None

    def state_dict(self) -> dict[str, Any]:
        return {"frames": self.frames, "restarts": self._restarts}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._frames = int(state_dict.get("frames", 0))
        self._restarts = int(state_dict.get("restarts", 0)) + 1
        if self.stream is not None:
            self.stream.frames = self._frames
        if self._background is not None:
            self._background.handed_frames = self._frames
