"""A family of test cells with K = 1, 2 or 3 components per unit: a rotation of the first two components with a
decay, plus a nonlinear input that reads the next component of the same unit (so each unit's K x K Jacobian block is
dense). Its variant that reads the neighbouring unit must be refused."""

from __future__ import annotations

import torch
from torch import nn

from onlinerec import ElementwiseCell


class RotationCell(ElementwiseCell):
    """c'_k = sigmoid(decay) * rot(angle) c_k + tanh(g_k + mix_k * c_{(k+1) mod K}), rot acting on components 0 and 1."""

    num_components = 3
    num_gates = 3

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        self.angle = nn.Parameter(torch.rand(hidden_size) * 3.0)
        self.decay = nn.Parameter(torch.randn(hidden_size))
        self.mix = nn.Parameter(torch.randn(self.num_components, hidden_size) * 0.5)

    def neighbour(self, c_prev):
        """What component k's input reads: component (k + 1) mod K of the same unit."""
        return c_prev.roll(-1, dims=-2) if self.num_components > 1 else c_prev

    def recurrence(self, gates, c_prev):
        k = self.num_components
        rho = torch.sigmoid(self.decay)
        if k == 1:
            return rho * c_prev + torch.tanh(gates[..., 0, :] + self.mix[0] * c_prev)
        a, b = c_prev[..., 0, :], c_prev[..., 1, :]
        cos, sin = torch.cos(self.angle), torch.sin(self.angle)
        rotated = torch.cat([torch.stack([cos * a - sin * b, sin * a + cos * b], -2), c_prev[..., 2:, :]], -2)
        drive = torch.tanh(gates + self.mix * self.neighbour(c_prev))
        return rho * rotated + drive


class Rotation1Cell(RotationCell):
    num_components = 1
    num_gates = 1


class Rotation2Cell(RotationCell):
    num_components = 2
    num_gates = 2


class Rotation3Cell(RotationCell):
    pass


class Rotation3MixesUnits(RotationCell):
    """Component 2 reads unit n+1: not element-wise per unit."""

    def neighbour(self, c_prev):
        return super().neighbour(c_prev).roll(1, dims=-1)


ROTATION_CELLS = {1: Rotation1Cell, 2: Rotation2Cell, 3: Rotation3Cell}
