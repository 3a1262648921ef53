"""experiments/count_recall_errors.py: its counts against POPGym's own, a policy that answers right and one that is one
off, and the script on a trained run."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.helpers import load_benchmark, load_experiment

pytest.importorskip("popgym")

diag = load_experiment("count_recall_errors")


@pytest.mark.parametrize("name", ["CountRecallEasy", "CountRecallMedium", "CountRecallHard"])
def test_the_counts_read_from_observations_are_popgyms(name):
    import popgym.envs

    from onlinerec.rl.envs import make_vector_env

    env = getattr(popgym.envs, name)()
    kinds = env.observation_space.nvec[0]
    obs, info = env.reset(seed=3)
    seen, popgym_counts, rewards, answers = [obs], [info["counts"].copy()], [], []
    done = False
    while not done:
        # answer right on odd steps, one off on even ones: the reward says which POPGym scored as right
        _, right = diag.true_counts(np.eye(kinds)[np.array(seen)].reshape(len(seen), -1), kinds)
        answer = int(right[-1]) + (len(seen) % 2 == 0) * (-1 if right[-1] > 0 else 1)
        answers.append(answer == right[-1])
        obs, reward, terminated, truncated, info = env.step(answer)
        rewards.append(reward)
        done = terminated or truncated
        if not done:
            seen.append(obs)
            popgym_counts.append(info["counts"].copy())
    counts, _ = diag.true_counts(np.eye(kinds)[np.array(seen)].reshape(len(seen), -1), kinds)
    np.testing.assert_array_equal(counts, np.array(popgym_counts))
    assert all((r > 0) == a for r, a in zip(rewards, answers))
    # the runner's env gives the same one-hot layout the script reads: [dealt kind | asked kind]
    vec = make_vector_env(f"popgym:{name}", 1, seed=0)
    first, _ = vec.reset()
    vec.close()
    assert first.shape == (1, 2 * kinds) and first[0, :kinds].sum() == first[0, kinds:].sum() == 1


def test_observations_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match=r"shape \(T, 4\)"):
        diag.true_counts(np.zeros((5, 3)), 2)


def test_the_script_reads_a_trained_run_and_refuses_other_folders(tmp_path, capsys):
    from onlinerec.rl.runner import main as rl

    run = tmp_path / "run"
    args = ["--config", "examples/configs/popgym.yaml", "--env", "popgym:CountRecallEasy", "--num_envs", "2",
            "--total_frames", "64", "--eval_episodes", "0", "--progress", "false", "--tensorboard", "false",
            "--out_dir", str(run)]  # fmt: skip
    rl(args)
    capsys.readouterr()
    out = tmp_path / "diag.json"
    png = tmp_path / "errors.png"
    assert diag.main([str(run), "--episodes", "4", "--json", str(out), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert table.startswith("| run | greedy return | exact |") and f"| {run} |" in table
    assert "| reference on popgym:CountRecallEasy: a clock (expected) | -0.443 | 28% |" in table
    (result,) = json.loads(out.read_text())
    assert result["episodes"] == 4 and 0.0 <= result["exact"] <= result["within_one"] <= 1.0
    assert set(result["rings"]) == {"fast", "slow"}  # popgym.yaml's LRU has both rings
    slow_magnitude, _ = result["rings"]["slow"]
    fast_magnitude, _ = result["rings"]["fast"]
    assert slow_magnitude > fast_magnitude  # untrained (64 frames), the slow ring still keeps more of a card
    with pytest.raises(FileNotFoundError, match="onlinerec rl. run folder"):
        diag.main([str(tmp_path)])
    with pytest.raises(SystemExit):
        diag.main([str(run), "--episodes", "1"])
    other = tmp_path / "other"  # the same folder, as if trained on another env
    shutil.copytree(run, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "env": "popgym:RepeatFirstEasy"}))
    with pytest.raises(ValueError, match="trained on popgym:RepeatFirstEasy; this diagnostic reads popgym:CountRecall"):
        diag.main([str(other)])


def test_runs_are_grouped_by_arm_without_their_seed():
    assert diag.arm_of("runs/x/r2ac/CountRecallEasy/lru_mingru_sep-seed12") == "lru_mingru_sep"
    assert diag.arm_of("runs/diagnostics/cre_diag") == "cre_diag"  # a folder of any other name is its own arm
    assert diag.arm_of("a-seedling") == "a-seedling"


def test_the_script_reads_a_recurrentppo_policy_saved_by_the_memory_suite(tmp_path, capsys):
    pytest.importorskip("sb3_contrib")
    suite = load_benchmark("memory_suite")
    record = tmp_path / "ppo_lstm" / "seed3.json"
    record.parent.mkdir()
    record.write_text(json.dumps(suite.run_sb3("CountRecallEasy", 3, record, steps=256)))
    capsys.readouterr()
    assert diag.main([str(record.with_suffix(".zip")), "--episodes", "4"]) == 0
    (row,) = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {record.with_suffix('.zip')} |")
    ]
    assert row.endswith("| - | - |")  # no LRU rings
    assert diag.arm_of(str(record.with_suffix(".zip"))) == "ppo_lstm"
    with pytest.raises(FileNotFoundError, match="RecurrentPPO seed<k>.zip"):
        diag.main([str(tmp_path / "missing.zip")])


@pytest.mark.parametrize("same_known", [False, True])
def test_the_reference_policies_expected_returns_match_popgyms_rewards(same_known):
    """The exact expected return of the clock references against their play in POPGym itself (Monte Carlo)."""
    import popgym.envs

    env = popgym.envs.CountRecallEasy()
    cards, kinds = diag.deck_of("popgym:CountRecallEasy")
    assert (cards, kinds) == (52, 2)
    rng = np.random.default_rng(7)
    returns = []
    for _ in range(1500):
        (dealt, asked), _ = env.reset(seed=int(rng.integers(2**31)))
        step, total, done = 1, 0.0, False
        while not done:
            answer = diag.reference_answer(cards, kinds, step, bool(dealt == asked) if same_known else None)
            (dealt, asked), reward, terminated, truncated, _ = env.step(answer)
            total, step, done = total + reward, step + 1, terminated or truncated
        returns.append(total)
    name = "a clock and this card" if same_known else "a clock"
    expected = diag.references("popgym:CountRecallEasy")[name]["return"]
    stderr = np.std(returns) / np.sqrt(len(returns))
    assert abs(np.mean(returns) - expected) < 4 * stderr + 1e-3, (np.mean(returns), expected, stderr)
    assert diag.references("popgym:CountRecallEasy")["counts each kind"]["return"] == 1.0
