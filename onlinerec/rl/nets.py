"""Observation encoders ("stems") below the recurrent core: IMPALA ResNet, Nature CNN, and an MLP for vectors.

Every stem maps observations (N, *obs_shape) to features (N, out_features) and infers its flatten size
from ``obs_shape``. Image stems take uint8 channels-first frames and scale them by 1/255 themselves.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = ["STEMS", "ImpalaStem", "MLPStem", "NatureStem", "make_stem"]


def _as_float_image(obs: Tensor, dtype: torch.dtype) -> Tensor:
    return obs.to(dtype) / 255.0 if obs.dtype == torch.uint8 else obs.to(dtype)


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaStem(nn.Module):
    """IMPALA ResNet (docs/r2ac.md#network): per stage Conv3x3 -> MaxPool3x3/s2/p1 -> 2 residual blocks; channels 16, 32, 32;
    then ReLU -> flatten -> Linear(-> out_features) -> ReLU. Atari (4,84,84) flattens to 3872, DMLab (3,72,96) to
    3456, ProcGen (3,64,64) to 2048."""

    def __init__(
        self, obs_shape: tuple[int, ...], out_features: int = 256, channels: tuple[int, ...] = (16, 32, 32)
    ) -> None:
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(
                f"ImpalaStem needs channels-first image observations (C, H, W); got shape {tuple(obs_shape)}."
            )
        layers: list[nn.Module] = []
        c_in = obs_shape[0]
        for c_out in channels:
            layers += [
                nn.Conv2d(c_in, c_out, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                _ResidualBlock(c_out),
                _ResidualBlock(c_out),
            ]
            c_in = c_out
        self.convs = nn.Sequential(*layers)
        self.flat_features = _flat_size(self.convs, obs_shape)
        self.fc = nn.Linear(self.flat_features, out_features)
        self.out_features = out_features

    def forward(self, obs: Tensor) -> Tensor:
        x = torch.relu(self.convs(_as_float_image(obs, self.fc.weight.dtype)))
        return torch.relu(self.fc(x.flatten(1)))


class NatureStem(nn.Module):
    """Nature-DQN CNN (Mnih et al. 2015): Conv8x8/4 (32) -> Conv4x4/2 (64) -> Conv3x3/1 (64), ReLUs, then
    Linear(-> out_features) -> ReLU. Much cheaper than the ResNet on a CPU; small frames keep at least 1x1."""

    def __init__(self, obs_shape: tuple[int, ...], out_features: int = 256) -> None:
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(
                f"NatureStem needs channels-first image observations (C, H, W); got shape {tuple(obs_shape)}."
            )
        self.convs = nn.Sequential(
            nn.Conv2d(obs_shape[0], 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
        )
        self.flat_features = _flat_size(self.convs, obs_shape)
        self.fc = nn.Linear(self.flat_features, out_features)
        self.out_features = out_features

    def forward(self, obs: Tensor) -> Tensor:
        return torch.relu(self.fc(self.convs(_as_float_image(obs, self.fc.weight.dtype)).flatten(1)))


class MLPStem(nn.Module):
    """For small vector observations (memory tasks): flatten -> Linear(-> out_features) -> ReLU. No /255 scaling."""

    def __init__(self, obs_shape: tuple[int, ...], out_features: int = 64) -> None:
        super().__init__()
        flat = 1
        for s in obs_shape:
            flat *= int(s)
        self.flat_features = flat
        self.fc = nn.Linear(flat, out_features)
        self.out_features = out_features

    def forward(self, obs: Tensor) -> Tensor:
        return torch.relu(self.fc(obs.to(self.fc.weight.dtype).flatten(1)))


def _flat_size(convs: nn.Module, obs_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        return int(convs(torch.zeros(1, *obs_shape)).numel())


STEMS: dict[str, Callable[..., nn.Module]] = {"impala": ImpalaStem, "nature": NatureStem, "mlp": MLPStem}
"""Stems by name, for configs: ``make_stem("impala", (4, 84, 84))``."""


def make_stem(name: str, obs_shape: tuple[int, ...], out_features: int = 256) -> nn.Module:
    """Build a stem by name ("impala", "nature", "mlp"); ``name="auto"`` picks "impala" for images, else "mlp"."""
    obs_shape = tuple(int(s) for s in obs_shape)
    if name == "auto":
        name = "impala" if len(obs_shape) == 3 else "mlp"
    try:
        cls = STEMS[name]
    except KeyError:
        raise ValueError(f"Unknown stem {name!r}; choose one of {sorted(STEMS)} or 'auto'.") from None
    return cls(obs_shape, out_features)
