"""Gymnasium-registered envs (POPGym, MiniGrid memory, any gymnasium env) as SAME_STEP vector envs.

Each stream is a single gymnasium env; ``SyncVectorEnv`` (default), ``AsyncVectorEnv`` (``vectorization="async"``,
one subprocess per stream) or :class:`~onlinerec.rl.envs.resilient.ResilientVectorEnv` (``vectorization="resilient"``: one
subprocess per stream, and a worker that crashes or hangs is replaced by a fresh env whose stream is flagged reset,
``info["restarted"]``) batches them with ``autoreset_mode=SAME_STEP``; the last observation of a finished episode is
in ``info["final_obs"]`` (gymnasium's convention), the returned observation is the new episode's first.

- ``popgym:<Env>`` (e.g. ``RepeatPreviousEasy``, ``RepeatFirstMedium``, ``CountRecallHard``, ``AutoencodeEasy``,
  ``ConcentrationEasy``): observations flattened with ``gymnasium.spaces.flatten`` (Discrete parts become one-hots)
  and cast to ``float32``, shape ``(d,)`` with ``d = flatdim(space)`` (RepeatPreviousEasy: ``(4,)``).
  ``MultiDiscrete`` action spaces (Battleship, MineSweeper) are flattened into one ``Discrete(prod)``; Box actions
  (the Pendulum variants) are passed through as float32. Envs whose observation needs the previous action
  (POPGym's ``obs_requires_prev_action``: MultiarmedBandit, Concentration, Battleship, MineSweeper, LabyrinthEscape,
  LabyrinthExplore) get it appended, one-hot, as POPGym's own baselines do (``prev_action``: force it on or off).
- ``MiniGrid-*`` / ``minigrid:<id>`` (e.g. ``MiniGrid-MemoryS7-v0`` … ``MiniGrid-MemoryS17Random-v0``): the agent's
  partial 7×7 view. ``pixels=False`` (default): the symbolic grid encoding (object, colour, state) as ``uint8
  (3, 7, 7)``; ``pixels=True``: rendered RGB ``uint8 (3, 7·tile, 7·tile)`` (``tile_size`` 8 → 56×56).
  ``dict_obs=True``: a ``Dict`` observation ``{"image": uint8 (3, 7, 7) (or the pixels), "direction": Discrete(4)}``
  (MiniGrid's own dict without the mission text). 7 actions (MiniGrid's full set).
- ``gymnasium:<id>``: observations passed through (Box, Discrete, Dict, Tuple: batched by gymnasium), actions
  Discrete (MultiDiscrete flattened as above) or Box (float32); a Tuple/Dict action space is refused. Built in:
  ``CartPoleNoVel-v1`` and ``PendulumNoVel-v1`` (rl-zoo's masked-velocity envs, :class:`MaskVelocity`), and the
  positions-only MuJoCo tasks ``HopperNoVel-v5``, ``Walker2dNoVel-v5``, ``HalfCheetahNoVel-v5`` (the "-P" tasks of
  the recurrent-RL literature; ``pip install 'onlinerec[mujoco]'``).

Every maker takes ``wrappers``: a list of gymnasium wrappers applied to each stream's env right after it is made (before
onlinerec's own flattening / channels-first adapters), each given as ``{"class_path": "gymnasium.wrappers.TimeLimit",
"init_args": {"max_episode_steps": 200}}`` (LightningCLI's style; a bare class path, a class or a callable
``env -> env`` also work). See docs/envs.md.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Sequence
from typing import Any, Callable

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from onlinerec.rl.envs.base import MissingBackendError, SameStepEnv, action_kind, unexpected_env_kwargs

__all__ = [
    "MaskVelocity",
    "WrapperSpec",
    "apply_wrappers",
    "make_gymnasium",
    "make_minigrid",
    "make_popgym",
    "resolve_callable",
    "vectorize",
]

WrapperSpec = Any
"""One wrapper: ``{"class_path": "pkg.mod.Wrapper", "init_args": {...}}``, a class path string, or a callable
``(env, **init_args) -> env``."""


def resolve_callable(path: str) -> Callable:
    """``"pkg.module.Name"`` (or ``"pkg.module:Name"``) → the object; a bare name is looked up in
    ``gymnasium.wrappers`` (``"TimeLimit"``)."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"expected a class path such as 'gymnasium.wrappers.TimeLimit', got {path!r}")
    module, sep, name = path.partition(":") if ":" in path else path.rpartition(".")
    if not sep:
        module, name = "gymnasium.wrappers", path
    try:
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import {path!r} ({type(err).__name__}: {err})") from err
    if not callable(obj):
        raise ValueError(f"{path!r} is not callable")
    return obj


def _wrapper(spec: WrapperSpec) -> tuple[Callable, dict[str, Any]]:
    if isinstance(spec, dict):
        unknown = set(spec) - {"class_path", "init_args"}
        if "class_path" not in spec or unknown:
            raise ValueError(
                f"a wrapper is {{class_path: ..., init_args: {{...}}}}, got {spec!r}"
                + (f" (unknown keys {sorted(unknown)})" if unknown else "")
            )
        target = spec["class_path"]
        kwargs = dict(spec.get("init_args") or {})
        if kwargs.get("env", 0) is None:  # jsonargparse fills in the wrapped env's slot as None: the env comes here
            del kwargs["env"]
    else:
        target, kwargs = spec, {}
    return (resolve_callable(target) if isinstance(target, str) else target), kwargs


def apply_wrappers(env: gymnasium.Env, wrappers: Sequence[WrapperSpec] | None) -> gymnasium.Env:
    """``env`` wrapped by each of ``wrappers`` in order (the first is innermost)."""
    for spec in wrappers or ():
        fn, kwargs = _wrapper(spec)
        env = fn(env, **kwargs)
    return env


def check_wrappers(wrappers: Any) -> list:
    """``wrappers`` as a list (one wrapper, a class path or a dict given alone is a list of one), each resolved once
    here so that a bad class path fails in this process, not in an env worker."""
    if wrappers is None:
        return []
    if isinstance(wrappers, (str, dict)) or callable(wrappers):
        wrappers = [wrappers]
    wrappers = list(wrappers)
    for spec in wrappers:
        _wrapper(spec)  # fail early, in this process, on a bad class path
    return wrappers


class MaskVelocity(gymnasium.ObservationWrapper):
    """Zero the velocity entries of a classic-control observation (rl-zoo's ``MaskVelocityWrapper`` semantics): the
    MDP becomes partially observable, the observation space is unchanged.

    ``indices``: which entries to zero; None: looked up by the env's id in :attr:`VELOCITY_INDICES`.
    """

    VELOCITY_INDICES: dict[str, tuple[int, ...]] = {
        "CartPole-v0": (1, 3),  # cart velocity, pole angular velocity
        "CartPole-v1": (1, 3),
        "MountainCar-v0": (1,),
        "MountainCarContinuous-v0": (1,),
        "Pendulum-v1": (2,),  # angular velocity (obs = cos, sin, velocity)
        "LunarLander-v3": (2, 3, 5),
        "LunarLanderContinuous-v3": (2, 3, 5),
        "Hopper-v5": tuple(range(5, 11)),  # qpos[1:] (5 entries), then qvel (6)
        "Walker2d-v5": tuple(range(8, 17)),  # qpos[1:] (8), then qvel (9)
        "HalfCheetah-v5": tuple(range(8, 17)),
    }

    def __init__(self, env: gymnasium.Env, indices: Sequence[int] | None = None):
        super().__init__(env)
        if indices is None:
            env_id = env.spec.id if env.spec is not None else None
            if env_id not in self.VELOCITY_INDICES:
                raise ValueError(
                    f"MaskVelocity knows the velocity entries of {sorted(self.VELOCITY_INDICES)}, not {env_id!r}: "
                    "pass indices=[...]"
                )
            indices = self.VELOCITY_INDICES[env_id]
        self.keep = np.ones(env.observation_space.shape, dtype=bool)
        self.keep[np.asarray(indices, dtype=np.int64)] = False
        self.indices = tuple(int(i) for i in indices)

    def observation(self, observation):
        return np.where(self.keep, observation, 0).astype(self.observation_space.dtype, copy=False)


def _masked(base_id: str, **kwargs: Any) -> gymnasium.Env:
    return MaskVelocity(gymnasium.make(base_id, **kwargs))


#: rl-zoo's masked-velocity ids, registered with gymnasium on import: ``gymnasium:CartPoleNoVel-v1`` etc.
NO_VELOCITY_ENVS = {
    "CartPoleNoVel-v1": "CartPole-v1",
    "PendulumNoVel-v1": "Pendulum-v1",
    "HopperNoVel-v5": "Hopper-v5",
    "Walker2dNoVel-v5": "Walker2d-v5",
    "HalfCheetahNoVel-v5": "HalfCheetah-v5",
}
for _id, _base in NO_VELOCITY_ENVS.items():
    if _id not in gymnasium.registry:
        gymnasium.register(_id, entry_point=_masked, kwargs={"base_id": _base})

MUJOCO_INSTALL = (
    "pip install 'onlinerec[mujoco]'  (gymnasium[mujoco] with mujoco<4: the index's mujoco 4 has no engine)"
)

MEMORY_INSTALL = "pip install 'onlinerec[memory]'  (popgym and minigrid)"


class _FlatObs(gymnasium.ObservationWrapper):
    """Flatten any (Discrete / MultiDiscrete / Tuple / Box) observation into a float32 vector. The flat space keeps
    gymnasium's ``flatten_space`` bounds: [0, 1] on the one-hot codes of the discrete parts, a Box part's own bounds
    elsewhere (``R2ACConfig.obs_norm_skip_binary`` reads them)."""

    def __init__(self, env):
        super().__init__(env)
        self._space = env.observation_space
        flat = spaces.flatten_space(self._space)
        low, high = (np.asarray(b, dtype=np.float32) for b in (flat.low, flat.high))
        self.observation_space = spaces.Box(low, high, shape=low.shape, dtype=np.float32)

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


def _check_actions(env: gymnasium.Env, env_id: str) -> gymnasium.Env:
    """MultiDiscrete flattened into one Discrete; Discrete and Box passed; anything else refused (``action_kind``)."""
    if isinstance(env.action_space, spaces.MultiDiscrete):
        env = _FlatMultiDiscreteAction(env)
    action_kind(env.action_space, env_id)
    return env


class _DictMiniGrid(gymnasium.ObservationWrapper):
    """MiniGrid's dict observation without the mission text: ``{"image": channels-first uint8, "direction"}``."""

    def __init__(self, env):
        super().__init__(env)
        h, w, c = env.observation_space["image"].shape
        self.observation_space = spaces.Dict(
            {"image": spaces.Box(0, 255, shape=(c, h, w), dtype=np.uint8), "direction": spaces.Discrete(4)}
        )

    def observation(self, obs):
        image = np.ascontiguousarray(np.transpose(obs["image"], (2, 0, 1)), dtype=np.uint8)
        return {"image": image, "direction": int(obs["direction"])}


def vectorize(
    env_fns: list[Callable[[], gymnasium.Env]],
    *,
    seed: int,
    env_id: str,
    vectorization: str = "sync",
    **metadata: Any,
) -> SameStepEnv:
    """Batch single envs with SAME_STEP autoreset and wrap them with the onlinerec contract (``metadata`` may hold
    :class:`~onlinerec.rl.envs.base.SameStepEnv`'s ``end_fn`` and extra metadata such as ``frames_per_step``).

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


def make_gymnasium(
    name: str,
    num_envs: int,
    seed: int = 0,
    *,
    vectorization: str = "sync",
    wrappers: Sequence[WrapperSpec] | None = None,
    **make_kwargs,
):
    """Any registered gymnasium env (``gymnasium.make(name, **make_kwargs)``, then ``wrappers``): observations
    unchanged, Discrete/MultiDiscrete/Box actions (see the module docstring)."""
    wrappers = check_wrappers(wrappers)
    env_id = f"gymnasium:{name}"

    def fn():
        return _check_actions(apply_wrappers(gymnasium.make(name, **make_kwargs), wrappers), env_id)

    try:
        fn().close()  # fail early, in this process, on a bad id or action space
    except (gymnasium.error.UnregisteredEnv, gymnasium.error.DeprecatedEnv) as err:  # a misspelt id or version
        raise ValueError(
            f"unknown gymnasium env {env_id!r}: {err} (every registered id: python -c 'import gymnasium; "
            "gymnasium.pprint_registry()')"
        ) from err
    except gymnasium.error.DependencyNotInstalled as err:
        # gymnasium's own hint would fetch mujoco 4, which has no engine
        if "mujoco" in str(gymnasium.spec(NO_VELOCITY_ENVS.get(name, name)).entry_point):
            raise MissingBackendError(f"{env_id} needs MuJoCo, which is not installed. Fix: {MUJOCO_INSTALL}") from err
        raise MissingBackendError(f"{env_id} needs a package that is not installed: {err}") from err
    return vectorize([fn] * num_envs, seed=seed, env_id=env_id, vectorization=vectorization)


def did_you_mean(name: str, candidates: Sequence[str]) -> str:
    """A hint naming the closest of ``candidates`` to a misspelt name (empty when none is close); the env adapters and
    the memory suite's command line use it."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _popgym_class(name: str):
    try:
        import popgym.envs as penvs
    except ImportError as e:
        raise MissingBackendError(f"POPGym envs need popgym: {MEMORY_INSTALL}") from e
    names = sorted(c.__name__ for c in penvs.ALL)
    if name not in names:
        raise ValueError(f"unknown POPGym env {name!r}{did_you_mean(name, names)}; available: {', '.join(names)}")
    return getattr(penvs, name)


def make_popgym(
    name: str,
    num_envs: int,
    seed: int = 0,
    *,
    vectorization: str = "sync",
    wrappers: Sequence[WrapperSpec] | None = None,
    prev_action: bool | None = None,
    **env_kwargs,
):
    """``popgym:<Env>`` with flattened float32 observations (see the module docstring).

    ``prev_action``: append the action just taken to each observation (POPGym's ``PreviousAction`` wrapper; a reset
    observation carries action 0). None: as the env declares (``obs_requires_prev_action``: MultiarmedBandit,
    Concentration, Battleship, MineSweeper, LabyrinthEscape/Explore), whose observation alone does not say which
    action paid or which cell was probed, so without it the task cannot be learned."""
    cls = _popgym_class(name)
    env_id = f"popgym:{name}"
    wrappers = check_wrappers(wrappers)
    if prev_action is None:
        prev_action = bool(getattr(cls, "obs_requires_prev_action", False))

    def fn():
        try:
            env = cls(**env_kwargs)
        except TypeError as e:
            import inspect

            takes = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
            raise ValueError(  # a bad setting, reported as one line by the CLI
                f"{unexpected_env_kwargs(env_id, env_kwargs, e)} The env takes {takes or 'no arguments'}, and "
                "onlinerec adds prev_action, wrappers and vectorization."
            ) from e
        if prev_action:
            from popgym.wrappers import PreviousAction

            env = PreviousAction(env)
        return _FlatObs(_check_actions(apply_wrappers(env, wrappers), env_id))

    fn().close()
    return vectorize([fn] * num_envs, seed=seed, env_id=env_id, vectorization=vectorization)


def make_minigrid(
    name: str,
    num_envs: int,
    seed: int = 0,
    *,
    pixels: bool = False,
    tile_size: int = 8,
    dict_obs: bool = False,
    vectorization: str = "sync",
    wrappers: Sequence[WrapperSpec] | None = None,
    **make_kwargs,
):
    """MiniGrid (e.g. ``MiniGrid-MemoryS7-v0``): channels-first uint8 partial view, or with ``dict_obs`` the view
    and the agent's direction as a Dict (see the module docstring)."""
    wrappers = check_wrappers(wrappers)
    try:
        import minigrid  # noqa: F401  (registers the MiniGrid-* ids)
        from minigrid.wrappers import ImgObsWrapper, RGBImgPartialObsWrapper
    except ImportError as e:
        raise MissingBackendError(f"MiniGrid envs need minigrid: {MEMORY_INSTALL}") from e
    if name not in gymnasium.registry:
        known = sorted(k for k in gymnasium.registry if k.startswith("MiniGrid-Memory"))
        minigrid_ids = [k for k in gymnasium.registry if k.startswith("MiniGrid-")]
        raise ValueError(
            f"unknown MiniGrid env {name!r}{did_you_mean(name, minigrid_ids)}; memory tasks: {', '.join(known)}"
        )

    def fn():
        env = apply_wrappers(gymnasium.make(name, **make_kwargs), wrappers)
        if pixels:
            env = RGBImgPartialObsWrapper(env, tile_size=tile_size)
        env = _check_actions(env, name)
        return _DictMiniGrid(env) if dict_obs else _ChannelsFirst(ImgObsWrapper(env))

    fn().close()
    return vectorize([fn] * num_envs, seed=seed, env_id=name, vectorization=vectorization)
