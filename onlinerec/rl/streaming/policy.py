"""The streaming agent's policy without learning: B streams acting with fixed weights and frozen normalisers, for the
final evaluation (``onlinerec.rl.evaluation.evaluate``) and for export."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from onlinerec.gradients import TBPTT

__all__ = ["EvaluationActor"]


class EvaluationActor:
    """``agent``'s actor network acting on B streams of its own, without gradients or sensitivities (the interface
    :func:`~onlinerec.rl.evaluation.evaluate` drives): each stream keeps the core's state only, observations are
    normalised with the statistics training left (not updated)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.net = agent.actor
        self.carries: dict[str, Any] = {}

    @property
    def training(self) -> bool:
        return self.agent.training

    def train(self, mode: bool = True) -> EvaluationActor:
        self.agent.train(mode)
        return self

    def eval(self) -> EvaluationActor:
        return self.train(False)

    @property
    def device(self) -> torch.device:
        return self.agent.running_return.device

    def reset_streams(self, stream: str) -> None:
        self.carries.pop(stream, None)

    def env_actions(self, actions: Tensor) -> Tensor:
        return self.net.head.env_actions(actions)

    @torch.no_grad()
    def act(self, obs: Tensor, reward: Tensor, reset: Tensor, greedy: bool = True, stream: str = "eval"):
        """Actions for a batch of observations (B, ...): the most likely (``greedy``) or sampled."""
        x = obs.reshape(obs.shape[0], -1).float()
        if self.agent.obs_norm is not None:
            x = self.agent.obs_norm(x)
        carry = self.carries.get(stream)
        if carry is None and self.net.core is not None:
            carry = TBPTT().init_carry(self.net.core, x.shape[0])
        params, self.carries[stream] = self.net.step(x, reset.bool(), carry, TBPTT())
        head = self.net.head
        return (head.mode(params) if greedy else head.sample(params)), params
