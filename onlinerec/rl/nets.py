"""Observation encoders ("stems") below the recurrent core: IMPALA ResNet, Nature CNN, and an MLP for vectors.

Every stem maps observations (N, *obs_shape) to features (N, out_features) and infers its flatten size
from ``obs_shape``. Image stems take uint8 channels-first frames and scale them by 1/255 themselves.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = ["STEMS", "GridStem", "ImpalaStem", "MLPStem", "NatureStem", "make_stem"]


def _as_float_image(obs: Tensor, dtype: torch.dtype, channels_last: bool = False) -> Tensor:
    """``obs`` as ``dtype``, uint8 frames scaled by 1/255, in one pass: the conversion, the scaling and (for a batch
    of images, ``channels_last=True``) the channels-last layout are a single ``torch.mul`` into a new tensor.

    The scale is a float64 scalar tensor for float64 stems (computed in float64) and a Python float otherwise
    (computed in float32, then rounded to ``dtype``); the result differs from ``obs.to(dtype) / 255`` by at most one
    rounding (<= 6e-8 in float32, 2.2e-16 in float64)."""
    fmt = torch.channels_last if channels_last and obs.dim() == 4 else torch.contiguous_format
    if obs.dtype != torch.uint8:
        return obs.to(dtype=dtype, memory_format=fmt)
    out = torch.empty(obs.shape, dtype=dtype, device=obs.device, memory_format=fmt)
    scale = torch.tensor(1 / 255, dtype=torch.float64) if dtype == torch.float64 else 1 / 255
    return torch.mul(obs, scale, out=out)


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


_VECTOR_STEM_HINT = (
    "For vector observations use the MLP stem: stem='mlp' (onlinerec rl --stem mlp), or stem='auto', which picks the "
    "stem from the observation's shape."
)


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
                f"ImpalaStem needs channels-first image observations (C, H, W); got shape {tuple(obs_shape)}. "
                + _VECTOR_STEM_HINT
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
        # channels-last activations (the parameters keep their layout): faster convolutions and weight
        # gradients on CPU (docs/performance.md#end-to-end-r2ac); flatten(1) reads them in (C, H, W) order as before
        x = torch.relu(self.convs(_as_float_image(obs, self.fc.weight.dtype, channels_last=True)))
        return torch.relu(self.fc(x.flatten(1)))


class NatureStem(nn.Module):
    """Nature-DQN CNN (Mnih et al. 2015): Conv8x8/4 (32) -> Conv4x4/2 (64) -> Conv3x3/1 (64), ReLUs, then
    Linear(-> out_features) -> ReLU. Much cheaper than the ResNet on a CPU; small frames keep at least 1x1."""

    def __init__(self, obs_shape: tuple[int, ...], out_features: int = 256) -> None:
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(
                f"NatureStem needs channels-first image observations (C, H, W); got shape {tuple(obs_shape)}. "
                + _VECTOR_STEM_HINT
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
        # channels-last activations, parameters unchanged (see ImpalaStem.forward)
        x = self.convs(_as_float_image(obs, self.fc.weight.dtype, channels_last=True))
        return torch.relu(self.fc(x.flatten(1)))


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


class GridStem(nn.Module):
    """For MiniGrid's symbolic view, channels first: per cell an object type, a colour and a state, small integers.
    Each channel is one-hot encoded (11 object types, 6 colours, 3 states: minigrid's ``OBJECT_TO_IDX``,
    ``COLOR_TO_IDX`` and ``STATE_TO_IDX``) -> flatten -> Linear(-> out_features) -> ReLU.

    The MLP stem reads these indices as magnitudes, so a key (5) differs from a ball (6) by one unit of one input among
    147; here every category of every cell is its own feature."""

    SIZES = (11, 6, 3)
    """Categories per channel: object type, colour, state."""

    def __init__(self, obs_shape: tuple[int, ...], out_features: int = 64) -> None:
        super().__init__()
        if len(obs_shape) != 3 or obs_shape[0] != len(self.SIZES):
            raise ValueError(
                f"the 'grid' stem reads MiniGrid's symbolic view, shape (3, H, W) channels first (object, colour, "
                f"state); got observations of shape {tuple(obs_shape)}. Use stem 'mlp' for vectors or 'auto' for images."
            )
        self.register_buffer("sizes", torch.tensor(self.SIZES).reshape(1, -1, 1, 1), persistent=False)
        self.flat_features = sum(self.SIZES) * obs_shape[1] * obs_shape[2]
        self.fc = nn.Linear(self.flat_features, out_features)
        self.out_features = out_features

    def forward(self, obs: Tensor) -> Tensor:
        idx = obs.long()
        if bool(((idx < 0) | (idx >= self.sizes)).any()):  # not a MiniGrid view: never encode it wrongly (one check)
            raise ValueError(
                f"the 'grid' stem got values outside MiniGrid's categories {self.SIZES} per channel "
                f"(min {int(idx.min())}, max {int(idx.max())}); is this MiniGrid's symbolic view (not pixels)?"
            )
        parts = [nn.functional.one_hot(idx[:, c], n) for c, n in enumerate(self.SIZES)]  # (N, H, W, n) each
        return torch.relu(self.fc(torch.cat(parts, dim=-1).to(self.fc.weight.dtype).flatten(1)))


def _flat_size(convs: nn.Module, obs_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        return int(convs(torch.zeros(1, *obs_shape)).numel())


STEMS: dict[str, Callable[..., nn.Module]] = {
    "impala": ImpalaStem, "nature": NatureStem, "mlp": MLPStem, "grid": GridStem,
}  # fmt: skip
"""Stems by name, for configs: ``make_stem("impala", (4, 84, 84))``."""


def make_stem(name: str, obs_shape: tuple[int, ...], out_features: int = 256) -> nn.Module:
    """Build a stem by name ("impala", "nature", "mlp", "grid"); ``name="auto"`` picks "impala" for images, else "mlp"."""
    obs_shape = tuple(int(s) for s in obs_shape)
    if name == "auto":
        name = "impala" if len(obs_shape) == 3 else "mlp"
    try:
        cls = STEMS[name]
    except KeyError:
        raise ValueError(f"Unknown stem {name!r}; choose one of {sorted(STEMS)} or 'auto'.") from None
    return cls(obs_shape, out_features)


# -- composite observations (Dict / Tuple spaces) --------------------------------------------------------------
TEXT_BUCKETS = 64
"""Embedding rows for a text observation key: a string's id is the CRC-32 of its UTF-8 bytes (:func:`text_ids`),
and it reads row ``id % TEXT_BUCKETS`` (the default of :class:`DictStem`'s ``text_buckets``)."""


def text_ids(values: object) -> Tensor:
    """Strings (a sequence or a numpy array of str) -> int64 ids, the CRC-32 of each one's UTF-8 bytes.

    The documented rule for text observation keys (MiniGrid's ``mission``): the stem never sees the text, only this
    stable hash, which it embeds (:data:`TEXT_BUCKETS` rows); a text that never changes is a learned constant."""
    import zlib

    import numpy as np

    arr = np.asarray(values, dtype=object)
    ids = [zlib.crc32(str(v).encode("utf-8")) for v in arr.reshape(-1)]
    return torch.tensor(ids, dtype=torch.int64).reshape(arr.shape)


def flat_spaces(spec: dict[str, object], prefix: str = "") -> dict[str, dict[str, object]]:
    """The leaves of a Dict/Tuple space spec (:func:`onlinerec.rl.spaces.space_spec`) by flat key: nested Dict keys are
    joined with ``.``, Tuple items are named by their index (``"0"``, ``"1"``, ...). Any other spec is one leaf
    named ``"obs"`` (or ``prefix``)."""
    kind = spec["type"]
    if kind == "Dict":
        items = list(spec["spaces"].items())  # type: ignore[union-attr]
    elif kind == "Tuple":
        items = [(str(i), s) for i, s in enumerate(spec["spaces"])]  # type: ignore[arg-type]
    else:
        return {prefix or "obs": spec}
    out: dict[str, dict[str, object]] = {}
    for key, sub in items:
        out.update(flat_spaces(sub, f"{prefix}.{key}" if prefix else str(key)))  # type: ignore[arg-type]
    return out


def flatten_observation(obs: object, prefix: str = "") -> object:
    """A (batched) Dict/Tuple observation as one flat dict with :func:`flat_spaces`' keys; anything else unchanged."""
    if isinstance(obs, dict):
        items = list(obs.items())
    elif isinstance(obs, tuple) and not (obs and isinstance(obs[0], str)):  # a tuple of strings is a batch of text
        items = [(str(i), v) for i, v in enumerate(obs)]
    else:
        return {prefix: obs} if prefix else obs
    out: dict[str, object] = {}
    for key, value in items:
        sub = flatten_observation(value, f"{prefix}.{key}" if prefix else str(key))
        out.update(sub if isinstance(sub, dict) else {str(key): sub})
    return out


def is_image_spec(spec: dict[str, object]) -> bool:
    """A 3-dimensional Box is an image (channels first, or channels last when the last axis has 1, 3 or 4 entries
    and the first does not)."""
    return spec["type"] == "Box" and len(spec["shape"]) == 3  # type: ignore[arg-type]


def is_channels_last(shape: tuple[int, ...]) -> bool:
    """Whether an image of this shape is channels-last (H, W, C): the last axis has 1, 3 or 4 entries, the first not."""
    return shape[-1] in (1, 3, 4) and shape[0] not in (1, 3, 4)


class SmallImageStem(nn.Module):
    """For images too small for the Nature/IMPALA stems (MiniGrid's 7x7 view): Conv3x3/p1 (16) -> ReLU ->
    Conv3x3/p1 (32) -> ReLU -> flatten -> Linear(-> out_features) -> ReLU. uint8 is scaled by 1/255."""

    def __init__(self, obs_shape: tuple[int, ...], out_features: int = 64) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(obs_shape[0], 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU()
        )
        self.flat_features = _flat_size(self.convs, obs_shape)
        self.fc = nn.Linear(self.flat_features, out_features)
        self.out_features = out_features

    def forward(self, obs: Tensor) -> Tensor:
        return torch.relu(self.fc(self.convs(_as_float_image(obs, self.fc.weight.dtype)).flatten(1)))


class _ImageKey(nn.Module):
    """An image stem that first moves a channels-last image's channels to the front."""

    def __init__(self, shape: tuple[int, ...], stem: str, out_features: int) -> None:
        super().__init__()
        self.channels_last = is_channels_last(shape)
        chw = (shape[2], shape[0], shape[1]) if self.channels_last else tuple(shape)
        if stem in ("auto", "impala", "nature") and min(chw[1:]) >= 36:
            self.net = STEMS["impala" if stem == "auto" else stem](chw, out_features)
        else:
            self.net = SmallImageStem(chw, out_features)
        self.out_features = out_features

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(obs.permute(0, 3, 1, 2) if self.channels_last else obs)


class _EmbeddingKey(nn.Module):
    """Discrete (one index), MultiDiscrete (one per component, embeddings concatenated) or hashed text."""

    def __init__(self, sizes: list[int], starts: list[int], dim: int, modulo: bool = False) -> None:
        super().__init__()
        offsets = [0]
        for n in sizes[:-1]:
            offsets.append(offsets[-1] + n)
        self.register_buffer("offsets", torch.tensor(offsets, dtype=torch.int64), persistent=False)
        self.register_buffer("starts", torch.tensor(starts, dtype=torch.int64), persistent=False)
        self.register_buffer("sizes", torch.tensor(sizes, dtype=torch.int64), persistent=False)
        self.modulo = modulo
        self.embedding = nn.Embedding(sum(sizes), dim)
        self.out_features = dim * len(sizes)

    def forward(self, obs: Tensor) -> Tensor:
        idx = obs.long().reshape(obs.shape[0], -1) - self.starts
        idx = idx.remainder(self.sizes) if self.modulo else idx.clamp(min=0).minimum(self.sizes - 1)
        return self.embedding(idx + self.offsets).flatten(1)


class DictStem(nn.Module):
    """One stem per key of a Dict or Tuple observation, concatenated, then Linear(-> out_features) -> ReLU.

    Keys are :func:`flat_spaces`' (nested keys joined with ``.``, Tuple items by index). Per key, from its space:

    - 3-dimensional Box (an image, channels first or last): ``image_stem`` ("impala", "nature"; "auto" is
      "impala") when both sides are at least 36 pixels, else :class:`SmallImageStem`; width ``out_features``;
    - any other Box, and MultiBinary: flatten -> Linear(-> ``vector_features``) -> ReLU (:class:`MLPStem`);
    - Discrete: an ``embedding_dim`` embedding; MultiDiscrete: one per component, concatenated;
    - Text: hashed (:func:`text_ids`: CRC-32 of the UTF-8 bytes, modulo ``text_buckets``) into an embedding.
      ``skip_text=True`` drops text keys instead.

    ``forward`` takes the flat dict of (N, ...) tensors (a plain tensor when the space has a single key).
    """

    def __init__(
        self,
        spec: dict[str, object],
        out_features: int = 256,
        image_stem: str = "auto",
        vector_features: int = 64,
        embedding_dim: int = 16,
        text_buckets: int = TEXT_BUCKETS,
        skip_text: bool = False,
    ) -> None:
        super().__init__()
        self.keys: list[str] = []
        stems: dict[str, nn.Module] = {}
        for key, sub in flat_spaces(spec).items():
            kind = sub["type"]
            if kind == "Text" and skip_text:
                continue
            if is_image_spec(sub) and image_stem != "mlp":
                stem: nn.Module = _ImageKey(tuple(sub["shape"]), image_stem, out_features)  # type: ignore[arg-type]
            elif kind in ("Box", "MultiBinary"):
                stem = MLPStem(tuple(sub["shape"]), vector_features)  # type: ignore[arg-type]
            elif kind == "Discrete":
                stem = _EmbeddingKey([int(sub["n"])], [int(sub.get("start", 0))], embedding_dim)  # type: ignore[arg-type, union-attr]
            elif kind == "MultiDiscrete":
                nvec = [int(n) for n in torch.tensor(sub["nvec"]).reshape(-1).tolist()]
                stem = _EmbeddingKey(nvec, [0] * len(nvec), embedding_dim)
            elif kind == "Text":
                stem = _EmbeddingKey([int(text_buckets)], [0], embedding_dim, modulo=True)
            else:
                raise ValueError(f"observation key {key!r} has an unsupported space {kind}.")
            self.keys.append(key)
            stems[key.replace(".", "__")] = stem
        if not self.keys:
            raise ValueError("the observation space has no key a stem can read (only skipped text keys?).")
        self.stems = nn.ModuleDict(stems)
        total = sum(int(s.out_features) for s in stems.values())
        self.fc = nn.Linear(total, out_features)
        self.out_features = out_features

    def forward(self, obs: dict[str, Tensor] | Tensor) -> Tensor:
        if isinstance(obs, Tensor):
            if len(self.keys) != 1:
                raise ValueError(f"DictStem reads the keys {self.keys}; got a single tensor.")
            obs = {self.keys[0]: obs}
        missing = [k for k in self.keys if k not in obs]
        if missing:
            raise KeyError(f"the observation lacks the keys {missing} (it has {sorted(obs)}).")
        feats = [self.stems[k.replace(".", "__")](obs[k]) for k in self.keys]
        x = torch.cat([f.to(self.fc.weight.dtype) for f in feats], dim=-1)
        return torch.relu(self.fc(x))


__all__ += [
    "DictStem",
    "SmallImageStem",
    "flat_spaces",
    "flatten_observation",
    "is_channels_last",
    "is_image_spec",
    "text_ids",
]
