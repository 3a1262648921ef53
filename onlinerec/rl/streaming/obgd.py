"""Overshooting-bounded gradient descent (ObGD) with eligibility traces: the optimiser of streaming deep RL.

Elsayed, Vasan & Mahmood (2024), "Streaming Deep Reinforcement Learning Finally Works", Algorithm 3. Every parameter
keeps a trace z (its shape) of past gradients of the step's objective; a TD error delta then moves the weights along
the trace, with a step size cut so that one update cannot overshoot the TD target by more than a factor:

    z      <- gamma * lambda * z + grad                 (grad: d objective / d theta, this step's)
    delta' =  max(|delta|, 1)
    alpha' =  alpha / max(1, alpha * kappa * delta' * ||z||_1)
    theta  <- theta + alpha' * delta * z

The traces are zeroed where an episode ends (after that step's update). Every operation runs on the parameters'
device with no host synchronisation (the step size stays a tensor).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn


class ObGD(nn.Module):
    """ObGD over ``params`` with its own traces (one instance per network: the actor's and the critic's have their own
    kappa). The traces are buffers, so they follow the module's device and dtype and its ``state_dict``; the parameters
    are only referenced (their module owns them).

    Args:
        params: the parameters it moves (their ``.grad`` holds this step's gradient of the objective, to ascend).
        lr: alpha, the largest step size (1.0 in stream-x).
        gamma, lam: the traces decay by gamma * lam per step.
        kappa: the overshooting bound's safety factor (stream-x's AC: 3.0 for the policy, 2.0 for the value; Farr et
            al. 2026: 1.5 and 1.0).
    """

    def __init__(self, params: Iterable[nn.Parameter], lr: float, gamma: float, lam: float, kappa: float) -> None:
        super().__init__()
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ObGD needs at least one parameter that requires grad.")
        self.lr, self.decay, self.kappa = float(lr), float(gamma) * float(lam), float(kappa)
        self._trace_names = [f"trace_{i}" for i in range(len(self.params))]
        for name, p in zip(self._trace_names, self.params):
            self.register_buffer(name, torch.zeros_like(p))

    @property
    def traces(self) -> list[Tensor]:
        """z, one per parameter, in the order of ``params``."""
        return [self._buffers[name] for name in self._trace_names]

    @torch.no_grad()
    def step(self, delta: Tensor, reset: bool) -> Tensor:
        """Add this step's gradients to the traces and move along them by ``delta`` (a 0-d tensor); zero the traces
        if ``reset`` (the episode ended). Returns the step size used, as a 0-d tensor (no host synchronisation)."""
        traces = self.traces
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        torch._foreach_mul_(traces, self.decay)
        torch._foreach_add_(traces, grads)
        norm = torch.stack(torch._foreach_norm(traces, 1)).sum()
        bound = self.lr * self.kappa * delta.abs().clamp_min(1.0) * norm
        step = self.lr / bound.clamp_min(1.0)
        torch._foreach_add_(self.params, torch._foreach_mul(traces, step * delta))
        if reset:
            torch._foreach_zero_(traces)
        return step

    def extra_repr(self) -> str:
        return f"lr={self.lr}, decay={self.decay}, kappa={self.kappa}, parameters={len(self.params)}"
