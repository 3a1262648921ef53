"""benchmarks/minigrid_cue.py: the cue statistics against scripted MiniGrid-Memory policies whose answers are known (one
that remembers the cue when it sees it at its first step, one that ignores it), and the script on a trained run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("minigrid")

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "minigrid_cue.py"
spec = importlib.util.spec_from_file_location("minigrid_cue", PATH)
cue = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cue)

KEY, BALL = 5, 6  # MiniGrid's object indices
LEFT, RIGHT, FORWARD = 0, 1, 2


class Scripted:
    """Walks straight down the hallway; at the split (objects two cells to each side) turns to the object that matches
    the cue if it saw the cue at its first step (``remember``), else always to the left one. In the channels-first
    view ``obs[0][i][j]`` the agent stands at (3, 6) facing up: (2, 6) is the cell on its left, where the cue lies for
    a start on the room's first column; (1, 6) and (5, 6) are two cells to its left and right."""

    env, seed = cue.ENV, 0

    def __init__(self, remember: bool) -> None:
        self.remember, self.cue, self.turned = remember, None, False

    def act(self, obs, reward, reset, greedy):
        view = obs[0, 0]
        if reset[0]:
            self.cue, self.turned = (view[2][6] if view[2][6] in (KEY, BALL) else None), False
        if self.turned:
            return np.array([FORWARD])
        if view[1][6] in (KEY, BALL) and view[5][6] in (KEY, BALL):  # at the split
            self.turned = True
            target = self.cue if self.remember and self.cue is not None else view[1][6]
            return np.array([LEFT if view[1][6] == target else RIGHT])
        return np.array([FORWARD])


def test_a_policy_that_remembers_the_cue_succeeds_whenever_it_saw_it():
    s = cue.cue_statistics(Scripted(remember=True), 300, seed=1, greedy=True)
    assert s["episodes"] == 300 and s["timeouts"] == 0
    assert 0.1 < s["cue_seen_first_step"] == s["cue_seen"] < 0.35  # it never turns back to look
    assert s["success_if_seen"] == 1.0
    assert 0.35 < s["success_if_not_seen"] < 0.65  # a guess
    assert s["return"] > 0.5


def test_a_policy_that_ignores_the_cue_guesses_either_way():
    s = cue.cue_statistics(Scripted(remember=False), 300, seed=1, greedy=True)
    assert 0.3 < s["success_if_seen"] < 0.7 and 0.35 < s["success_if_not_seen"] < 0.65
    assert s["success"] == pytest.approx(s["return"] / 0.97, abs=0.05)  # a success pays about 0.97 here


def test_the_script_reads_a_trained_run_and_refuses_other_folders(tmp_path, capsys):
    from onlinerec.rl.runner import main as rl

    run = tmp_path / "run"
    args = ["--env", cue.ENV, "--num_envs", "2", "--M", "4", "--total_frames", "16", "--stem", "mlp", "--cell", "lru",
            "--hidden_size", "8", "--fc_size", "8", "--eval_episodes", "0", "--progress", "false",
            "--tensorboard", "false", "--out_dir", str(run)]  # fmt: skip
    assert rl(args) == 0
    capsys.readouterr()
    assert cue.main([str(run), "--episodes", "5", "--json", str(tmp_path / "cue.json")]) == 0
    table = capsys.readouterr().out
    assert "| run | greedy |" in table and "| run | sampled |" in table
    assert (tmp_path / "cue.json").is_file()
    assert cue.main([str(tmp_path)]) == 2
    assert "neither an onlinerec rl run folder" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
