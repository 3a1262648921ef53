"""The streaming agent's policy without learning: B streams acting with fixed weights and frozen normalisers, for the
final evaluation (:class:`EvaluationActor`, driven by ``onlinerec.rl.evaluation.evaluate``) and as a TorchScript file
(:func:`export_stream_policy`, the same interface as ``R2AC.export``'s)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from onlinerec.gradients import TBPTT
from onlinerec.rl.streaming.network import action_features

__all__ = ["EvaluationActor", "export_stream_policy"]


class EvaluationActor:
    """``agent``'s actor network acting on B streams of its own, without gradients or sensitivities (the interface
    :func:`~onlinerec.rl.evaluation.evaluate` drives): each stream keeps the core's state only, observations are
    normalised with the statistics training left (not updated)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.net = agent.actor
        self.carries: dict[str, Any] = {}
        self.previous_actions: dict[str, Tensor] = {}  # each stream's last action, as the core reads it

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
        self.previous_actions.pop(stream, None)

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
        extra, head = None, self.net.head
        if self.agent.extra_size:
            previous = self.previous_actions.get(stream)
            if previous is None:
                previous = x.new_zeros(x.shape[0], self.agent.extra_size - 1)
            extra = previous_inputs(self.agent.return_norm, previous, reward, reset)
        params, self.carries[stream] = self.net.step(x, reset.bool(), carry, TBPTT(), extra)
        actions = head.mode(params) if greedy else head.sample(params)
        if self.agent.extra_size:
            self.previous_actions[stream] = action_features(head, actions, x.dtype)
        return actions, params


def previous_inputs(return_norm: nn.Module | None, previous: Tensor, reward: Tensor, reset: Tensor) -> Tensor:
    """The core's extra inputs for B streams acting with fixed weights: each stream's previous action features (B, F)
    and the reward that came with this observation, divided by the return's std as in training (``return_norm``);
    zeros where ``reset`` marks an episode's first step."""
    r = reward.reshape(-1, 1).to(previous.dtype)
    if return_norm is not None:
        r = r / return_norm.std.to(previous.dtype)
    return torch.cat([previous, r], dim=-1) * (~reset.bool()).unsqueeze(-1).to(previous.dtype)


class _Step(nn.Module):
    """One step of a copy of the agent's actor: (obs, reward, reset, state) -> (action or parameters, new state)."""

    def __init__(self, agent: Any, output: str, greedy: bool, template: Any) -> None:
        super().__init__()
        self.net, self.obs_norm, self.return_norm = agent.actor, agent.obs_norm, agent.return_norm
        self.extra_size = agent.extra_size
        self.template, self.output, self.greedy = template, output, greedy

    def forward(self, obs: Tensor, reward: Tensor, reset: Tensor, state: list[Tensor]):
        from onlinerec.rl.export import flatten_carry, unflatten_carry

        x = obs.reshape(obs.shape[0], -1).float()
        if self.obs_norm is not None:
            x = self.obs_norm(x)
        carry = None if self.template is None else unflatten_carry(self.template, state, 0)[0]
        extra = previous_inputs(self.return_norm, state[-1], reward, reset) if self.extra_size else None
        params, carry = self.net.step(x, reset, carry, TBPTT(), extra)
        new_state = [state[0]] if carry is None else flatten_carry(carry)
        if self.output == "params":
            return params, new_state
        head = self.net.head
        actions = head.mode(params) if self.greedy else head.sample(params)
        if self.extra_size:  # the state ends with this step's action, which the next step reads
            new_state.append(action_features(head, actions, x.dtype))
        return head.env_actions(actions), new_state


def export_stream_policy(agent: Any, path: str | Path, *, output: str = "action", greedy: bool = True) -> Path:
    """Write the streaming agent's policy (its actor network and observation normaliser) as a TorchScript file that
    loads with torch alone: ``policy.initial_state(B)``, then ``action, state = policy(obs, reset, state, reward)`` per
    step (``output="params"``: the distribution's parameters; ``greedy=False``: sampled actions). ``reward`` is the
    reward that came with ``obs``, which a policy with ``prev_action_reward`` reads (its state also keeps its last
    action); other policies ignore it. The agent is not
    modified (a copy goes to the CPU)."""
    from onlinerec.rl.export import flatten_carry, write_policy

    if output not in ("action", "params"):
        raise ValueError(f"output must be 'action' or 'params', got {output!r}.")
    if output == "params" and agent.extra_size:
        raise ValueError(
            "this policy reads its previous action (prev_action_reward), which it cannot know when it gives only the "
            "distribution's parameters; export it with output='action'."
        )
    model = copy.deepcopy(agent).cpu().eval()
    model.requires_grad_(False)
    dtype = next(model.parameters()).dtype
    core = model.actor.core
    template = None if core is None else TBPTT().init_carry(core, 1, device="cpu", dtype=dtype)
    shapes = [[0]] if template is None else [list(t.shape[1:]) for t in flatten_carry(template)]
    if model.extra_size:
        shapes.append([model.extra_size - 1])  # the previous action's features
    step = _Step(model, output, greedy, template).eval()
    metadata = {
        "format": "onlinerec streaming policy v1",
        "output": output,
        "greedy": greedy,
        "obs_size": model.obs_size,
    }
    return write_policy(step, torch.zeros(2, model.obs_size), shapes, dtype, metadata, path)
