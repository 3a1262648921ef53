"""The RL segment type: :class:`RolloutSegment` and the observation trees it holds.

Timing convention (torchbeast's; docs/r2ac.md#actor-and-learner-timing). A segment holds T = M + 1 *entries* per stream.
Entry t holds what the agent sees at step t — observation ``obs_t``, the reward that arrived with it, the ``reset`` flag
(``obs_t`` starts an episode) — together with the actor output that *led to* it: the action taken at ``obs_{t-1}`` and
the behaviour logits it was sampled from. Entry 0 repeats entry M of the previous segment of the same stream (the
*overlap*), so losses use ``actions[1:]``, ``rewards[1:]``, ``reset[1:]`` against the learner's outputs on entries
``0 .. M-1``, and entry M only supplies the bootstrap value.

How the actor fills these entries, and how its carried state matches the learner's, is in :mod:`onlinerec.rl.actor`.
Observations are arrays or, for Dict/Tuple observation spaces, flat dicts of them (:func:`obs_to_tensor`);
:func:`tree_map` and :func:`stack_tree` treat both alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from onlinerec.data.segment import Segment
from onlinerec.rl.nets import flatten_observation, text_ids

__all__ = ["RolloutSegment", "check_rollout", "obs_to_tensor", "stack_tree", "tree_map"]


def obs_to_tensor(obs: Any, device: torch.device | str | None = None) -> Tensor | dict[str, Tensor]:
    """A batched observation as the agent reads it: an array becomes a tensor; a Dict/Tuple observation a flat dict
    of tensors (:func:`~onlinerec.rl.nets.flatten_observation`: nested keys joined with ``.``, Tuple items by index),
    text values becoming their CRC-32 ids (:func:`~onlinerec.rl.nets.text_ids`)."""
    flat = flatten_observation(obs)
    if isinstance(flat, dict):
        return {k: _leaf_tensor(v, device) for k, v in flat.items()}
    return _leaf_tensor(flat, device)


def _leaf_tensor(value: Any, device: torch.device | str | None) -> Tensor:
    if isinstance(value, Tensor):
        return value.to(device) if device is not None else value
    arr = np.asarray(value)
    if arr.dtype.kind in "USO":
        t = text_ids(arr)
    else:
        t = torch.as_tensor(arr)
    return t.to(device) if device is not None else t


def tree_map(value: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``fn`` on a tensor, or on every value of a flat dict of tensors (Dict/Tuple observations)."""
    if isinstance(value, dict):
        return {k: fn(v) for k, v in value.items()}
    return fn(value)


def stack_tree(values: list[Any]) -> Any:
    """One tensor (or flat dict of tensors) from a list of them, stacked along a new leading dimension."""
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
            k: tree_map(v, lambda x: x.to(device)) if isinstance(v, (Tensor, dict)) else v for k, v in values.items()
        }
        return type(self)(**moved)

    def select(self, streams: Tensor) -> RolloutSegment:
        """The segment of the streams ``streams`` (a 1-d index tensor, in that order): every (T, B, ...) field indexed
        along B; ``frames`` and ``env_restarts`` (this process's counters) unchanged."""
        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        picked = {
            k: tree_map(v, lambda x: x[:, streams]) if isinstance(v, (Tensor, dict)) else v for k, v in values.items()
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


def check_rollout(segment: Any) -> None:
    """Refuse a batch that is not a :class:`RolloutSegment`: R2AC learns from the segments of
    :class:`~onlinerec.rl.datamodule.RolloutDataModule` only."""
    if not isinstance(segment, RolloutSegment):
        raise TypeError(f"R2AC trains on RolloutSegments (from RolloutDataModule), got {type(segment).__name__}.")
