"""Reinforcement learning with online recurrent learning: R2AC, V-trace, rollouts, vision stems, env adapters.

``onlinerec.rl.envs`` (imported on first use) turns env ids such as "ALE/Qbert-v5", "procgen:chaser",
"dmlab:rooms_watermaze" or "memory:tmaze" into gymnasium vector envs. The names below are imported on first use too,
so that ``onlinerec rl --help`` and the experiment's settings work without gymnasium (``pip install -e .``), and a run
without it says which extra to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from onlinerec.rl.nets import STEMS, ImpalaStem, MLPStem, NatureStem, make_stem
from onlinerec.rl.r2ac_config import R2ACConfig
from onlinerec.rl.segment import RolloutSegment
from onlinerec.rl.vtrace import vtrace

if TYPE_CHECKING:  # imported on first use: they need gymnasium
    from onlinerec.rl.actor import Actor, RolloutStream
    from onlinerec.rl.datamodule import RolloutDataModule
    from onlinerec.rl.r2ac import R2AC

_LAZY = {"Actor": "actor", "RolloutStream": "actor", "RolloutDataModule": "datamodule", "R2AC": "r2ac", "envs": "envs"}

__all__ = [
    "R2AC",
    "STEMS",
    "Actor",
    "ImpalaStem",
    "MLPStem",
    "NatureStem",
    "R2ACConfig",
    "RolloutDataModule",
    "RolloutSegment",
    "RolloutStream",
    "envs",
    "make_stem",
    "vtrace",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'onlinerec.rl' has no attribute {name!r}")
    module = importlib.import_module(f"onlinerec.rl.{_LAZY[name]}")
    value = module if name == "envs" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
