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
from typing import Any, Literal

import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from typing_extensions import override

from onlinerec.cells import ElementwiseCell, Parallel, make_cell
from onlinerec.gradients.carry import Carry, StackCarry
from onlinerec.rl.evaluation import evaluate
from onlinerec.rl.monitor import RolloutMonitor
from onlinerec.rl.nets import DictStem, is_channels_last, is_image_spec, make_stem
from onlinerec.rl.normalize import ObservationNormalizer, ReturnNormalizer, discounted_returns
from onlinerec.rl.policy import ActionHead, make_head, space_from_spec, space_spec
from onlinerec.rl.rollout import RolloutSegment
from onlinerec.rl.vtrace import vtrace
from onlinerec.training.module import OnlineRecurrentModule

__all__ = ["R2AC", "R2ACConfig"]


@dataclass
class R2ACConfig:
    """Loss and optimisation hyper-parameters of R2AC; the defaults are the paper's (docs/r2ac.md#the-papers-settings)."""

    discount: float = 0.99
    """gamma; the discount is 0 across an episode (or life) end."""
    baseline_cost: float = 0.5
    """Weight of the value loss 1/2 sum (v_s - V(x_s))^2."""
    entropy_cost: float = 0.01
    """Weight of the entropy regulariser sum pi log pi (minus the entropy); the weight at the start under
    ``entropy_cost_final``."""
    entropy_cost_final: float | None = None
    """None (the paper's): ``entropy_cost`` throughout. A number: the entropy cost moves linearly from ``entropy_cost``
    to this over ``total_updates``, on the learning rate's clock (at optimiser step k both are at the fraction
    k / total_updates of their way), so a policy kept exploring early can settle late (0: a greedy-leaning policy at
    the end). Without ``total_updates`` (and no trainer's ``max_steps``) it stays at ``entropy_cost``."""
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
    """Learner updates (optimiser steps: ``epochs * minibatches`` per segment) over which the LR decays to 0; None: the
    trainer's ``max_steps`` (no decay if unset)."""
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

    # -- a scale-free learning signal and several passes per segment (off by default: the paper's R2AC) --------------
    reward_norm: bool = False
    """Divide rewards by a running estimate of the discounted return's standard deviation (sb3's ``VecNormalize``,
    PPO's reward scaling; :class:`~onlinerec.rl.normalize.ReturnNormalizer`), after ``reward_scale`` and before
    ``reward_clip``, in the loss and in the reward input. The statistics are module buffers (checkpointed, identical
    on every DDP rank: each update all-reduces), updated once per training segment, after its update, from its
    rewards; each stream's running return is carried state (per rank, checkpointed with the carries). ``reward_clip``
    then clips the normalised reward (sb3 clips at 10; 0: no clipping)."""
    obs_norm: bool = False
    """Normalise vector observations feature by feature with running means and standard deviations, clipped to
    +-``obs_clip`` (the observation half of sb3's ``VecNormalize``, which rl-zoo's tuned RecurrentPPO uses on
    CartPoleNoVel; :class:`~onlinerec.rl.normalize.ObservationNormalizer`). As with ``reward_norm`` the statistics are
    module buffers (checkpointed, exported with the policy, identical on every DDP rank), updated once per training
    segment after its update from its entries 1..M, so the actor and every pass of a segment see the same
    normalisation. For flat vector observations only: image stems scale their pixels themselves."""
    obs_clip: float = 10.0
    """Bound of the normalised observations under ``obs_norm`` (sb3's ``clip_obs``); <= 0: no clipping."""
    obs_norm_skip_binary: bool = False
    """Under ``obs_norm``, leave as they are the features that the observation space bounds to exactly [0, 1]: the
    one-hot codes of flattened Discrete / MultiDiscrete parts (every ``popgym:`` memory game, and the previous action
    that some carry), and flags; only the other features are normalised. Normalised, a one-hot feature that is on a
    tenth of the time becomes 3.0 or -0.33, so the stem's inputs grow with the number of categories. Needs the
    observation space's bounds (``observation_space=``; the RL runner passes it). False: every feature is
    normalised (sb3's ``VecNormalize``)."""
    advantage_norm: bool = False
    """Normalise the policy-gradient advantages of every optimiser step to mean 0 and standard deviation 1 over its
    M x B entries ((A - mean) / (std + 1e-8), population std; this process's streams under DDP)."""
    loss_reduction: Literal["sum", "mean"] = "sum"
    """"sum" (the paper's): the losses are sums over the M steps and B streams, so the gradient's size grows with M and
    B; "mean": means over those M x B entries (= sum / (M B)), so a learning rate means the same for any M, B and
    number of DDP processes."""
    epochs: int = 1
    """K, gradient passes over each segment (1: the paper's one pass). With ``epochs * minibatches > 1`` every pass
    restarts from the carry (state and sensitivities) saved at the segment start and recomputes the segment with the
    current weights; the carry moves forward once per segment (docs/r2ac.md#several-passes-per-segment)."""
    minibatches: int = 1
    """Optimiser steps per pass, each on B / minibatches consecutive stream slots (the same split every pass); must
    divide B, the streams of a segment on this process (``num_envs``)."""
    bootstrap_truncation: bool = False
    """Bootstrap where an episode hits a time limit (truncated, not terminated) instead of treating the cut as the
    episode's end: the reward of that step gains gamma times the actor's value of the episode's final observation
    (from ``info["final_obs"]``, computed at collection from the actor's state; sb3 and Pardo et al. 2018, "Time
    Limits in Reinforcement Learning", do the same). Off: the paper's R2AC, where every end is terminal."""
    detach_value: bool = False
    """The value head reads the core's output with its gradient stopped: the value loss trains the value head (its
    MLP and linear layer) only, and the stem, core and ``core_norm`` learn from the policy and entropy terms alone.
    The forward pass and every value are unchanged, so the gradient of the shared layers equals the one with
    ``baseline_cost = 0``, and the value head's equals the one without this option. Off: the paper's shared
    actor-critic, where the value loss also shapes the core (weighted by ``baseline_cost``)."""
    ppo_clip: float | None = None
    """None: the V-trace policy gradient (the paper's). eps > 0: PPO's clipped-ratio objective
    min(rho A, clip(rho, 1 - eps, 1 + eps) A), rho = pi / mu against the actor's policy mu, with A the V-trace advantage
    r_s + gamma_s v_{s+1} - V(x_s) (without its importance weight, which rho replaces)."""

    trace_lambda: float = 1.0
    """lambda in [0, 1] of V-trace's traces, c_s = lambda min(clip_c, rho_s) (Espeholt et al. 2018, remark 2): 1 is
    the paper's V-trace; below 1 the targets lean on the critic sooner, with less variance and more bias. On-policy,
    v_s - V(x_s) is then GAE(gamma, lambda)'s advantage (PPO's lambda; RecurrentPPO's rl-zoo recipe uses 0.8)."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.trace_lambda, bool)
            or not isinstance(self.trace_lambda, (int, float))
            or not (0.0 <= self.trace_lambda <= 1.0)
        ):
            raise ValueError(
                f"R2ACConfig.trace_lambda must be a number in [0, 1] (1: the paper's V-trace; PPO's GAE often uses "
                f"0.95 or 0.8), got {self.trace_lambda!r}."
            )
        if self.loss_reduction not in ("sum", "mean"):
            raise ValueError(f"R2ACConfig.loss_reduction must be 'sum' or 'mean', got {self.loss_reduction!r}.")
        for name in ("epochs", "minibatches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"R2ACConfig.{name} must be an int >= 1, got {value!r}; 1 is the paper's one pass over each segment."
                )
        if self.ppo_clip is not None and not self.ppo_clip > 0:
            raise ValueError(
                f"R2ACConfig.ppo_clip must be a number > 0 (PPO uses 0.1 to 0.3) or None for V-trace's policy "
                f"gradient, got {self.ppo_clip!r}."
            )
        if self.optimizer not in ("rmsprop", "adam"):
            raise ValueError(f"R2ACConfig.optimizer must be 'rmsprop' or 'adam', got {self.optimizer!r}.")
        if self.obs_norm_skip_binary and not self.obs_norm:
            raise ValueError(
                "R2ACConfig.obs_norm_skip_binary=True only says which features obs_norm leaves alone, and obs_norm is "
                "off: set obs_norm=True as well (--r2ac.obs_norm true), or drop obs_norm_skip_binary "
                "(--r2ac.obs_norm_skip_binary false)."
            )
        if self.entropy_cost_final is not None and not self.entropy_cost_final >= 0:
            raise ValueError(
                f"R2ACConfig.entropy_cost_final must be a number >= 0 (the entropy cost at the end of training) or "
                f"None to keep entropy_cost constant, got {self.entropy_cost_final!r}."
            )

    @property
    def passes(self) -> int:
        """Optimiser steps per segment: ``epochs * minibatches`` (1: the paper's R2AC)."""
        return self.epochs * self.minibatches


def _mlp(width: int, sizes: list[int]) -> nn.Module:
    """Linear + tanh layers of the given widths (sb3's policy MLP); no layers: the identity (no parameters)."""
    layers: list[nn.Module] = []
    for out in sizes:
        layers += [nn.Linear(width, out), nn.Tanh()]
        width = out
    return nn.Sequential(*layers) if layers else nn.Identity()


class R2AC(OnlineRecurrentModule):
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
        config: loss and optimiser settings (:class:`R2ACConfig`; the paper's by default).
        cell_kwargs: extra keyword arguments for the cell when ``cell`` is an alias (e.g. ``{"forget_bias": 2.0}``).
        method: a gradient method or its name; None takes the trainer strategy's.
        action_space: the env's single action space (a gymnasium space or its
            :func:`~onlinerec.rl.policy.space_spec`): ``Discrete`` -> softmax policy, float ``Box`` -> diagonal
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
        action_spec = _action_spec(num_actions, action_space)
        head_sizes = [int(w) for w in head_sizes]
        if any(w < 1 for w in head_sizes):
            raise ValueError(f"head_sizes must be positive widths, got {head_sizes}.")
        obs_spec, obs_shape = _observation_spec(obs_shape, observation_space)
        core_in = fc_size + 1
        if separate_critic and isinstance(cell, ElementwiseCell):
            raise ValueError(
                "separate_critic=True builds the critic's core like the actor's from the cell's name; pass cell as a "
                f"name or a list of names (e.g. 'elstm' or ['lru', 'mingru']), not a built {type(cell).__name__}."
            )
        if isinstance(cell, (str, list, tuple)):  # a name, or a list of names (a stack of different cells)
            cell_obj: ElementwiseCell | None = make_cell(cell, core_in, hidden_size, **(cell_kwargs or {}))
        else:
            cell_obj = cell
        actor_core = cell_obj  # the policy's core (the whole core without separate_critic)
        if cell_obj is not None and cell_obj.input_size != core_in:
            raise ValueError(
                f"the cell's input_size is {cell_obj.input_size} but R2AC feeds it fc_size + 1 = {core_in} features."
            )
        if isinstance(config, dict):
            config = R2ACConfig(**config)
        if separate_critic and config is not None and config.detach_value:
            raise ValueError(
                "detach_value=True with separate_critic=True would leave the critic's own core untrained (the value "
                "loss is all it learns from); use one of them."
            )
        if separate_critic and cell_obj is not None:  # the critic's core: built like the actor's, its own weights
            critic_core = make_cell(cell, core_in, hidden_size, **(cell_kwargs or {}))
            cell_obj = Parallel([cell_obj, critic_core])  # each reads its own stem's features (R2AC.features)
        self.config = config or R2ACConfig()
        super().__init__(cell_obj, lr=self.config.lr, method=method)
        self.loss_reduction = self.config.loss_reduction  # the base module scales a sum by W under DDP, not a mean
        self.automatic_optimization = self.config.passes == 1  # several passes step the optimiser themselves
        self.return_normalizer = ReturnNormalizer() if self.config.reward_norm else None
        self._loss_streams: Tensor | None = None  # set during the first of several passes: minibatch 0's streams
        self._log_losses = True  # False for all but the last of several passes (see log_step)
        cell_name = list(cell) if isinstance(cell, (list, tuple)) else cell  # a name, or the names of a mixed stack
        if isinstance(cell, ElementwiseCell):  # an instance: its class name (the module keeps its weights)
            cell_name = type(cell).__name__
        self.save_hyperparameters(
            {
                "num_actions": action_spec["n"] if action_spec["type"] == "Discrete" else None,
                "obs_shape": None if obs_shape is None else list(obs_shape),
                "cell": cell_name,
                "hidden_size": hidden_size if actor_core is None else actor_core.hidden_size,
                "stem": stem,
                "fc_size": fc_size,
                "config": asdict(self.config),
                "cell_kwargs": dict(cell_kwargs or {}),
                "action_space": action_spec,
                "observation_space": obs_spec,
                "head_sizes": head_sizes,
                "core_norm": bool(core_norm),
                "separate_critic": bool(separate_critic),
            }
        )
        self._spaces = {  # the gymnasium spaces given (in memory only; checkpoints keep the specs)
            k: v for k, v in (("action", action_space), ("observation", observation_space)) if _is_space(v)
        }
        self.action_space_spec = action_spec
        self.observation_space_spec = obs_spec
        self.num_actions: int | None = action_spec["n"] if action_spec["type"] == "Discrete" else None
        self.obs_shape = obs_shape
        self.obs_normalizer = self._obs_normalizer(obs_shape, obs_spec)
        self._schedule_total: int | None = None  # the LR schedule's length, set by configure_optimizers
        self.stem: nn.Module = self._make_stem(obs_spec, obs_shape, stem, fc_size)
        self.critic_stem: nn.Module | None = None
        if separate_critic:
            self.critic_stem = self._make_stem(obs_spec, obs_shape, stem, fc_size)
        head_in = core_in if actor_core is None else actor_core.output_size
        self._split = (head_in, head_in) if separate_critic else None  # widths of the actor's and critic's outputs
        # a linear-recurrent core's output is unbounded (an LRU unit near |lambda| = 1 sums its inputs): normalised, its
        # growth cannot blow up the logits (docs/r2ac.md#the-networks-options)
        self.core_norm: nn.Module = nn.LayerNorm(head_in) if core_norm else nn.Identity()
        self.critic_norm: nn.Module | None = None
        if separate_critic:
            self.critic_norm = nn.LayerNorm(head_in) if core_norm else nn.Identity()
        self.policy_mlp, self.value_mlp = _mlp(head_in, head_sizes), _mlp(head_in, head_sizes)
        head_in = head_sizes[-1] if head_sizes else head_in
        cfg = self.config
        self.policy: ActionHead = make_head(
            action_spec,
            head_in,
            state_dependent_std=cfg.state_dependent_std,
            squash=cfg.squash_actions,
            log_std_init=cfg.log_std_init,
        )
        self.baseline = nn.Linear(head_in, 1)

    @staticmethod
    def _make_stem(obs_spec: Any, obs_shape: Any, stem: str, fc_size: int) -> nn.Module:
        if obs_shape is None or (obs_spec is not None and is_image_spec(obs_spec) and is_channels_last(obs_shape)):
            return DictStem(obs_spec, fc_size, image_stem=stem)  # per key; or an HWC image
        return make_stem(stem, obs_shape, fc_size)

    def _obs_normalizer(self, obs_shape: Any, obs_spec: dict[str, Any] | None) -> ObservationNormalizer | None:
        """``obs_norm``'s running statistics, after checking that the observations are flat vectors (not images, not
        Dict/Tuple observations, whose ``obs_shape`` is None); with ``obs_norm_skip_binary``, the mask of the
        features whose bounds are [0, 1]."""
        if not self.config.obs_norm:
            return None
        if obs_shape is None or len(obs_shape) != 1:
            seen = "Dict/Tuple observations" if obs_shape is None else f"observations of shape {tuple(obs_shape)}"
            raise ValueError(
                f"R2ACConfig.obs_norm normalises flat vector observations, but this agent reads {seen}. Image stems "
                "scale their pixels themselves: leave obs_norm off; for other observations normalise in the env "
                "(env_kwargs vector_wrappers=[{class_path: gymnasium.wrappers.vector.NormalizeObservation}])."
            )
        keep = _unit_bounded(obs_spec, tuple(obs_shape)) if self.config.obs_norm_skip_binary else None
        keep = keep if keep is not None and bool(keep.any()) else None  # nothing to keep: plain obs_norm, exactly
        return ObservationNormalizer(tuple(obs_shape), clip=self.config.obs_clip, keep=keep)

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
        flat = _map(obs, lambda v: v.reshape(t * b, *v.shape[2:]))
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
        critic_input = h.detach() if self.config.detach_value else h  # detach_value: the value loss stops at the head
        return self.policy(self.policy_mlp(h)), self._value(critic_input)

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
        """One agent step for B streams (the :class:`~onlinerec.rl.rollout.Actor` step): advances the carried
        state of ``stream`` (zeroed first where ``reset``) and returns (actions, policy parameters (B, P)).

        Discrete: actions (B,) int64 sampled from softmax(logits), or the argmax when ``greedy``. Box: actions
        (B, A) float32, a sample of the Gaussian (its mean when ``greedy``) in the normalised space; the env takes
        :meth:`env_actions` of them (clipped or squashed into its bounds)."""
        x = self.features(_map(obs, lambda v: v.unsqueeze(0)), reward.unsqueeze(0))
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
        x = self.features(_map(obs, lambda v: v.unsqueeze(0)), reward.unsqueeze(0))
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
        entry M (no grad). Advances the "train" carry over entries 0..M-1 only (module docstring of rollout)."""
        m = segment.length - 1
        x = self.features(segment.inputs, segment.rewards)
        logits, values = self.heads(self(x[:m], segment.reset[:m], "train"))
        bootstrap = self._value_ahead(x[m:], segment.reset[m:], "train")  # entry M, from the carry at the segment's end
        return logits, values, bootstrap

    @override
    def segment_outputs(self, segment: RolloutSegment, stream: str) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        _check_rollout(segment)
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
            pg = target_logp * advantages
        else:
            ratio = torch.exp(target_logp - segment.behaviour_logp[1:].to(values.dtype))
            pg = torch.min(ratio * advantages, ratio.clamp(1 - cfg.ppo_clip, 1 + cfg.ppo_clip) * advantages)
            extra["clip_fraction"] = ((ratio - 1).abs() > cfg.ppo_clip).to(values.dtype).mean().detach()
        reduce = Tensor.sum if cfg.loss_reduction == "sum" else Tensor.mean
        pg_loss = -reduce(pg)
        baseline_loss = cfg.baseline_cost * 0.5 * reduce((vs - values) ** 2)
        entropy_cost = self.entropy_cost_now()
        entropy_loss = entropy_cost * reduce(-entropy)
        total = pg_loss + baseline_loss + entropy_loss
        if cfg.entropy_cost_final is not None:
            extra["entropy_cost"] = torch.tensor(entropy_cost)
        return {
            "loss": total,
            "pg_loss": pg_loss,
            "baseline_loss": baseline_loss,
            "entropy_loss": entropy_loss,
            "entropy": entropy.detach().mean(),
            **extra,
        }

    def entropy_cost_now(self) -> float:
        """The entropy cost of the next optimiser step: ``entropy_cost``, or under ``entropy_cost_final`` the point
        of the linear schedule that the LR schedule has reached (both decay with the optimiser steps taken)."""
        cfg = self.config
        progress = None if cfg.entropy_cost_final is None else self._schedule_progress()
        if progress is None:
            return cfg.entropy_cost
        return cfg.entropy_cost + (cfg.entropy_cost_final - cfg.entropy_cost) * progress

    def _schedule_progress(self) -> float | None:
        """k / total_updates in [0, 1] after k optimiser steps of the LR schedule; None outside a trainer or
        without a schedule."""
        total = self._schedule_total
        if not total or self._trainer is None or not self.trainer.lr_scheduler_configs:
            return None
        return min(1.0, self.trainer.lr_scheduler_configs[0].scheduler.last_epoch / total)

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

    def several_passes(self, segment: RolloutSegment) -> dict[str, Tensor]:
        """``epochs`` passes over ``segment``, each of ``minibatches`` optimiser steps on consecutive stream slots,
        with RTRL kept exact (docs/r2ac.md#several-passes-per-segment). Returns (and logs) the last step's losses (detached).

        Every step starts from the "train" carry saved at the segment start (state and sensitivities, the
        minibatch's streams selected), recomputes the segment with the current weights, backpropagates (Lightning's
        ``manual_backward``: AMP scaling and DDP's gradient averaging as usual), clips by ``grad_clip`` and steps the
        optimiser and the LR schedule. With fixed weights each step's core gradient is therefore full BPTT over the
        stream's history for that step's loss.

        The carry moves forward once: the first step unrolls every stream (its loss and gradient cover minibatch 0
        only; streams do not interact, so that is minibatch 0's gradient) and the carry it leaves, computed with the
        weights the actor acted with, is the one carried to the next segment. It is exactly the carry of the
        paper's one-pass R2AC and equal to the actor's state, so the next segment's first pass is on-policy.
        """
        _check_rollout(segment)
        cfg = self.config
        b = segment.num_streams
        if b % cfg.minibatches:
            divisors = [d for d in range(1, b + 1) if b % d == 0]
            raise ValueError(
                f"R2ACConfig.minibatches = {cfg.minibatches} does not divide the {b} streams of a segment (num_envs on "
                f"this process): choose minibatches among {divisors}, or num_envs a multiple of {cfg.minibatches}."
            )
        opt, sched = self.optimizers(), self.lr_schedulers()
        start = self._segment_start(b)
        every = torch.arange(b, device=segment.reset.device)
        groups = every.chunk(cfg.minibatches)
        moved_on = None
        for epoch in range(cfg.epochs):
            for j, streams in enumerate(groups):
                first = epoch == 0 and j == 0
                if start is not None:  # a copy: the unroll may update it in place (donation)
                    self._carries["train"] = start.select(every if first else streams)
                part = segment if first or cfg.minibatches == 1 else segment.select(streams)
                self._loss_streams = streams if first and cfg.minibatches > 1 else None
                self._log_losses = epoch == cfg.epochs - 1 and j == len(groups) - 1
                try:
                    result = self.shared_step(part, "train")
                finally:
                    self._loss_streams, self._log_losses = None, True
                if first:
                    moved_on = self._carries.get("train")
                opt.zero_grad()
                self.manual_backward(result["loss"])
                opt.step()  # clipping: on_before_optimizer_step, after AMP's unscale as in automatic optimisation
                if sched is not None:
                    sched.step()
        if moved_on is not None:
            self._carries["train"] = moved_on
        return {k: v.detach() for k, v in result.items()}

    @override
    def log_step(self, result: dict[str, Tensor], stream: str, num_streams: int) -> None:
        """As the base class, but of several passes only the last step logs: Lightning keeps a training step's last
        logged value anyway, and a ``self.log`` costs about a millisecond (a fifth of a 10-pass run's time)."""
        if self._log_losses:
            super().log_step(result, stream, num_streams)

    def _segment_start(self, b: int) -> Carry | StackCarry | None:
        """The "train" carry at the segment start for ``b`` streams (zeros before the first segment), adapted to the
        method once and on the cell's device; None without a cell, or when the carry holds another number of streams
        (the first pass then raises the base module's error)."""
        if self.cell is None:
            return None
        carry = self._carries.get("train")
        if carry is None:
            return self.method.init_carry(self.cell, b)
        if carry.batch_size != b:
            return None
        device = next(self.cell.parameters()).device
        return self._adapt(carry if carry.device == device else carry.to(device), self.method)

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

    # -- optimisation -------------------------------------------------------------------------------
    @override
    def configure_optimizers(self) -> Any:
        """RMSProp or Adam at ``lr``, decaying linearly to 0 over ``total_updates`` optimiser steps (default: the
        trainer's ``max_steps``, which counts optimiser steps: ``epochs * minibatches`` per segment)."""
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
        self._schedule_total = total  # entropy_cost_final's schedule runs on this one's clock (_schedule_progress)
        if not self.automatic_optimization:  # several_passes steps it after every optimiser step
            return {"optimizer": opt, "lr_scheduler": sched}
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}

    @override
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        clip = self.config.grad_clip if gradient_clip_val is None else gradient_clip_val
        if clip and clip > 0:
            self.clip_gradients(
                optimizer, gradient_clip_val=clip, gradient_clip_algorithm=gradient_clip_algorithm or "norm"
            )

    @override
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Lightning clips only under automatic optimisation; several passes clip here, at the same point of the step
        # (after AMP's unscale, before the optimiser), so grad_clip means the same.
        if not self.automatic_optimization:
            self.configure_gradient_clipping(optimizer)

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


def _check_rollout(segment: Any) -> None:
    if not isinstance(segment, RolloutSegment):
        raise TypeError(f"R2AC trains on RolloutSegments (from RolloutDataModule), got {type(segment).__name__}.")


def _select_streams(outputs: tuple[Tensor, Tensor, Tensor], streams: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Policy parameters (M, B, P), values (M, B) and bootstrap values (B,) of the streams ``streams``."""
    params, values, bootstrap = outputs
    return params[:, streams], values[:, streams], bootstrap[streams]


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


def _unit_bounded(obs_spec: dict[str, Any] | None, shape: tuple[int, ...]) -> Tensor:
    """The features a Box observation space bounds to exactly [0, 1] (``R2ACConfig.obs_norm_skip_binary``)."""
    if obs_spec is None:
        raise ValueError(
            "R2ACConfig.obs_norm_skip_binary reads the observation space's bounds, but this R2AC was built from "
            "obs_shape alone: build it with observation_space= (R2AC.from_spaces), or set obs_norm_skip_binary=False."
        )
    space = space_from_spec(obs_spec)  # the one reader of the spec's bounds (a scalar or one per feature)
    return torch.from_numpy((space.low == 0) & (space.high == 1)).reshape(shape)


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
