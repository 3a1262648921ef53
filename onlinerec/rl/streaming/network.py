"""The streaming actor-critic's networks: stream-x's layers (sparse initialisation, LayerNorm without parameters, leaky
ReLU) around a recurrent core, stepped one env step at a time by a gradient method."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from onlinerec.cells import ElementwiseCell
from onlinerec.cells.composite import CompositeCell
from onlinerec.gradients import TBPTT, GradientMethod
from onlinerec.gradients.carry import Carry, StackCarry
from onlinerec.rl.policy import ActionHead, CategoricalHead, GaussianHead

__all__ = ["StreamNet", "action_features", "sparse_init_"]


def sparse_init_(weight: Tensor, sparsity: float) -> Tensor:
    """Elsayed et al.'s sparse initialisation, in place: LeCun-uniform weights (bound sqrt(1 / fan_in)) with a share
    ``sparsity`` of each output unit's inputs set to zero (at least one kept)."""
    fan_out, fan_in = weight.shape
    zeros = min(fan_in - 1, math.ceil(sparsity * fan_in))
    with torch.no_grad():
        weight.uniform_(-math.sqrt(1.0 / fan_in), math.sqrt(1.0 / fan_in))
        for row in range(fan_out):
            weight[row, torch.randperm(fan_in)[:zeros]] = 0.0
    return weight


def action_features(head: ActionHead, actions: Tensor, dtype: torch.dtype) -> Tensor:
    """Actions (B, ...) as network inputs (B, F): a one-hot code for a Discrete space; for a Box, the action in the
    head's normalised space where the env takes it (clipped to [-1, 1] on bounded dimensions, or tanh-squashed)."""
    if isinstance(head, CategoricalHead):
        return F.one_hot(actions.long(), head.param_size).to(dtype)
    if isinstance(head, GaussianHead):
        u = actions.to(dtype)
        return torch.tanh(u) if head.squash else torch.where(head.bounded, u.clamp(-1.0, 1.0), u)
    raise TypeError(f"no action features for a {type(head).__name__}")


class StreamNet(nn.Module):
    """observation -> core -> Linear -> LayerNorm -> leaky ReLU -> head, one step of B streams at a time.

    By default the core reads the (normalised) observation itself, so that every parameter below the head's layers is
    the core's and its exact RTRL gradient is the whole network's. ``embed=True`` is the network of the RTU's authors
    (Elelimy et al. 2024): observation -> Linear -> LayerNorm -> leaky ReLU (the embedding) -> core, and the embedding
    also passes around the core to the dense layer above it. The embedding learns from each step's own gradient (the
    core's input gradient at that step): exact RTRL covers the core and everything above it. ``extra_size`` inputs
    (the previous action and reward) join the core's input, after the embedding.

    ``core=None`` is stream-x's feed-forward network: Linear -> LayerNorm -> leaky ReLU in the core's place, reading
    the observation and the extra inputs (``embed`` changes nothing there: that first layer is the embedding). The
    LayerNorms have no parameters, as in stream-x; the dense layers and the head's linear layers get the sparse
    initialisation, the core keeps its own (its eigenvalues or gate biases set its memory at the start).
    """

    def __init__(
        self,
        obs_size: int,
        width: int,
        core: ElementwiseCell | None,
        head: nn.Module,
        sparsity: float,
        *,
        embed: bool = False,
        extra_size: int = 0,
    ):
        super().__init__()
        self.width, self.extra_size = width, extra_size
        self.core = core
        self.encoder = nn.Linear(obs_size + extra_size, width) if core is None else None
        self.embed = nn.Linear(obs_size, width) if embed and core is not None else None
        core_input = (obs_size if self.embed is None else width) + extra_size
        if core is not None and core.input_size != core_input:
            raise ValueError(f"the core reads {core.input_size} features; this network gives it {core_input}.")
        skip = 0 if self.embed is None else core_input
        self.hidden = nn.Linear(width if core is None else core.output_size + skip, width)
        self.head = head
        for layer in [self.encoder, self.embed, self.hidden, *head.modules()]:
            if isinstance(layer, nn.Linear):
                sparse_init_(layer.weight, sparsity)
                nn.init.zeros_(layer.bias)

    def top(self, h: Tensor) -> Tensor:
        """The head's output from the core's output (with the embedding's beside it; without a core, the first
        layer's output)."""
        return self.head(_dense(self.hidden, h, self.width))

    def core_input(self, obs: Tensor, extra: Tensor | None = None) -> Tensor:
        """What the core reads at a step: the observation or its embedding, then the extra inputs."""
        u = obs if self.embed is None else _dense(self.embed, obs, self.width)
        return u if extra is None else torch.cat([u, extra], dim=-1)

    def above_core(self, state: Tensor, u: Tensor) -> Tensor:
        """The head's output from the core's state after reading ``u`` (:meth:`core_input`)."""
        out = _output(self.core, state, u)
        return self.top(out if self.embed is None else torch.cat([out, u], dim=-1))

    def step(
        self,
        obs: Tensor,
        reset: Tensor,
        carry: Carry | StackCarry | None,
        method: GradientMethod,
        extra: Tensor | None = None,
    ):
        """One step: obs (B, D), reset (B,) bool, ``extra`` (B, extra_size) or None -> the head's output and the
        core's new carry. The core's gradient comes from ``method`` (RTRL: exact, through the carried sensitivities;
        TBPTT: this step only)."""
        if self.core is None:
            x = obs if extra is None else torch.cat([obs, extra], dim=-1)
            return self.top(_dense(self.encoder, x, self.width)), carry
        u = self.core_input(obs, extra)
        state, carry = method.step(self.core, u, reset, carry)
        return self.above_core(state, u), carry

    @torch.no_grad()
    def peek(self, obs: Tensor, carry: Carry | StackCarry | None, extra: Tensor | None = None) -> Tensor:
        """The head's output one step on from ``carry`` without moving it and without a graph (a TD target)."""
        core = self.core
        if isinstance(carry, Carry) and carry.window is None and not isinstance(core, CompositeCell):
            u = self.core_input(obs, extra)
            return self.above_core(core(u, carry.c), u)  # one cell, one input: its own single step
        keep = torch.zeros(obs.shape[0], dtype=torch.bool, device=obs.device)
        return self.step(obs, keep, None if carry is None else carry.state_only(), TBPTT(), extra)[0]


def _dense(layer: nn.Linear, x: Tensor, width: int) -> Tensor:
    return F.leaky_relu(F.layer_norm(layer(x), (width,)))


def _output(core: ElementwiseCell, state: Tensor, u: Tensor) -> Tensor:
    """The core's output: a cell's readout of its state; a stack's (or any composite's) unroll returns it already."""
    return state if isinstance(core, CompositeCell) else core.readout(state, u)
