"""Dict and Tuple observations: one stem per key (image -> CNN, vector -> MLP, discrete -> embedding, text ->
hashed embedding), and R2AC training on MiniGrid's full dict observation {"image", "direction", "mission"}."""

from __future__ import annotations

import math

import gymnasium as gym
import lightning as L
import numpy as np
import pytest
import torch

from onlinerec import RTRLStrategy
from onlinerec.rl import R2AC, RolloutDataModule, RolloutStream
from onlinerec.rl.nets import DictStem, SmallImageStem, flat_spaces, flatten_observation, text_ids
from onlinerec.rl.segment import obs_to_tensor
from onlinerec.rl.spaces import space_spec

pytest.importorskip("minigrid")

MINIGRID = "gymnasium:MiniGrid-MemoryS7-v0"  # no ImgObsWrapper: the full dict observation


def test_one_stem_per_key_chosen_from_the_space():
    space = gym.spaces.Dict(
        {
            "pixels": gym.spaces.Box(0, 255, (3, 64, 64), np.uint8),
            "view": gym.spaces.Box(0, 255, (7, 7, 3), np.uint8),
            "pos": gym.spaces.Box(-1, 1, (2,), np.float32),
            "dir": gym.spaces.Discrete(4, start=1),
            "inventory": gym.spaces.MultiDiscrete([3, 5]),
            "goal": gym.spaces.Text(10),
            "extra": gym.spaces.Tuple((gym.spaces.MultiBinary(3),)),
        }
    )
    spec = space_spec(space)
    assert sorted(flat_spaces(spec)) == ["dir", "extra.0", "goal", "inventory", "pixels", "pos", "view"]
    stem = DictStem(spec, out_features=32, image_stem="nature")
    assert type(stem.stems["pixels"].net).__name__ == "NatureStem"  # large image: the named CNN
    assert isinstance(stem.stems["view"].net, SmallImageStem) and stem.stems["view"].channels_last  # 7x7 HWC
    assert type(stem.stems["pos"]).__name__ == "MLPStem" and type(stem.stems["extra__0"]).__name__ == "MLPStem"
    assert stem.stems["inventory"].out_features == 32  # one 16-wide embedding per component
    n = 5
    batch = flatten_observation(
        {
            "pixels": np.random.randint(0, 255, (n, 3, 64, 64), np.uint8),
            "view": np.random.randint(0, 255, (n, 7, 7, 3), np.uint8),
            "pos": np.random.randn(n, 2).astype(np.float32),
            "dir": np.array([1, 2, 3, 4, 1]),
            "inventory": np.random.randint(0, 3, (n, 2)),
            "goal": ("red", "blue", "red", "", "x"),
            "extra": (np.random.randint(0, 2, (n, 3), np.int8),),
        }
    )
    obs = obs_to_tensor(batch)
    assert obs["goal"].dtype == torch.int64 and obs["goal"][0] == obs["goal"][2]  # the same text, the same id
    assert int(obs["goal"][0]) == int(text_ids(["red"])[0])
    out = stem(obs)
    assert out.shape == (n, 32) and torch.isfinite(out).all()
    assert "goal" not in DictStem(spec, 32, skip_text=True).keys  # the other documented rule for text keys


def test_minigrid_dict_observation_trains():
    dm = RolloutDataModule(MINIGRID, num_envs=3, seed=0)
    obs_space, action_space, _ = dm.spaces()
    assert set(obs_space.spaces) == {"image", "direction", "mission"}
    torch.manual_seed(0)
    model = R2AC.from_spaces(obs_space, action_space, hidden_size=16, fc_size=32)
    assert isinstance(model.stem, DictStem) and model.obs_shape is None
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    tr = L.Trainer(
        strategy=RTRLStrategy(M=4), max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    tr.fit(model, dm)
    assert math.isfinite(float(tr.callback_metrics["train/loss"]))
    changed = {k for k, p in model.named_parameters() if not torch.equal(before[k], p)}
    for key in ("image", "direction", "mission"):  # every key's stem gets gradients
        assert any(k.startswith(f"stem.stems.{key}.") for k in changed), key
    assert "cell.input_proj.weight" in changed


def test_dict_segments_and_greedy_evaluation():
    from onlinerec.rl.envs import make_vector_env

    env = make_vector_env(MINIGRID, 2, seed=1)
    torch.manual_seed(0)
    model = R2AC.from_spaces(env.single_observation_space, env.single_action_space, hidden_size=8, fc_size=16)
    seg = RolloutStream(env, model).next_segment(3)
    assert set(seg.inputs) == {"image", "direction", "mission"}
    assert seg.inputs["image"].shape == (4, 2, 7, 7, 3) and seg.inputs["mission"].dtype == torch.int64
    assert seg.length == 4 and seg.num_streams == 2 and seg.steps == 3
    moved = seg.to("cpu")
    assert set(moved.inputs) == set(seg.inputs)
    result = model.evaluate(make_vector_env(MINIGRID, 2, seed=2), num_episodes=2, max_steps=400)
    assert len(result["returns"]) + result["truncated"] >= 1
