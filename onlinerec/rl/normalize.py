"""Reward normalisation by a running estimate of the discounted return's scale (``R2ACConfig.reward_norm``).

The scheme of stable-baselines3's ``VecNormalize`` (PPO's reward scaling): every stream keeps its discounted return
R_t = gamma R_{t-1} + r_t (zeroed after an episode ends), a running variance of those returns is kept over all
streams, and rewards are divided by its standard deviation sqrt(var + eps). Only the scale changes (the mean is not
subtracted), so the sign of a reward and where it is zero are kept.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["ReturnNormalizer", "discounted_returns"]


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


class ReturnNormalizer(nn.Module):
    """Running mean and variance of discounted returns (Chan et al.'s parallel update, sb3's ``RunningMeanStd``:
    mean 0, var 1 and a count of 1e-4 to start), as float64 buffers: they are checkpointed with the weights.

    Under DDP :meth:`update` all-reduces the batch's count, sum and sum of squares first, so every rank applies the
    same update and the statistics are identical on all ranks (the returns of all W * B streams).

    Args:
        eps: added to the variance under the square root of :attr:`std`.
    """

    def __init__(self, eps: float = 1e-8) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("count", torch.full((), 1e-4, dtype=torch.float64))

    @property
    def std(self) -> Tensor:
        """sqrt(var + eps), the divisor of the rewards."""
        return (self.var + self.eps).sqrt()

    @torch.no_grad()
    def update(self, returns: Tensor) -> None:
        """Fold a batch of returns (any shape; every entry one sample) into the statistics."""
        x = returns.detach().to(device=self.mean.device, dtype=torch.float64).reshape(-1)
        moments = torch.stack([x.new_tensor(float(x.numel())), x.sum(), (x * x).sum()])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(moments)  # every rank folds in the same batch: all W * B streams' returns
        n, total, squares = moments.unbind()
        if float(n) == 0:
            return
        batch_mean = total / n
        batch_var = (squares / n - batch_mean**2).clamp_min(0.0)
        count = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / count
        self.mean.add_(delta * n / count)
        self.var.copy_(m2 / count)
        self.count.copy_(count)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"
