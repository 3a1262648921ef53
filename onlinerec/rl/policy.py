"""R2AC's action distributions, chosen from the env's action space (docs/r2ac.md#action-and-observation-spaces).

A head maps core outputs h (..., N) to the *parameters* of a distribution (..., P); everything else is a pure
function of those parameters, so the actor, the rollout (behaviour log-probs), the learner (V-trace and the
losses) and an exported policy all read the same numbers:

=====================  ======================  ===========================================  ==========================
head                   action space            parameters (..., P)                          actions (what is stored)
=====================  ======================  ===========================================  ==========================
:class:`CategoricalHead`  ``Discrete(n)``      logits, P = n                                int64 (...,)
:class:`GaussianHead`     float ``Box`` (A =   [mean; log-std] of a diagonal Gaussian in    float32 (..., A): the
                          ``prod(shape)``)     the space normalised to [-1, 1] per          Gaussian sample u (before
                                               dimension, P = 2A                            clipping or tanh)
=====================  ======================  ===========================================  ==========================

``log_prob(params, actions)`` and ``entropy(params)`` return (...,) tensors that V-trace and the losses use
unchanged; ``sample``/``mode`` draw or pick actions; ``env_actions(actions)`` maps them into the env's action
space (the identity for Discrete; for a Box: tanh squashing or clipping, then the affine map of [-1, 1] onto
[low, high]). :func:`make_head` picks the head from a gymnasium space (or its
:func:`~onlinerec.rl.spaces.space_spec`); a mixed Discrete/Box space (Tuple or Dict) is refused.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from onlinerec.rl.spaces import space_spec

__all__ = ["ActionHead", "CategoricalHead", "GaussianHead", "make_head"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _leaf_types(spec: dict[str, Any]) -> list[str]:
    if spec["type"] == "Dict":
        return [t for sub in spec["spaces"].values() for t in _leaf_types(sub)]
    if spec["type"] == "Tuple":
        return [t for sub in spec["spaces"] for t in _leaf_types(sub)]
    return [spec["type"]]


def _per_dimension(value: Any, shape: tuple[int, ...]) -> Tensor:
    """A bound (a scalar, or one value per entry of the Box, flat or shaped) as a flat float32 vector."""
    t = torch.as_tensor(value, dtype=torch.float32)
    n = math.prod(shape)
    if t.numel() == n:
        return t.reshape(n).clone()
    return t.broadcast_to(shape).reshape(n).clone()


# -- heads ----------------------------------------------------------------------------------------------------
class ActionHead(nn.Module):
    """What every head provides (see the module docstring). ``forward`` is the only method with parameters."""

    kind: ClassVar[str]
    """``"discrete"`` or ``"continuous"``."""
    action_dtype: ClassVar[torch.dtype]
    """dtype of the stored actions."""
    param_size: int
    """P, the width of the distribution parameters (``behaviour_logits``' last dimension)."""
    action_size: tuple[int, ...]
    """Shape of one stored action: () for Discrete, (A,) for a Box."""

    def log_prob(self, params: Tensor, actions: Tensor) -> Tensor:
        raise NotImplementedError

    def entropy(self, params: Tensor) -> Tensor:
        raise NotImplementedError

    def sample(self, params: Tensor) -> Tensor:
        raise NotImplementedError

    def mode(self, params: Tensor) -> Tensor:
        raise NotImplementedError

    def env_actions(self, actions: Tensor) -> Tensor:
        """``actions`` (B, ...) as the env takes them (inside its action space)."""
        return actions

    def first_entry(self, batch_size: int) -> tuple[Tensor, Tensor, Tensor]:
        """(actions, params, log-probs) a rollout stores at a stream's first entry, where no action led to it."""
        raise NotImplementedError


class CategoricalHead(nn.Linear, ActionHead):
    """Softmax policy over ``Discrete(n)``: an ``nn.Linear(in_features, n)`` whose outputs are the logits (the paper's
    policy layer: its parameters keep the names ``weight`` and ``bias``)."""

    kind = "discrete"
    action_dtype = torch.int64

    def __init__(self, in_features: int, num_actions: int) -> None:
        super().__init__(in_features, num_actions)
        self.param_size = int(num_actions)
        self.action_size = ()

    def log_prob(self, params: Tensor, actions: Tensor) -> Tensor:
        return F.log_softmax(params, dim=-1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self, params: Tensor) -> Tensor:
        log_probs = F.log_softmax(params, dim=-1)
        return -(log_probs.exp() * log_probs).sum(-1)

    def sample(self, params: Tensor) -> Tensor:
        probs = torch.softmax(params.float(), -1)
        return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).reshape(probs.shape[:-1])

    def mode(self, params: Tensor) -> Tensor:
        return params.argmax(-1)

    def first_entry(self, batch_size: int) -> tuple[Tensor, Tensor, Tensor]:
        n = self.param_size
        return (
            torch.zeros(batch_size, dtype=torch.int64),
            torch.zeros(batch_size, n),
            torch.full((batch_size,), -math.log(n)),
        )


class GaussianHead(ActionHead):
    """Diagonal Gaussian policy over a float ``Box`` with A = ``prod(shape)`` dimensions.

    The Gaussian lives in the normalised space where each bounded dimension spans [-1, 1] (unbounded dimensions keep
    their units); :meth:`env_actions` maps a sample u to the env: ``squash=False`` clips u to [-1, 1],
    ``squash=True`` takes tanh(u), and bounded dimensions are then mapped affinely onto [low, high].

    ``log_prob`` is the log-density of u, and with ``squash`` that of tanh(u) (the change of variables adds
    ``-sum log(1 - tanh(u)^2)``, computed stably as ``2 (log 2 - u - softplus(-2u))``); the affine map to the bounds
    adds a constant that cancels in the ratio pi/mu, so it is left out. ``entropy`` is the entropy of the Gaussian
    (before squashing, which has no closed form): the usual regulariser.

    Args:
        in_features: N, the width of the core output.
        shape: the Box's shape; ``low``, ``high``: its bounds (scalars or arrays; +-inf for unbounded).
        state_dependent_std: the log-std is a linear function of h (else one learned parameter per dimension,
            independent of the state: the default).
        squash: tanh squashing (needs finite bounds) instead of clipping.
        log_std_init: the initial log-std (state-independent: the parameter's value; state-dependent: the bias).
        log_std_bounds: the log-std is clamped to this range.
    """

    kind = "continuous"
    action_dtype = torch.float32

    def __init__(
        self,
        in_features: int,
        shape: tuple[int, ...] | list[int],
        low: Any = -1.0,
        high: Any = 1.0,
        *,
        state_dependent_std: bool = False,
        squash: bool = False,
        log_std_init: float = 0.0,
        log_std_bounds: tuple[float, float] = (-5.0, 2.0),
    ) -> None:
        super().__init__()
        self.shape = tuple(int(s) for s in shape)
        a = int(math.prod(self.shape))
        self.action_size = (a,)
        self.param_size = 2 * a
        lo, hi = (_per_dimension(v, self.shape) for v in (low, high))
        if bool((lo >= hi).any()):
            raise ValueError(f"the Box's low must be below its high in every dimension; got low={low}, high={high}.")
        bounded = torch.isfinite(lo) & torch.isfinite(hi)
        if squash and not bool(bounded.all()):
            raise ValueError("squash=True (tanh) needs finite bounds in every dimension of the Box; use squash=False.")
        self.register_buffer("center", torch.where(bounded, (hi + lo) / 2, torch.zeros_like(lo)), persistent=False)
        self.register_buffer("half_range", torch.where(bounded, (hi - lo) / 2, torch.ones_like(lo)), persistent=False)
        self.register_buffer("bounded", bounded, persistent=False)
        self.squash = bool(squash)
        self.state_dependent_std = bool(state_dependent_std)
        self.log_std_bounds = (float(log_std_bounds[0]), float(log_std_bounds[1]))
        self.mean = nn.Linear(in_features, a)
        with torch.no_grad():  # start near the centre of the action space with the chosen spread
            self.mean.weight.mul_(0.01)
            self.mean.bias.zero_()
        if self.state_dependent_std:
            self.log_std = nn.Linear(in_features, a)
            with torch.no_grad():
                self.log_std.weight.mul_(0.01)
                self.log_std.bias.fill_(log_std_init)
        else:
            self.log_std = nn.Parameter(torch.full((a,), float(log_std_init)))

    def forward(self, h: Tensor) -> Tensor:
        mean = self.mean(h)
        log_std = self.log_std(h) if self.state_dependent_std else self.log_std.to(mean.dtype).expand_as(mean)
        return torch.cat([mean, log_std.clamp(*self.log_std_bounds)], dim=-1)

    def split(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """(mean, log-std), each (..., A)."""
        return params.chunk(2, dim=-1)

    def log_prob(self, params: Tensor, actions: Tensor) -> Tensor:
        mean, log_std = self.split(params)
        u = actions.to(mean.dtype)
        z = (u - mean) * torch.exp(-log_std)
        logp = (-0.5 * z * z - log_std - _LOG_SQRT_2PI).sum(-1)
        if self.squash:
            logp = logp - (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
        return logp

    def entropy(self, params: Tensor) -> Tensor:
        _, log_std = self.split(params)
        return (0.5 + _LOG_SQRT_2PI + log_std).sum(-1)

    def sample(self, params: Tensor) -> Tensor:
        mean, log_std = self.split(params.float())
        return mean + torch.exp(log_std) * torch.randn_like(mean)

    def mode(self, params: Tensor) -> Tensor:
        return self.split(params.float())[0]

    def env_actions(self, actions: Tensor) -> Tensor:
        u = actions.float()
        a = torch.tanh(u) if self.squash else torch.where(self.bounded, u.clamp(-1.0, 1.0), u)
        return (self.center + self.half_range * a).reshape(*actions.shape[:-1], *self.shape)

    def first_entry(self, batch_size: int) -> tuple[Tensor, Tensor, Tensor]:
        a = self.action_size[0]
        return torch.zeros(batch_size, a), torch.zeros(batch_size, 2 * a), torch.zeros(batch_size)

    def extra_repr(self) -> str:
        std = "state-dependent" if self.state_dependent_std else "state-independent"
        return f"shape={self.shape}, {std} log-std, squash={self.squash}"


def make_head(action_space: Any, in_features: int, **gaussian: Any) -> ActionHead:
    """The head for ``action_space`` (a gymnasium space or its :func:`~onlinerec.rl.spaces.space_spec`): ``Discrete`` ->
    :class:`CategoricalHead`, float ``Box`` -> :class:`GaussianHead` (``gaussian`` are its keyword arguments).
    Mixed Discrete/Box spaces and other spaces are refused with a ``ValueError`` that says what to do."""
    spec = space_spec(action_space)
    kind = spec["type"]
    if kind == "Discrete":
        if spec.get("start", 0) != 0:
            raise ValueError(f"a Discrete action space must start at 0 (got start={spec['start']}); wrap the env.")
        return CategoricalHead(in_features, spec["n"])
    if kind == "Box":
        if not str(spec.get("dtype", "float32")).startswith("float"):
            raise ValueError(
                f"a Box action space must have a float dtype, got {spec['dtype']}; use Discrete for integers."
            )
        return GaussianHead(in_features, spec["shape"], spec["low"], spec["high"], **gaussian)
    if kind in ("Tuple", "Dict"):
        leaves = _leaf_types(spec)
        if {"Discrete", "MultiDiscrete", "MultiBinary"} & set(leaves) and "Box" in leaves:
            raise ValueError(
                f"mixed Discrete/Box action spaces are not supported ({kind} of {leaves}): R2AC's policy is either "
                "categorical (Discrete) or Gaussian (Box). Wrap the env so that it exposes one Discrete or one Box "
                "action space."
            )
        raise ValueError(
            f"{kind} action spaces are not supported ({leaves}); wrap the env so that it exposes one Discrete or one "
            "float Box action space (gymnasium.spaces.flatten_space gives a Box)."
        )
    raise ValueError(
        f"{kind} action spaces are not supported by R2AC's policy heads; use Discrete or a float Box "
        "(a MultiDiscrete space can be flattened into one Discrete)."
    )
