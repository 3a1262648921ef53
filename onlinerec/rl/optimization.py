"""How R2AC's parameters are updated: the optimiser and its learning-rate schedule, gradient-norm clipping, and one
or several optimiser steps per segment (docs/r2ac.md#several-passes-per-segment).

:class:`SegmentOptimization` is the base class of :class:`~onlinerec.rl.r2ac.R2AC`: an
:class:`~onlinerec.OnlineRecurrentModule` optimised as its :class:`~onlinerec.rl.r2ac_config.R2ACConfig` says. One
optimiser step per segment (the paper's) runs through Lightning's automatic optimisation; ``epochs * minibatches > 1``
steps run through :meth:`SegmentOptimization.several_passes`, each from the carry saved at the segment start.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from typing_extensions import override

from onlinerec.cells import ElementwiseCell
from onlinerec.gradients.carry import Carry, StackCarry
from onlinerec.rl.r2ac_config import R2ACConfig
from onlinerec.rl.segment import RolloutSegment, check_rollout
from onlinerec.training.module import OnlineRecurrentModule

__all__ = ["SegmentOptimization"]


class SegmentOptimization(OnlineRecurrentModule):
    """An :class:`~onlinerec.OnlineRecurrentModule` whose optimiser ``config`` (an
    :class:`~onlinerec.rl.r2ac_config.R2ACConfig`) describes: RMSProp or Adam, the learning rate decaying linearly to
    0 over ``total_updates`` optimiser steps, the global gradient norm clipped at ``grad_clip``, and
    ``epochs * minibatches`` optimiser steps per segment.

    With one step per segment Lightning's automatic optimisation runs it; with several the module optimises manually
    (:meth:`several_passes`), and Lightning's ``global_step`` counts optimiser steps, ``epochs * minibatches`` per
    segment. During the first of several passes ``_loss_streams`` holds minibatch 0's streams: the subclass's
    ``segment_loss`` computes the loss of those streams only (the pass unrolls every stream, to move the carry).

    Args:
        cell: the recurrent core (None: feed-forward), as for :class:`~onlinerec.OnlineRecurrentModule`.
        config: the optimisation settings; its ``lr`` is the module's ``lr``.
        method: a gradient method or its name; None takes the trainer strategy's.
    """

    def __init__(self, cell: ElementwiseCell | None, config: R2ACConfig, method: Any = None) -> None:
        super().__init__(cell, lr=config.lr, method=method)
        self.config = config
        self.automatic_optimization = config.passes == 1  # several passes step the optimiser themselves
        self._loss_streams: Tensor | None = None  # set during the first of several passes: minibatch 0's streams
        self._log_losses = True  # False for all but the last of several passes (see log_step)
        self._schedule_total: int | None = None  # the LR schedule's length, set by configure_optimizers

    # -- the optimiser ------------------------------------------------------------------------------
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
        self._schedule_total = total  # entropy_cost_final's schedule runs on this one's clock (schedule_progress)
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

    def schedule_progress(self) -> float | None:
        """k / total_updates in [0, 1] after k optimiser steps of the LR schedule; None outside a trainer or
        without a schedule."""
        total = self._schedule_total
        if not total or self._trainer is None or not self.trainer.lr_scheduler_configs:
            return None
        return min(1.0, self.trainer.lr_scheduler_configs[0].scheduler.last_epoch / total)

    # -- several passes per segment ---------------------------------------------------------------
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
        check_rollout(segment)
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
