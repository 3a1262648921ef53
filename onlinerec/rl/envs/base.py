"""Shared pieces of the env adapters: episode statistics, the SAME_STEP wrapper, seeding, errors."""

from __future__ import annotations

from typing import Any, Callable

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

__all__ = [
    "EpisodeTracker",
    "SameStepEnv",
    "MissingBackendError",
    "ensure_contract",
    "same_step_metadata",
    "stream_seeds",
]


class MissingBackendError(ImportError):
    """An optional env backend (ale-py, procgen, deepmind_lab, popgym, minigrid, ...) is not installed."""


def stream_seeds(seed: int, num_envs: int) -> np.ndarray:
    """Per-stream seeds: env ``i`` gets ``seed + i``."""
    return np.arange(int(seed), int(seed) + int(num_envs), dtype=np.int64)


def same_step_metadata(base: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    """A fresh metadata dict (never the class-level one) for an env that meets the onlinerec contract:
    ``autoreset_mode = SAME_STEP`` and ``episode_statistics = True`` (``info`` has the episode keys on every step)."""
    meta = dict(base or {})
    meta.update(extra)
    meta["autoreset_mode"] = AutoresetMode.SAME_STEP
    meta["episode_statistics"] = True
    return meta


def autoreset_mode(env: Any) -> AutoresetMode:
    """The vector env's declared ``metadata["autoreset_mode"]``; a clear error where it declares none."""
    mode = (getattr(env, "metadata", None) or {}).get("autoreset_mode")
    if mode is None:
        raise ValueError(
            f"{type(env).__name__} does not declare metadata['autoreset_mode'], so onlinerec cannot tell on which step a new "
            "episode starts. Set it (gymnasium.vector.AutoresetMode.SAME_STEP, NEXT_STEP or DISABLED; gymnasium's "
            "SyncVectorEnv/AsyncVectorEnv set it from their autoreset_mode= argument)."
        )
    return AutoresetMode(mode)


def ensure_contract(env: Any) -> Any:
    """``env`` if it already meets the onlinerec contract (see :mod:`onlinerec.rl.envs`), else wrapped so it does.

    A SAME_STEP env gains the episode statistics; a NEXT_STEP or DISABLED env (gymnasium's default is NEXT_STEP) is
    adapted: where an episode ends, the finished streams are reset at once (``reset(options={"reset_mask": ...})``)
    and the step returns the new episode's first observation, the terminal one going to ``info["final_obs"]``.
    """
    meta = getattr(env, "metadata", None) or {}
    if meta.get("episode_statistics") and autoreset_mode(env) == AutoresetMode.SAME_STEP:
        return env
    return SameStepEnv(env, env_id=meta.get("env_id"))


class EpisodeTracker:
    """Accumulates per-stream returns and lengths (in agent steps) of *real* episodes.

    ``step(rewards, episode_end)`` adds this step's reward and one step, and returns
    ``(episode_return, episode_length)`` arrays that hold the finished episode's totals where
    ``episode_end`` is True (the last reward included) and 0 elsewhere; those streams restart at 0.
    """

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def reset(self, mask: np.ndarray | None = None) -> None:
        if mask is None:
            self.returns[:] = 0.0
            self.lengths[:] = 0
        else:
            self.returns[mask] = 0.0
            self.lengths[mask] = 0

    def step(self, rewards: np.ndarray, episode_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.returns += np.asarray(rewards, dtype=np.float64)
        self.lengths += 1
        end = np.asarray(episode_end, dtype=bool)
        ret = np.where(end, self.returns, 0.0).astype(np.float32)
        length = np.where(end, self.lengths, 0).astype(np.int64)
        self.reset(end)
        return ret, length


class SameStepEnv(VectorWrapper):
    """Wraps any gymnasium vector env and adds the onlinerec contract.

    - SAME_STEP resets: a SAME_STEP backend does them itself; for a NEXT_STEP or DISABLED backend the wrapper resets
      the streams whose episode just ended (``reset(options={"reset_mask": done})``, which gymnasium's vector envs
      support) and returns the new episodes' first observations in the same step; the terminal observations go to
      ``info["final_obs"]`` (an object array, None where no episode ended), as gymnasium's SAME_STEP mode does.
    - ``info["episode_end"]``, ``info["episode_return"]``, ``info["episode_length"]`` on every step;
      ``episode_end = end_fn(terminated, truncated, info)`` (default ``terminated | truncated``). Where the backend
      restarted a crashed worker (``info["restarted"]``, :class:`~onlinerec.rl.envs.resilient.ResilientVectorEnv`) the
      interrupted episode is dropped: its statistics restart at 0 and no finished episode is reported.
    - ``reset()`` without a seed uses the seed given at construction the first time (so
      ``make_vector_env(..., seed=s)`` alone fixes the streams' seeds), and ``None`` afterwards.
    - ``metadata["autoreset_mode"] = SAME_STEP`` (a per-instance dict).
    - actions are cast to ``int64`` numpy arrays.
    """

    def __init__(
        self,
        env: VectorEnv,
        *,
        seed: int | None = None,
        end_fn: Callable[[np.ndarray, np.ndarray, dict], np.ndarray] | None = None,
        env_id: str | None = None,
        **metadata: Any,
    ):
        super().__init__(env)
        self._backend_mode = autoreset_mode(env)
        metadata.setdefault("frames_per_step", env.metadata.get("frames_per_step", 1))
        self.metadata = same_step_metadata(env.metadata, env_id=env_id, **metadata)
        self._seed = seed
        self._seeded = False
        self._end_fn = end_fn
        self.tracker = EpisodeTracker(env.num_envs)

    def reset(self, *, seed=None, options=None):
        if seed is None and not self._seeded and self._seed is not None:
            seed = int(self._seed)
        self._seeded = True
        obs, info = self.env.reset(seed=seed, options=options)
        mask = None if options is None else options.get("reset_mask")
        self.tracker.reset(mask)
        self._on_reset(obs, info, mask)
        return obs, info

    def _on_reset(self, obs, info, mask) -> None:  # hook for subclasses
        pass

    def episode_end(self, terminated: np.ndarray, truncated: np.ndarray, info: dict) -> np.ndarray:
        if self._end_fn is not None:
            return np.asarray(self._end_fn(terminated, truncated, info), dtype=bool)
        return np.logical_or(terminated, truncated)

    def step(self, actions):
        actions = np.asarray(actions, dtype=np.int64).reshape(self.num_envs)
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        info = dict(info)
        done = np.logical_or(terminated, truncated)
        if self._backend_mode != AutoresetMode.SAME_STEP and done.any():
            obs = self._start_next_episodes(obs, done, info)
        end = self.episode_end(np.asarray(terminated, bool), np.asarray(truncated, bool), info)
        restarted = np.asarray(info.get("restarted", False), dtype=bool)
        end = end & ~restarted  # a crashed worker's episode did not finish: drop it
        ret, length = self.tracker.step(rewards, end)
        if restarted.any():
            self.tracker.reset(restarted)
        info["episode_end"] = end
        info["episode_return"] = ret
        info["episode_length"] = length
        return obs, rewards, terminated, truncated, info

    def _start_next_episodes(self, obs: Any, done: np.ndarray, info: dict) -> Any:
        """Reset the streams in ``done`` now (a NEXT_STEP/DISABLED backend would do it on the next step, or never)."""
        try:
            new_obs, reset_info = self.env.reset(options={"reset_mask": np.asarray(done, dtype=np.bool_)})
        except Exception as err:  # noqa: BLE001 - any failure: explain the contract and the fix
            raise ValueError(
                f"{type(self.env).__name__} autoresets in {self._backend_mode.name} mode and could not reset single streams "
                f"with reset(options={{'reset_mask': ...}}) ({type(err).__name__}: {err}). onlinerec needs SAME_STEP "
                "autoreset (a finished stream's step returns the next episode's first observation): build the env with "
                "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP."
            ) from err
        final = np.empty(len(done), dtype=object)
        for i in np.flatnonzero(done):
            final[i] = _row(obs, i)
        info["final_obs"] = final
        for key, value in reset_info.items():
            info.setdefault(key, value)
        return new_obs


def _row(obs: Any, i: int) -> Any:
    """Stream i of a batched observation (an array, or a dict/tuple of arrays)."""
    if isinstance(obs, dict):
        return {k: _row(v, i) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_row(v, i) for v in obs)
    return np.array(obs[i], copy=True)


def discrete_actions(space: gymnasium.Space, env_id: str) -> int:
    if not isinstance(space, gymnasium.spaces.Discrete):
        raise ValueError(f"{env_id}: onlinerec's RL adapters need a Discrete action space, got {space}")
    if int(space.start) != 0:
        raise ValueError(f"{env_id}: Discrete action space must start at 0, got start={space.start}")
    return int(space.n)
