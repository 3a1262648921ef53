"""Action and observation spaces: gymnasium spaces as plain data, and what an agent reads from them.

:func:`space_spec` / :func:`space_from_spec` turn a space into a dict of plain values and back; checkpoints and exported
policies store spaces that way (plain types only, so checkpoints load weights-only). From an env's spaces,
:func:`resolve_action_spec` and :func:`resolve_observation_spec` give what R2AC builds its policy head and stem for,
:func:`unit_bounded_features` the features that ``obs_norm_skip_binary`` leaves alone, and
:func:`check_agent_fits_env` refuses an agent built for other spaces than an env's
(docs/r2ac.md#action-and-observation-spaces).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "check_agent_fits_env",
    "is_space",
    "resolve_action_spec",
    "resolve_observation_spec",
    "space_from_spec",
    "space_spec",
    "unit_bounded_features",
]


# -- spaces as plain data ---------------------------------------------------------------------------------------
def _bound(values: Any) -> float | list[float]:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.size and np.all(arr == arr[0]):
        return float(arr[0])
    return [float(v) for v in arr]


def space_spec(space: Any) -> dict[str, Any]:
    """A gymnasium space as a dict of plain Python values (JSON/YAML-able, loadable with ``weights_only=True``).

    ``{"type": "Discrete", "n", "start"}``, ``{"type": "Box", "shape", "low", "high", "dtype"}`` (a bound that is
    the same everywhere is one float), ``{"type": "MultiDiscrete", "nvec"}``, ``{"type": "MultiBinary", "shape"}``,
    ``{"type": "Text", "min_length", "max_length", "charset"}`` (another space whose samples are strings, as
    MiniGrid's ``MissionSpace``: ``{"type": "Text", "space": its class name}``), ``{"type": "Dict", "spaces": {key: spec}}``, ``{"type": "Tuple",
    "spaces": [spec, ...]}``. A dict with a ``"type"`` is returned as it is.
    """
    if isinstance(space, dict) and "type" in space:
        return space
    import gymnasium

    spaces = gymnasium.spaces
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "shape": [int(s) for s in space.shape],
            "low": _bound(space.low),
            "high": _bound(space.high),
            "dtype": np.dtype(space.dtype).name,
        }
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).astype(int).tolist()}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "shape": [int(s) for s in np.atleast_1d(space.shape)]}
    if isinstance(space, spaces.Text):
        return {
            "type": "Text",
            "min_length": int(space.min_length),
            "max_length": int(space.max_length),
            "charset": "".join(sorted(space.character_set)),
        }
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {str(k): space_spec(v) for k, v in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_spec(v) for v in space.spaces]}
    if isinstance(space, spaces.Space) and isinstance(space.sample(), str):  # e.g. MiniGrid's MissionSpace
        return {"type": "Text", "space": type(space).__name__}
    raise ValueError(
        f"unsupported space {space!r}: onlinerec takes Discrete, Box, MultiDiscrete, MultiBinary, Text, Dict and Tuple."
    )


def space_from_spec(spec: dict[str, Any]) -> Any:
    """The gymnasium space of a :func:`space_spec` dict."""
    import gymnasium

    spaces = gymnasium.spaces
    kind = spec["type"]
    if kind == "Discrete":
        return spaces.Discrete(spec["n"], start=spec.get("start", 0))
    if kind == "Box":
        shape = tuple(spec["shape"])
        dtype = np.dtype(spec["dtype"])  # bounds in the space's own dtype: they came from it, so the cast is exact
        low = np.asarray(spec["low"], dtype=dtype).reshape(shape if isinstance(spec["low"], list) else ())
        high = np.asarray(spec["high"], dtype=dtype).reshape(shape if isinstance(spec["high"], list) else ())
        return spaces.Box(np.broadcast_to(low, shape), np.broadcast_to(high, shape), shape, dtype=spec["dtype"])
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(spec["nvec"])
    if kind == "MultiBinary":
        return spaces.MultiBinary(spec["shape"])
    if kind == "Text":
        kwargs = {"min_length": spec.get("min_length", 1)}
        if "charset" in spec:
            kwargs["charset"] = spec["charset"]
        return spaces.Text(spec.get("max_length", 256), **kwargs)
    if kind == "Dict":
        return spaces.Dict({k: space_from_spec(v) for k, v in spec["spaces"].items()})
    if kind == "Tuple":
        return spaces.Tuple([space_from_spec(v) for v in spec["spaces"]])
    raise ValueError(f"unknown space type {kind!r}")


# -- what an agent reads from them -------------------------------------------------------------------------
def is_space(value: Any) -> bool:
    """Whether ``value`` is a gymnasium space (not None, not a :func:`space_spec` dict)."""
    return value is not None and not isinstance(value, dict) and hasattr(value, "sample")


def resolve_action_spec(num_actions: int | None, action_space: Any) -> dict[str, Any]:
    """The action space's :func:`space_spec`, from ``action_space`` or, for a Discrete action set, ``num_actions``
    (given both, they must agree)."""
    if action_space is None:
        if num_actions is None:
            raise ValueError("R2AC needs num_actions (a Discrete action set) or action_space= (e.g. a Box).")
        return {"type": "Discrete", "n": int(num_actions), "start": 0}
    spec = space_spec(action_space)
    if num_actions is not None and (spec["type"] != "Discrete" or int(spec["n"]) != int(num_actions)):
        raise ValueError(f"num_actions={num_actions} contradicts action_space={spec}; pass one of them.")
    return spec


def resolve_observation_spec(
    obs_shape: Sequence[int] | None, observation_space: Any
) -> tuple[dict[str, Any] | None, tuple[int, ...] | None]:
    """(spec, shape) of the observations: the :func:`space_spec` of ``observation_space`` (None without one) and
    the array shape (``obs_shape``, or the Box's shape; None for Dict/Tuple and other non-Box observations). Given
    both, they must agree."""
    if observation_space is None:
        if obs_shape is None:
            raise ValueError("R2AC needs obs_shape (array observations) or observation_space= (e.g. a Dict).")
        return None, tuple(int(s) for s in obs_shape)
    spec = space_spec(observation_space)
    if spec["type"] != "Box":
        if obs_shape is not None:
            raise ValueError(f"obs_shape={tuple(obs_shape)} given for a {spec['type']} observation space; drop it.")
        return spec, None
    shape = tuple(int(s) for s in spec["shape"])
    if obs_shape is not None and tuple(int(s) for s in obs_shape) != shape:
        raise ValueError(f"obs_shape={tuple(obs_shape)} contradicts observation_space's shape {shape}.")
    return spec, shape


def unit_bounded_features(obs_spec: dict[str, Any] | None, shape: tuple[int, ...]) -> Tensor:
    """The features a Box observation space bounds to exactly [0, 1] (``R2ACConfig.obs_norm_skip_binary``)."""
    if obs_spec is None:
        raise ValueError(
            "R2ACConfig.obs_norm_skip_binary reads the observation space's bounds, but this R2AC was built from "
            "obs_shape alone: build it with observation_space= (R2AC.from_spaces), or set obs_norm_skip_binary=False."
        )
    space = space_from_spec(obs_spec)  # the one reader of the spec's bounds (a scalar or one per feature)
    return torch.from_numpy((space.low == 0) & (space.high == 1)).reshape(shape)


# -- an agent against an env -------------------------------------------------------------------------------
def check_agent_fits_env(agent: Any, env: Any) -> None:
    """Refuse an agent built for other actions or observations than ``env``'s (one stream's spaces).

    Reads, where the agent has them (R2AC does): ``agent.action_space`` (a gymnasium space, compared with the env's
    ``single_action_space``), else ``agent.num_actions`` (a Discrete env's ``n``) or ``agent.action_dim`` (a Box env's
    flat size); ``agent.observation_space`` (compared with ``single_observation_space``), else ``agent.obs_shape``.
    An action space onlinerec cannot act in (e.g. a Tuple mixing Discrete and Box) is refused whatever the agent.
    """
    import gymnasium

    from onlinerec.rl.envs.base import action_kind

    env_name = (getattr(env, "metadata", None) or {}).get("env_id") or type(env).__name__
    fix = "build the agent from the env's spaces: RolloutDataModule(...).spaces() returns (observation_space, action_space, _)"
    space = getattr(env, "single_action_space", None)
    kind = action_kind(space, env_name) if space is not None else None
    want_space = getattr(agent, "action_space", None)
    if isinstance(want_space, gymnasium.Space) and space is not None and want_space != space:
        raise ValueError(f"the agent acts in {want_space} but {env_name} has action space {space}: {fix}.")
    want = getattr(agent, "num_actions", None)
    have = getattr(space, "n", None) if kind == "discrete" else None
    if want is not None and kind == "continuous":
        raise ValueError(
            f"the agent has num_actions = {int(want)} (a categorical policy) but {env_name} has continuous actions "
            f"{space}: {fix}, with a Gaussian policy."
        )
    if want is not None and have is not None and int(want) != int(have):
        raise ValueError(
            f"the agent has num_actions = {int(want)} but {env_name} has {int(have)} actions (single_action_space.n): "
            f"{fix}, e.g. R2AC(num_actions={int(have)}, ...)."
        )
    want_dim = getattr(agent, "action_dim", None)
    if want_dim is not None and space is not None:
        if kind != "continuous":
            raise ValueError(
                f"the agent has action_dim = {int(want_dim)} (a Gaussian policy) but {env_name} has {space}: {fix}."
            )
        if int(want_dim) != int(np.prod(space.shape)):
            raise ValueError(
                f"the agent has action_dim = {int(want_dim)} but {env_name}'s actions {space} have "
                f"{int(np.prod(space.shape))} dimensions: {fix}."
            )
    want_obs = getattr(agent, "observation_space", None)
    have_obs = getattr(env, "single_observation_space", None)
    if isinstance(want_obs, gymnasium.Space) and have_obs is not None and want_obs != have_obs:
        raise ValueError(f"the agent expects observations {want_obs} but {env_name} gives {have_obs}: {fix}.")
    want_shape = getattr(agent, "obs_shape", None)
    have_shape = getattr(have_obs, "shape", None)
    if want_shape is not None and have_shape is not None and tuple(want_shape) != tuple(have_shape):
        raise ValueError(
            f"the agent's stem expects observations of shape obs_shape = {tuple(want_shape)} but {env_name} gives "
            f"{tuple(have_shape)}: {fix}, e.g. R2AC(..., obs_shape={tuple(have_shape)})."
        )
