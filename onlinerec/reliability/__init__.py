"""Reliability: env workers that survive crashes and hangs (the NaN guard and stream-order checks live in
:mod:`onlinerec.callbacks`; atomic, weights-only checkpoints in :mod:`onlinerec.checkpoint`)."""

from onlinerec.reliability.resilient_env import EnvRestart, ResilientVectorEnv

__all__ = ["EnvRestart", "ResilientVectorEnv"]
