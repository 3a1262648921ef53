"""A check at the start of a run: do a factory's streams differ at all?

A factory ``(num_envs, seed) -> VectorEnv`` whose envs ignore the seed they are given (each draws from a generator
of its own with a fixed seed, or every stream gets the same seed) replays the same episodes in every stream, and
nothing else notices: B streams then teach no more than one. :func:`warn_if_streams_identical` builds a second copy
of the env, steps it with different random actions in each stream, and warns once per factory if every stream
showed the same observations throughout. The copy is closed afterwards, and the random number generators of
``random``, numpy and torch are restored, so the run's own env and results are those without the check.
"""

from __future__ import annotations

import copy
import random
import sys
import warnings
from typing import Any, Callable

import numpy as np

__all__ = ["warn_if_streams_identical"]

CHECK_STEPS = 16
"""Steps after the first observation that the check compares (it stops at the first difference)."""

_CHECKED: set[Any] = set()  # the factories checked in this process: each once


def warn_if_streams_identical(make: Callable[[], Any], num_envs: int, name: str, key: Any) -> bool:
    """Warn (once per ``key``) if the ``num_envs`` streams of a fresh env from ``make()`` (the factory's env, adapted
    to the contract) show identical observations at reset and for :data:`CHECK_STEPS` steps of random actions, drawn
    separately for each stream. Returns whether it warned. Side-effect free: see the module docstring."""
    if num_envs < 2 or key in _CHECKED:
        return False
    _CHECKED.add(key)
    saved = _rng_states()
    try:
        identical = _identical_streams(make, num_envs)
    except Exception:  # noqa: BLE001 - the check never stops a run: the real env reports its own errors
        identical = False
    finally:
        _restore_rng_states(saved)
    if identical:
        warnings.warn(
            f"The {num_envs} streams of {name} showed identical observations at reset and for {CHECK_STEPS} steps of "
            "different random actions in each: the streams most likely ignore the seed they are given, so every "
            f"stream replays the same episodes and {num_envs} streams teach no more than one. The factory is called as "
            "factory(num_envs, seed): give stream i a seed of its own (onlinerec.rl.envs.stream_seed(seed, i)), or "
            "let each env draw its randomness from self.np_random, which reset(seed=...) reseeds (onlinerec then "
            "seeds stream i with stream_seed(seed, i)), instead of a generator with a fixed seed. An env whose "
            "observations involve no randomness at all looks the same; its streams are fine as they are.",
            stacklevel=4,
        )
    return identical


def _identical_streams(make: Callable[[], Any], num_envs: int) -> bool:
    env = make()
    try:
        obs, _ = env.reset()
        if not _same_rows(obs, num_envs):
            return False
        space = copy.deepcopy(env.single_action_space)
        space.seed(0)  # its own generator: the check draws nothing from the global ones
        for _ in range(CHECK_STEPS):
            actions = np.stack([np.asarray(space.sample()) for _ in range(num_envs)])
            obs, *_ = env.step(actions)
            if not _same_rows(obs, num_envs):
                return False
        return True
    finally:
        env.close()


def _same_rows(obs: Any, num_envs: int) -> bool:
    """Whether every stream's observation equals stream 0's (arrays, or dicts / tuples of arrays)."""
    if isinstance(obs, dict):
        return all(_same_rows(v, num_envs) for v in obs.values())
    if isinstance(obs, tuple):
        return all(_same_rows(v, num_envs) for v in obs)
    rows = np.asarray(obs)
    return all(np.array_equal(rows[0], rows[i]) for i in range(1, num_envs))


def _rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {"random": random.getstate(), "numpy": np.random.get_state()}
    torch = sys.modules.get("torch")
    if torch is not None:
        states["torch"] = torch.random.get_rng_state()
    return states


def _restore_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["random"])
    np.random.set_state(states["numpy"])
    if "torch" in states:
        sys.modules["torch"].random.set_rng_state(states["torch"])
