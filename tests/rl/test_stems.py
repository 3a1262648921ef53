"""The image stems' channels-last forward and one-op uint8 scaling give the outputs and gradients of a plain
contiguous NCHW reference."""

from __future__ import annotations

import pytest
import torch

from onlinerec.rl.nets import ImpalaStem, NatureStem, _as_float_image


# ------------------------------------------------------------------------------------------------
# The plain reference: contiguous NCHW, `obs.to(dtype) / 255.0`
# ------------------------------------------------------------------------------------------------
def plain_as_float_image(obs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return obs.to(dtype) / 255.0 if obs.dtype == torch.uint8 else obs.to(dtype)


def plain_forward(stem: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
    if isinstance(stem, ImpalaStem):
        x = torch.relu(stem.convs(plain_as_float_image(obs, stem.fc.weight.dtype)))
        return torch.relu(stem.fc(x.flatten(1)))
    return torch.relu(stem.fc(stem.convs(plain_as_float_image(obs, stem.fc.weight.dtype)).flatten(1)))


SHAPES = {"atari": (4, 84, 84), "procgen": (3, 64, 64), "dmlab": (3, 72, 96)}


def frames(n: int, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, *shape), generator=gen, dtype=torch.uint8)


def grads(stem: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in stem.named_parameters()}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("cls", [NatureStem, ImpalaStem])
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_stem_matches_the_plain_reference_float32(cls, shape):
    torch.manual_seed(0)
    stem = cls(SHAPES[shape])
    obs = frames(6, SHAPES[shape])
    new = stem(obs)
    new.pow(2).sum().backward()
    g_new = grads(stem)
    stem.zero_grad(set_to_none=True)
    ref = plain_forward(stem, obs)
    ref.pow(2).sum().backward()
    g_ref = grads(stem)
    assert new.shape == ref.shape == (6, stem.out_features)
    assert new.is_contiguous()
    assert (new - ref).abs().max().item() <= 1e-6 * max(1.0, ref.abs().max().item())
    for name in g_ref:
        assert rel(g_new[name], g_ref[name]) <= 1e-5, name


@pytest.mark.parametrize("cls", [NatureStem, ImpalaStem])
def test_stem_matches_the_plain_reference_float64(cls):
    torch.manual_seed(1)
    stem = cls(SHAPES["atari"]).double()
    obs = frames(3, SHAPES["atari"], seed=1)
    new = stem(obs)
    assert new.dtype == torch.float64
    torch.testing.assert_close(new, plain_forward(stem, obs), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls", [NatureStem, ImpalaStem])
def test_stem_float_observations_and_batch_of_one(cls):
    """Already-float frames (no scaling) and a single frame go through the same path."""
    torch.manual_seed(2)
    stem = cls(SHAPES["procgen"])
    obs = frames(1, SHAPES["procgen"], seed=2).float() / 255.0
    torch.testing.assert_close(stem(obs), plain_forward(stem, obs), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cls", [NatureStem, ImpalaStem])
def test_parameters_and_gradients_keep_their_layout(cls):
    """Only the activations are channels-last: parameters, their gradients and so state_dicts, optimiser state and
    DDP buckets are unchanged."""
    stem = cls(SHAPES["atari"])
    stem(frames(2, SHAPES["atari"])).sum().backward()
    for name, p in stem.named_parameters():
        assert p.is_contiguous(), name
        assert p.grad is not None and p.grad.is_contiguous(), name


def test_as_float_image_one_op_scaling():
    obs = frames(4, SHAPES["atari"], seed=3)
    for dtype, tol in ((torch.float32, 6e-8), (torch.float64, 2.3e-16)):
        x = _as_float_image(obs, dtype, channels_last=True)
        assert x.dtype == dtype and x.is_contiguous(memory_format=torch.channels_last)
        assert (x - plain_as_float_image(obs, dtype)).abs().max().item() <= tol
        y = _as_float_image(obs, dtype)
        assert y.is_contiguous() and torch.equal(x, y)
    bf = _as_float_image(obs, torch.bfloat16)
    assert bf.dtype == torch.bfloat16
    assert (bf.float() - obs.float() / 255).abs().max().item() <= 2e-3  # one bfloat16 rounding of the exact value
    # not uint8: converted, never scaled; a 3-D frame stays channels-first
    f = torch.rand(2, 3, 8, 8, dtype=torch.float64)
    assert torch.equal(_as_float_image(f, torch.float32, channels_last=True), f.float())
    single = _as_float_image(obs[0], torch.float32, channels_last=True)
    assert single.shape == obs.shape[1:] and single.is_contiguous()


@pytest.mark.parametrize("cls", [ImpalaStem, NatureStem])
def test_an_image_stem_given_a_vector_observation_names_the_fix(cls):
    with pytest.raises(ValueError, match=r"got shape \(3,\).*--stem mlp.*'auto'"):
        cls((3,), 16)


# ------------------------------------------------------------------------------------------------
# The 'grid' stem: MiniGrid's symbolic view, one-hot per channel
# ------------------------------------------------------------------------------------------------
def test_the_grid_stem_is_a_linear_map_of_the_one_hot_codes():
    """Against a loop that writes each cell's three one-hot codes by hand (float64)."""
    from onlinerec.rl.nets import GridStem, make_stem

    torch.manual_seed(0)
    stem = make_stem("grid", (3, 2, 3), 5).double()
    assert isinstance(stem, GridStem)
    obs = torch.stack([torch.randint(0, n, (4, 2, 3)) for n in GridStem.SIZES], dim=1).to(torch.uint8)
    codes = torch.zeros(4, 2, 3, sum(GridStem.SIZES), dtype=torch.float64)
    for b in range(4):
        for i in range(2):
            for j in range(3):
                start = 0
                for c, n in enumerate(GridStem.SIZES):
                    codes[b, i, j, start + int(obs[b, c, i, j])] = 1.0
                    start += n
    expected = torch.relu(codes.flatten(1) @ stem.fc.weight.T + stem.fc.bias)
    torch.testing.assert_close(stem(obs), expected, rtol=0, atol=1e-12)
    key, ball = obs.clone(), obs.clone()  # one cell's object: a key (5) or a ball (6) moves a different weight column
    key[0, 0, 0, 0], ball[0, 0, 0, 0] = 5, 6
    assert not torch.equal(stem(key)[0], stem(ball)[0])


def test_the_grid_stem_refuses_what_is_not_a_symbolic_minigrid_view():
    from onlinerec.rl.nets import make_stem

    with pytest.raises(ValueError, match=r"shape \(3, H, W\).*got observations of shape \(147,\).*'mlp'"):
        make_stem("grid", (147,), 8)
    stem = make_stem("grid", (3, 7, 7), 8)
    with pytest.raises(ValueError, match=r"outside MiniGrid's categories.*max 200.*not pixels"):
        stem(torch.full((1, 3, 7, 7), 200, dtype=torch.uint8))
