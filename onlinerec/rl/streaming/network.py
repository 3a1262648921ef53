"""The streaming actor-critic's networks: stream-x's layers (sparse initialisation, LayerNorm without parameters, leaky
ReLU) with a recurrent core in place of the first hidden layer, stepped one env step at a time by a gradient method."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from onlinerec.cells import ElementwiseCell
from onlinerec.cells.composite import CompositeCell
from onlinerec.gradients import TBPTT, GradientMethod
from onlinerec.gradients.carry import Carry, StackCarry

__all__ = ["StreamNet", "sparse_init_"]


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


class StreamNet(nn.Module):
    """observation -> core -> Linear -> LayerNorm -> leaky ReLU -> head, one step of B streams at a time.

    The core reads the (normalised) observation itself, so that every parameter below the head's layers is the
    core's: its exact RTRL gradient is then the whole network's (a dense layer below the core would get only its
    one-step gradient). ``core=None`` is stream-x's feed-forward network: Linear -> LayerNorm -> leaky ReLU in the
    core's place. The LayerNorms have no parameters, as in stream-x; the dense layers and the head's linear layers get
    the sparse initialisation, the core keeps its own (its eigenvalues or gate biases set its memory at the start).
    """

    def __init__(self, obs_size: int, width: int, core: ElementwiseCell | None, head: nn.Module, sparsity: float):
        super().__init__()
        self.width = width
        self.core = core
        self.encoder = nn.Linear(obs_size, width) if core is None else None
        self.hidden = nn.Linear(width if core is None else core.output_size, width)
        self.head = head
        for layer in [self.encoder, self.hidden, *head.modules()]:
            if isinstance(layer, nn.Linear):
                sparse_init_(layer.weight, sparsity)
                nn.init.zeros_(layer.bias)

    def top(self, h: Tensor) -> Tensor:
        """The head's output from the core's output (without a core, the first layer's)."""
        return self.head(_dense(self.hidden, h, self.width))

    def step(self, obs: Tensor, reset: Tensor, carry: Carry | StackCarry | None, method: GradientMethod):
        """One step: obs (B, D), reset (B,) bool -> the head's output and the core's new carry. The core's gradient
        comes from ``method`` (RTRL: exact, through the carried sensitivities; TBPTT: this step only)."""
        if self.core is None:
            return self.top(_dense(self.encoder, obs, self.width)), carry
        state, carry = method.step(self.core, obs, reset, carry)
        return self.top(_output(self.core, state, obs)), carry

    @torch.no_grad()
    def peek(self, obs: Tensor, carry: Carry | StackCarry | None) -> Tensor:
        """The head's output one step on from ``carry`` without moving it and without a graph (a TD target)."""
        core = self.core
        if isinstance(carry, Carry) and carry.window is None and not isinstance(core, CompositeCell):
            return self.top(core.readout(core(obs, carry.c), obs))  # one cell, one input: its own single step
        keep = torch.zeros(obs.shape[0], dtype=torch.bool, device=obs.device)
        return self.step(obs, keep, None if carry is None else carry.state_only(), TBPTT())[0]


def _dense(layer: nn.Linear, x: Tensor, width: int) -> Tensor:
    return F.leaky_relu(F.layer_norm(layer(x), (width,)))


def _output(core: ElementwiseCell, state: Tensor, u: Tensor) -> Tensor:
    """The core's output: a cell's readout of its state; a stack's (or any composite's) unroll returns it already."""
    return state if isinstance(core, CompositeCell) else core.readout(state, u)
