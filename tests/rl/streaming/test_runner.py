"""``onlinerec stream`` end to end: a run's files, a resumed run equal to an uninterrupted one bit for bit, a folder
holding another experiment refused, the baselines, continuous actions, the exported policy."""

from __future__ import annotations

import csv
import json

import pytest
import torch

pytest.importorskip("gymnasium")
from onlinerec.rl.streaming.runner import load_agent, main  # noqa: E402
from onlinerec.training.checkpoint import atomic_torch_save, load_checkpoint_file  # noqa: E402
from tests.helpers import needs_cuda  # noqa: E402

TINY = ["--env", "memory:tmaze", "--env_kwargs", "{length: 2}", "--hidden_size", "4", "--stream.width", "8",
        "--log_every", "50", "--checkpoint_every", "100", "--eval_episodes", "2", "--progress", "false"]  # fmt: skip
WIRING = {"plain": [], "embedded": ["--stream.embed", "true", "--stream.prev_action_reward", "true"]}


def flat(state, prefix=""):
    if isinstance(state, dict):
        for k, v in state.items():
            yield from flat(v, f"{prefix}.{k}")
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            yield from flat(v, f"{prefix}[{i}]")
    else:
        yield prefix, state


def same(a, b) -> bool:
    fa, fb = dict(flat(a)), dict(flat(b))
    return fa.keys() == fb.keys() and all(
        torch.equal(x, fb[k]) if torch.is_tensor(x) else x == fb[k] for k, x in fa.items()
    )


def on_cpu(state):
    """A (nested) state with its tensors copied to the CPU."""
    if isinstance(state, dict):
        return {k: on_cpu(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(on_cpu(v) for v in state)
    return state.cpu() if torch.is_tensor(state) else state


@pytest.mark.parametrize("wiring", WIRING)
def test_a_run_writes_its_folder_and_its_policy_exports(tmp_path, wiring):
    out = tmp_path / "run"
    assert main([*TINY, *WIRING[wiring], "--total_frames", "300", "--out_dir", str(out)]) == 0
    for name in ("config.json", "metrics.csv", "eval.json", "learning_curve.png", "checkpoints/final.ckpt"):
        assert (out / name).exists(), name
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert [int(r["frames"]) for r in rows] == [50, 100, 150, 200, 250, 300]
    assert json.loads((out / "eval.json").read_text())["returns"]
    policy = torch.jit.load(str(load_agent(out).export(tmp_path / "policy.pt")))
    action, state = policy(torch.zeros(3, 4), torch.tensor([True, True, False]), policy.initial_state(3))
    assert action.shape == (3,) and len(state) == (2 if wiring == "embedded" else 1)  # + the previous action


@pytest.mark.parametrize("wiring", WIRING)
def test_a_resumed_run_continues_bit_for_bit(tmp_path, wiring):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    args = [*TINY, *WIRING[wiring]]
    assert main([*args, "--total_frames", "400", "--out_dir", str(straight)]) == 0
    assert main([*args, "--total_frames", "230", "--out_dir", str(interrupted)]) == 0  # stops mid-way
    assert main([*args, "--total_frames", "400", "--out_dir", str(interrupted)]) == 0  # continues from its checkpoint
    a = load_checkpoint_file(straight / "checkpoints" / "final.ckpt")
    b = load_checkpoint_file(interrupted / "checkpoints" / "final.ckpt")
    assert same(a, b)  # weights, normalisers, traces, carries with their sensitivities, the random generator
    rows = [list(csv.DictReader(open(d / "metrics.csv"))) for d in (straight, interrupted)]
    keep = ("frames", "episodes", "return", "abs_td_error")
    assert [[r[k] for k in keep] for r in rows[0]] == [[r[k] for k in keep] for r in rows[1]]


def test_a_folder_with_other_settings_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TINY, "--total_frames", "100", "--out_dir", str(out), "--eval_episodes", "0"]) == 0
    before = (out / "config.json").read_text()
    assert main([*TINY, "--total_frames", "100", "--out_dir", str(out), "--method", "tbptt"]) == 2
    assert "method" in capsys.readouterr().err and (out / "config.json").read_text() == before
    assert main([*TINY, "--total_frames", "100", "--out_dir", str(out), "--stream.embed", "true"]) == 2
    err = capsys.readouterr().err
    assert "stream.embed: False -> True" in err and "kappa_policy" not in err, err


def test_the_baselines_run(tmp_path):
    assert main([*TINY, "--method", "tbptt", "--total_frames", "100", "--out_dir", str(tmp_path / "tbptt")]) == 0
    no_core = [a for a in TINY if a not in ("--hidden_size", "4")]
    assert main([*no_core, "--cell", "none", "--total_frames", "100", "--out_dir", str(tmp_path / "ff")]) == 0


def test_the_feed_forward_baseline_refuses_core_options_given_with_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*TINY, "--cell", "none", "--total_frames", "100", "--out_dir", str(tmp_path / "ff")])
    assert exit_.value.code == 2 and "--hidden_size 4" in capsys.readouterr().err
    assert not (tmp_path / "ff").exists()


def test_continuous_actions_and_time_limits(tmp_path):
    args = ["--env", "gymnasium:Pendulum-v1", "--hidden_size", "4", "--stream.width", "8", "--total_frames", "250",
            "--log_every", "100", "--eval_episodes", "1", "--eval_max_steps", "20", "--progress", "false",
            "--out_dir", str(tmp_path / "pendulum")]  # fmt: skip
    assert main(args) == 0  # a 200-step time limit: the TD target bootstraps from the last observation


@pytest.mark.parametrize(
    "saved_on, resumed_on",
    [pytest.param("cuda", "cpu", marks=needs_cuda), pytest.param("cpu", "cuda", marks=needs_cuda)],
    ids=["gpu-to-cpu", "cpu-to-gpu"],
)
def test_the_agent_resumes_across_devices_bit_for_bit_in_float64(tmp_path, saved_on, resumed_on):
    """What a checkpoint holds (weights, normalisers, traces, the cores' carries with their sensitivities), written on
    one device and loaded as ``onlinerec stream`` loads it into an agent on the other, arrives bit for bit in float64;
    the agent then steps there."""
    from gymnasium import spaces

    from onlinerec.rl.streaming.agent import StreamAC

    def agent(device):
        torch.manual_seed(0)
        return StreamAC(spaces.Box(-1.0, 1.0, (3,)), spaces.Discrete(3), cell="lru", hidden_size=4).double().to(device)

    def step(a, gen, t):
        x = torch.randn(1, 3, generator=gen, dtype=torch.float64).to(a.running_return.device)
        a.act(x, reset=t == 0)
        return a.learn(float(torch.randn((), generator=gen)), x.flip(-1), False, False)

    saved, gen = agent(saved_on), torch.Generator().manual_seed(1)
    for t in range(5):
        step(saved, gen, t)
    atomic_torch_save({"agent": saved.state_dict(), "learner": saved.learner_state()}, tmp_path / "agent.ckpt")
    state = load_checkpoint_file(tmp_path / "agent.ckpt", map_location="cpu")
    resumed = agent(resumed_on)
    resumed.load_state_dict(state["agent"])
    resumed.load_learner_state(state["learner"])
    assert same(on_cpu(resumed.state_dict()), on_cpu(saved.state_dict()))
    assert same(on_cpu(resumed.learner_state()), on_cpu(saved.learner_state()))
    assert {c.device.type for c in resumed.carries.values()} == {resumed_on}
    assert torch.isfinite(step(resumed, gen, 5)).all()


def test_a_resumed_metrics_log_keeps_its_rows_on_disk_from_the_start(tmp_path):
    from onlinerec.rl.streaming.runner import _MetricsLog

    path = tmp_path / "metrics.csv"
    log = _MetricsLog(path, keep_until=0)
    for frames in (100, 200, 300):
        log.write(frames, episodes=1, mean_return=0.5, abs_td_error=0.1, steps_per_second=10.0)
    log.close()
    resumed = _MetricsLog(path, keep_until=200)  # a crash before its first flush must not lose the kept rows
    assert [r["frames"] for r in csv.DictReader(open(path))] == ["100", "200"] and resumed.last_frames == 200
    resumed.close()


def test_running_a_finished_run_again_leaves_it_as_it_is(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TINY, "--total_frames", "120", "--out_dir", str(out)]) == 0
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main([*TINY, "--total_frames", "120", "--out_dir", str(out)]) == 0  # the same command again
    assert "already holds this run, finished at 120 frames; nothing to do" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files


def test_a_run_made_before_a_setting_existed_resumes_with_its_default(tmp_path):
    """A folder whose config.json predates a setting of the algorithm (here: the embedding) continues: that run had
    the setting's default."""
    out = tmp_path / "run"
    assert main([*TINY, "--total_frames", "120", "--out_dir", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    del config["stream"]["embed"], config["stream"]["prev_action_reward"]
    (out / "config.json").write_text(json.dumps(config))
    assert main([*TINY, "--total_frames", "240", "--out_dir", str(out)]) == 0
    assert int(load_checkpoint_file(out / "checkpoints" / "final.ckpt")["frames"]) == 240


def test_a_run_that_stopped_during_its_evaluation_is_evaluated_by_the_same_command(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TINY, "--total_frames", "120", "--out_dir", str(out)]) == 0
    weights = (out / "checkpoints" / "final.ckpt").read_bytes()
    want = json.loads((out / "eval.json").read_text())
    (out / "eval.json").unlink()  # as if the process had stopped after training, before its evaluation was written
    capsys.readouterr()
    assert main([*TINY, "--total_frames", "120", "--out_dir", str(out)]) == 0
    assert "trained to 120 frames; evaluated it" in capsys.readouterr().out
    assert json.loads((out / "eval.json").read_text()) == want
    assert (out / "checkpoints" / "final.ckpt").read_bytes() == weights  # not trained again
