"""benchmarks/memory_suite.py's pieces, without running the suite: its R2AC configs are valid ``onlinerec rl`` configs,
the scores are what docs/results.md says, and the RecurrentPPO arm acts in onlinerec's envs (same streams)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from tests.helpers import load_benchmark

suite = load_benchmark("memory_suite")


def test_scores_final_mmer_auc():
    grid, curve = suite.curve_on_grid([100.0, 200.0, 400.0], [0.0, 1.0, 0.5], budget=400)
    assert len(grid) == suite.POINTS and grid[-1] == 400
    assert math.isnan(curve[0])  # before the first logged value
    s = suite.scores(curve)
    assert s["final"] == pytest.approx(0.5) and s["mmer"] == pytest.approx(1.0, abs=0.02)
    assert 0.4 < s["auc"] < 0.9
    steps, values = suite.running_means([(10, 1.0), (20, 0.0), (30, 0.0)], window=2)
    assert steps == [10.0, 20.0, 30.0] and values == [1.0, 0.5, 0.0]


def parse_as_onlinerec_rl(cfg, tmp_path):
    """An arm's config as ``onlinerec rl --config`` reads it (an unknown option or a bad value raises)."""
    import yaml

    from onlinerec.rl.runner import parse_experiment

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return parse_experiment(["--config", str(path)])


@pytest.mark.parametrize("name", list(suite.ENVS))
@pytest.mark.parametrize("method", ["rtrl", "tbptt", "ff", "rtrl-qrnn"])
def test_r2ac_configs_parse_as_onlinerec_rl_configs(name, method, tmp_path):
    cfg = suite.r2ac_config(name, method, 1, tmp_path, 1000, cell="qrnn" if "-" in method else None)
    parsed = parse_as_onlinerec_rl(cfg, tmp_path)
    assert parsed.env == suite.ENVS[name].env and parsed.seed == 1 and parsed.total_frames == 1000
    assert parsed.cell == {"rtrl": "elstm", "tbptt": "elstm", "ff": None, "rtrl-qrnn": "qrnn"}[method]
    assert parsed.method == ("rtrl" if method.startswith("rtrl") else "tbptt")


@pytest.mark.parametrize(("method", "gradient"), [("lru_passes", "rtrl"), ("lru_tbptt_passes", "tbptt")])
def test_lru_arms_use_the_lru_with_its_own_settings_and_the_passes_options(method, gradient, tmp_path):
    cfg = suite.r2ac_config("CartPoleNoVel", method, 0, tmp_path, 1000)
    assert (cfg["cell"], cfg["method"], cfg["cell_kwargs"]) == ("lru", gradient, {})  # not the eLSTM's forget_bias
    assert cfg["r2ac"]["epochs"] == 4 and cfg["r2ac"]["advantage_norm"] is True
    assert suite.r2ac_config("CartPoleNoVel", "rtrl", 0, tmp_path, 1000)["cell_kwargs"] == {"forget_bias": 1.0}


def test_sb3_adapter_acts_in_onlinerecs_streams():
    pytest.importorskip("sb3_contrib")
    from onlinerec.rl.envs import make_vector_env, run_env_seed

    seed = run_env_seed(0, purpose="train")
    env = suite.sb3_vec_env("gymnasium:CartPoleNoVel-v1", 4, seed, {})
    reference = make_vector_env("gymnasium:CartPoleNoVel-v1", 4, seed=seed)
    np.testing.assert_array_equal(env.reset(), reference.reset()[0])  # the same streams as the R2AC arm
    for _ in range(60):
        env.step_async(np.zeros(4, dtype=np.int64))
        obs, reward, done, infos = env.step_wait()
        assert obs.shape == (4, 4) and reward.dtype == np.float32
        for i in np.flatnonzero(done):
            assert infos[i]["terminal_observation"].shape == (4,) and "episode" in infos[i]
    assert env.episodes and env.steps == 240
    env.close()


def test_rl_zoo_normalize_wraps_training_and_evaluation_sees_the_same_scaling(tmp_path, monkeypatch):
    pytest.importorskip("sb3_contrib")
    from stable_baselines3.common.vec_env import VecNormalize

    assert suite.ENVS["CartPoleNoVel"].sb3["normalize"] is True  # rl-zoo's ppo_lstm.yml has normalize: true
    seen = {}
    evaluate = suite.evaluate_sb3

    def spy(model, spec, seed, normalize_obs=None, **kw):
        seen["env"], seen["normalize_obs"] = model.get_env(), normalize_obs
        return evaluate(model, spec, seed, normalize_obs, max_steps=50)

    monkeypatch.setattr(suite, "evaluate_sb3", spy)
    record = suite.run_sb3("CartPoleNoVel", 0, tmp_path / "r.json", 512)
    assert isinstance(seen["env"], VecNormalize) and seen["normalize_obs"] == seen["env"].normalize_obs
    assert record["steps"] == 512 and record["config"]["normalize"] is True
    assert all(v > 5 for v in record["curve"] if np.isfinite(v))  # the env's own returns, not normalised rewards


def test_a_recurrentppo_tuning_run_changes_one_setting_and_its_child_is_told_which(tmp_path):
    base = suite.ENVS["CountRecallEasy"].sb3
    assert suite.sb3_settings("CountRecallEasy") == base
    assert suite.sb3_settings("CountRecallEasy", "ppo_lstm_ent01") == {**base, "ent_coef": 0.01}
    assert "--variant" not in suite.sb3_args("CountRecallEasy", 0, 10, tmp_path / "a.json")
    assert suite.sb3_args("CountRecallEasy", 0, 10, tmp_path / "a.json", "ppo_lstm_lr1e3")[-2:] == [
        "--variant",
        "ppo_lstm_lr1e3",
    ]
    assert set(suite.SB3_TUNING) <= set(suite.NAMED_ONLY)  # not in the default suite
    with pytest.raises(SystemExit):  # an unknown variant is refused, not run as the default
        suite.main(["sb3", "--env", "CountRecallEasy", "--seed", "0", "--json", str(tmp_path / "b.json"),
                    "--variant", "ppo_lstm_typo"])  # fmt: skip


def test_a_recurrentppo_tuning_run_trains_with_its_change(tmp_path):
    pytest.importorskip("sb3_contrib")
    record = suite.run_sb3("RepeatPreviousEasy", 0, tmp_path / "c.json", 256, "ppo_lstm_ent01")
    assert record["config"]["ent_coef"] == 0.01 and "--variant ppo_lstm_ent01" in record["command"]


@pytest.mark.parametrize("method", sorted(suite.SB3_ARMS))
def test_every_recurrentppo_arm_builds_with_the_settings_it_names(method):
    pytest.importorskip("sb3_contrib")
    settings = suite.sb3_settings("CountRecallEasy", method)
    model, env, raw = suite.make_sb3_model("CountRecallEasy", 0, method)  # an unknown keyword raises here
    try:
        assert raw.num_envs == settings["n_envs"] and (env is not raw) == bool(settings.get("normalize"))
        for key in ("n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "ent_coef"):
            if key in settings:
                assert getattr(model, key) == settings[key], key
        start_lr = suite._schedule(settings.get("learning_rate", 3e-4))  # "lin_x": a schedule that starts at x
        start_lr = start_lr(1.0) if callable(start_lr) else start_lr
        assert model.lr_schedule(1.0) == pytest.approx(start_lr)
    finally:
        env.close()


@pytest.mark.parametrize("config", sorted(suite.SHIPPED_CONFIGS))
def test_a_shipped_config_is_the_suites_arm(tmp_path, config):
    import yaml

    shipped = yaml.safe_load((suite.REPO / "examples" / "configs" / config).read_text())
    env, method, scale = suite.SHIPPED_CONFIGS[config]
    arm = suite.r2ac_config(env, method, 0, tmp_path, int(suite.ENVS[env].steps * scale))
    keys = ("env", "num_envs", "M", "cell", "hidden_size", "stem", "fc_size", "core_norm", "separate_critic")
    for key in (*keys, "total_frames", "eval_episodes"):
        assert shipped.get(key) == arm.get(key), key
    assert shipped.get("cell_kwargs", {}) == arm["cell_kwargs"]
    window = shipped["r2ac"].get("return_window", arm["r2ac"]["return_window"])  # the suite's window, if stated
    assert {**shipped["r2ac"], "return_window": window} == arm["r2ac"]


def test_a_child_runs_cpu_time_is_measured_and_a_failure_is_its_exit_status(tmp_path):
    code, cpu = suite.run_child([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], tmp_path / "a.log")
    assert code == 0 and 0.05 < cpu < 60
    code, _ = suite.run_child([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], tmp_path / "b.log")
    assert code == 3 and "boom" in (tmp_path / "b.log").read_text()


def _finished_run(out, seed: int, **fields) -> None:
    """A finished CountRecallEasy ``rtrl`` run's record, as ``run`` writes it, with ``fields`` added."""
    import json

    curve = [0.1] * suite.POINTS
    record = {"env": "CountRecallEasy", "method": "rtrl", "seed": seed, "budget": 10, "wall_s": 60.0, "eval": 0.0,
              "grid": list(range(suite.POINTS)), "curve": curve, **suite.scores(curve), **fields}  # fmt: skip
    path = suite.job_path(out, "CountRecallEasy", "rtrl", seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_the_report_gives_cpu_minutes_where_runs_recorded_them(tmp_path):
    _finished_run(tmp_path, 0, cpu_s=120.0)
    _finished_run(tmp_path, 1)  # runs before CPU time was recorded have none
    table = suite.report(tmp_path).read_text()
    assert "| CPU min / run |" in table and "| 1.0 | 2.0 (1 of 2) |" in table


def test_the_report_lists_seeds_in_numeric_order(tmp_path):
    for seed in (11, 2, 10, 0):
        _finished_run(tmp_path, seed)
    assert "| 4 (0, 2, 10, 11) |" in suite.report(tmp_path).read_text()


def test_an_arm_has_one_colour_in_every_panel_of_the_figure(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    curve = [0.1] * suite.POINTS
    records = [
        {"env": env, "method": method, "seed": 0, "grid": list(range(suite.POINTS)), "curve": curve}
        for env, methods in (("CountRecallEasy", ["ppo_lstm"]), ("RepeatFirstEasy", ["rtrl", "ppo_lstm"]))
        for method in methods
    ]
    seen = {}
    monkeypatch.setattr(plt, "close", lambda fig: seen.setdefault("fig", fig))  # keep the figure to read it
    suite.figure(records, ["CountRecallEasy", "RepeatFirstEasy"], ["rtrl", "ppo_lstm"], tmp_path / "f.png")
    colours = [{line.get_label(): line.get_color() for line in ax.get_lines()} for ax in seen["fig"].axes[:2]]
    assert colours[0]["ppo_lstm (1)"] == colours[1]["ppo_lstm (1)"]  # the first panel has no rtrl line
    assert colours[1]["rtrl (1)"] != colours[1]["ppo_lstm (1)"]


def test_a_run_at_another_budget_does_not_pass_off_the_folders_runs_as_its_own(tmp_path, capsys):
    import json

    path = suite.job_path(tmp_path, "CountRecallEasy", "lru_mingru_pg", 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"budget": suite.ENVS["CountRecallEasy"].steps}))  # a finished run at 1x
    args = ["run", "--out", str(tmp_path), "--envs", "CountRecallEasy", "--methods", "lru_mingru_pg", "--seeds", "0"]
    with pytest.raises(SystemExit, match="another budget.*its own --out"):
        suite.main([*args, "--budget-scale", "2"])
    with pytest.raises(SystemExit):  # a budget of nothing is refused before any run
        suite.main([*args, "--budget-scale", "0"])
    assert "--budget-scale must be above 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a negative seed, before any run (it failed inside each child before)
        suite.main([*args[:-1], "-1"])
    assert "--seeds must be 0 or more" in capsys.readouterr().err


@pytest.mark.parametrize("method", sorted(suite.R2AC_METHODS))
def test_every_r2ac_arm_is_a_valid_onlinerec_rl_config(method, tmp_path):
    cfg = suite.r2ac_config("CountRecallEasy", method, 0, tmp_path, 1000)
    parsed = parse_as_onlinerec_rl(cfg, tmp_path)  # an unknown option or a bad value raises here
    assert parsed.M == cfg["M"] and all(getattr(parsed.r2ac, k) == v for k, v in cfg["r2ac"].items())


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["run", "--envs", "CountRecalHard"], "unknown env 'CountRecalHard' (did you mean 'CountRecallHard'?)"),
        (["run", "--methods", "lru_mingru_sepp"], "unknown arm 'lru_mingru_sepp' (did you mean 'lru_mingru_sep'?)"),
        (["sb3", "--env", "RepeatFirstEsy", "--seed", "0", "--json", "x.json"], "did you mean 'RepeatFirstEasy'"),
    ],
)
def test_a_misspelt_env_or_arm_names_the_closest(args, hint, capsys):
    with pytest.raises(SystemExit):  # refused before any run, with the closest name rather than 70 choices alone
        suite.main(args)
    assert hint in capsys.readouterr().err
