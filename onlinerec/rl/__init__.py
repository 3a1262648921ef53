"""Reinforcement learning with online recurrent learning: R2AC, V-trace, rollouts, vision stems, env adapters.

``onlinerec.rl.envs`` (imported on first use) turns env ids such as "ALE/Qbert-v5", "procgen:chaser",
"dmlab:rooms_watermaze" or "memory:tmaze" into gymnasium vector envs.
"""

from __future__ import annotations

import importlib
from typing import Any

from onlinerec.rl.actor import Actor, RolloutStream
from onlinerec.rl.datamodule import RolloutDataModule
from onlinerec.rl.nets import STEMS, ImpalaStem, MLPStem, NatureStem, make_stem
from onlinerec.rl.r2ac import R2AC
from onlinerec.rl.r2ac_config import R2ACConfig
from onlinerec.rl.segment import RolloutSegment
from onlinerec.rl.vtrace import vtrace

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
    if name == "envs":  # lazy: the env adapters pull optional backends
        return importlib.import_module("onlinerec.rl.envs")
    raise AttributeError(f"module 'onlinerec.rl' has no attribute {name!r}")
