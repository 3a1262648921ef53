"""Gymnasium-registered envs (POPGym, MiniGrid memory, any Discrete-action gymnasium env) as SAME_STEP vector envs.

Each stream is a single gymnasium env; ``SyncVectorEnv`` (default), ``AsyncVectorEnv`` (``vectorization="async"``,
one subprocess per stream) or :class:`~onlinerec.rl.envs.resilient.ResilientVectorEnv` (``vectorization="resilient"``: one
subprocess per stream, and a worker that crashes or hangs is replaced by a fresh env whose stream is flagged reset,
``info["restarted"]``) batches them with ``autoreset_mode=SAME_STEP``; the last observation of a finished episode is
in ``info["final_obs"]`` (gymnasium's convention), the returned observation is the new episode's first.

- ``popgym:<Env>`` (e.g. ``RepeatPreviousEasy``, ``RepeatFirstMedium``, ``CountRecallHard``, ``AutoencodeEasy``,
  ``ConcentrationEasy``): observations flattened with ``gymnasium.spaces.flatten`` (Discrete parts become one-hots)
  and cast to ``float32``, shape ``(d,)`` with ``d = flatdim(space)`` (RepeatPreviousEasy: ``(4,)``).
  ``MultiDiscrete`` action spaces (Battleship, MineSweeper) are flattened into one ``Discrete(prod)``.
  Continuous-action envs (the Pendulum variants) are rejected.
- ``MiniGrid-*`` / ``minigrid:<id>`` (e.g. ``MiniGrid-MemoryS7-v0`` … ``MiniGrid-MemoryS17Random-v0``): the agent's
  partial 7×7 view. ``pixels=False`` (default): the symbolic grid encoding (object, colour, state) as ``uint8
  (3, 7, 7)``; ``pixels=True``: rendered RGB ``uint8 (3, 7·tile, 7·tile)`` (``tile_size`` 8 → 56×56).
  7 actions (MiniGrid's full set).
- ``gymnasium:<id>``: passed through (Discrete action space required).
"""

from __future__ import annotations

from typing import Any, Callable

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from onlinerec.rl.envs.base import MissingBackendError, SameStepEnv, discrete_actions

__all__ = ["make_gymnasium", "make_popgym", "make_minigrid", "vectorize"]

MEMORY_INSTALL = "pip install 'onlinerec[memory]'  (popgym and minigrid)"


class _FlatObs(gymnasium.ObservationWrapper):
    """Flatten any (Discrete / MultiDiscrete / Tuple / Box) observation into a float32 vector."""

    def __init__(self, env):
        super().__init__(env)
        self._space = env.observation_space
        dim = spaces.flatdim(self._space)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(dim,), dtype=np.float32)

    def observation(self, obs):
        return np.asarray(spaces.flatten(self._space, obs), dtype=np.float32)


class _FlatMultiDiscreteAction(gymnasium.ActionWrapper):
    """``MultiDiscrete(nvec)`` actions as one ``Discrete(prod(nvec))`` (row-major)."""

    def __init__(self, env):
        super().__init__(env)
        self._nvec = np.asarray(env.action_space.nvec, dtype=np.int64).reshape(-1)
        self.action_space = spaces.Discrete(int(np.prod(self._nvec)))

    def action(self, action):
        return np.array(np.unravel_index(int(action), tuple(self._nvec)), dtype=np.int64)


class _ChannelsFirst(gymnasium.ObservationWrapper):
    """HWC uint8 image → CHW."""

    def __init__(self, env):
        super().__init__(env)
        h, w, c = env.observation_space.shape
        self.observation_space = spaces.Box(0, 255, shape=(c, h, w), dtype=np.uint8)

    def observation(self, obs):
        return np.ascontiguousarray(np.transpose(obs, (2, 0, 1)), dtype=np.uint8)


def _check_discrete(env: gymnasium.Env, env_id: str) -> gymnasium.Env:
    if isinstance(env.action_space, spaces.MultiDiscrete):
        env = _FlatMultiDiscreteAction(env)
    discrete_actions(env.action_space, env_id)
    return env


def vectorize(
    env_fns: list[Callable[[], gymnasium.Env]],
    *,
    seed: int,
    env_id: str,
    vectorization: str = "sync",
    **metadata: Any,
) -> SameStepEnv:
    """Batch single envs with SAME_STEP autoreset and wrap them with the onlinerec contract.

    ``vectorization``: "sync" (in-process), "async" (one subprocess per stream) or "resilient" (one subprocess per
    stream, restarted on a crash or hang; for its ``step_timeout`` / ``max_restarts``, wrap a
    ``ResilientVectorEnv`` in a ``SameStepEnv`` yourself).
    """
    if vectorization == "sync":
        venv = SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
    elif vectorization == "async":
        venv = AsyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
    elif vectorization == "resilient":
        from onlinerec.rl.envs.resilient import ResilientVectorEnv

        venv = ResilientVectorEnv(env_fns, seed=seed)
    else:
        raise ValueError(f"vectorization must be 'sync', 'async' or 'resilient', got {vectorization!r}")
    return SameStepEnv(venv, seed=seed, env_id=env_id, **metadata)


def make_gymnasium(name: str, num_envs: int, seed: int = 0, *, vectorization: str = "sync", **make_kwargs):
    """Any registered gymnasium env with a Discrete (or MultiDiscrete) action space, observations unchanged."""

    def fn():
        return _check_discrete(gymnasium.make(name, **make_kwargs), f"gymnasium:{name}")

    fn().close()  # fail early, in this process, on a bad id or action space
    return vectorize([fn] * num_envs, seed=seed, env_id=f"gymnasium:{name}", vectorization=vectorization)


def _popgym_class(name: str):
    try:
        import popgym.envs as penvs
    except ImportError as e:
        raise MissingBackendError(f"POPGym envs need popgym: {MEMORY_INSTALL}") from e
    names = sorted(c.__name__ for c in penvs.ALL)
    if name not in names:
        raise ValueError(f"unknown POPGym env {name!r}; available: {', '.join(names)}")
    return getattr(penvs, name)


def make_popgym(name: str, num_envs: int, seed: int = 0, *, vectorization: str = "sync", **env_kwargs):
    """``popgym:<Env>`` with flattened float32 observations (see the module docstring)."""
    cls = _popgym_class(name)
    env_id = f"popgym:{name}"

    def fn():
        env = cls(**env_kwargs)
        if isinstance(env.action_space, spaces.Box):
            raise ValueError(f"{env_id} has continuous actions {env.action_space}; onlinerec needs discrete ones")
        return _FlatObs(_check_discrete(env, env_id))

    fn().close()
    return vectorize([fn] * num_envs, seed=seed, env_id=env_id, vectorization=vectorization)


def make_minigrid(
    name: str,
    num_envs: int,
    seed: int = 0,
    *,
    pixels: bool = False,
    tile_size: int = 8,
    vectorization: str = "sync",
    **make_kwargs,
):
    """MiniGrid (e.g. ``MiniGrid-MemoryS7-v0``): channels-first uint8 partial view (see the module docstring)."""
    try:
        import minigrid  # noqa: F401  (registers the MiniGrid-* ids)
        from minigrid.wrappers import ImgObsWrapper, RGBImgPartialObsWrapper
    except ImportError as e:
        raise MissingBackendError(f"MiniGrid envs need minigrid: {MEMORY_INSTALL}") from e
    if name not in gymnasium.registry:
        known = sorted(k for k in gymnasium.registry if k.startswith("MiniGrid-Memory"))
        raise ValueError(f"unknown MiniGrid env {name!r}; memory tasks: {', '.join(known)}")

    def fn():
        env = gymnasium.make(name, **make_kwargs)
        if pixels:
            env = RGBImgPartialObsWrapper(env, tile_size=tile_size)
        return _ChannelsFirst(ImgObsWrapper(_check_discrete(env, name)))

    fn().close()
    return vectorize([fn] * num_envs, seed=seed, env_id=name, vectorization=vectorization)
