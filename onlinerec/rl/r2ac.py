"""R2AC: the real-time recurrent actor-critic (docs/r2ac.md) as an :class:`~onlinerec.OnlineRecurrentModule`.

obs -> stem (IMPALA ResNet / Nature CNN / MLP; one stem per key for Dict/Tuple observations) -> [features; clipped
last reward] -> cell (eLSTM by default) -> readout (output gate) -> policy head and value. The policy head comes from
the action space (:mod:`onlinerec.rl.policy`: softmax over a Discrete space, a diagonal Gaussian over a Box). Trained with V-trace actor-critic losses summed over time and
batch, RMSProp, linear LR decay to 0 and gradient-norm clipping. The gradient method (RTRL, TBPTT, SnAP) and the
segment length M come from the trainer's strategy; ``cell=None`` gives the feed-forward baseline (heads on
[features; reward]).

This module is the network, its losses and its optimiser. Acting and rollouts are in :mod:`onlinerec.rl.rollout`,
evaluation in :mod:`onlinerec.rl.evaluation`, what a run logs (frames/s, returns) in :mod:`onlinerec.rl.monitor`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from typing_extensions import override

from onlinerec.cells import ElementwiseCell, make_cell
from onlinerec.rl.evaluation import evaluate
from onlinerec.rl.monitor import RolloutMonitor
from onlinerec.rl.nets import DictStem, is_channels_last, is_image_spec, make_stem
from onlinerec.rl.policy import ActionHead, make_head, space_from_spec, space_spec
from onlinerec.rl.rollout import RolloutSegment
from onlinerec.rl.vtrace import vtrace
from onlinerec.training.module import OnlineRecurrentModule

__all__ = ["R2AC", "R2ACConfig"]


@dataclass
class R2ACConfig:
    """Loss and optimisation hyper-parameters of R2AC; the defaults are the paper's (docs/r2ac.md#optimiser-and-hyper-parameters)."""

    discount: float = 0.99
    """gamma; the discount is 0 across an episode (or life) end."""
    baseline_cost: float = 0.5
    """Weight of the value loss 1/2 sum (v_s - V(x_s))^2."""
    entropy_cost: float = 0.01
    """Weight of the entropy regulariser sum pi log pi (minus the entropy)."""
    reward_clip: float = 1.0
    """Rewards are clipped to [-reward_clip, reward_clip] in the loss and in the reward input; <= 0: no clipping."""
    lr: float = 6e-4
    """RMSProp learning rate at the start; decays linearly to 0 over ``total_updates``."""
    rms_alpha: float = 0.99
    """RMSProp smoothing constant."""
    rms_eps: float = 0.01
    """RMSProp epsilon (PyTorch places it outside the square root, as the paper's code does)."""
    rms_momentum: float = 0.0
    """RMSProp momentum."""
    grad_clip: float = 40.0
    """Global gradient-norm clip over all parameters (RTRL gradients included); <= 0: no clipping."""
    total_updates: int | None = None
    """Learner updates over which the LR decays to 0; None: the trainer's ``max_steps`` (no decay if unset)."""
    clip_rho: float = 1.0
    """V-trace rho-bar (importance-weight truncation of the TD errors)."""
    clip_c: float = 1.0
    """V-trace c-bar (truncation of the traces)."""
    clip_pg_rho: float = 1.0
    """Truncation of the importance weight of the policy-gradient advantage."""
    return_window: int = 100
    """The logged mean episode return is over the last ``return_window`` completed episodes."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before ``reward_clip``, in the loss and in the reward input (1: the paper's).
    For dense negative rewards such as Pendulum's (about -16..0 per step) use 0.1 and ``reward_clip`` 0."""
    optimizer: str = "rmsprop"
    """"rmsprop" (the paper's, with ``rms_alpha``, ``rms_eps``, ``rms_momentum``) or "adam" (``adam_eps``; betas
    (0.9, 0.999)). Both start at ``lr`` and decay linearly over ``total_updates``."""
    adam_eps: float = 1e-5
    """Adam's epsilon (``optimizer: adam`` only)."""
    log_std_init: float = 0.0
    """Continuous actions (Box) only: the Gaussian policy's initial log standard deviation, in the action space
    normalised to [-1, 1] (0: std 1, half the range of a bounded dimension)."""
    state_dependent_std: bool = False
    """Continuous actions only: the log-std is a linear function of the core output (default: one learned parameter
    per action dimension, independent of the state)."""
    squash_actions: bool = False
    """Continuous actions only: tanh-squash the Gaussian into the bounds (with the log-prob correction) instead of
    clipping its samples to them."""


class R2AC(OnlineRecurrentModule):
    """Real-time recurrent actor-critic (Irie et al. 2024) with V-trace (docs/r2ac.md).

    The losses are summed over time and streams (the paper's convention, ``loss_reduction = "sum"``): under DDP the
    backpropagated loss is multiplied by the number of processes W, so that W processes with B streams each compute
    the gradient of one process with all W * B streams; the logged losses are this process's sums.

    Build it from the env's spaces with :meth:`from_spaces` (any action and observation space R2AC supports), or
    for a Discrete action set and array observations from ``num_actions`` and ``obs_shape`` (the paper's setting).

    Args:
        num_actions: A, the size of the discrete action set (or None with ``action_space``).
        obs_shape: one observation's shape: (C, H, W) uint8 frames, or (D,) vectors (or None with
            ``observation_space``).
        cell: an ElementwiseCell built for input size ``fc_size + 1``, a cell alias ("elstm", "qrnn", "sru",
            "felstm"), or None for the feed-forward baseline.
        hidden_size: N, when ``cell`` is an alias.
        stem: "impala" (paper), "nature" (cheaper on CPU), "mlp" (vector observations) or "auto".
        fc_size: width of the stem's output (256 in the paper).
        config: loss and optimiser settings (:class:`R2ACConfig`; the paper's by default).
        cell_kwargs: extra keyword arguments for the cell when ``cell`` is an alias (e.g. ``{"forget_bias": 2.0}``).
        method: a gradient method or its name; None takes the trainer strategy's.
        action_space: the env's single action space (a gymnasium space or its
            :func:`~onlinerec.rl.policy.space_spec`): ``Discrete`` -> softmax policy, float ``Box`` -> diagonal
            Gaussian (``R2ACConfig.log_std_init``, ``state_dependent_std``, ``squash_actions``).
        observation_space: the env's single observation space: a ``Box`` gives ``obs_shape``; a ``Dict`` or
            ``Tuple`` (or a Discrete/MultiDiscrete/Text space) gets a :class:`~onlinerec.rl.nets.DictStem`, one stem
            per key (``stem`` picks the CNN of image keys).
    """

    loss_reduction = "sum"

    def __init__(
        self,
        num_actions: int | None = None,
        obs_shape: Sequence[int] | None = None,
        cell: ElementwiseCell | str | None = "elstm",
        hidden_size: int = 256,
        stem: str = "impala",
        fc_size: int = 256,
        config: R2ACConfig | dict[str, Any] | None = None,
        cell_kwargs: dict[str, Any] | None = None,
        method: Any = None,
        *,
        action_space: Any = None,
        observation_space: Any = None,
    ) -> None:
        action_spec = _action_spec(num_actions, action_space)
        obs_spec, obs_shape = _observation_spec(obs_shape, observation_space)
        core_in = fc_size + 1
        if isinstance(cell, str):
            cell_obj: ElementwiseCell | None = make_cell(cell, core_in, hidden_size, **(cell_kwargs or {}))
        else:
            cell_obj = cell
        if cell_obj is not None and cell_obj.input_size != core_in:
            raise ValueError(
                f"the cell's input_size is {cell_obj.input_size} but R2AC feeds it fc_size + 1 = {core_in} features."
            )
        if isinstance(config, dict):
            config = R2ACConfig(**config)
        self.config = config or R2ACConfig()
        super().__init__(cell_obj, lr=self.config.lr, method=method)
        self.save_hyperparameters(
            {
                "num_actions": action_spec["n"] if action_spec["type"] == "Discrete" else None,
                "obs_shape": None if obs_shape is None else list(obs_shape),
                "cell": cell if isinstance(cell, str) or cell is None else type(cell).__name__,
                "hidden_size": hidden_size if cell_obj is None else cell_obj.hidden_size,
                "stem": stem,
                "fc_size": fc_size,
                "config": asdict(self.config),
                "cell_kwargs": dict(cell_kwargs or {}),
                "action_space": action_spec,
                "observation_space": obs_spec,
            }
        )
        self._spaces = {  # the gymnasium spaces given (in memory only; checkpoints keep the specs)
            k: v for k, v in (("action", action_space), ("observation", observation_space)) if _is_space(v)
        }
        self.action_space_spec = action_spec
        self.observation_space_spec = obs_spec
        self.num_actions: int | None = action_spec["n"] if action_spec["type"] == "Discrete" else None
        self.obs_shape = obs_shape
        if obs_shape is None or (obs_spec is not None and is_image_spec(obs_spec) and is_channels_last(obs_shape)):
            self.stem: nn.Module = DictStem(obs_spec, fc_size, image_stem=stem)  # per key; or an HWC image
        else:
            self.stem = make_stem(stem, obs_shape, fc_size)
        head_in = core_in if cell_obj is None else cell_obj.output_size
        cfg = self.config
        self.policy: ActionHead = make_head(
            action_spec,
            head_in,
            state_dependent_std=cfg.state_dependent_std,
            squash=cfg.squash_actions,
            log_std_init=cfg.log_std_init,
        )
        self.baseline = nn.Linear(head_in, 1)

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
        """The reward as the loss and the reward input see it: times ``reward_scale``, clipped to ``reward_clip``."""
        if self.config.reward_scale != 1.0:
            reward = reward * self.config.reward_scale
        c = self.config.reward_clip
        return reward.clamp(-c, c) if c > 0 else reward

    def features(self, obs: Tensor | dict[str, Tensor], reward: Tensor) -> Tensor:
        """Core inputs x (T, B, fc_size + 1) = [stem(obs); clipped reward] for obs (T, B, *obs_shape), or a dict of
        such tensors (Dict/Tuple observations, flat keys). x has the cell's dtype (under autocast the stem's output
        is bfloat16/float16; the cell's own layers still run under autocast)."""
        t, b = reward.shape[:2]
        flat = _map(obs, lambda v: v.reshape(t * b, *v.shape[2:]))
        feats = self.stem(flat).reshape(t, b, -1)
        x = torch.cat([feats, self._clip(reward.to(feats.dtype)).unsqueeze(-1)], dim=-1)
        if self.cell is not None:
            x = x.to(next(self.cell.parameters()).dtype)
        return x

    def heads(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """Policy parameters (..., P) (the logits for Discrete actions) and value (...,) from core outputs h (..., N)."""
        return self.policy(h), self.baseline(h).squeeze(-1)

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
        """One agent step for B streams (the :class:`~onlinerec.rl.rollout.Actor` step): advances the carried
        state of ``stream`` (zeroed first where ``reset``) and returns (actions, policy parameters (B, P)).

        Discrete: actions (B,) int64 sampled from softmax(logits), or the argmax when ``greedy``. Box: actions
        (B, A) float32, a sample of the Gaussian (its mean when ``greedy``) in the normalised space; the env takes
        :meth:`env_actions` of them (clipped or squashed into its bounds)."""
        x = self.features(_map(obs, lambda v: v.unsqueeze(0)), reward.unsqueeze(0))
        params, _ = self.heads(self(x, reset.unsqueeze(0).bool(), stream)[0])
        actions = self.policy.mode(params) if greedy else self.policy.sample(params)
        return actions, params

    def env_actions(self, actions: Tensor) -> Tensor:
        """Actions from :meth:`act` as the env takes them: unchanged for Discrete; for a Box, clipped (or
        tanh-squashed) into [-1, 1] and mapped onto its bounds, shaped (B, *shape)."""
        return self.policy.env_actions(actions)

    # -- the learner ----------------------------------------------------------------------------
    def learner_outputs(self, segment: RolloutSegment) -> tuple[Tensor, Tensor, Tensor]:
        """Policy parameters (M, B, P) and values (M, B) on entries 0..M-1 (with grad) and the bootstrap value (B,) at
        entry M (no grad). Advances the "train" carry over entries 0..M-1 only (module docstring of rollout)."""
        m = segment.length - 1
        x = self.features(segment.inputs, segment.rewards)
        logits, values = self.heads(self(x[:m], segment.reset[:m], "train"))
        with torch.no_grad():
            h_boot = x[m:].detach()  # entry M, from the carry at the segment's end, which stays where it is
            if not self.feed_forward:
                h_boot = self.cell.readout(self.lookahead(h_boot, segment.reset[m:]), h_boot)
            _, bootstrap = self.heads(h_boot[0])
        return logits, values, bootstrap

    @override
    def segment_outputs(self, segment: RolloutSegment, stream: str) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        if not isinstance(segment, RolloutSegment):
            raise TypeError(f"R2AC trains on RolloutSegments (from RolloutDataModule), got {type(segment).__name__}.")
        if stream != "train":
            raise RuntimeError(
                f"R2AC learns from training rollouts only; evaluate it with R2AC.evaluate (got a {stream} batch)."
            )
        return self.learner_outputs(segment)

    @override
    def segment_loss(self, outputs: tuple[Tensor, Tensor, Tensor], segment: RolloutSegment) -> dict[str, Tensor]:  # type: ignore[override]
        """V-trace actor-critic losses of one segment, summed over time and streams (docs/r2ac.md)."""
        cfg = self.config
        params, values, bootstrap = (_full_precision(t) for t in outputs)  # AMP: the losses in float32
        actions = segment.actions[1:]
        rewards = self._clip(segment.rewards[1:].to(values.dtype))
        discounts = cfg.discount * (~segment.reset[1:]).to(values.dtype)
        target_logp = self.policy.log_prob(params, actions)
        entropy = self.policy.entropy(params)
        vs, advantages = vtrace(
            segment.behaviour_logp[1:].to(values.dtype),
            target_logp.detach(),
            rewards,
            discounts,
            values.detach(),
            bootstrap,
            clip_rho=cfg.clip_rho,
            clip_c=cfg.clip_c,
            clip_pg_rho=cfg.clip_pg_rho,
        )
        pg_loss = -(target_logp * advantages).sum()
        baseline_loss = cfg.baseline_cost * 0.5 * ((vs - values) ** 2).sum()
        entropy_loss = cfg.entropy_cost * (-entropy).sum()
        total = pg_loss + baseline_loss + entropy_loss
        return {
            "loss": total,
            "pg_loss": pg_loss,
            "baseline_loss": baseline_loss,
            "entropy_loss": entropy_loss,
            "entropy": entropy.detach().mean(),
        }

    def losses(self, segment: RolloutSegment) -> dict[str, Tensor]:
        """:meth:`segment_loss` of one training segment (advances the "train" carry)."""
        return self.segment_loss(self.learner_outputs(segment), segment)

    @override
    def configure_callbacks(self) -> list[Callback]:
        """FiniteGuard (see the base class) and a :class:`~onlinerec.rl.monitor.RolloutMonitor` unless the Trainer has one."""
        have = self._trainer.callbacks if self._trainer is not None else []
        extra = (
            [] if any(isinstance(cb, RolloutMonitor) for cb in have) else [RolloutMonitor(self.config.return_window)]
        )
        return super().configure_callbacks() + extra

    # -- optimisation -------------------------------------------------------------------------------
    @override
    def configure_optimizers(self) -> Any:
        cfg = self.config
        if cfg.optimizer == "rmsprop":
            opt: torch.optim.Optimizer = torch.optim.RMSprop(
                self.parameters(), lr=cfg.lr, alpha=cfg.rms_alpha, eps=cfg.rms_eps, momentum=cfg.rms_momentum
            )
        elif cfg.optimizer == "adam":
            opt = torch.optim.Adam(self.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        else:
            raise ValueError(f"R2ACConfig.optimizer must be 'rmsprop' or 'adam', got {cfg.optimizer!r}.")
        total = cfg.total_updates
        if total is None and self._trainer is not None and self.trainer.max_steps and self.trainer.max_steps > 0:
            total = self.trainer.max_steps
        if not total:
            return opt
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: max(0.0, 1.0 - k / total))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}

    @override
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        clip = self.config.grad_clip if gradient_clip_val is None else gradient_clip_val
        if clip and clip > 0:
            self.clip_gradients(
                optimizer, gradient_clip_val=clip, gradient_clip_algorithm=gradient_clip_algorithm or "norm"
            )

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


def _map(obs: Any, fn: Any) -> Any:
    """``fn`` on a tensor, or on every value of a dict of tensors (Dict/Tuple observations)."""
    if isinstance(obs, dict):
        return {k: fn(v) for k, v in obs.items()}
    return fn(obs)


def _is_space(value: Any) -> bool:
    return value is not None and not isinstance(value, dict) and hasattr(value, "sample")


def _full_precision(t: Tensor) -> Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _action_spec(num_actions: int | None, action_space: Any) -> dict[str, Any]:
    if action_space is None:
        if num_actions is None:
            raise ValueError("R2AC needs num_actions (a Discrete action set) or action_space= (e.g. a Box).")
        return {"type": "Discrete", "n": int(num_actions), "start": 0}
    spec = space_spec(action_space)
    if num_actions is not None and (spec["type"] != "Discrete" or int(spec["n"]) != int(num_actions)):
        raise ValueError(f"num_actions={num_actions} contradicts action_space={spec}; pass one of them.")
    return spec


def _observation_spec(
    obs_shape: Sequence[int] | None, observation_space: Any
) -> tuple[dict[str, Any] | None, tuple[int, ...] | None]:
    if observation_space is None:
        if obs_shape is None:
            raise ValueError("R2AC needs obs_shape (array observations) or observation_space= (e.g. a Dict).")
        return None, tuple(int(s) for s in obs_shape)
    spec = space_spec(observation_space)
    if spec["type"] != "Box":
        if obs_shape is not None:
            raise ValueError(f"obs_shape={tuple(obs_shape)} given for a {spec['type']} observation space; drop it.")
        return spec, None
    shape = tuple(int(s) for s in spec["shape"])
    if obs_shape is not None and tuple(int(s) for s in obs_shape) != shape:
        raise ValueError(f"obs_shape={tuple(obs_shape)} contradicts observation_space's shape {shape}.")
    return spec, shape
