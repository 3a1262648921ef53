"""Streaming RL with exact RTRL: stream AC(lambda) whose recurrent core learns from every env step as it comes
(batch size 1, no replay), through the carried RTRL sensitivities (docs/streaming.md).

- :class:`StreamAC` (``agent.py``): the agent, one env stream; :class:`StreamACConfig` (``config.py``): its settings.
- :class:`ObGD` (``obgd.py``): the optimiser with eligibility traces and the overshooting bound.
- ``network.py``: the actor's and the critic's networks; ``policy.py``: acting without learning (evaluation).
- ``experiment.py``, ``runner.py``: ``onlinerec stream``, a run from a YAML config.
"""

from onlinerec.rl.streaming.config import StreamACConfig
from onlinerec.rl.streaming.obgd import ObGD

__all__ = ["ObGD", "StreamAC", "StreamACConfig"]


def __getattr__(name: str):
    if name == "StreamAC":  # needs gymnasium (the action heads' spaces): imported on first use
        from onlinerec.rl.streaming.agent import StreamAC

        return StreamAC
    raise AttributeError(f"module 'onlinerec.rl.streaming' has no attribute {name!r}")
