"""experiments/memory_suite.py: every R2AC and RecurrentPPO setting it adds to benchmarks/memory_suite.py is a valid
run, under its name, with the held-out envs, the report's order and the command line of the suite."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import load_experiment

settings = load_experiment("memory_suite", module="experiments_memory_suite")
settings.register()
suite = settings.suite  # the suite these settings are added to


def parse_as_onlinerec_rl(cfg, tmp_path):
    """A setting's config as ``onlinerec rl --config`` reads it (an unknown option or a bad value raises)."""
    import yaml

    from onlinerec.rl.experiment import parse_experiment

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return parse_experiment(["--config", str(path)])


def test_registering_adds_every_setting_to_the_suite_once():
    assert set(settings.SETTINGS) <= set(suite.R2AC_METHODS) and set(settings.SB3_TUNING) <= set(suite.SB3_METHODS)
    before = (dict(suite.R2AC_METHODS), dict(suite.SB3_METHODS), list(suite.METHOD_ORDER))
    settings.register()  # again: nothing changes
    assert before == (suite.R2AC_METHODS, suite.SB3_METHODS, suite.METHOD_ORDER)
    assert suite.METHOD_ORDER[: len(settings.ORDER)] == settings.ORDER
    assert set(suite.METHOD_ORDER) == set(suite.R2AC_METHODS) | set(suite.SB3_METHODS)
    assert suite.DEFAULT_METHODS == settings.DEFAULT and set(settings.ABLATION) <= suite.DASHED


def test_the_held_out_envs_are_every_env_but_the_suites_own():
    assert len(set(settings.HELD_OUT)) == len(settings.HELD_OUT)
    assert set(settings.HELD_OUT) == set(suite.ENVS) - set(suite.SUITE_ENVS)


@pytest.mark.parametrize("method", sorted(settings.SETTINGS))
def test_every_r2ac_setting_is_a_valid_onlinerec_rl_config(method, tmp_path):
    cfg = suite.r2ac_config("CountRecallEasy", method, 0, tmp_path, 1000)
    parsed = parse_as_onlinerec_rl(cfg, tmp_path)  # an unknown option or a bad value raises here
    assert parsed.M == cfg["M"] and all(getattr(parsed.r2ac, k) == v for k, v in cfg["r2ac"].items())


@pytest.mark.parametrize(("method", "gradient"), [("lru_passes", "rtrl"), ("lru_tbptt_passes", "tbptt")])
def test_lru_settings_use_the_lru_with_its_own_settings_and_the_passes_options(method, gradient, tmp_path):
    cfg = suite.r2ac_config("CartPoleNoVel", method, 0, tmp_path, 1000)
    assert (cfg["cell"], cfg["method"], cfg["cell_kwargs"]) == ("lru", gradient, {})  # not the eLSTM's forget_bias
    assert cfg["r2ac"]["epochs"] == 4 and cfg["r2ac"]["advantage_norm"] is True
    assert suite.r2ac_config("CartPoleNoVel", "rtrl", 0, tmp_path, 1000)["cell_kwargs"] == {"forget_bias": 1.0}


def test_a_shipped_setting_is_the_suites_method_but_for_its_run_folder(tmp_path):
    for old, new in settings.SHIPPED.items():
        a, b = (suite.r2ac_config("CountRecallEasy", m, 0, tmp_path, 1000) for m in (old, new))
        assert {**a, "out_dir": None} == {
            "method": "rtrl",
            **b,
            "out_dir": None,
        }  # the shipped files leave rtrl implicit


def test_a_recurrentppo_tuning_setting_changes_one_setting_and_its_child_runs_this_script(tmp_path):
    base = suite.ENVS["CountRecallEasy"].sb3
    assert suite.sb3_settings("CountRecallEasy", "ppo_lstm_ent01") == {**base, "ent_coef": 0.01}
    assert suite.sb3_args("CountRecallEasy", 0, 10, tmp_path / "a.json", "ppo_lstm_lr1e3")[-2:] == [
        "--variant",
        "ppo_lstm_lr1e3",
    ]
    assert suite.SCRIPT == suite.REPO / "experiments" / "memory_suite.py"  # it knows every setting's name


def test_a_recurrentppo_tuning_setting_trains_with_its_change(tmp_path):
    pytest.importorskip("sb3_contrib")
    record = suite.run_sb3("RepeatPreviousEasy", 0, tmp_path / "c.json", 256, "ppo_lstm_ent01")
    assert record["config"]["ent_coef"] == 0.01
    assert record["command"].startswith("python experiments/memory_suite.py sb3 ")
    assert record["command"].endswith("--variant ppo_lstm_ent01")


@pytest.mark.parametrize("method", sorted(settings.SB3_TUNING))
def test_every_recurrentppo_setting_builds_with_the_settings_it_names(method):
    pytest.importorskip("sb3_contrib")
    model_settings = suite.sb3_settings("CountRecallEasy", method)
    model, env, raw = suite.make_sb3_model("CountRecallEasy", 0, method)  # an unknown keyword raises here
    try:
        assert raw.num_envs == model_settings["n_envs"] and (env is not raw) == bool(model_settings.get("normalize"))
        for key in ("n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "ent_coef"):
            if key in model_settings:
                assert getattr(model, key) == model_settings[key], key
        start_lr = suite._schedule(model_settings.get("learning_rate", 3e-4))  # "lin_x": a schedule from x
        start_lr = start_lr(1.0) if callable(start_lr) else start_lr
        assert model.lr_schedule(1.0) == pytest.approx(start_lr)
    finally:
        env.close()


def test_the_report_orders_settings_as_the_figures_do(tmp_path):
    curve = [0.1] * suite.POINTS
    for method in ("ppo_lstm_zoo", "lru_mingru_sep", "ppo_lstm", "lru_mingru_long_sep", "popgym"):
        path = suite.job_path(tmp_path, "CountRecallEasy", method, 0)
        path.parent.mkdir(parents=True)
        record = {"env": "CountRecallEasy", "method": method, "seed": 0, "budget": 10, "wall_s": 60.0, "eval": 0.0,
                  "grid": list(range(suite.POINTS)), "curve": curve, **suite.scores(curve)}  # fmt: skip
        path.write_text(json.dumps(record))
    rows = [line.split(" | ")[1] for line in suite.report(tmp_path).read_text().splitlines()[2:]]
    assert rows == ["lru_mingru_long_sep", "ppo_lstm", "lru_mingru_sep", "ppo_lstm_zoo", "popgym"]


def test_a_misspelt_setting_names_the_closest(capsys):
    with pytest.raises(SystemExit):
        settings.main(["run", "--methods", "lru_mingru_sepp"])
    assert "unknown method 'lru_mingru_sepp' (did you mean 'lru_mingru_sep'?)" in capsys.readouterr().err


def test_the_command_line_runs_the_suites_report(tmp_path):
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(suite.REPO / "experiments" / "memory_suite.py"), "report", "--out", str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "no finished runs yet" in proc.stdout, proc.stderr[-2000:]
