"""R2AC: the real-time recurrent actor-critic (docs/r2ac.md) as an :class:`~onlinerec.OnlineRecurrentModule`.

obs -> stem (IMPALA ResNet / Nature CNN / MLP; one stem per key for Dict/Tuple observations) -> [features; clipped
last reward] -> cell (eLSTM by default) -> readout (output gate) -> policy head and value. The policy head comes from
the action space (:mod:`onlinerec.rl.policy`: softmax over a Discrete space, a diagonal Gaussian over a Box). Trained
with V-trace actor-critic losses summed over time and batch, RMSProp, linear LR decay to 0 and gradient-norm clipping.
The gradient method (RTRL, TBPTT, SnAP) and the segment length M come from the trainer's strategy; ``cell=None`` gives
the feed-forward baseline (heads on [features; reward]).

This module is the agent: how its network acts and learns from a segment. Its settings are in
:mod:`onlinerec.rl.r2ac_config`, the network's parts in :mod:`onlinerec.rl.r2ac_network`, the loss terms in
:mod:`onlinerec.rl.losses`, the optimiser and the passes over a segment in :mod:`onlinerec.rl.optimization`; acting
in :mod:`onlinerec.rl.actor`, evaluation in :mod:`onlinerec.rl.evaluation`, what a run logs (frames/s, returns) in
:mod:`onlinerec.rl.monitor`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from typing_extensions import override

from onlinerec.cells import ElementwiseCell
from onlinerec.gradients.carry import Carry
from onlinerec.rl.evaluation import evaluate
from onlinerec.rl.losses import baseline_loss, clipped_ratio_loss, entropy_loss, policy_gradient_loss
from onlinerec.rl.monitor import RolloutMonitor
from onlinerec.rl.normalize import ReturnNormalizer, discounted_returns
from onlinerec.rl.optimization import SegmentOptimization
from onlinerec.rl.policy import ActionHead
from onlinerec.rl.r2ac_config import R2ACConfig, config_from_dict
from onlinerec.rl.r2ac_network import build_network
from onlinerec.rl.segment import RolloutSegment, check_rollout, tree_map
from onlinerec.rl.spaces import is_space, resolve_action_spec, resolve_observation_spec, space_from_spec
from onlinerec.rl.vtrace import vtrace

__all__ = ["R2AC", "R2ACConfig"]


class R2AC(SegmentOptimization):
    """Real-time recurrent actor-critic (Irie et al. 2024) with V-trace (docs/r2ac.md).

    The losses are summed over time and streams (the paper's convention, ``loss_reduction = "sum"``): under DDP the
    backpropagated loss is multiplied by the number of processes W, so that W processes with B streams each compute
    the gradient of one process with all W * B streams; the logged losses are this process's sums.
    ``R2ACConfig.loss_reduction = "mean"`` averages them instead (nothing to scale under DDP).

    One optimiser step per segment, as in the paper, by Lightning's automatic optimisation. With
    ``R2ACConfig.epochs * minibatches > 1`` the module optimises manually: every pass restarts from the carry saved at
    the segment start, and the carry moves forward once (:meth:`training_step`). Lightning's ``global_step`` then
    counts optimiser steps, ``epochs * minibatches`` per segment.

    Build it from the env's spaces with :meth:`from_spaces` (any action and observation space R2AC supports), or
    for a Discrete action set and array observations from ``num_actions`` and ``obs_shape`` (the paper's setting).

    Args:
        num_actions: A, the size of the discrete action set (or None with ``action_space``).
        obs_shape: one observation's shape: (C, H, W) uint8 frames, or (D,) vectors (or None with
            ``observation_space``).
        cell: an ElementwiseCell built for input size ``fc_size + 1``, a cell alias ("elstm", "qrnn", "sru",
            "felstm", ...), a list of aliases for a stack of different cells (``["lru", "mingru"]``, each layer's
            arguments in ``cell_kwargs["layer_kwargs"]``), or None for the feed-forward baseline.
        hidden_size: N, when ``cell`` is an alias.
        stem: "impala" (paper), "nature" (cheaper on CPU), "mlp" (vector observations) or "auto".
        fc_size: width of the stem's output (256 in the paper).
        config: loss and optimiser settings (:class:`R2ACConfig` or a dict of its fields; the paper's by default).
        cell_kwargs: extra keyword arguments for the cell when ``cell`` is an alias (e.g. ``{"forget_bias": 2.0}``).
        method: a gradient method or its name; None takes the trainer strategy's.
        action_space: the env's single action space (a gymnasium space or its
            :func:`~onlinerec.rl.spaces.space_spec`): ``Discrete`` -> softmax policy, float ``Box`` -> diagonal
            Gaussian (``R2ACConfig.log_std_init``, ``state_dependent_std``, ``squash_actions``).
        observation_space: the env's single observation space: a ``Box`` gives ``obs_shape``; a ``Dict`` or
            ``Tuple`` (or a Discrete/MultiDiscrete/Text space) gets a :class:`~onlinerec.rl.nets.DictStem`, one stem
            per key (``stem`` picks the CNN of image keys).
        head_sizes: widths of a feed-forward tanh MLP between the core's output and the policy head, and of another
            before the value head (sb3's recurrent policies use (64, 64)); () (the paper's): linear heads. Feed-forward,
            so every gradient method treats it like the heads.
        core_norm: a LayerNorm on the core's output before both heads (False: the paper's). For linear-recurrent cells
            such as the LRU, whose output is unbounded: on MiniGrid-MemoryS7 it grew to rms 23 and the policy went
            deterministic (docs/r2ac.md#the-networks-options).
        separate_critic: the value head reads a core of its own, with its own stem: a second stem and core built like
            the first, side by side in a :class:`~onlinerec.cells.Parallel` cell (RecurrentPPO's default, an LSTM
            each). The policy and value losses then share no parameter, so ``baseline_cost`` weighs the critic's
            learning alone and the value loss no longer shapes the policy's features. Both cores are trained by the
            same gradient method (RTRL: exact for each); twice the parameters and about twice the core's compute.
            ``core_norm`` normalises each core's output on its own. False: the paper's shared core.
    """

    loss_reduction = "sum"

    def __init__(
        self,
        num_actions: int | None = None,
        obs_shape: Sequence[int] | None = None,
        cell: ElementwiseCell | str | Sequence[str] | None = "elstm",
        hidden_size: int = 256,
        stem: str = "impala",
        fc_size: int = 256,
        config: R2ACConfig | dict[str, Any] | None = None,
        cell_kwargs: dict[str, Any] | None = None,
        method: Any = None,
        *,
        action_space: Any = None,
        observation_space: Any = None,
        head_sizes: Sequence[int] = (),
        core_norm: bool = False,
        separate_critic: bool = False,
    ) -> None:
        action_spec = resolve_action_spec(num_actions, action_space)
        obs_spec, obs_shape = resolve_observation_spec(obs_shape, observation_space)
        config = config_from_dict(config) if isinstance(config, dict) else config or R2ACConfig()
        net = build_network(
            action_spec,
            obs_spec,
            obs_shape,
            config,
            cell=cell,
            hidden_size=hidden_size,
            stem=stem,
            fc_size=fc_size,
            cell_kwargs=cell_kwargs,
            head_sizes=head_sizes,
            core_norm=core_norm,
            separate_critic=separate_critic,
        )
        super().__init__(net.core, config, method=method)
        self.loss_reduction = config.loss_reduction  # the base module scales a sum by W under DDP, not a mean
        self.return_normalizer = ReturnNormalizer() if config.reward_norm else None
        cell_name = list(cell) if isinstance(cell, (list, tuple)) else cell  # a name, or the names of a mixed stack
        if isinstance(cell, ElementwiseCell):  # an instance: its class name (the module keeps its weights)
            cell_name = type(cell).__name__
        self.save_hyperparameters(
            {
                "num_actions": action_spec["n"] if action_spec["type"] == "Discrete" else None,
                "obs_shape": None if obs_shape is None else list(obs_shape),
                "cell": cell_name,
                "hidden_size": hidden_size if net.actor_core is None else net.actor_core.hidden_size,
                "stem": stem,
                "fc_size": fc_size,
                "config": asdict(config),
                "cell_kwargs": dict(cell_kwargs or {}),
                "action_space": action_spec,
                "observation_space": obs_spec,
                "head_sizes": net.head_sizes,
                "core_norm": bool(core_norm),
                "separate_critic": bool(separate_critic),
            }
        )
        self._spaces = {  # the gymnasium spaces given (in memory only; checkpoints keep the specs)
            k: v for k, v in (("action", action_space), ("observation", observation_space)) if is_space(v)
        }
        self.action_space_spec = action_spec
        self.observation_space_spec = obs_spec
        self.num_actions: int | None = action_spec["n"] if action_spec["type"] == "Discrete" else None
        self.obs_shape = obs_shape
        self.obs_normalizer = net.obs_normalizer
        self.stem: nn.Module = net.stem
        self.critic_stem: nn.Module | None = net.critic_stem
        self._split = net.split  # widths of the actor's and critic's outputs (separate_critic)
        self.core_norm: nn.Module = net.core_norm
        self.critic_norm: nn.Module | None = net.critic_norm
        self.policy_mlp, self.value_mlp = net.policy_mlp, net.value_mlp
        self.policy: ActionHead = net.policy
        self.baseline = net.baseline

    @classmethod
    def from_spaces(cls, observation_space: Any, action_space: Any, **kwargs: Any) -> R2AC:
        """An R2AC for an env's single observation and action spaces (``env.single_observation_space``,
        ``env.single_action_space``, or ``RolloutDataModule.spaces()``); ``stem`` defaults to "auto" (IMPALA for
        images, MLP for vectors, one stem per key for Dict/Tuple). Other keyword arguments as for the constructor."""
        kwargs.setdefault("stem", "auto")
        return cls(observation_space=observation_space, action_space=action_space, **kwargs)

    @property
    def action_space(self) -> Any:
        """The gymnasium action space the policy acts in (the one given, or rebuilt from its stored spec)."""
        return self._spaces.get("action") or space_from_spec(self.action_space_spec)

    @property
    def observation_space(self) -> Any:
        """The gymnasium observation space the stem reads: the one given, else rebuilt from its stored spec; None
        when the model was built from ``obs_shape``, or its spec stands in for a space it cannot rebuild (a custom
        text space such as MiniGrid's mission)."""
        if "observation" in self._spaces:
            return self._spaces["observation"]
        spec = self.observation_space_spec
        if spec is None or "'space':" in repr(spec):
            return None
        return space_from_spec(spec)

    @property
    def action_dim(self) -> int | None:
        """A, the flat size of a Box action (None for Discrete actions)."""
        return self.policy.action_size[0] if self.policy.kind == "continuous" else None

    @property
    def action_head(self) -> ActionHead:
        """The policy head (:mod:`onlinerec.rl.policy`): log-probs, entropy, sampling and the env's actions."""
        return self.policy

    @property
    def feed_forward(self) -> bool:
        return self.cell is None

    # -- the network ----------------------------------------------------------------------------
    def _clip(self, reward: Tensor) -> Tensor:
        """The reward as the loss and the reward input see it: times ``reward_scale``, divided by the running return
        scale (``reward_norm``), clipped to ``reward_clip``."""
        if self.config.reward_scale != 1.0:
            reward = reward * self.config.reward_scale
        if self.return_normalizer is not None:
            reward = reward / self.return_normalizer.std.to(reward.dtype)
        c = self.config.reward_clip
        return reward.clamp(-c, c) if c > 0 else reward

    def features(self, obs: Tensor | dict[str, Tensor], reward: Tensor) -> Tensor:
        """Core inputs x (T, B, fc_size + 1) = [stem(obs); clipped reward] for obs (T, B, *obs_shape), or a dict of
        such tensors (Dict/Tuple observations, flat keys). x has the cell's dtype (under autocast the stem's output
        is bfloat16/float16; the cell's own layers still run under autocast)."""
        t, b = reward.shape[:2]
        if self.obs_normalizer is not None:
            obs = self.obs_normalizer(obs)
        flat = tree_map(obs, lambda v: v.reshape(t * b, *v.shape[2:]))
        feats = self.stem(flat).reshape(t, b, -1)
        r = self._clip(reward.to(feats.dtype)).unsqueeze(-1)
        if self.critic_stem is None:
            x = torch.cat([feats, r], dim=-1)
        else:  # separate_critic: [actor's features; reward; critic's features; reward], each core reads its half
            x = torch.cat([feats, r, self.critic_stem(flat).reshape(t, b, -1), r], dim=-1)
        if self.cell is not None:
            x = x.to(next(self.cell.parameters()).dtype)
        return x

    def heads(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """Policy parameters (..., P) (the logits for Discrete actions) and value (...,) from core outputs h (..., N)
        (layer-normalised first under ``core_norm``). With ``separate_critic`` h is [actor's core output; critic's]."""
        if self._split is not None:
            actor, critic = h.split(self._split, dim=-1)
            return self.policy(self.policy_mlp(self.core_norm(actor))), self._value(self.critic_norm(critic))
        h = self.core_norm(h)
        return self.policy(self.policy_mlp(h)), self._value(h)

    def _value(self, h: Tensor) -> Tensor:
        return self.baseline(self.value_mlp(h)).squeeze(-1)

    def policy_params(self, h: Tensor) -> Tensor:
        """The policy half of :meth:`heads` (what an exported policy runs)."""
        if self._split is not None:
            h = h[..., : self._split[0]]
        return self.policy(self.policy_mlp(self.core_norm(h)))

    @torch.no_grad()
    def act(
        self,
        obs: Tensor | dict[str, Tensor],
        reward: Tensor,
        reset: Tensor,
        *,
        greedy: bool = False,
        stream: str = "act",
    ) -> tuple[Tensor, Tensor]:
        """One agent step for B streams (the :class:`~onlinerec.rl.actor.Actor` step): advances the carried
        state of ``stream`` (zeroed first where ``reset``) and returns (actions, policy parameters (B, P)).

        Discrete: actions (B,) int64 sampled from softmax(logits), or the argmax when ``greedy``. Box: actions
        (B, A) float32, a sample of the Gaussian (its mean when ``greedy``) in the normalised space; the env takes
        :meth:`env_actions` of them (clipped or squashed into its bounds)."""
        x = self.features(tree_map(obs, lambda v: v.unsqueeze(0)), reward.unsqueeze(0))
        params, _ = self.heads(self(x, reset.unsqueeze(0).bool(), stream)[0])
        actions = self.policy.mode(params) if greedy else self.policy.sample(params)
        return actions, params

    @property
    def bootstraps_truncation(self) -> bool:
        """Whether rollouts should record :meth:`truncation_values` (``config.bootstrap_truncation``)."""
        return self.config.bootstrap_truncation

    @torch.no_grad()
    def truncation_values(self, obs: Tensor | dict[str, Tensor], reward: Tensor, stream: str = "act") -> Tensor:
        """Values (B,) of observations that follow the last :meth:`act` step of ``stream`` (the final observations
        of episodes cut by a time limit, with the reward that came with them), from its carried state, which is not
        advanced. Equals the value :meth:`act` would compute next if the episode had gone on."""
        x = self.features(tree_map(obs, lambda v: v.unsqueeze(0)), reward.unsqueeze(0))
        return self._value_ahead(x, torch.zeros_like(x[..., 0], dtype=torch.bool), stream)

    @torch.no_grad()
    def _value_ahead(self, x: Tensor, reset: Tensor, stream: str) -> Tensor:
        """Value (B,) of one step of core inputs x (1, B, D) that follows ``stream``'s carry, which stays where it is
        (the learner's bootstrap value at entry M; the actor's value of a truncated episode's final observation)."""
        h = x.detach()
        if not self.feed_forward:
            h = self.cell.readout(self.lookahead(h, reset, stream), h)
        return self.heads(h[0])[1]

    def env_actions(self, actions: Tensor) -> Tensor:
        """Actions from :meth:`act` as the env takes them: unchanged for Discrete; for a Box, clipped (or
        tanh-squashed) into [-1, 1] and mapped onto its bounds, shaped (B, *shape)."""
        return self.policy.env_actions(actions)

    # -- the learner ----------------------------------------------------------------------------
    def learner_outputs(self, segment: RolloutSegment) -> tuple[Tensor, Tensor, Tensor]:
        """Policy parameters (M, B, P) and values (M, B) on entries 0..M-1 (with grad) and the bootstrap value (B,) at
        entry M (no grad). Advances the "train" carry over entries 0..M-1 only (the module docstrings of
        :mod:`onlinerec.rl.segment` and :mod:`onlinerec.rl.actor`)."""
        m = segment.length - 1
        x = self.features(segment.inputs, segment.rewards)
        logits, values = self.heads(self(x[:m], segment.reset[:m], "train"))
        bootstrap = self._value_ahead(x[m:], segment.reset[m:], "train")  # entry M, from the carry at the segment's end
        return logits, values, bootstrap

    @override
    def segment_outputs(self, segment: RolloutSegment, stream: str) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        check_rollout(segment)
        if stream != "train":
            raise RuntimeError(
                f"R2AC learns from training rollouts only; evaluate it with R2AC.evaluate (got a {stream} batch)."
            )
        return self.learner_outputs(segment)

    @override
    def segment_loss(self, outputs: tuple[Tensor, Tensor, Tensor], segment: RolloutSegment) -> dict[str, Tensor]:  # type: ignore[override]
        """V-trace actor-critic losses of one segment, summed (``loss_reduction = "mean"``: averaged) over time and
        streams (docs/r2ac.md); with ``ppo_clip`` the policy loss is PPO's clipped-ratio objective."""
        # the first of several passes unrolled every stream (for the carry); its loss is minibatch 0's
        if self._loss_streams is not None:
            outputs, segment = _select_streams(outputs, self._loss_streams), segment.select(self._loss_streams)
        cfg = self.config
        params, values, bootstrap = (_full_precision(t) for t in outputs)  # AMP: the losses in float32
        target_logp = self.policy.log_prob(params, segment.actions[1:])
        entropy = self.policy.entropy(params)
        vs, advantages = self._targets(target_logp.detach(), values.detach(), bootstrap, segment)
        extra = {}
        if cfg.ppo_clip is None:
            pg_loss = policy_gradient_loss(target_logp, advantages, cfg.loss_reduction)
        else:
            behaviour_logp = segment.behaviour_logp[1:].to(values.dtype)
            pg_loss, extra["clip_fraction"] = clipped_ratio_loss(
                target_logp, behaviour_logp, advantages, cfg.ppo_clip, cfg.loss_reduction
            )
        value_loss = cfg.baseline_cost * baseline_loss(vs, values, cfg.loss_reduction)
        entropy_cost = self.entropy_cost_now()
        entropy_term = entropy_cost * entropy_loss(entropy, cfg.loss_reduction)
        total = pg_loss + value_loss + entropy_term
        if cfg.entropy_cost_final is not None:
            extra["entropy_cost"] = torch.tensor(entropy_cost)
        return {
            "loss": total,
            "pg_loss": pg_loss,
            "baseline_loss": value_loss,
            "entropy_loss": entropy_term,
            "entropy": entropy.detach().mean(),
            **extra,
        }

    def entropy_cost_now(self) -> float:
        """The entropy cost of the next optimiser step: ``entropy_cost``, or under ``entropy_cost_final`` the point
        of the linear schedule that the LR schedule has reached (both decay with the optimiser steps taken)."""
        cfg = self.config
        progress = None if cfg.entropy_cost_final is None else self.schedule_progress()
        if progress is None:
            return cfg.entropy_cost
        return cfg.entropy_cost + (cfg.entropy_cost_final - cfg.entropy_cost) * progress

    @torch.no_grad()
    def targets(self, outputs: tuple[Tensor, Tensor, Tensor], segment: RolloutSegment) -> tuple[Tensor, Tensor]:
        """The value targets v_s and the policy-gradient advantages (M, B) that :meth:`segment_loss` uses for
        ``outputs`` (from :meth:`learner_outputs`): V-trace's; the advantages without their importance weight under
        ``ppo_clip``; normalised to mean 0, std 1 under ``advantage_norm``. Detached."""
        params, values, bootstrap = (_full_precision(t) for t in outputs)
        return self._targets(self.policy.log_prob(params, segment.actions[1:]), values, bootstrap, segment)

    def _targets(
        self, target_logp: Tensor, values: Tensor, bootstrap: Tensor, segment: RolloutSegment
    ) -> tuple[Tensor, Tensor]:
        cfg = self.config
        vs, advantages = vtrace(
            segment.behaviour_logp[1:].to(values.dtype),
            target_logp,
            self._rewards_with_truncation(segment, values.dtype),
            cfg.discount * (~segment.reset[1:]).to(values.dtype),
            values,
            bootstrap,
            clip_rho=cfg.clip_rho,
            clip_c=cfg.clip_c,
            clip_pg_rho=cfg.clip_pg_rho,
            weight_advantages=cfg.ppo_clip is None,  # PPO's ratio stands in for the importance weight
            trace_lambda=cfg.trace_lambda,
        )
        if cfg.advantage_norm:
            advantages = (advantages - advantages.mean()) / (advantages.std(correction=0) + 1e-8)
        return vs, advantages

    def _rewards_with_truncation(self, segment: RolloutSegment, dtype: torch.dtype) -> Tensor:
        """Entries 1..M of the loss's rewards (scaled, normalised, clipped); under ``bootstrap_truncation`` plus gamma
        times the value of the final observation where a time limit cut the episode (its discount stays 0)."""
        rewards = self._clip(segment.rewards[1:].to(dtype))
        if self.config.bootstrap_truncation and segment.truncation_value is not None:
            rewards = rewards + self.config.discount * segment.truncation_value[1:].to(dtype)
        return rewards

    def losses(self, segment: RolloutSegment) -> dict[str, Tensor]:
        """:meth:`segment_loss` of one training segment (advances the "train" carry)."""
        return self.segment_loss(self.learner_outputs(segment), segment)

    # -- the learner's step -------------------------------------------------------------------------
    @override
    def training_step(self, batch: RolloutSegment, batch_idx: int) -> dict[str, Tensor]:  # type: ignore[override]
        """One segment: the paper's single update (Lightning's automatic optimisation) or, with ``epochs *
        minibatches > 1``, that many optimiser steps (:meth:`several_passes`); then, with ``reward_norm``, the
        segment's returns join the running statistics (after the update, so that the actor and every pass saw the
        same reward scale); with ``obs_norm``, its observations join theirs."""
        result = super().training_step(batch, batch_idx) if self.automatic_optimization else self.several_passes(batch)
        self._update_return_statistics(batch)
        if self.obs_normalizer is not None:  # entry 0 was the previous segment's entry M
            self.obs_normalizer.update(batch.inputs[1:])
        return result

    def _update_return_statistics(self, segment: RolloutSegment) -> None:
        """``reward_norm``: carry every stream's discounted return over entries 1..M and fold those returns into the
        running statistics."""
        if self.return_normalizer is None:
            return
        rewards = segment.rewards[1:].to(torch.float64) * self.config.reward_scale
        carried = self._carries.get(_RETURNS)
        start = rewards.new_zeros(segment.num_streams)
        if carried is not None and carried.batch_size == segment.num_streams:
            start = carried.c[:, 0].to(start)
        returns, last = discounted_returns(start, rewards, segment.reset[1:], self.config.discount)
        self.return_normalizer.update(returns)
        self._carries[_RETURNS] = Carry(last.unsqueeze(-1))

    @override
    def configure_callbacks(self) -> list[Callback]:
        """FiniteGuard (see the base class) and a :class:`~onlinerec.rl.monitor.RolloutMonitor` unless the Trainer has one."""
        have = self._trainer.callbacks if self._trainer is not None else []
        extra = (
            [] if any(isinstance(cb, RolloutMonitor) for cb in have) else [RolloutMonitor(self.config.return_window)]
        )
        return super().configure_callbacks() + extra

    # -- evaluation ---------------------------------------------------------------------------------
    def evaluate(
        self,
        env: Any,
        num_episodes: int = 10,
        *,
        greedy: bool = True,
        max_steps: int | None = None,
        video: str | None = None,
    ) -> dict[str, Any]:
        """Play ``num_episodes`` real episodes on a vector env; see :func:`onlinerec.rl.evaluation.evaluate`
        (``video``: save stream 0's episodes as a GIF there)."""
        return evaluate(self, env, num_episodes, greedy=greedy, max_steps=max_steps, video=video)

    # -- deployment ---------------------------------------------------------------------------------
    def export(self, path: Any, *, output: str = "action", greedy: bool = True) -> Any:
        """Write a self-contained TorchScript policy to ``path``; see :func:`onlinerec.rl.export.export_policy`.
        Loading it needs only torch: ``policy = torch.jit.load(path)``, ``state = policy.initial_state(B)``,
        ``action, state = policy(obs, reset, state, reward)``."""
        from onlinerec.rl.export import export_policy

        return export_policy(self, path, output=output, greedy=greedy)


_RETURNS = "returns"
"""Key of the per-stream discounted returns (``reward_norm``) among the carries: per-stream state like the recurrent
one, kept per rank and checkpointed with it (never a buffer that DDP would broadcast from rank 0)."""


def _select_streams(outputs: tuple[Tensor, Tensor, Tensor], streams: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Policy parameters (M, B, P), values (M, B) and bootstrap values (B,) of the streams ``streams``."""
    params, values, bootstrap = outputs
    return params[:, streams], values[:, streams], bootstrap[streams]


def _full_precision(t: Tensor) -> Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
