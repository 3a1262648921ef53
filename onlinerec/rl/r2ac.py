"""R2AC: the real-time recurrent actor-critic (docs/r2ac.md) as an :class:`~onlinerec.OnlineRecurrentModule`.

obs -> stem (IMPALA ResNet / Nature CNN / MLP) -> [features; clipped last reward] -> cell (eLSTM by default) ->
readout (output gate) -> policy logits and value. Trained with V-trace actor-critic losses summed over time and
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
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from typing_extensions import override

from onlinerec.cells import ElementwiseCell, make_cell
from onlinerec.rl.evaluation import evaluate
from onlinerec.rl.monitor import RolloutMonitor
from onlinerec.rl.nets import make_stem
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


class R2AC(OnlineRecurrentModule):
    """Real-time recurrent actor-critic (Irie et al. 2024) with V-trace (docs/r2ac.md).

    The losses are summed over time and streams (the paper's convention, ``loss_reduction = "sum"``): under DDP the
    backpropagated loss is multiplied by the number of processes W, so that W processes with B streams each compute
    the gradient of one process with all W * B streams; the logged losses are this process's sums.

    Args:
        num_actions: A, the size of the discrete action set.
        obs_shape: one observation's shape: (C, H, W) uint8 frames, or (D,) vectors.
        cell: an ElementwiseCell built for input size ``fc_size + 1``, a cell alias ("elstm", "qrnn", "sru",
            "felstm"), or None for the feed-forward baseline.
        hidden_size: N, when ``cell`` is an alias.
        stem: "impala" (paper), "nature" (cheaper on CPU), "mlp" (vector observations) or "auto".
        fc_size: width of the stem's output (256 in the paper).
        config: loss and optimiser settings (:class:`R2ACConfig`; the paper's by default).
        cell_kwargs: extra keyword arguments for the cell when ``cell`` is an alias (e.g. ``{"forget_bias": 2.0}``).
        method: a gradient method or its name; None takes the trainer strategy's.
    """

    loss_reduction = "sum"

    def __init__(
        self,
        num_actions: int,
        obs_shape: Sequence[int],
        cell: ElementwiseCell | str | None = "elstm",
        hidden_size: int = 256,
        stem: str = "impala",
        fc_size: int = 256,
        config: R2ACConfig | dict[str, Any] | None = None,
        cell_kwargs: dict[str, Any] | None = None,
        method: Any = None,
    ) -> None:
        obs_shape = tuple(int(s) for s in obs_shape)
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
                "num_actions": num_actions,
                "obs_shape": list(obs_shape),
                "cell": cell if isinstance(cell, str) or cell is None else type(cell).__name__,
                "hidden_size": hidden_size if cell_obj is None else cell_obj.hidden_size,
                "stem": stem,
                "fc_size": fc_size,
                "config": asdict(self.config),
                "cell_kwargs": dict(cell_kwargs or {}),
            }
        )
        self.num_actions = int(num_actions)
        self.obs_shape = obs_shape
        self.stem = make_stem(stem, obs_shape, fc_size)
        head_in = core_in if cell_obj is None else cell_obj.output_size
        self.policy = nn.Linear(head_in, num_actions)
        self.baseline = nn.Linear(head_in, 1)

    @property
    def feed_forward(self) -> bool:
        return self.cell is None

    # -- the network ----------------------------------------------------------------------------
    def _clip(self, reward: Tensor) -> Tensor:
        c = self.config.reward_clip
        return reward.clamp(-c, c) if c > 0 else reward

    def features(self, obs: Tensor, reward: Tensor) -> Tensor:
        """Core inputs x (T, B, fc_size + 1) = [stem(obs); clipped reward] for obs (T, B, *obs_shape)."""
        t, b = obs.shape[:2]
        feats = self.stem(obs.reshape(t * b, *obs.shape[2:])).reshape(t, b, -1)
        return torch.cat([feats, self._clip(reward.to(feats.dtype)).unsqueeze(-1)], dim=-1)

    def heads(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """Policy logits (..., A) and value (...,) from core outputs h (..., N)."""
        return self.policy(h), self.baseline(h).squeeze(-1)

    @torch.no_grad()
    def act(
        self, obs: Tensor, reward: Tensor, reset: Tensor, *, greedy: bool = False, stream: str = "act"
    ) -> tuple[Tensor, Tensor]:
        """One agent step for B streams (the :class:`~onlinerec.rl.rollout.Actor` step): advances the carried
        state of ``stream`` (zeroed first where ``reset``) and returns (actions (B,), logits (B, A)). Samples
        from softmax(logits), or takes the argmax when ``greedy``."""
        x = self.features(obs.unsqueeze(0), reward.unsqueeze(0))
        logits, _ = self.heads(self(x, reset.unsqueeze(0).bool(), stream)[0])
        if greedy:
            return logits.argmax(-1), logits
        return torch.multinomial(torch.softmax(logits.float(), -1), 1).squeeze(-1), logits

    # -- the learner ----------------------------------------------------------------------------
    def learner_outputs(self, segment: RolloutSegment) -> tuple[Tensor, Tensor, Tensor]:
        """Logits (M, B, A) and values (M, B) on entries 0..M-1 (with grad) and the bootstrap value (B,) at
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
        logits, values, bootstrap = outputs
        actions = segment.actions[1:]
        rewards = self._clip(segment.rewards[1:].to(values.dtype))
        discounts = cfg.discount * (~segment.reset[1:]).to(values.dtype)
        log_probs = F.log_softmax(logits, dim=-1)
        target_logp = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
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
        entropy_loss = cfg.entropy_cost * (log_probs.exp() * log_probs).sum()
        total = pg_loss + baseline_loss + entropy_loss
        return {"loss": total, "pg_loss": pg_loss, "baseline_loss": baseline_loss, "entropy_loss": entropy_loss}

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
        opt = torch.optim.RMSprop(
            self.parameters(), lr=cfg.lr, alpha=cfg.rms_alpha, eps=cfg.rms_eps, momentum=cfg.rms_momentum
        )
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
        self, env: Any, num_episodes: int = 10, *, greedy: bool = True, max_steps: int | None = None
    ) -> dict[str, Any]:
        """Play ``num_episodes`` real episodes on a vector env; see :func:`onlinerec.rl.evaluation.evaluate`."""
        return evaluate(self, env, num_episodes, greedy=greedy, max_steps=max_steps)
