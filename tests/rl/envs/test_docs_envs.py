"""docs/envs.md's "bring your own env" recipe runs as written (block after block, in one namespace), and its YAML
is a valid ``onlinerec rl`` config whose env builds."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import yaml

PAGE = Path(__file__).resolve().parents[3] / "docs" / "envs.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_bring_your_own_env_recipe_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = blocks("python")
    assert len(code) >= 4
    namespace: dict = {}
    for block in code:
        exec(compile(block, str(PAGE), "exec"), namespace)  # noqa: S102  (the page's own code)
    out = capsys.readouterr().out
    assert "episode ended: [ True  True  True  True]" in out
    assert re.search(r"greedy evaluation: [0-9.]+ over 8 episodes", out)


def test_the_config_example_is_a_valid_rl_config(tmp_path):
    from onlinerec.rl import RolloutDataModule
    from onlinerec.rl.experiment import parse_experiment

    (config,) = blocks("yaml")
    path = tmp_path / "my_run.yaml"
    path.write_text(config)
    cfg = parse_experiment(["--config", str(path)])
    assert cfg.env == "gymnasium:CartPoleNoVel-v1" and yaml.safe_load(config)["num_envs"] == cfg.num_envs
    env = RolloutDataModule(cfg.env, num_envs=2, env_kwargs=cfg.env_kwargs).make_env(2, 0)
    env.reset()
    *_, info = env.step(np.zeros(2, dtype=np.int64))
    assert env.metadata["autoreset_mode"].name == "SAME_STEP" and "episode_end" in info
    env.close()
