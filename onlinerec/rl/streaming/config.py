"""The streaming actor-critic's settings: :class:`StreamACConfig`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StreamACConfig"]


@dataclass
class StreamACConfig:
    """Stream AC(lambda)'s settings (docs/streaming.md). The defaults are those of Farr et al. (2026) for the recurrent
    agent; the rest follows stream-x (Elsayed, Vasan & Mahmood 2024)."""

    discount: float = 0.99
    """gamma; 0 across a termination."""
    trace_lambda: float = 0.8
    """lambda of the eligibility traces: each step's gradient fades by gamma * lambda per step."""
    lr: float = 1.0
    """ObGD's largest step size alpha; the overshooting bound cuts it when the traces or the TD error are large."""
    kappa_policy: float = 1.5
    """ObGD's safety factor for the policy's network (stream-x's feed-forward agent: 3.0)."""
    kappa_value: float = 1.0
    """ObGD's safety factor for the value's network (stream-x's feed-forward agent: 2.0)."""
    entropy_cost: float = 0.01
    """Weight of the policy's entropy in its objective, signed by the TD error (stream-x's entropy term)."""
    width: int = 128
    """Width of the dense layer between the recurrent core and the head (each network: observation -> core -> width ->
    head; without a core, stream-x's two layers of this width)."""
    embed: bool = False
    """An embedding (Linear -> LayerNorm -> leaky ReLU, ``width`` wide) between the observation and the core, whose
    output also passes around the core to the dense layer above it: the RTU authors' network (Elelimy et al. 2024).
    It can code conjunctions of observation features that a linear recurrence cannot form; it learns from each
    step's own gradient (exact RTRL covers the core and what is above it)."""
    prev_action_reward: bool = False
    """The core also reads the previous action (one-hot, or the normalised Box action) and the previous reward
    (divided by the same running std as the TD error's), zeros at an episode's first step: what tells a core whose
    state starts at zero that the episode has just begun."""
    sparsity: float = 0.9
    """Share of each dense layer's input weights set to zero at initialisation (stream-x's sparse initialisation)."""
    obs_norm: bool = True
    """Normalise each observation feature by its running mean and standard deviation (updated at every step)."""
    reward_norm: bool = True
    """Divide rewards by the running standard deviation of the discounted return (stream-x's reward scaling)."""
    bootstrap_truncation: bool = True
    """Bootstrap the TD target at a time limit (from the value of the episode's last observation) instead of
    treating it as a termination; stream-x treats every episode end as terminal (False)."""

    def __post_init__(self) -> None:
        for name, low, high in (("discount", 0.0, 1.0), ("trace_lambda", 0.0, 1.0), ("sparsity", 0.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise ValueError(f"StreamACConfig.{name} must be a number in [{low}, {high}], got {value!r}.")
        for name in ("lr", "kappa_policy", "kappa_value"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"StreamACConfig.{name} must be a number > 0, got {value!r}.")
        if isinstance(self.entropy_cost, bool) or not self.entropy_cost >= 0:
            raise ValueError(f"StreamACConfig.entropy_cost must be a number >= 0, got {self.entropy_cost!r}.")
        for name in ("embed", "prev_action_reward", "obs_norm", "reward_norm", "bootstrap_truncation"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"StreamACConfig.{name} must be true or false, got {getattr(self, name)!r}.")
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise ValueError(f"StreamACConfig.width must be a positive int, got {self.width!r}.")
