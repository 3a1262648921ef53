"""experiments/minigrid_cue.py: the cue statistics against its scripted MiniGrid-Memory policies, whose answers are known
(one ignores the cue, one remembers it when it sees it at its first step, one turns to look at it), and the script on a
trained run."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

from tests.helpers import load_experiment

pytest.importorskip("minigrid")

cue = load_experiment("minigrid_cue")  # registered as minigrid_cue, so wrappers can name minigrid_cue.CueInView


def test_a_policy_that_remembers_the_cue_succeeds_whenever_it_saw_it():
    s = cue.cue_statistics(cue.ScriptedAgent("remember"), 300, seed=1, greedy=True)
    assert s["episodes"] == 300 and s["timeouts"] == 0
    assert 0.1 < s["cue_seen_first_step"] == s["cue_seen"] < 0.35  # it never turns back to look
    assert s["success_if_seen"] == 1.0
    assert 0.35 < s["success_if_not_seen"] < 0.65  # a guess
    assert s["return"] > 0.5


def test_a_policy_that_ignores_the_cue_guesses_either_way():
    s = cue.cue_statistics(cue.ScriptedAgent("ignore"), 300, seed=1, greedy=True)
    assert 0.3 < s["success_if_seen"] < 0.7 and 0.35 < s["success_if_not_seen"] < 0.65
    assert s["success"] == pytest.approx(s["return"] / 0.97, abs=0.05)  # a success pays about 0.97 here


def test_a_policy_that_turns_to_look_sees_the_cue_every_time_and_always_succeeds():
    s = cue.cue_statistics(cue.ScriptedAgent("look"), 200, seed=1, greedy=True)
    assert s["cue_seen"] == 1.0 and s["success"] == 1.0 and math.isnan(s["success_if_not_seen"])
    assert s["return"] > 0.95  # two extra turns cost 0.9 * 2 / 245 each time


def test_the_references_are_printed_and_drawn_and_a_mistake_is_named(capsys, tmp_path):
    assert cue.main(["--references", "--episodes", "20", "--plot", str(tmp_path / "cue.png")]) == 0
    assert (tmp_path / "cue.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert all(f"| scripted: {p} | greedy |" in table for p in ("ignore", "remember", "look"))
    assert "sampled" not in table  # a script does not sample
    with pytest.raises(SystemExit):
        cue.main([])  # nothing to play: argparse's usage error
    with pytest.raises(ValueError, match="policy must be"):
        cue.ScriptedAgent("peek")


def test_the_script_reads_a_trained_run_and_refuses_other_folders(tmp_path, capsys):
    from onlinerec.rl.runner import main as rl

    run = tmp_path / "run"
    args = ["--env", cue.ENV, "--num_envs", "2", "--M", "4", "--total_frames", "16", "--stem", "mlp", "--cell", "lru",
            "--hidden_size", "8", "--fc_size", "8", "--eval_episodes", "0", "--progress", "false",
            "--tensorboard", "false", "--out_dir", str(run)]  # fmt: skip
    assert rl(args) == 0
    capsys.readouterr()
    assert cue.main([str(run), "--episodes", "30", "--json", str(tmp_path / "cue.json")]) == 0
    table = capsys.readouterr().out
    assert "| run | greedy |" in table and "| run | sampled |" in table
    figures = json.loads((tmp_path / "cue.json").read_text())
    assert figures.keys() == {"run:greedy", "run:sampled"} and figures["run:greedy"]["episodes"] == 30
    for f in figures.values():  # the critic's values of seen-cue episodes' last steps (a timeout counts as a failure)
        assert f["cue_seen"] > 0 and math.isfinite(f["value_last_step_if_seen_failure"])
    assert cue.main([str(run), str(tmp_path)]) == 2  # every agent is checked before any is played
    out, err = capsys.readouterr()
    assert "neither an onlinerec rl run folder" in err and out == ""


def test_cue_in_view_writes_a_first_step_cue_into_every_later_view_of_its_episode():
    from onlinerec.rl.envs import make_vector_env

    env = make_vector_env(cue.ENV, 1, seed=2, wrappers=[{"class_path": "minigrid_cue.CueInView"}])
    plain = make_vector_env(cue.ENV, 1, seed=2)  # the same streams without the wrapper, stepped alongside
    walker = cue.ScriptedAgent("ignore")  # walks straight to an object: many short episodes
    (obs, _), (reference, _) = env.reset(), plain.reset()
    reset, marked, unmarked = np.ones(1, bool), 0, 0
    for _ in range(600):
        seen = env.env.envs[0].get_wrapper_attr("cue")
        if reset[0]:  # an episode's first step: marked exactly when the cue is in view
            inner = plain.env.envs[0].unwrapped
            assert (seen is not None) == inner.agent_sees(*cue.cue_cell(inner))
        if seen is None:
            assert (obs == reference).all()  # the env's own view
            unmarked += 1
        else:
            expected = reference.copy()
            expected[0, 0, 0, 0] = seen  # object index of the view's top-left cell: nothing else changes
            assert (obs == expected).all()
            marked += 1
        action = walker.act(obs, np.zeros(1), reset, True)
        obs, _, terminated, truncated, _ = env.step(action)
        reference, *_ = plain.step(action)
        reset = terminated | truncated
    assert marked > 50 and unmarked > 50


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
