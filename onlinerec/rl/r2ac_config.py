"""R2AC's settings: :class:`R2ACConfig`, the losses' and the optimiser's hyper-parameters, with their checks.

The defaults are the paper's (docs/r2ac.md#the-papers-settings). :data:`REMOVED_FIELDS` names the fields that are gone
and what replaces them; :func:`config_from_dict` builds a config from a saved model's hyper-parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["REMOVED_FIELDS", "R2ACConfig", "config_from_dict", "removed_field_error"]

REMOVED_FIELDS: dict[str, str] = {
    "detach_value": "give the value a core of its own with separate_critic: true, or lower baseline_cost",
}
"""Fields R2ACConfig no longer has, each with what replaces it. A config file or a command line that sets one is
refused with :func:`removed_field_error`'s message."""


def removed_field_error(name: str) -> str:
    """The message for a config that sets the removed field ``name``."""
    return f"{name} was removed: {REMOVED_FIELDS[name]}."


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


def config_from_dict(values: Mapping[str, Any]) -> R2ACConfig:
    """An :class:`R2ACConfig` from a mapping of its fields (``R2AC(config={...})``, a checkpoint's hyper-parameters).

    A removed field set to ``False``, which is what R2AC does now, is dropped, so that a model saved while the field
    existed loads; set otherwise, it raises ``ValueError`` with what replaces it."""
    values = dict(values)
    for name in REMOVED_FIELDS:
        if name in values and values.pop(name) is not False:
            raise ValueError(removed_field_error(name))
    return R2ACConfig(**values)
