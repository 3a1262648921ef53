"""benchmarks/memory_suite.py's pieces, without running the suite: its R2AC configs are valid ``onlinerec rl`` configs
(the shipped ones exactly as they ship, and as the settings their results were measured with), the scores are what
docs/results.md says, the report and the figure, and RecurrentPPO acts in onlinerec's envs (same streams)."""

from __future__ import annotations

import dataclasses
import math
import sys

import numpy as np
import pytest

from tests.helpers import load_benchmark, load_experiment, load_script

suite = load_benchmark("memory_suite")
experiments = load_experiment("memory_suite", module="experiments_memory_suite")  # imports only: registers nothing

CONTRACT = ["popgym", "long_segments", "cartpole_novel", "rtrl", "tbptt", "ff"]
CONTRACT_SB3 = ["ppo_lstm", "ppo_lstm_zoo", "ppo_lstm_e20_lam08"]


def test_the_suite_has_exactly_its_methods_and_every_popgym_env():
    fresh = load_script("benchmarks/memory_suite", module="memory_suite_as_shipped")  # before any registration
    assert list(fresh.R2AC_METHODS) == CONTRACT and list(fresh.SB3_METHODS) == CONTRACT_SB3
    popgym = pytest.importorskip("popgym.envs")
    names = {env.__name__ for env in popgym.ALL}
    assert set(suite.ENVS) == names | {"MiniGridMemoryS7", "CartPoleNoVel"}
    assert set(suite.SUITE_ENVS) <= set(suite.ENVS) and set(suite.DEFAULT_METHODS) <= set(CONTRACT + CONTRACT_SB3)


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
    """A method's config as ``onlinerec rl --config`` reads it (an unknown option or a bad value raises)."""
    import yaml

    from onlinerec.rl.experiment import parse_experiment

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


def _fields(cfg) -> dict:
    """An ``ExperimentConfig`` field by field (``r2ac.<field>`` for its ``R2ACConfig``)."""
    flat = dataclasses.asdict(cfg)
    return {**{k: v for k, v in flat.items() if k != "r2ac"}, **{f"r2ac.{k}": v for k, v in flat["r2ac"].items()}}


@pytest.mark.parametrize("name", list(suite.ENVS))
@pytest.mark.parametrize(("method", "setting"), [(new, old) for old, new in experiments.SHIPPED.items()])
def test_a_shipped_configs_method_is_the_setting_it_was_measured_as(method, setting, name, tmp_path, monkeypatch):
    """``popgym``, ``long_segments`` and ``cartpole_novel`` give the same ``onlinerec rl`` config, field by field, as
    the settings whose results docs/results.md reports (experiments/memory_suite.py), on every env: only the run
    folder, named after the method, differs."""
    monkeypatch.setitem(suite.R2AC_METHODS, setting, experiments.SETTINGS[setting])
    steps = suite.ENVS[name].steps * (3 if method == "cartpole_novel" else 1)  # cartpole_novel.yaml's 3x budget
    new = _fields(parse_as_onlinerec_rl(suite.r2ac_config(name, method, 2, tmp_path, steps), tmp_path))
    old = _fields(parse_as_onlinerec_rl(suite.r2ac_config(name, setting, 2, tmp_path, steps), tmp_path))
    assert new.keys() == old.keys()
    for key in new:
        if key == "out_dir":
            assert (new[key], old[key]) == tuple(f"{tmp_path}/r2ac/{name}/{m}-seed2" for m in (method, setting))
        else:
            assert new[key] == old[key], key


@pytest.mark.parametrize("method", ["popgym", "long_segments", "cartpole_novel"])
def test_a_shipped_config_runs_in_the_suite_as_it_ships(method, tmp_path):
    """On its own env and budget the suite changes only where a run writes, evaluates and logs."""
    from onlinerec.rl.experiment import parse_experiment

    path = suite.CONFIGS / suite.R2AC_METHODS[method]["yaml"]
    shipped = _fields(parse_experiment(["--config", str(path)]))
    name = next(n for n, spec in suite.ENVS.items() if spec.env == shipped["env"])
    ran = _fields(
        parse_as_onlinerec_rl(suite.r2ac_config(name, method, 0, tmp_path, int(shipped["total_frames"])), tmp_path)
    )
    bookkeeping = {"out_dir", "eval_max_steps", "checkpoint_every", "log_every", "progress", "tensorboard"}
    assert {k for k in shipped if shipped[k] != ran[k]} <= bookkeeping


def test_an_env_with_a_wider_network_widens_a_shipped_config_as_it_widens_the_others(tmp_path):
    cfg = suite.r2ac_config("MiniGridMemoryS7", "popgym", 0, tmp_path, 1000)
    assert (cfg["hidden_size"], cfg["fc_size"]) == (128, 127)  # the stem one narrower, as in popgym.yaml
    assert suite.r2ac_config("MiniGridMemoryS7", "rtrl", 0, tmp_path, 1000)["hidden_size"] == 128


@pytest.mark.parametrize("method", CONTRACT)
def test_every_r2ac_method_is_a_valid_onlinerec_rl_config(method, tmp_path):
    cfg = suite.r2ac_config("CountRecallEasy", method, 0, tmp_path, 1000)
    parsed = parse_as_onlinerec_rl(cfg, tmp_path)  # an unknown option or a bad value raises here
    assert parsed.M == cfg["M"] and all(getattr(parsed.r2ac, k) == v for k, v in cfg["r2ac"].items())


def test_sb3_adapter_acts_in_onlinerecs_streams():
    pytest.importorskip("sb3_contrib")
    from onlinerec.rl.envs import make_vector_env, run_env_seed

    seed = run_env_seed(0, purpose="train")
    env = suite.sb3_vec_env("gymnasium:CartPoleNoVel-v1", 4, seed, {})
    reference = make_vector_env("gymnasium:CartPoleNoVel-v1", 4, seed=seed)
    np.testing.assert_array_equal(env.reset(), reference.reset()[0])  # the same streams as R2AC's
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


def test_a_recurrentppo_method_changes_the_envs_settings_and_its_child_is_told_which(tmp_path):
    base = suite.ENVS["CountRecallEasy"].sb3
    assert suite.sb3_settings("CountRecallEasy") == base
    assert suite.sb3_settings("CountRecallEasy", "ppo_lstm_e20_lam08") == {**base, "n_epochs": 20, "gae_lambda": 0.8}
    assert "--variant" not in suite.sb3_args("CountRecallEasy", 0, 10, tmp_path / "a.json")
    assert suite.sb3_args("CountRecallEasy", 0, 10, tmp_path / "a.json", "ppo_lstm_zoo")[-2:] == [
        "--variant",
        "ppo_lstm_zoo",
    ]
    with pytest.raises(SystemExit):  # an unknown variant is refused, not run as the default
        suite.main(["sb3", "--env", "CountRecallEasy", "--seed", "0", "--json", str(tmp_path / "b.json"),
                    "--variant", "ppo_lstm_typo"])  # fmt: skip


def test_a_recurrentppo_method_trains_with_its_change_and_records_its_command(tmp_path):
    pytest.importorskip("sb3_contrib")
    record = suite.run_sb3("RepeatPreviousEasy", 0, tmp_path / "c.json", 256, "ppo_lstm_zoo")
    assert record["config"]["n_steps"] == 32 and record["config"]["normalize"] is True
    assert record["command"].startswith("python benchmarks/memory_suite.py sb3 --env RepeatPreviousEasy")
    assert record["command"].endswith("--variant ppo_lstm_zoo")


@pytest.mark.parametrize("method", CONTRACT_SB3)
def test_every_recurrentppo_method_builds_with_the_settings_it_names(method):
    pytest.importorskip("sb3_contrib")
    check_recurrentppo_builds(suite, method)


def check_recurrentppo_builds(module, method: str) -> None:
    """RecurrentPPO with ``method``'s settings on CountRecallEasy has each of them."""
    settings = module.sb3_settings("CountRecallEasy", method)
    model, env, raw = module.make_sb3_model("CountRecallEasy", 0, method)  # an unknown keyword raises here
    try:
        assert raw.num_envs == settings["n_envs"] and (env is not raw) == bool(settings.get("normalize"))
        for key in ("n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "ent_coef"):
            if key in settings:
                assert getattr(model, key) == settings[key], key
        start_lr = module._schedule(settings.get("learning_rate", 3e-4))  # "lin_x": a schedule that starts at x
        start_lr = start_lr(1.0) if callable(start_lr) else start_lr
        assert model.lr_schedule(1.0) == pytest.approx(start_lr)
    finally:
        env.close()


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
    _finished_run(tmp_path, 1)  # a record without CPU time
    table = suite.report(tmp_path).read_text()
    assert "| CPU min / run |" in table and "| 1.0 | 2.0 (1 of 2) |" in table


def test_the_report_lists_seeds_in_numeric_order(tmp_path):
    for seed in (11, 2, 10, 0):
        _finished_run(tmp_path, seed)
    assert "| 4 (0, 2, 10, 11) |" in suite.report(tmp_path).read_text()


def test_a_method_has_one_colour_in_every_panel_of_the_figure(tmp_path, monkeypatch):
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

    path = suite.job_path(tmp_path, "CountRecallEasy", "popgym", 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"budget": suite.ENVS["CountRecallEasy"].steps}))  # a finished run at 1x
    args = ["run", "--out", str(tmp_path), "--envs", "CountRecallEasy", "--methods", "popgym", "--seeds", "0"]
    with pytest.raises(SystemExit, match="another budget.*its own --out"):
        suite.main([*args, "--budget-scale", "2"])
    with pytest.raises(SystemExit):  # a budget of nothing is refused before any run
        suite.main([*args, "--budget-scale", "0"])
    assert "--budget-scale must be above 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a negative seed, before any run (each child would fail on it)
        suite.main([*args[:-1], "-1"])
    assert "--seeds must be 0 or more" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["run", "--envs", "CountRecalHard"], "unknown env 'CountRecalHard' (did you mean 'CountRecallHard'?)"),
        (["run", "--methods", "popgymm"], "unknown method 'popgymm' (did you mean 'popgym'?)"),
        (["sb3", "--env", "RepeatFirstEsy", "--seed", "0", "--json", "x.json"], "did you mean 'RepeatFirstEasy'"),
    ],
)
def test_a_misspelt_env_or_method_names_the_closest(args, hint, capsys):
    with pytest.raises(SystemExit):  # refused before any run, with the closest name rather than every choice
        suite.main(args)
    assert hint in capsys.readouterr().err


def test_registering_a_setting_adds_it_and_refuses_another_under_a_taken_name(monkeypatch):
    for name in ("R2AC_METHODS", "SB3_METHODS", "METHOD_ORDER", "DEFAULT_METHODS", "DASHED"):
        monkeypatch.setattr(suite, name, type(getattr(suite, name))(getattr(suite, name)))  # a copy to change
    monkeypatch.setattr(suite, "SCRIPT", suite.SCRIPT)
    setting = {"method": "rtrl", "cell": "lru", "cell_kwargs": {}}
    suite.register_methods(
        {"lru_rtrl": setting}, {"ppo_lstm_e5": {"n_epochs": 5}}, order=["lru_rtrl"], dashed=["lru_rtrl"]
    )
    assert suite.R2AC_METHODS["lru_rtrl"] == setting and suite.SB3_METHODS["ppo_lstm_e5"] == {"n_epochs": 5}
    assert (
        suite.METHOD_ORDER[0] == "lru_rtrl" and "ppo_lstm_e5" not in suite.METHOD_ORDER and "lru_rtrl" in suite.DASHED
    )
    suite.register_methods({"lru_rtrl": dict(setting)})  # the same setting again: no change
    with pytest.raises(ValueError, match="already has a method named 'popgym'"):
        suite.register_methods({"popgym": setting})
    with pytest.raises(ValueError, match="unknown methods"):
        suite.register_methods(default=["lru_gru"])
