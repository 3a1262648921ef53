"""Rollouts: the RL Segment type and a LightningDataModule that acts in the envs with the current weights.

Timing convention (torchbeast's; docs/r2ac.md#actor-and-learner-timing). A segment holds T = M + 1 *entries* per stream. Entry t holds
what the agent sees at step t — observation ``obs_t``, the reward that arrived with it, the ``reset`` flag
(``obs_t`` starts an episode) — together with the actor output that *led to* it: the action taken at ``obs_{t-1}``
and the behaviour logits it was sampled from. Entry 0 repeats entry M of the previous segment of the same stream
(the *overlap*), so losses use ``actions[1:]``, ``rewards[1:]``, ``reset[1:]`` against the learner's outputs on
entries ``0 .. M-1``, and entry M only supplies the bootstrap value.

Acting and the learner's carried state (learner-carried sensitivities; docs/r2ac.md#actor-and-learner-timing). Acting runs in the training
process on the module's *current* weights, one agent step at a time, under ``no_grad``: the module's ``act`` step
advances its own carried state under the stream name ``"act"`` (c only, no sensitivities). Per segment the actor
processes entries 0 .. M-1 (each to choose the action that produces the next entry); entry M is only observed.
The learner then unrolls the same entries 0 .. M-1 from its own ``"train"`` carry, with the same weights (the
update comes after), so its carry at the segment end is the actor's state after entry M-1 — exactly the state
from which the next segment's entry 0 (= this entry M) is processed, by both. Entry M's bootstrap value is
computed from that carry without gradient and without storing the result. By induction the two carries stay
equal (up to float rounding), and the learner's RTRL sensitivities are exact for the weights in use.
``RolloutDataModule(async_actor=True)`` gives this up for speed: a copy of the agent acts on a background thread with
weights one update old, while the learner trains on the previous segment.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol, runtime_checkable

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from onlinerec.data.segment import Segment
from onlinerec.rl.envs.base import action_kind, ensure_contract, run_env_seed
from onlinerec.rl.nets import flatten_observation, text_ids
from onlinerec.rl.policy import ActionHead, CategoricalHead

# The rollout dataset is sized on purpose (so that Lightning does not prefetch a segment collected with stale
# weights) and never runs in loader workers, so Lightning's warning about sized IterableDatasets does not apply.
warnings.filterwarnings("ignore", message=r".*`IterableDataset` has `__len__` defined.*")

__all__ = [
    "Actor",
    "RolloutDataModule",
    "RolloutSegment",
    "RolloutStream",
    "action_head_of",
    "check_agent_fits_env",
    "default_action_repeat",
    "obs_to_tensor",
]


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


def obs_to_tensor(obs: Any, device: torch.device | str | None = None) -> Tensor | dict[str, Tensor]:
    """A batched observation as the agent reads it: an array becomes a tensor; a Dict/Tuple observation a flat dict
    of tensors (:func:`~onlinerec.rl.nets.flatten_observation`: nested keys joined with ``.``, Tuple items by index),
    text values becoming their CRC-32 ids (:func:`~onlinerec.rl.nets.text_ids`)."""
    flat = flatten_observation(obs)
    if isinstance(flat, dict):
        return {k: _leaf_tensor(v, device) for k, v in flat.items()}
    return _leaf_tensor(flat, device)


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


def _leaf_tensor(value: Any, device: torch.device | str | None) -> Tensor:
    if isinstance(value, Tensor):
        return value.to(device) if device is not None else value
    arr = np.asarray(value)
    if arr.dtype.kind in "USO":
        t = text_ids(arr)
    else:
        t = torch.as_tensor(arr)
    return t.to(device) if device is not None else t


def _tree_map(value: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(value, dict):
        return {k: fn(v) for k, v in value.items()}
    return fn(value)


def _stack(values: list[Any]) -> Any:
    if isinstance(values[0], dict):
        return {k: torch.stack([v[k] for v in values]) for k in values[0]}
    return torch.stack(values)


@dataclass
class RolloutSegment(Segment):
    """M + 1 entries of B env streams (time-major), with the overlap convention of this module's docstring.

    Fields (``T = M + 1``):

    ============================  ===========  ===================================================================
    field                         shape/dtype  meaning at entry t
    ============================  ===========  ===================================================================
    ``inputs``                    (T, B, ...)  observation obs_t (uint8 frames or small vectors, as the env gives);
                                               Dict/Tuple observations: a flat dict of such tensors (keys from
                                               :func:`~onlinerec.rl.nets.flat_spaces`; text as int64 ids)
    ``reset``                     (T, B) bool  obs_t starts an episode (or a life): carried state zeroed before t;
                                               also "done" for the discount (gamma_{t-1} = 0). True at the first
                                               step of every stream.
    ``targets``                   None         (supervised field, unused)
    ``rewards``                   (T, B) f32   raw reward that arrived with obs_t (0 at a stream's first step)
    ``actions``                   (T, B) i64   action taken at obs_{t-1} that led to obs_t (0 at the first step).
                                  or           Box actions: (T, B, A) f32, A = prod(shape): the policy's sample u
                                  (T, B, A)    in its normalised space, before clipping/tanh (the env was sent
                                  f32          ``agent.env_actions(u)``); log-probs are of u (of tanh(u) when
                                               squashed). Zeros at the first step.
    ``behaviour_logits``          (T, B, P)    the behaviour distribution's parameters at obs_{t-1}: the logits
                                  f32          (P = A) for Discrete; [mean; log-std] (P = 2A) for a Gaussian
                                               (:mod:`onlinerec.rl.policy`). Zeros at the first step.
    ``behaviour_logp``            (T, B) f32   log mu(actions_t | obs_{t-1}) under those parameters (at the first
                                               step: the uniform policy's -log A, or 0 for a Box; never used)
    ``episode_end``               (T, B) bool  a real episode (game over, not a lost life) ended with the step that
                                               led to obs_t
    ``episode_return``            (T, B) f32   that episode's undiscounted return, where ``episode_end``
    ``episode_length``            (T, B) i64   its length in agent steps, where ``episode_end``
    ``truncation_value``          (T, B) f32   where the step that led to obs_t hit a time limit (truncated, not
                                               terminated): the agent's value of that episode's final observation
                                               (``agent.truncation_values``, from its state after obs_{t-1}, the
                                               weights it acted with); 0 elsewhere. None: the agent does not
                                               bootstrap truncations (R2ACConfig.bootstrap_truncation off)
    ``frames``                    int          env frames so far on this process after this segment
                                               (agent steps x action repeat, all streams)
    ``env_restarts``              int          env workers restarted after a crash or hang so far on this process
                                               (``info["restarted"]``, ``vectorization="resilient"``)
    ============================  ===========  ===================================================================

    Entry 0 repeats the previous segment's entry M, so episode statistics are read from entries 1..M only.
    """

    rewards: Tensor | None = None
    actions: Tensor | None = None
    behaviour_logits: Tensor | None = None
    behaviour_logp: Tensor | None = None
    episode_end: Tensor | None = None
    episode_return: Tensor | None = None
    episode_length: Tensor | None = None
    truncation_value: Tensor | None = None
    frames: int = 0
    env_restarts: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.inputs, dict):
            leaves = list(self.inputs.values())
            if not leaves or not all(isinstance(v, Tensor) and v.dim() >= 2 for v in leaves):
                raise ValueError("RolloutSegment.inputs as a dict needs (T, B, ...) tensors as values.")
            if len({tuple(v.shape[:2]) for v in leaves}) != 1:
                raise ValueError(
                    "RolloutSegment.inputs: every key must start with the same (T, B); got "
                    f"{ {k: tuple(v.shape) for k, v in self.inputs.items()} }."
                )
            Segment(leaves[0], self.reset)  # the reset flags' checks, against (T, B)
        else:
            super().__post_init__()
        t, b = self._lead_shape
        if t < 2:
            raise ValueError(f"a RolloutSegment needs M + 1 >= 2 entries (M >= 1), got {t}.")
        for name in (
            "rewards",
            "actions",
            "behaviour_logits",
            "behaviour_logp",
            "episode_end",
            "episode_return",
            "episode_length",
        ):
            value = getattr(self, name)
            if not isinstance(value, Tensor) or tuple(value.shape[:2]) != (t, b):
                got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"RolloutSegment.{name} must be a tensor starting with (T, B) = {(t, b)}; got {got}.")
        if self.truncation_value is not None and tuple(self.truncation_value.shape) != (t, b):
            raise ValueError(
                f"RolloutSegment.truncation_value must be a (T, B) = {(t, b)} tensor or None; got "
                f"{tuple(self.truncation_value.shape)}."
            )

    distinct_per_rank: ClassVar[bool] = True  # every rank acts in its own envs, seeded apart by rank

    @property
    def _lead_shape(self) -> tuple[int, int]:
        """(T, B) of the inputs (a tensor, or a dict of them)."""
        lead = next(iter(self.inputs.values())) if isinstance(self.inputs, dict) else self.inputs
        return int(lead.shape[0]), int(lead.shape[1])

    @property
    def length(self) -> int:
        return self._lead_shape[0]

    @property
    def num_streams(self) -> int:
        return self._lead_shape[1]

    def to(self, device: torch.device | str) -> RolloutSegment:
        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        moved = {
            k: _tree_map(v, lambda x: x.to(device)) if isinstance(v, (Tensor, dict)) else v for k, v in values.items()
        }
        return type(self)(**moved)

    def select(self, streams: Tensor) -> RolloutSegment:
        """The segment of the streams ``streams`` (a 1-d index tensor, in that order): every (T, B, ...) field indexed
        along B; ``frames`` and ``env_restarts`` (this process's counters) unchanged."""
        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        picked = {
            k: _tree_map(v, lambda x: x[:, streams]) if isinstance(v, (Tensor, dict)) else v for k, v in values.items()
        }
        return type(self)(**picked)

    @property
    def steps(self) -> int:
        """M: the learner trains on entries 0..M-1; entry M only supplies the bootstrap value."""
        return self.length - 1

    def completed_episodes(self) -> tuple[Tensor, Tensor]:
        """Returns and lengths of the real episodes that ended inside this segment (entries 1..M)."""
        end = self.episode_end[1:]
        return self.episode_return[1:][end], self.episode_length[1:][end]


def default_action_repeat(env_id: str) -> int:
    """Frames per agent step by env family: 4 for Atari and DMLab (docs/r2ac.md#per-environment-settings), else 1."""
    return 4 if env_id.startswith(("ALE/", "dmlab:")) else 1


def check_agent_fits_env(agent: Any, env: Any) -> None:
    """Refuse an agent built for other actions or observations than ``env``'s (one stream's spaces).

    Reads, where the agent has them (R2AC does): ``agent.action_space`` (a gymnasium space, compared with the env's
    ``single_action_space``), else ``agent.num_actions`` (a Discrete env's ``n``) or ``agent.action_dim`` (a Box env's
    flat size); ``agent.observation_space`` (compared with ``single_observation_space``), else ``agent.obs_shape``.
    An action space onlinerec cannot act in (e.g. a Tuple mixing Discrete and Box) is refused whatever the agent.
    """
    import gymnasium

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


EnvFactory = Callable[[int, int], Any]
"""``factory(num_envs, seed) -> gymnasium.vector.VectorEnv``: any autoreset mode (NEXT_STEP/DISABLED envs are adapted,
:func:`~onlinerec.rl.envs.base.ensure_contract`); ``seed`` is the env seed of :func:`~onlinerec.rl.envs.run_env_seed`
— seed stream ``i`` with ``stream_seed(seed, i)``, or return an unseeded env and let the adapter do it."""


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
        for _ in range(m):
            cur = entries[-1]
            actions, logits = self.agent.act(
                _tree_map(cur["inputs"], lambda v: v.to(self.device)),
                cur["rewards"].to(self.device),
                cur["reset"].to(self.device),
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
        stacked = {k: _stack([e[k] for e in entries]) for k in entries[0]}
        return RolloutSegment(**stacked, frames=self.frames, env_restarts=self.env_restarts)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


class _SegmentDataset(IterableDataset):
    """Endless segments from one persistent :class:`RolloutStream`; sized so Lightning does not prefetch
    (a prefetched segment would be collected with weights one update old; ``async_actor`` does that on purpose, with an
    actor copy whose weights are refreshed between optimiser steps)."""

    def __init__(self, datamodule: RolloutDataModule, length: int) -> None:
        self.datamodule = datamodule
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[RolloutSegment]:
        dm = self.datamodule
        for _ in range(self.length):
            yield dm.next_segment()


class _RolloutLoader(DataLoader):
    """The training loader, resumable in Lightning's sense (it has ``state_dict`` / ``load_state_dict``), so a run
    resumed mid-epoch gets no "dataloader is not resumable" warning. Its position needs no restoring: a resumed run
    starts its env streams afresh on seeds of their own (an env's state cannot be saved; docs/envs.md#seeds), and the
    frame count comes from :meth:`RolloutDataModule.load_state_dict`."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class RolloutDataModule(L.LightningDataModule):
    """Streams :class:`RolloutSegment` s of M + 1 entries from ``num_envs`` env streams, acting in the training
    process with the module's current weights (see the module docstring for the timing and carry conventions).

    M is read from the trainer's strategy (``trainer.strategy.M``, one source of truth). The agent is the
    trainer's LightningModule, which must implement :class:`Actor`. The data loader runs in the main process
    (``num_workers=0``, ``batch_size=None``); the envs may run their own workers.

    Args:
        env: an env id for :func:`onlinerec.rl.envs.make_vector_env` ("ALE/Qbert-v5", "procgen:chaser",
            "dmlab:rooms_watermaze", "memory:tmaze", ...) or a factory ``(num_envs, seed) -> VectorEnv``.
        num_envs: B, the number of streams on this process.
        seed: the run's seed. The envs get ``run_env_seed(seed, purpose="train", rank=rank, restart=k)`` (DDP rank
            ``rank``, k-th resume of this run), and stream ``i`` of it ``stream_seed(that, i)``: different seeds,
            ranks and resumes share no env stream (``onlinerec.rl.envs`` documents the convention).
        action_repeat: frames per agent step for the frame counter; None: the env's ``metadata["frames_per_step"]``,
            else 4 for Atari/DMLab ids and 1 otherwise.
        env_kwargs: extra keyword arguments for ``make_vector_env``.
        segments_per_epoch: segments in one Lightning epoch; None: the segments the trainer's ``max_steps`` allows if
            set (``max_steps`` / the module's ``config.passes`` optimiser steps per segment, 1 if it has none), else
            1000.
        async_actor: collect segment k + 1 on a background thread while the learner updates on segment k, so that acting
            and env steps run beside the learner's forward, backward and optimiser step. The actor is then a copy of
            the agent whose parameters and buffers are refreshed from the learner's before each segment: it acts with
            weights one update old (V-trace's importance weights correct for that, as they do for IMPALA's actors),
            and the learner's carry, computed with the newer weights, is no longer equal to the actor's state. Off by
            default (the paper's R2AC acts with the current weights). Measured: ~1.5x frames/s on an idle 2-core
            machine, no gain when other jobs hold the cores (docs/performance.md#overlapping-acting-with-learning).
    """

    def __init__(
        self,
        env: str | EnvFactory,
        num_envs: int = 32,
        seed: int = 0,
        action_repeat: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        segments_per_epoch: int | None = None,
        async_actor: bool = False,
    ) -> None:
        super().__init__()
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}.")
        self.env = env
        self.num_envs = int(num_envs)
        self.seed = int(seed)
        self.env_kwargs = dict(env_kwargs or {})
        self.action_repeat = None if action_repeat is None else int(action_repeat)
        self.segments_per_epoch = segments_per_epoch
        self.async_actor = bool(async_actor)
        self.stream: RolloutStream | None = None
        self._frames = 0
        self._background: _BackgroundActor | None = None  # async_actor: the actor copy and the segment in flight
        self._restarts = 0  # resumes so far: each re-seeds the envs so that resumed runs do not replay episodes

    # -- envs -----------------------------------------------------------------------------------
    def make_env(self, num_envs: int, seed: int) -> Any:
        """A vector env for ``num_envs`` streams under env seed ``seed`` (stream ``i``: ``stream_seed(seed, i)``),
        adapted to the SAME_STEP contract if it is not (a factory may return any gymnasium vector env)."""
        from onlinerec.rl.envs import make_vector_env

        return ensure_contract(make_vector_env(self.env, num_envs, seed=seed, **self.env_kwargs), seed=seed)

    def spaces(self) -> tuple[Any, Any, int]:
        """(observation space, action space, frames per agent step) of one stream, from a throwaway env."""
        env = self.make_env(1, self.seed)
        try:
            return env.single_observation_space, env.single_action_space, self.resolve_action_repeat(env)
        finally:
            getattr(env, "close", lambda: None)()

    def env_spaces(self) -> tuple[tuple[int, ...], int, int]:
        """(observation shape, number of actions, frames per agent step) of one stream, for a Discrete-action env with
        array observations; :meth:`spaces` gives the spaces themselves (Box actions, Dict/Tuple observations)."""
        obs_space, act_space, repeat = self.spaces()
        if not hasattr(act_space, "n") or obs_space.shape is None:
            raise ValueError(
                f"env_spaces() describes Discrete actions and array observations; this env has {act_space} and "
                f"{obs_space}: use spaces(), which returns (observation_space, action_space, frames per step)."
            )
        return tuple(obs_space.shape), int(act_space.n), repeat

    def resolve_action_repeat(self, env: Any) -> int:
        """Frames per agent step: the argument, else the env's metadata, else the id's family default."""
        if self.action_repeat is not None:
            return self.action_repeat
        meta = getattr(env, "metadata", None) or {}
        if meta.get("frames_per_step"):
            return int(meta["frames_per_step"])
        return default_action_repeat(self.env) if isinstance(self.env, str) else 1

    @property
    def unroll_length(self) -> int:
        """M, from the trainer's strategy."""
        trainer = self.trainer
        m = getattr(getattr(trainer, "strategy", None), "M", None)
        if m is None:
            raise RuntimeError(
                "RolloutDataModule reads M from the trainer's strategy: use Trainer(strategy=RTRLStrategy(M=...)) "
                "(or TBPTTStrategy / SnAPStrategy, also for a feed-forward agent)."
            )
        return int(m)

    @property
    def frames(self) -> int:
        """Env frames on this process so far (agent steps x action repeat) in the segments handed to the learner (with
        ``async_actor``, the segment still being collected is not counted: a checkpoint does not hold it)."""
        if self._background is not None:
            return self._background.handed_frames
        return self.stream.frames if self.stream is not None else self._frames

    def next_segment(self) -> RolloutSegment:
        """The learner's next segment of M = ``unroll_length`` steps (with ``async_actor``, the one collected in the
        background; the next is started at once)."""
        if self._background is not None:
            return self._background.next_segment(self.unroll_length)
        return self.stream.next_segment(self.unroll_length)

    # -- Lightning hooks ----------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        if self.stream is None:
            agent = trainer.lightning_module
            if not isinstance(agent, Actor):
                raise TypeError(
                    f"{type(agent).__name__} has no act(obs, reward, reset) step; RolloutDataModule needs one (see onlinerec.rl.Actor)."
                )
            seed = run_env_seed(self.seed, purpose="train", rank=trainer.global_rank, restart=self._restarts)
            env = self.make_env(self.num_envs, seed)
            actor = actor_copy(agent) if self.async_actor else agent
            try:
                self.stream = RolloutStream(
                    env, actor, self.resolve_action_repeat(env), agent.device, frames=self._frames
                )
            except BaseException:
                getattr(env, "close", lambda: None)()  # e.g. an agent built for another action count
                raise
            if self.async_actor:
                self._background = _BackgroundActor(self.stream, agent, self._frames)
        length = self.segments_per_epoch
        if length is None and trainer.max_steps and trainer.max_steps > 0:
            # max_steps counts optimiser steps; a module with several per segment (R2AC's epochs) needs fewer segments,
            # and the progress bar's total is this length
            passes = getattr(getattr(trainer.lightning_module, "config", None), "passes", 1)
            length = math.ceil(trainer.max_steps / passes)
        length = 1000 if length is None else length
        return _RolloutLoader(_SegmentDataset(self, int(length)), batch_size=None, num_workers=0)

    def teardown(self, stage: str) -> None:
        if self.stream is not None:
            self._frames = self.frames
            if self._background is not None:  # the env may close only once the thread has finished with it
                self._background.close()
                self._background = None
            self.stream.close()
            self.stream = None

    def state_dict(self) -> dict[str, Any]:
        return {"frames": self.frames, "restarts": self._restarts}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._frames = int(state_dict.get("frames", 0))
        self._restarts = int(state_dict.get("restarts", 0)) + 1
        if self.stream is not None:
            self.stream.frames = self._frames
        if self._background is not None:
            self._background.handed_frames = self._frames


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


class _BackgroundActor:
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
