"""R2AC.export: a TorchScript policy whose greedy actions equal the module's on streams with resets, for every kind
of agent (element-wise and windowed cells, feed-forward, Gaussian, Dict observations), loaded with torch alone."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import pytest
import torch

from onlinerec import QRNNCell
from onlinerec.rl import R2AC

B, T = 3, 14


def vector_obs(b, g):
    return torch.randn(b, 6, generator=g)


def dict_obs(b, g):
    return {
        "direction": torch.randint(0, 4, (b,), generator=g),
        "image": torch.randint(0, 255, (b, 7, 7, 3), generator=g, dtype=torch.uint8),
        "mission": torch.randint(0, 2**31, (b,), generator=g),
    }


def agents():
    torch.manual_seed(0)
    mission = gym.spaces.Text(20)
    dict_space = gym.spaces.Dict(
        {"image": gym.spaces.Box(0, 255, (7, 7, 3), "uint8"), "direction": gym.spaces.Discrete(4), "mission": mission}
    )
    return {
        "elstm": (R2AC(4, (6,), hidden_size=8, stem="mlp", fc_size=8), vector_obs),
        "qrnn-window": (R2AC(4, (6,), cell=QRNNCell(9, 8), stem="mlp", fc_size=8), vector_obs),
        "feed-forward": (R2AC(4, (6,), cell=None, stem="mlp", fc_size=8), vector_obs),
        "mlp-heads": (R2AC(4, (6,), hidden_size=8, stem="mlp", fc_size=8, head_sizes=(5, 3)), vector_obs),
        "gaussian-tanh": (
            R2AC.from_spaces(
                gym.spaces.Box(-5, 5, (6,)),
                gym.spaces.Box(-2, 2, (2,)),
                hidden_size=8,
                fc_size=8,
                config={"squash_actions": True, "state_dependent_std": True},
            ),
            vector_obs,
        ),
        "dict": (R2AC.from_spaces(dict_space, gym.spaces.Discrete(7), hidden_size=8, fc_size=16), dict_obs),
        **_newer_cells(),
    }


def _newer_cells():
    """Units of K = 2 components (LRU: real and imaginary parts) and a stack of layers, where onlinerec has them."""
    from onlinerec import cells

    out = {}
    if "lru" in cells.CELLS:
        out["lru-K2"] = (R2AC(4, (6,), cell="lru", hidden_size=8, stem="mlp", fc_size=8), vector_obs)
        normed = R2AC(4, (6,), cell="lru", hidden_size=8, stem="mlp", fc_size=8, core_norm=True)
        with torch.no_grad():  # not the identity's affine map, so that a missing norm shows in the actions
            normed.core_norm.weight.normal_(generator=torch.Generator().manual_seed(2))
            normed.core_norm.bias.normal_(generator=torch.Generator().manual_seed(3))
        out["lru-core-norm"] = (normed, vector_obs)
    if hasattr(cells, "Stack"):
        stack = cells.Stack([cells.make_cell("elstm", 9, 8), cells.make_cell("elstm", 8, 8)], residual=True)
        out["stack"] = (R2AC(4, (6,), cell=stack, stem="mlp", fc_size=8), vector_obs)
    separate = R2AC(4, (6,), cell=["lru", "mingru"], hidden_size=8, stem="mlp", fc_size=8, core_norm=True,
                    separate_critic=True)  # fmt: skip
    out["separate-critic"] = (separate, vector_obs)  # the policy reads the actor's half of a Parallel core
    return out


@pytest.mark.parametrize("name", list(agents()))
def test_exported_policy_matches_the_module(name, tmp_path):
    model, make_obs = agents()[name]
    path = model.export(tmp_path / "policy.pt")
    policy = torch.jit.load(str(path))
    state = policy.initial_state(B)
    g = torch.Generator().manual_seed(1)
    for t in range(T):
        obs = make_obs(B, g)
        reset = torch.ones(B, dtype=torch.bool) if t == 0 else torch.rand(B, generator=g) < 0.25
        reward = torch.randn(B, generator=g) * 3
        actions, _ = model.act(obs, reward, reset, greedy=True, stream="check")
        exported, state = policy(obs, reset, state, reward)
        torch.testing.assert_close(exported, model.env_actions(actions), rtol=1e-5, atol=1e-6)
        carry = model.carry("check")
        if carry is not None:  # the exported state is the module's carry (the first layer's, for a stack)
            while hasattr(carry, "layers"):  # a stack, or a Parallel of stacks (separate_critic)
                carry = carry.layers[0]
            c = carry.c
            torch.testing.assert_close(state[0], c, rtol=1e-5, atol=1e-6)
    assert model.training  # the export worked on a copy: the module keeps its mode


def test_export_options_and_metadata(tmp_path):
    model, _ = agents()["gaussian-tanh"]
    path = model.export(tmp_path / "params.pt", output="params")
    extra = {"onlinerec.json": ""}
    policy = torch.jit.load(str(path), _extra_files=extra)
    meta = json.loads(extra["onlinerec.json"])
    assert meta["output"] == "params" and meta["action_space"]["type"] == "Box"
    params, state = policy(torch.zeros(5, 6), torch.ones(5, dtype=torch.bool), policy.initial_state(5))
    assert params.shape == (5, 4) and len(state) == 1 and state[0].shape == (5, 8)  # mean and log-std; c
    sampled = torch.jit.load(str(model.export(tmp_path / "sampled.pt", greedy=False)))
    a, _ = sampled(torch.zeros(200, 6), torch.ones(200, dtype=torch.bool), sampled.initial_state(200))
    assert a.std() > 0 and (a.abs() <= 2).all()
    assert not a.requires_grad and not params.requires_grad and not state[0].requires_grad  # env.step(a.numpy()) works
    with pytest.raises(ValueError, match="output"):
        model.export(tmp_path / "x.pt", output="logprobs")


def test_the_exported_file_needs_only_torch(tmp_path):
    model, _ = agents()["elstm"]
    path = model.export(tmp_path / "policy.pt")
    script = (
        "import sys, torch\n"
        "sys.modules['onlinerec'] = None  # importing onlinerec would fail\n"
        f"policy = torch.jit.load({str(path)!r})\n"
        "state = policy.initial_state(2)\n"
        "for t in range(5):\n"
        "    action, state = policy(torch.randn(2, 6), torch.tensor([t == 0, False]), state, torch.zeros(2))\n"
        "    action.numpy()  # what an env loop does with it: no autograd graph behind the output\n"
        "print(action.dtype, tuple(action.shape))\n"
    )
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torch.int64 (2,)"
