"""Evaluation: play real episodes with an agent's current weights, greedy (argmax) by default."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from onlinerec.rl.envs.base import ensure_contract

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(
    agent: Any,
    env: Any,
    num_episodes: int = 10,
    *,
    greedy: bool = True,
    max_steps: int | None = None,
    stream: str = "eval",
) -> dict[str, Any]:
    """Play ``num_episodes`` real episodes of ``env`` (a vector env) with ``agent.act``; return their statistics.

    The streams share the episodes: each env contributes ``ceil(num_episodes / num_envs)`` at most, so short episodes
    do not crowd out long ones. The agent carries its own state under ``stream`` (forgotten before and after).
    ``max_steps`` caps the agent steps (per env); the episodes finished by then are reported, and ``truncated`` says
    whether the cap cut the evaluation short. Episode statistics are the env's (``info["episode_return"]`` where
    ``info["episode_end"]``: whole games, not lives; see :func:`~onlinerec.rl.envs.base.ensure_contract`).

    Returns:
        ``{"mean", "std", "returns", "lengths", "truncated"}`` (mean and std NaN if no episode finished).
    """
    if num_episodes < 1:
        raise ValueError("num_episodes must be >= 1")
    env = ensure_contract(env)
    was_training = agent.training
    agent.eval()
    agent.reset_streams(stream)
    device = agent.device
    n = int(env.num_envs)
    quota = np.full(n, math.ceil(num_episodes / n))
    obs, _ = env.reset()
    reward = np.zeros(n, dtype=np.float32)
    reset = np.ones(n, dtype=bool)
    returns: list[float] = []
    lengths: list[int] = []
    step = 0
    try:
        while len(returns) < num_episodes and (max_steps is None or step < max_steps):
            step += 1
            actions, _ = agent.act(
                _tensor(obs, device),
                torch.as_tensor(reward, dtype=torch.float32, device=device),
                torch.as_tensor(reset, device=device),
                greedy=greedy,
                stream=stream,
            )
            obs, reward, terminated, truncated, info = env.step(actions.cpu().numpy())
            reward = np.asarray(reward, dtype=np.float32)
            reset = np.logical_or(terminated, truncated)
            for i in np.flatnonzero(info["episode_end"]):
                if quota[i] > 0 and len(returns) < num_episodes:
                    quota[i] -= 1
                    returns.append(float(info["episode_return"][i]))
                    lengths.append(int(info["episode_length"][i]))
    finally:
        agent.reset_streams(stream)
        agent.train(was_training)
    arr = np.asarray(returns, dtype=np.float64)
    mean, std = (float(arr.mean()), float(arr.std())) if len(arr) else (float("nan"), float("nan"))
    return {"mean": mean, "std": std, "returns": returns, "lengths": lengths, "truncated": len(returns) < num_episodes}


def _tensor(obs: Any, device: torch.device) -> Any:
    """A batched observation (an array, or a dict of arrays) as tensors on ``device``."""
    if isinstance(obs, dict):
        return {k: _tensor(v, device) for k, v in obs.items()}
    return torch.as_tensor(np.asarray(obs), device=device)
