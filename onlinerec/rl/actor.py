"""The actor: what a rollout needs from the agent (:class:`Actor`), and env streams acted in to make segments.

Acting and the learner's carried state (learner-carried sensitivities; docs/r2ac.md#actor-and-learner-timing). Acting
runs in the training process on the module's *current* weights, one agent step at a time, under ``no_grad``: the
module's ``act`` step advances its own carried state under the stream name ``"act"`` (c only, no sensitivities). Per
segment the actor processes entries 0 .. M-1 (each to choose the action that produces the next entry); entry M is only
observed. The learner then unrolls the same entries 0 .. M-1 from its own ``"train"`` carry, with the same weights (the
update comes after), so its carry at the segment end is the actor's state after entry M-1 — exactly the state from which
the next segment's entry 0 (= this entry M) is processed, by both. Entry M's bootstrap value is computed from that carry
without gradient and without storing the result. By induction the two carries stay equal (up to float rounding), and the
learner's RTRL sensitivities are exact for the weights in use. ``RolloutDataModule(async_actor=True)`` gives this up for
speed: a copy of the agent acts on a background thread with weights one update old, while the learner trains on the
previous segment.

:class:`RolloutStream` steps B env streams with an :class:`Actor` and returns consecutive
:class:`~onlinerec.rl.segment.RolloutSegment` s; :func:`actor_copy` and :class:`BackgroundActor` act on a background
thread (``async_actor``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from onlinerec.rl.envs.base import ensure_contract
from onlinerec.rl.policy import ActionHead, CategoricalHead
from onlinerec.rl.segment import RolloutSegment, obs_to_tensor, stack_tree, tree_map
from onlinerec.rl.spaces import check_agent_fits_env

__all__ = ["Actor", "BackgroundActor", "RolloutStream", "action_head_of", "actor_copy"]


@runtime_checkable
class Actor(Protocol):
    """What a rollout needs from the agent (R2AC implements it)."""

    def act(
        self, obs: Tensor, reward: Tensor, reset: Tensor, *, greedy: bool = False, stream: str = "act"
    ) -> tuple[Tensor, Tensor]:
        """One agent step for B streams: obs (B, ...) (or a flat dict of such tensors for Dict/Tuple observations),
        last reward (B,), reset (B,) bool (obs starts an episode: zero the carried state first) -> (actions,
        distribution parameters (B, P)). Discrete: actions (B,) int64 and logits (B, A). Advances the carried state
        of ``stream``; runs without gradient.

        An agent with continuous actions also has ``action_head`` (:class:`~onlinerec.rl.policy.ActionHead`: the
        rollout reads log-probs from it) and ``env_actions(actions)`` (what the env is sent); without them the
        actions are sent as they are and scored as a softmax over the parameters.

        An agent whose ``bootstraps_truncation`` is True also has ``truncation_values(obs, reward) -> (B,)``: its
        value of observations that follow its last ``act`` step (used for the final observation of episodes cut by a
        time limit, :class:`RolloutSegment`'s ``truncation_value``), without advancing its state."""
        ...


def _row(obs: Any, i: int) -> Any:
    """Stream ``i`` of a batched observation (an array, or a dict / tuple of them)."""
    if isinstance(obs, dict):
        return {k: _row(v, i) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_row(v, i) for v in obs)
    return obs[i]


def _stack_rows(rows: list[Any]) -> Any:
    """One batched observation from per-stream ones (the inverse of :func:`_row`)."""
    if isinstance(rows[0], dict):
        return {k: _stack_rows([r[k] for r in rows]) for k in rows[0]}
    if isinstance(rows[0], tuple):
        return tuple(_stack_rows([r[j] for r in rows]) for j in range(len(rows[0])))
    return np.stack([np.asarray(r) for r in rows])


def action_head_of(agent: Any, action_space: Any) -> ActionHead:
    """The agent's ``action_head`` (log-probs of its actions); for an agent without one, a softmax over its
    parameters (Discrete action spaces only)."""
    head = getattr(agent, "action_head", None)
    if isinstance(head, ActionHead):
        return head
    n = getattr(action_space, "n", None)
    if n is None:
        raise ValueError(
            f"{type(agent).__name__} has no action_head, so its actions are scored as a softmax over Discrete actions, "
            f"but the env's action space is {action_space}. Give the agent an action_head (onlinerec.rl.policy)."
        )
    return CategoricalHead(1, int(n))


class RolloutStream:
    """B env streams and the last entry of each, producing consecutive :class:`RolloutSegment` s.

    Args:
        env: a vector env (SAME_STEP autoreset: when an episode ends at a step, that step's observation is
            the next episode's first and ``terminated | truncated`` is True).
        agent: the :class:`Actor` (called under ``no_grad`` with tensors on ``device``); its ``num_actions`` and
            ``obs_shape``, where it has them, must match the env's (:func:`check_agent_fits_env`).
        action_repeat: frames per agent step, for the frame counter.
        device: where observations go before ``agent.act``; None: the agent's ``device`` attribute, else CPU.
        frames: initial frame counter (resuming).

    Attributes:
        env_restarts: env workers restarted so far (the backend's ``info["restarted"]``; a restarted stream is
            flagged reset and its interrupted episode is not reported).
    """

    def __init__(
        self, env: Any, agent: Actor, action_repeat: int = 1, device: torch.device | str | None = None, frames: int = 0
    ) -> None:
        self.env = ensure_contract(env)  # SAME_STEP resets and episode statistics, whatever the backend
        self.agent = agent
        self.action_repeat = int(action_repeat)
        self.device = torch.device(device) if device is not None else getattr(agent, "device", torch.device("cpu"))
        self.frames = int(frames)
        self.env_restarts = 0
        self.num_envs = int(self.env.num_envs)
        check_agent_fits_env(agent, self.env)
        self.head = action_head_of(agent, self.env.single_action_space)
        self._last: dict[str, Any] | None = None

    # -- one entry ----------------------------------------------------------------------------
    def _entry(self, obs, reward, reset, action, logits, logp, end, ret, length) -> dict[str, Any]:
        return {
            "inputs": obs_to_tensor(obs),
            "rewards": torch.as_tensor(np.asarray(reward, dtype=np.float32)),
            "reset": torch.as_tensor(np.asarray(reset, dtype=bool)),
            "actions": action,
            "behaviour_logits": logits,
            "behaviour_logp": logp,
            "episode_end": torch.as_tensor(np.asarray(end, dtype=bool)),
            "episode_return": torch.as_tensor(np.asarray(ret, dtype=np.float32)),
            "episode_length": torch.as_tensor(np.asarray(length, dtype=np.int64)),
        }

    def _first_entry(self) -> dict[str, Tensor]:
        obs, info = self.env.reset()
        self.env_restarts += int(np.count_nonzero(info.get("restarted", False)))
        b = self.num_envs
        actions, params, logp = self.head.first_entry(b)
        zeros = np.zeros(b)
        entry = self._entry(obs, zeros, np.ones(b, bool), actions, params, logp, zeros.astype(bool), zeros, zeros)
        if self._bootstraps:
            entry["truncation_value"] = torch.zeros(b)
        return entry

    @property
    def _bootstraps(self) -> bool:
        """The agent values the final observation of time-limited episodes (R2ACConfig.bootstrap_truncation)."""
        return bool(getattr(self.agent, "bootstraps_truncation", False))

    def _truncation_values(self, obs, reward, terminated, truncated, info) -> Tensor:
        """(B,) the agent's value of each stream's final observation where its episode hit a time limit, else 0."""
        cut = np.asarray(truncated, dtype=bool) & ~np.asarray(terminated, dtype=bool)
        out = torch.zeros(self.num_envs)
        if not cut.any():
            return out
        final = info.get("final_obs")
        if final is None or any(final[i] is None for i in np.flatnonzero(cut)):
            raise RuntimeError(
                f"{type(self.env).__name__} truncated an episode without its final observation in "
                'info["final_obs"], which bootstrap_truncation needs; turn R2ACConfig.bootstrap_truncation off.'
            )
        rows = [final[i] if cut[i] else _row(obs, i) for i in range(self.num_envs)]
        batch = obs_to_tensor(_stack_rows(rows), self.device)
        values = self.agent.truncation_values(
            batch, torch.as_tensor(np.asarray(reward, np.float32), device=self.device)
        )
        out[torch.as_tensor(cut)] = values.detach().float().cpu()[torch.as_tensor(cut)]
        return out

    # -- one segment --------------------------------------------------------------------------
    @torch.no_grad()
    def next_segment(self, m: int) -> RolloutSegment:
        """Act for ``m`` agent steps in every stream and return the M + 1 entries (entry 0 = last entry M)."""
        if m < 1:
            raise ValueError(f"M must be >= 1, got {m}.")
        if self._last is None:
            self._last = self._first_entry()
        entries = [self._last]
        # one batch to the device per step (copies from host memory that need not wait for the device's queue) and
        # one back: the actions, whose copy to the host is the step's one wait for the device
        to_device = lambda v: v.to(self.device, non_blocking=True)  # noqa: E731
        for _ in range(m):
            cur = entries[-1]
            actions, logits = self.agent.act(
                tree_map(cur["inputs"], to_device), to_device(cur["rewards"]), to_device(cur["reset"])
            )
            to_env = getattr(self.agent, "env_actions", None)
            env_actions = (to_env(actions) if to_env is not None else actions).detach().cpu()
            actions = actions.detach().cpu().to(self.head.action_dtype)
            logits = logits.detach().cpu().float()
            logp = self.head.log_prob(logits, actions).float()
            obs, reward, terminated, truncated, info = self.env.step(env_actions.numpy())
            done = np.logical_or(terminated, truncated)
            self.env_restarts += int(np.count_nonzero(info.get("restarted", False)))
            end, ret, length = info["episode_end"], info["episode_return"], info["episode_length"]
            entries.append(self._entry(obs, reward, done, actions, logits, logp, end, ret, length))
            if self._bootstraps:
                entries[-1]["truncation_value"] = self._truncation_values(obs, reward, terminated, truncated, info)
        self._last = entries[-1]
        self.frames += m * self.num_envs * self.action_repeat
        stacked = {k: stack_tree([e[k] for e in entries]) for k in entries[0]}
        return RolloutSegment(**stacked, frames=self.frames, env_restarts=self.env_restarts)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


def actor_copy(agent: Any) -> Any:
    """A copy of ``agent`` for acting on another thread (``async_actor``): its own parameters and buffers, no trainer,
    and no carried states (the learner's keep RTRL's sensitivities; the first segment starts every stream afresh).
    Acting streams need no gradient method (``OnlineRecurrentModule.unroll``), so the copy needs no strategy."""
    import copy

    memo: dict[int, Any] = {}
    trainer = getattr(agent, "_trainer", None)
    if trainer is not None:
        memo[id(trainer)] = None
    carries = getattr(agent, "_carries", None)
    if isinstance(carries, dict):
        memo[id(carries)] = {}  # the learner's carries (with RTRL's sensitivities) are not the actor's
    return copy.deepcopy(agent, memo)


class BackgroundActor:
    """``async_actor``: one thread collects the next segment with :func:`actor_copy` while the learner trains on the
    current one. The copy's parameters and buffers are refreshed from the learner's in the training thread, between
    optimiser steps, just before each collection starts."""

    def __init__(self, stream: RolloutStream, learner: Any, frames: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.stream = stream
        self.handed_frames = int(frames)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="onlinerec-actor")
        self._pending: Any = None
        theirs = learner.state_dict(keep_vars=True)
        self._pairs = [  # (actor's tensor, learner's tensor): parameters and buffers (e.g. the normalisers' statistics)
            (mine, theirs[name]) for name, mine in stream.agent.state_dict(keep_vars=True).items()
        ]

    @torch.no_grad()
    def _refresh(self) -> None:
        for mine, theirs in self._pairs:
            mine.copy_(theirs)

    def next_segment(self, m: int) -> RolloutSegment:
        if self._pending is None:  # the first segment: collected now, with the current weights
            self._refresh()
            segment = self.stream.next_segment(m)
        else:
            try:
                segment = self._pending.result()
            except BaseException:
                self._pending = None  # the error is the caller's now: stop the thread with it
                self.close()
                raise
        self._refresh()
        self._pending = self._pool.submit(self.stream.next_segment, m)
        self.handed_frames = segment.frames
        return segment

    def close(self) -> None:
        """Wait for the segment in flight (it is dropped) and stop the thread."""
        if self._pending is not None:
            self._pending.exception()  # waits; an error there matters no more than the segment
            self._pending = None
        self._pool.shutdown(wait=True)
