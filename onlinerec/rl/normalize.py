"""Running statistics that make R2AC's inputs scale-free: reward normalisation by a running estimate of the
discounted return's scale (``R2ACConfig.reward_norm``) and observation normalisation (``R2ACConfig.obs_norm``).

Both follow stable-baselines3's ``VecNormalize``. Rewards (PPO's reward scaling): every stream keeps its discounted
return R_t = gamma R_{t-1} + r_t (zeroed after an episode ends), a running variance of those returns is kept over all
streams, and rewards are divided by its standard deviation sqrt(var + eps). Only the scale changes (the mean is not
subtracted), so the sign of a reward and where it is zero are kept. Observations: each feature is centred and scaled
by its running mean and standard deviation, then clipped.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["ObservationNormalizer", "ReturnNormalizer", "RunningMeanStd", "discounted_returns"]


def discounted_returns(start: Tensor, rewards: Tensor, done: Tensor, discount: float) -> tuple[Tensor, Tensor]:
    """Every step's running discounted return, (T, B), and the returns carried on, (B,).

    ``R_t = discount * R_{t-1} + rewards[t]`` from ``R_{-1} = start``, then ``R_t = 0`` where ``done[t]`` (the reward
    at t was the episode's last): sb3's ``returns = returns * gamma + reward; ...; returns[dones] = 0``.
    """
    ret, out = start, []
    for t in range(rewards.shape[0]):
        ret = ret * discount + rewards[t]
        out.append(ret)
        ret = ret.masked_fill(done[t], 0.0)
    return torch.stack(out), ret


def fold_one(mean, var, count, x):
    """(mean, var, count) after one more sample x: Chan et al.'s update with n = 1, on floats, NumPy arrays or tensors
    alike (the same float64 arithmetic in each)."""
    new_count = count + 1.0
    delta = x - mean
    m2 = var * count + delta * delta * count / new_count
    return mean + delta / new_count, m2 / new_count, new_count


class RunningMeanStd(nn.Module):
    """Running per-feature mean and variance of samples of shape ``shape`` (Chan et al.'s parallel update, sb3's
    ``RunningMeanStd``: mean 0, var 1 and a count of 1e-4 to start), as float64 buffers: they are checkpointed with
    the weights.

    Under DDP :meth:`update` all-reduces the batch's count, sums and sums of squares first, so every rank applies the
    same update and the statistics are identical on all ranks (the samples of all W processes).

    Args:
        shape: one sample's shape (``()``: scalars).
        eps: added to the variance under the square root of :attr:`std`.
    """

    def __init__(self, shape: tuple[int, ...] = (), eps: float = 1e-8) -> None:
        super().__init__()
        self.shape = tuple(int(n) for n in shape)
        self.eps = eps
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(self.shape, dtype=torch.float64))
        self.register_buffer("count", torch.full((), 1e-4, dtype=torch.float64))

    @property
    def std(self) -> Tensor:
        """sqrt(var + eps)."""
        return (self.var + self.eps).sqrt()

    @torch.no_grad()
    def update(self, samples: Tensor) -> None:
        """Fold a batch into the statistics: ``samples`` (..., *shape), every leading index one sample."""
        if tuple(samples.shape[samples.dim() - len(self.shape) :]) != self.shape:
            raise ValueError(
                f"samples of shape {self.shape} were expected, got a batch of shape {tuple(samples.shape)}."
            )
        x = samples.detach().to(device=self.mean.device, dtype=torch.float64).reshape(-1, *self.shape)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            moments = torch.cat([x.new_tensor([float(x.shape[0])]), x.sum(0).reshape(-1), (x * x).sum(0).reshape(-1)])
            dist.all_reduce(moments)  # every rank folds in the same batch: all W processes' samples
            n, (total, squares) = moments[0], moments[1:].chunk(2)
            if float(n) == 0:
                return
            total, squares = total.reshape(self.shape), squares.reshape(self.shape)
        elif x.shape[0] == 1:  # one sample (a streaming agent's step): the update below with n = 1, batch_var = 0
            mean, var, count = fold_one(self.mean, self.var, self.count, x[0])
            self.mean.copy_(mean)
            self.var.copy_(var)
            self.count.copy_(count)
            return
        else:  # one process: the same arithmetic without packing the moments
            if x.shape[0] == 0:
                return
            n, total, squares = float(x.shape[0]), x.sum(0), (x * x).sum(0)
        batch_mean = total / n
        batch_var = squares / n - batch_mean**2
        count = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var.clamp_min(0.0) * n + delta**2 * self.count * n / count
        self.mean.add_(delta * n / count)
        self.var.copy_(m2 / count)
        self.count.copy_(count)

    @torch.no_grad()
    def update_scalar(self, value: float) -> float:
        """Fold one sample of scalar statistics kept on the CPU (shape ``()``) and return the new :attr:`std`: the
        one-sample update of :meth:`update`, the same float64 arithmetic in Python floats, without a dozen tensor
        calls (a streaming agent makes one per env step)."""
        if self.shape or self.mean.device.type != "cpu":
            raise ValueError("update_scalar keeps scalar statistics on the CPU; use update() for these.")
        mean, var, count = fold_one(self.mean.item(), self.var.item(), self.count.item(), value)
        self.mean.fill_(mean)
        self.var.fill_(var)
        self.count.fill_(count)
        return math.sqrt(var + self.eps)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, eps={self.eps}"


class ReturnNormalizer(RunningMeanStd):
    """The running variance of discounted returns (scalars) whose :attr:`std` divides the rewards
    (``R2ACConfig.reward_norm``): every entry of an update's batch is one return."""

    def __init__(self, eps: float = 1e-8) -> None:
        super().__init__((), eps)


class ObservationNormalizer(RunningMeanStd):
    """Per-feature running mean and variance of vector observations (``R2ACConfig.obs_norm``; the observation half of
    sb3's ``VecNormalize``): :meth:`forward` gives ``clip((obs - mean) / std, -clip, clip)`` in the observation's
    float dtype, except on the features ``keep`` marks, which pass through unchanged (cast to that dtype).

    Args:
        shape: one observation's shape.
        clip: bound of the normalised observation (sb3's ``clip_obs`` is 10); <= 0: no clipping.
        keep: a bool mask of ``shape``: features left as they are (``R2ACConfig.obs_norm_skip_binary``: one-hot
            codes). None: normalise every feature. Statistics are kept for every feature either way, so the
            checkpointed buffers are the same with or without it; the mask itself is rebuilt from the settings.
    """

    def __init__(
        self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8, keep: Tensor | None = None
    ) -> None:
        super().__init__(shape, eps)
        self.clip = float(clip)
        if keep is not None and tuple(keep.shape) != self.shape:
            raise ValueError(f"keep must be a mask of the observation's shape {self.shape}, got {tuple(keep.shape)}.")
        self.keep: Tensor | None
        self.register_buffer("keep", None if keep is None else keep.to(torch.bool), persistent=False)

    def forward(self, obs: Tensor) -> Tensor:
        x = obs.to(obs.dtype if obs.is_floating_point() else torch.float32)
        out = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        out = out.clamp(-self.clip, self.clip) if self.clip > 0 else out
        return out if self.keep is None else torch.where(self.keep, x, out)

    @torch.no_grad()
    def update_and_normalize_one(self, obs: Any) -> Tensor:
        """One observation (an array or tensor of ``shape``), statistics on the CPU: ``update(x[None])`` then
        ``forward(x)`` for x = obs as float32, returned as (1, D), computed in NumPy on the buffers' own memory: the
        same float64 and float32 arithmetic, without thirty tensor calls (a streaming agent makes one per env step)."""
        if self.mean.device.type != "cpu" or (dist.is_available() and dist.is_initialized()):
            raise ValueError("update_and_normalize_one keeps statistics on one CPU process; use update(), forward().")
        x = obs.numpy(force=True) if isinstance(obs, Tensor) else np.asarray(obs)
        x = x.astype(np.float32).reshape(self.shape)
        mean, var = self.mean.numpy(), self.var.numpy()  # views: writes land in the buffers
        mean[...], var[...], count = fold_one(mean, var, self.count.item(), x.astype(np.float64))
        self.count.fill_(count)
        out = (x - mean.astype(np.float32)) / np.sqrt(var + self.eps).astype(np.float32)
        if self.clip > 0:
            out = np.clip(out, -self.clip, self.clip)
        if self.keep is not None:
            out = np.where(self.keep.numpy(), x, out)
        return torch.from_numpy(out).reshape(1, -1)

    def extra_repr(self) -> str:
        kept = "" if self.keep is None else f", kept={int(self.keep.sum())}"
        return f"{super().extra_repr()}, clip={self.clip}{kept}"
