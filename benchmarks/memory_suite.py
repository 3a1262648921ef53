"""The memory suite: R2AC against sb3-contrib's RecurrentPPO on memory tasks nobody here wrote (every POPGym env,
MiniGrid-MemoryS7, CartPoleNoVel), with the same env construction, agent-step budgets and seeds.

Methods: ``popgym``, ``long_segments`` and ``cartpole_novel`` (the configs of those names in examples/configs/),
``rtrl``, ``tbptt`` and ``ff`` (the paper's R2AC with an eLSTM core: RTRL, TBPTT at the same M, no recurrent core),
and RecurrentPPO as ``ppo_lstm`` (sb3-contrib's defaults), ``ppo_lstm_zoo`` (rl-zoo's tuned recipe) and
``ppo_lstm_e20_lam08`` (20 epochs, GAE 0.8). Each (env, method, seed) runs in a subprocess and leaves
``<out>/runs/<env>/<method>/seed<k>.json``; a job whose JSON exists is skipped, so a stopped suite continues.

    python benchmarks/memory_suite.py run --out runs/memory_suite --jobs 2   # the default methods, the suite's envs
    python benchmarks/memory_suite.py run --envs CountRecallEasy --methods popgym ppo_lstm --seeds 0 --preview
    python benchmarks/memory_suite.py report --out runs/memory_suite         # table (markdown) and figure (PNG)

Needs ``pip install -e ".[suite]"``. Other settings plug in with :func:`register_methods` (experiments/ does).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import shlex
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "examples" / "configs"
POINTS = 50
"""Learning-curve points per run (evenly spaced in agent steps)."""
SCRIPT = Path(__file__).resolve()
"""The script that runs the suite: RecurrentPPO jobs run ``python <SCRIPT> sb3 ...`` (see :func:`register_methods`)."""


@dataclass(frozen=True)
class EnvSpec:
    """One env of the suite: its onlinerec id, the agent-step budget, the return window and each agent's settings."""

    env: str
    steps: int
    window: int
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    r2ac: dict[str, Any] = field(default_factory=dict)
    sb3: dict[str, Any] = field(default_factory=dict)
    sb3_source: str = "sb3-contrib defaults, LSTM width matched to R2AC's"
    random_return: float | None = None


# R2AC: eLSTM N = 64 for the small POPGym / CartPole observations, 128 for MiniGrid's 7x7x3 view; M = 4 (a small M:
# the cue is usually further back than M + 1 steps); B = 16 streams; everything else the paper's (RMSprop, V-trace,
# entropy 0.01, discount 0.99) except the learning rate (small nets learn faster with 2e-3, as on the T-maze). The
# configs of examples/configs/ take only the width N from here (their stem one narrower, as in the file).
_R2AC_COMMON: dict[str, Any] = {
    "num_envs": 16,
    "M": 4,
    "hidden_size": 64,
    "fc_size": 64,
    "stem": "mlp",
    "cell_kwargs": {"forget_bias": 1.0},
    "r2ac": {"lr": 2.0e-3},
}

SB3_MATCHED: dict[str, Any] = {"n_envs": 16, "policy_kwargs": {"lstm_hidden_size": 64}}
"""sb3-contrib RecurrentPPO defaults (n_steps 128, batch 128, 10 epochs, lr 3e-4, gamma 0.99, GAE 0.95, clip 0.2,
ent 0) with an LSTM as wide as R2AC's, on as many streams as R2AC."""

SB3_ZOO: dict[str, Any] = {
    "n_envs": 8, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
    "ent_coef": 0.0, "learning_rate": "lin_0.001", "clip_range": "lin_0.2", "normalize": True,
}  # fmt: skip
"""rl-zoo's tuned RecurrentPPO for CartPoleNoVel-v1 (hyperparams/ppo_lstm.yml; "lin_" = linear decay to 0), with its
VecNormalize of observations and rewards (normalize: true)."""

# Budget: 100,000 agent steps per run for every env and method (rl-zoo's CartPoleNoVel budget). sb3-contrib's
# RecurrentPPO runs at about 70-125 agent steps per CPU-second here (10-20 epochs over every rollout), R2AC at about
# 1,000: 15 (env, seed) pairs cost about 5.5 CPU-hours, i.e. about 3 hours on the 2-core machine when it is idle.
BUDGET = 100_000


def _popgym(name: str, random_return: float | None, window: int = 100) -> EnvSpec:
    """A POPGym env with the suite's budget, R2AC's common settings and RecurrentPPO's matched defaults."""
    return EnvSpec(
        f"popgym:{name}", steps=BUDGET, window=window, r2ac=_R2AC_COMMON, sb3=SB3_MATCHED, random_return=random_return
    )


# random_return: the mean return of uniform actions (8 x 3,000 steps; None where not measured). POPGym's mazes, and
# the bandits and RepeatFirstHard, whose episodes run 400-1,000 steps, average fewer episodes (window).
ENVS: dict[str, EnvSpec] = {
    "RepeatPreviousEasy": _popgym("RepeatPreviousEasy", -0.5),
    "RepeatFirstEasy": _popgym("RepeatFirstEasy", -0.5),
    "CountRecallEasy": _popgym("CountRecallEasy", None),
    "MiniGridMemoryS7": EnvSpec(
        "MiniGrid-MemoryS7-v0", steps=BUDGET, window=50,
        r2ac={**_R2AC_COMMON, "hidden_size": 128, "fc_size": 128},
        sb3={"n_envs": 16, "policy_kwargs": {"lstm_hidden_size": 128, "normalize_images": False}},
        sb3_source="sb3-contrib defaults, LSTM width matched to R2AC's; normalize_images=False (symbolic grid)",
    ),
    "CartPoleNoVel": EnvSpec(
        "gymnasium:CartPoleNoVel-v1", steps=BUDGET, window=20, r2ac=_R2AC_COMMON,
        sb3=SB3_ZOO,
        sb3_source="rl-zoo ppo_lstm.yml (CartPoleNoVel-v1), with its VecNormalize (normalize: true)",
        random_return=22.0,
    ),
    "AutoencodeEasy": _popgym("AutoencodeEasy", -0.5),
    "MultiarmedBanditEasy": _popgym("MultiarmedBanditEasy", 0.0, window=50),
    "BattleshipEasy": _popgym("BattleshipEasy", -0.456),
    "MineSweeperEasy": _popgym("MineSweeperEasy", -0.229),
    "HigherLowerEasy": _popgym("HigherLowerEasy", 0.006),
    "PositionOnlyCartPoleEasy": _popgym("PositionOnlyCartPoleEasy", 0.112),
    "NoisyPositionOnlyCartPoleEasy": _popgym("NoisyPositionOnlyCartPoleEasy", 0.111),
    "PositionOnlyPendulumEasy": _popgym("PositionOnlyPendulumEasy", 0.253),
    "ConcentrationEasy": _popgym("ConcentrationEasy", -0.198),
    "VelocityOnlyCartPoleEasy": _popgym("VelocityOnlyCartPoleEasy", 0.109),
    "LabyrinthEscapeEasy": _popgym("LabyrinthEscapeEasy", -0.289, window=32),
    "LabyrinthExploreEasy": _popgym("LabyrinthExploreEasy", -0.374, window=32),
    "RepeatPreviousMedium": _popgym("RepeatPreviousMedium", -0.494),
    "NoisyPositionOnlyPendulumEasy": _popgym("NoisyPositionOnlyPendulumEasy", 0.229),
    "AutoencodeMedium": _popgym("AutoencodeMedium", -0.495),
    "RepeatFirstMedium": _popgym("RepeatFirstMedium", -0.496),
    "CountRecallMedium": _popgym("CountRecallMedium", -0.925),
    "PositionOnlyCartPoleMedium": _popgym("PositionOnlyCartPoleMedium", 0.056),
    "PositionOnlyPendulumMedium": _popgym("PositionOnlyPendulumMedium", 0.268),
    "VelocityOnlyCartPoleMedium": _popgym("VelocityOnlyCartPoleMedium", 0.056),
    "NoisyPositionOnlyCartPoleMedium": _popgym("NoisyPositionOnlyCartPoleMedium", 0.111),
    "NoisyPositionOnlyPendulumMedium": _popgym("NoisyPositionOnlyPendulumMedium", 0.261),
    "MultiarmedBanditMedium": _popgym("MultiarmedBanditMedium", -0.007, window=50),
    "HigherLowerMedium": _popgym("HigherLowerMedium", -0.003),
    "BattleshipMedium": _popgym("BattleshipMedium", -0.427),
    "ConcentrationMedium": _popgym("ConcentrationMedium", -0.183),
    "PositionOnlyCartPoleHard": _popgym("PositionOnlyCartPoleHard", 0.036),
    "PositionOnlyPendulumHard": _popgym("PositionOnlyPendulumHard", 0.261),
    "MineSweeperMedium": _popgym("MineSweeperMedium", -0.403),
    "LabyrinthExploreMedium": _popgym("LabyrinthExploreMedium", -0.66, window=32),
    "VelocityOnlyCartPoleHard": _popgym("VelocityOnlyCartPoleHard", 0.038),
    "NoisyPositionOnlyCartPoleHard": _popgym("NoisyPositionOnlyCartPoleHard", 0.111),
    "LabyrinthEscapeMedium": _popgym("LabyrinthEscapeMedium", -0.935, window=32),
    "AutoencodeHard": _popgym("AutoencodeHard", -0.502),
    "RepeatPreviousHard": _popgym("RepeatPreviousHard", -0.5),
    "NoisyPositionOnlyPendulumHard": _popgym("NoisyPositionOnlyPendulumHard", 0.252),
    "RepeatFirstHard": _popgym("RepeatFirstHard", -0.499, window=32),
    "CountRecallHard": _popgym("CountRecallHard", -0.884),
    "MultiarmedBanditHard": _popgym("MultiarmedBanditHard", 0.013, window=32),
    "HigherLowerHard": _popgym("HigherLowerHard", -0.002),
    "BattleshipHard": _popgym("BattleshipHard", -0.381),
    "ConcentrationHard": _popgym("ConcentrationHard", -0.842),
    "MineSweeperHard": _popgym("MineSweeperHard", -0.431),
    "LabyrinthExploreHard": _popgym("LabyrinthExploreHard", -0.747, window=32),
    "LabyrinthEscapeHard": _popgym("LabyrinthEscapeHard", -0.904, window=32),
}  # fmt: skip
"""Every env the suite runs (``--envs``): POPGym's, MiniGrid-MemoryS7 and CartPoleNoVel; the report and the figure
keep this order."""
SUITE_ENVS = ["RepeatPreviousEasy", "RepeatFirstEasy", "CountRecallEasy", "MiniGridMemoryS7", "CartPoleNoVel"]
"""The envs ``run`` runs without ``--envs``."""

R2AC_METHODS: dict[str, dict[str, Any]] = {
    "popgym": {"yaml": "popgym.yaml"},
    "long_segments": {"yaml": "long_segments.yaml"},
    "cartpole_novel": {"yaml": "cartpole_novel.yaml"},
    "rtrl": {"method": "rtrl", "cell": "elstm"},
    "tbptt": {"method": "tbptt", "cell": "elstm"},
    "ff": {"method": "tbptt", "cell": None},  # feed-forward: no core; the method only sets M for the rollouts
}
"""R2AC's methods. A method is either ``{"yaml": <a file in examples/configs/>}``, that config as it ships (the suite
sets only the env, its network width, the seed, the budget, the output folder, evaluation and logging), or the env's
``r2ac`` settings changed by ``method`` and ``cell`` (gradient method and core), ``cell_kwargs``, ``r2ac``
(``R2ACConfig`` fields), ``config`` (other ``ExperimentConfig`` fields) and ``match_core_width`` (the stem one
narrower than the core, which also reads the reward, so that every layer keeps its width)."""
SB3_METHODS: dict[str, dict[str, Any]] = {
    "ppo_lstm": {},
    "ppo_lstm_zoo": SB3_ZOO,  # rl-zoo's whole CartPoleNoVel recipe on every env, its VecNormalize included
    "ppo_lstm_e20_lam08": {"n_epochs": 20, "gae_lambda": 0.8},  # the best of RecurrentPPO's CountRecallEasy settings
}
"""RecurrentPPO's methods: each one's change to the env's ``sb3`` settings (``ppo_lstm``: none)."""
DEFAULT_METHODS = ["popgym", "rtrl", "tbptt", "ff", "ppo_lstm", "ppo_lstm_zoo"]
"""The methods ``run`` runs without ``--methods``."""
METHOD_ORDER = [*R2AC_METHODS, *SB3_METHODS]
"""The report's order of methods (its rows, the figure's legend and colours); others follow by name."""
DASHED: set[str] = set()
"""Methods the figure draws dashed."""
EVAL_EPISODES = 32


def register_methods(
    r2ac: dict[str, dict[str, Any]] | None = None,
    sb3: dict[str, dict[str, Any]] | None = None,
    *,
    order: list[str] | None = None,
    default: list[str] | None = None,
    dashed: tuple[str, ...] | list[str] = (),
    script: str | Path | None = None,
) -> None:
    """Add settings to the suite before :func:`main` runs (experiments/memory_suite.py adds its own).

    ``r2ac`` maps new names to R2AC settings (the form of ``R2AC_METHODS``' values), ``sb3`` to RecurrentPPO's changes
    (as ``SB3_METHODS``); a name the suite already has is refused unless it comes with the same setting. ``order``: the
    report's order of methods, ``default``: what ``run`` runs without ``--methods``, ``dashed``: methods drawn dashed.
    ``script``: the file that registers them and calls :func:`main`; RecurrentPPO jobs run it as their subprocess,
    so that it knows their names.
    """
    global SCRIPT
    for registry, new in ((R2AC_METHODS, r2ac or {}), (SB3_METHODS, sb3 or {})):
        for name, setting in new.items():
            other = R2AC_METHODS.get(name, SB3_METHODS.get(name))
            if other is not None and other != setting:
                raise ValueError(f"the suite already has a method named {name!r}, with other settings")
            if "-" in name:
                raise ValueError(f"method names have no '-' ({name!r}): it marks --extra-cell's methods")
            registry[name] = setting
    known = [*R2AC_METHODS, *SB3_METHODS]
    for names in (order or [], default or [], dashed):
        unknown = [name for name in names if name not in known]
        if unknown:
            raise ValueError(f"unknown methods {unknown}: register them first")
    if order is not None:
        METHOD_ORDER[:] = list(dict.fromkeys([*order, *METHOD_ORDER]))
    if default is not None:
        DEFAULT_METHODS[:] = default
    DASHED.update(dashed)
    if script is not None:
        SCRIPT = Path(script).resolve()


# ----------------------------------------------------------------------------------------------------------------
# scores
# ----------------------------------------------------------------------------------------------------------------
def curve_on_grid(steps: list[float], values: list[float], budget: int) -> tuple[list[float], list[float]]:
    """The logged running-mean return, read at POINTS evenly spaced step counts (linear interpolation; NaN before
    the first logged value)."""
    grid = np.linspace(budget / POINTS, budget, POINTS)
    if not steps:
        return grid.tolist(), [float("nan")] * POINTS
    s, v = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    out = np.interp(grid, s, v)
    out[grid < s[0]] = np.nan
    return grid.tolist(), out.tolist()


def scores(curve: list[float]) -> dict[str, float]:
    """A run's scores from its learning curve (the mean undiscounted return of the last ``window`` training episodes,
    sampled actions, at ``POINTS`` evenly spaced step counts): ``final``, its last value (POPGym's "mean episodic
    return at the end of training"); ``mmer``, its maximum (POPGym's max-mean episodic return); ``auc``, its mean (the
    normalised area under the curve, in return units). A job's ``eval`` is separate: the mean return of greedy
    episodes on the evaluation streams after training."""
    c = np.asarray(curve, dtype=float)
    ok = c[~np.isnan(c)]
    if not len(ok):
        return {"final": float("nan"), "mmer": float("nan"), "auc": float("nan")}
    return {"final": float(ok[-1]), "mmer": float(ok.max()), "auc": float(np.nan_to_num(c, nan=ok[0]).mean())}


def running_means(episodes: list[tuple[int, float]], window: int) -> tuple[list[float], list[float]]:
    """(step, mean of the last ``window`` episode returns) after each episode."""
    steps, values, last = [], [], []
    for step, ret in episodes:
        last.append(ret)
        last = last[-window:]
        steps.append(float(step))
        values.append(float(np.mean(last)))
    return steps, values


# ----------------------------------------------------------------------------------------------------------------
# R2AC: onlinerec rl
# ----------------------------------------------------------------------------------------------------------------
def r2ac_config(name: str, method: str, seed: int, out: Path, steps: int, cell: str | None = None) -> dict[str, Any]:
    """The ``onlinerec rl`` config of R2AC ``method`` on env ``name`` (see ``R2AC_METHODS``); ``cell``: the
    ``--extra-cell`` hook's core for ``rtrl-<cell>`` and ``tbptt-<cell>``."""
    spec = ENVS[name]
    setting = dict(R2AC_METHODS[method.split("-")[0]])
    suite = {  # what the suite sets for every R2AC job
        "env": spec.env,
        "env_kwargs": dict(spec.env_kwargs),
        "total_frames": steps,
        "seed": seed,
        "eval_episodes": EVAL_EPISODES,
        "eval_envs": 16,
        "eval_max_steps": 20_000,
        "out_dir": str(out / "r2ac" / name / f"{method}-seed{seed}"),
        "checkpoint_every": 500,
        "log_every": max(1, steps // (spec.r2ac["M"] * spec.r2ac["num_envs"] * 4 * POINTS)),
        "threads": 1,
        "progress": False,
        "tensorboard": False,
    }
    if "yaml" in setting:  # a shipped config: the env's width N, the stem as much narrower as in the file
        import yaml

        cfg = yaml.safe_load((CONFIGS / setting["yaml"]).read_text())
        width = spec.r2ac["hidden_size"]
        cfg.update(hidden_size=width, fc_size=width - (cfg["hidden_size"] - cfg["fc_size"]), **suite)
        cfg["r2ac"] = {**cfg.get("r2ac", {}), "return_window": spec.window}
        return cfg
    cfg = {k: v for k, v in spec.r2ac.items() if k != "r2ac"}
    if "cell_kwargs" in setting:  # a setting with a cell of its own: that cell's settings
        cfg["cell_kwargs"] = setting["cell_kwargs"]
    if cell is not None:  # the hook: another built-in cell, with its own defaults
        setting["cell"] = cell
        cfg.pop("cell_kwargs", None)
    cfg.update(
        method=setting["method"],
        cell=setting["cell"],
        r2ac={**spec.r2ac.get("r2ac", {}), **setting.get("r2ac", {}), "return_window": spec.window},
        **suite,
    )
    cfg.update(setting.get("config", {}))  # the setting's own ExperimentConfig fields (e.g. core_norm)
    if setting.get("match_core_width"):  # the core reads fc_size + 1 features (with the reward): every layer's width
        cfg["fc_size"] = cfg["hidden_size"] - 1
    if setting["cell"] is None:
        cfg.pop("cell_kwargs", None)
    return cfg


def run_child(cmd: list[str], log_path: Path) -> tuple[int, float]:
    """Run ``cmd`` (output appended to ``log_path``); returns its exit status and the CPU seconds it and the children
    it waited for used (user + system): a run's cost that does not depend on how loaded the machine was."""
    with open(log_path, "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)  # noqa: S603
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # already reaped: tell Popen
    return proc.returncode, usage.ru_utime + usage.ru_stime


def run_r2ac(name: str, method: str, seed: int, out: Path, steps: int, cell: str | None) -> dict[str, Any]:
    import yaml

    from onlinerec.rl.curves import load_curve

    cfg = r2ac_config(name, method, seed, out, steps, cell)
    run_dir = Path(cfg["out_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    config = run_dir / "config.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = [sys.executable, "-m", "onlinerec.cli", "rl", "--config", str(config)]
    start = time.perf_counter()
    code, cpu = run_child(cmd, run_dir / "stdout.log")
    wall = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed (exit {code}); see {run_dir / 'stdout.log'}")
    frames, values = load_curve(run_dir, "return")
    result = json.loads((run_dir / "eval.json").read_text())
    grid, curve = curve_on_grid(frames, values, steps)
    return {
        "command": shlex.join(["python", "-m", "onlinerec.cli", "rl", "--config", str(config)]),
        "config": cfg,
        "wall_s": wall,
        "cpu_s": cpu,
        "train_seconds": result.get("train_seconds"),
        "steps": int(result["frames"]),
        "grid": grid,
        "curve": curve,
        "eval": result.get("eval", {}).get("mean"),
        "eval_returns": result.get("eval", {}).get("returns"),
    }


# ----------------------------------------------------------------------------------------------------------------
# RecurrentPPO: sb3-contrib on onlinerec's envs
# ----------------------------------------------------------------------------------------------------------------
def sb3_vec_env(env_id: str, num_envs: int, seed: int, env_kwargs: dict[str, Any]):
    """onlinerec's SAME_STEP vector env as an sb3 ``VecEnv`` (sb3 also autoresets in the step that ends an
    episode, keeping the terminal observation in ``infos[i]["terminal_observation"]``)."""
    from stable_baselines3.common.vec_env import VecEnv

    from onlinerec.rl.envs import make_vector_env

    class OnlinerecVecEnv(VecEnv):
        def __init__(self):
            self.env = make_vector_env(env_id, num_envs, seed=seed, **env_kwargs)
            self.episodes: list[tuple[int, float]] = []
            self.steps = 0
            self._actions = None
            self.render_mode = None
            super().__init__(num_envs, self.env.single_observation_space, self.env.single_action_space)

        def reset(self):
            obs, _ = self.env.reset()
            return obs

        def step_async(self, actions):
            self._actions = actions

        def step_wait(self):
            obs, reward, terminated, truncated, info = self.env.step(self._actions)
            self.steps += num_envs
            done = np.logical_or(terminated, truncated)
            infos: list[dict[str, Any]] = [{} for _ in range(num_envs)]
            for i in np.flatnonzero(done):
                final = info.get("final_obs")
                infos[i]["terminal_observation"] = None if final is None else final[i]
                infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            for i in np.flatnonzero(info["episode_end"]):
                self.episodes.append((self.steps, float(info["episode_return"][i])))
                infos[i]["episode"] = {"r": float(info["episode_return"][i]), "l": int(info["episode_length"][i])}
            return obs, np.asarray(reward, dtype=np.float32), done, infos

        def close(self):
            self.env.close()

        def get_attr(self, attr_name, indices=None):
            return [getattr(self, attr_name, None)] * num_envs

        def set_attr(self, attr_name, value, indices=None):
            setattr(self, attr_name, value)

        def env_method(self, method_name, *args, indices=None, **kwargs):
            return [None] * num_envs

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * num_envs

    return OnlinerecVecEnv()


def _schedule(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda progress_remaining: progress_remaining * start
    return value


def sb3_args(name: str, seed: int, steps: int, out_json: Path, method: str = "ppo_lstm") -> list[str]:
    args = ["--env", name, "--seed", str(seed), "--steps", str(steps), "--json", str(out_json)]
    return args if method == "ppo_lstm" else [*args, "--variant", method]


def sb3_settings(name: str, method: str = "ppo_lstm") -> dict[str, Any]:
    """RecurrentPPO's settings for env ``name``: the env's ``sb3`` values, with ``method``'s change."""
    return {**ENVS[name].sb3, **SB3_METHODS[method]}


def make_sb3_model(name: str, seed: int, method: str = "ppo_lstm") -> tuple[Any, Any, Any]:
    """RecurrentPPO with ``method``'s settings on env ``name``'s training streams: ``(model, env, raw)``, where
    ``env`` is what the model trains on (``raw`` behind rl-zoo's ``VecNormalize`` where the method has it)."""
    from sb3_contrib import RecurrentPPO

    from onlinerec.rl.envs import run_env_seed

    spec = ENVS[name]
    settings = sb3_settings(name, method)
    hp = {k: _schedule(v) for k, v in settings.items() if k not in ("n_envs", "normalize")}
    n_envs = int(settings.get("n_envs", 8))
    env = raw = sb3_vec_env(spec.env, n_envs, run_env_seed(seed, purpose="train"), spec.env_kwargs)
    if settings.get("normalize"):  # rl-zoo's `normalize: true`: observations and rewards, with the run's gamma
        from stable_baselines3.common.vec_env import VecNormalize

        env = VecNormalize(raw, gamma=hp.get("gamma", 0.99))
    return RecurrentPPO("MlpLstmPolicy", env, seed=seed, verbose=0, device="cpu", **hp), env, raw


def run_sb3(name: str, seed: int, out_json: Path, steps: int, method: str = "ppo_lstm") -> dict[str, Any]:
    """Train RecurrentPPO (``method``: a name in ``SB3_METHODS``) for ``steps`` agent steps, evaluate it
    deterministically, return the job's record."""
    import torch

    torch.set_num_threads(1)
    spec = ENVS[name]
    settings = sb3_settings(name, method)
    model, env, raw = make_sb3_model(name, seed, method)
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    train_seconds = time.perf_counter() - start
    s, v = running_means(raw.episodes, spec.window)  # the env's own returns, before any normalisation
    grid, curve = curve_on_grid(s, v, steps)
    eval_returns = evaluate_sb3(model, spec, seed, env.normalize_obs if env is not raw else None)
    model.save(out_json.with_suffix(".zip"))  # the trained policy, for analyses (experiments/)
    if env is not raw:
        env.save(str(out_json.with_suffix(".vecnormalize.pkl")))  # its observation statistics go with it
    env.close()
    return {
        "command": shlex.join(["python", _shown(SCRIPT), "sb3", *sb3_args(name, seed, steps, out_json, method)]),
        "config": {"env": spec.env, "env_kwargs": spec.env_kwargs, **settings, "source": spec.sb3_source},
        "train_seconds": train_seconds,
        "steps": int(raw.steps),
        "grid": grid,
        "curve": curve,
        "eval": float(np.mean(eval_returns)) if eval_returns else float("nan"),
        "eval_returns": eval_returns,
    }


def evaluate_sb3(
    model: Any, spec: EnvSpec, seed: int, normalize_obs: Any = None, max_steps: int = 20_000
) -> list[float]:
    """Deterministic episodes on the evaluation streams, spread evenly over 16 streams (as R2AC's evaluation);
    ``normalize_obs``: the training VecNormalize's (frozen) observation normalisation, if it had one."""
    from onlinerec.rl.envs import make_vector_env, run_env_seed

    n = 16
    env = make_vector_env(spec.env, n, seed=run_env_seed(seed, purpose="eval"), **spec.env_kwargs)
    quota = np.full(n, math.ceil(EVAL_EPISODES / n))
    obs, _ = env.reset()
    state, start = None, np.ones(n, dtype=bool)
    returns: list[float] = []
    for _ in range(max_steps):
        seen = obs if normalize_obs is None else normalize_obs(obs)
        action, state = model.predict(seen, state=state, episode_start=start, deterministic=True)
        obs, _, terminated, truncated, info = env.step(action)
        start = np.logical_or(terminated, truncated)
        for i in np.flatnonzero(info["episode_end"]):
            if quota[i] > 0:
                quota[i] -= 1
                returns.append(float(info["episode_return"][i]))
        if len(returns) >= EVAL_EPISODES:
            break
    env.close()
    return returns


# ----------------------------------------------------------------------------------------------------------------
# the suite: jobs, two at a time, resumable
# ----------------------------------------------------------------------------------------------------------------
def _shown(path: Path) -> str:
    """``path`` as a command shows it: relative to the repository where it is inside it."""
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def job_path(out: Path, name: str, method: str, seed: int) -> Path:
    return out / "runs" / name / method / f"seed{seed}.json"


def run_job(name: str, method: str, seed: int, out: Path, steps: int, cell: str | None) -> dict[str, Any]:
    path = job_path(out, name, method, seed)
    start = time.perf_counter()
    if method in SB3_METHODS:
        path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(SCRIPT), "sb3", *sb3_args(name, seed, steps, path.with_suffix(".partial"), method)]
        code, cpu = run_child(cmd, path.with_suffix(".log"))
        if code != 0:
            raise RuntimeError(f"{shlex.join(cmd)} failed (exit {code}); see {path.with_suffix('.log')}")
        record = json.loads(path.with_suffix(".partial").read_text())
        record["cpu_s"] = cpu
        path.with_suffix(".partial").unlink()
    else:
        record = run_r2ac(name, method, seed, out, steps, cell)
    record.update(env=name, method=method, seed=seed, budget=steps, wall_s=time.perf_counter() - start)
    record.update(scores(record["curve"]))
    record["machine"] = machine()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    return record


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "load_avg": os.getloadavg()}


def claim(path: Path) -> bool:
    """Take job ``path`` for this process (a ``.lock`` file holding our pid), so that several ``run`` processes can
    share one suite; a lock whose process is gone is taken over."""
    lock = path.with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                os.kill(int(lock.read_text() or 0), 0)
                return False  # another live process runs it
            except (ProcessLookupError, ValueError):
                lock.unlink(missing_ok=True)
                continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True
    return False


def run_suite(args: argparse.Namespace) -> None:
    out = Path(args.out)
    methods = list(args.methods)
    if args.extra_cell:
        methods += [f"rtrl-{args.extra_cell}", f"tbptt-{args.extra_cell}"]
    jobs, other_budget = [], []
    for seed in args.seeds:  # seed-major: a partial suite has every (env, method) at least once
        for name in args.envs:
            for method in methods:
                budget = max(1, int(ENVS[name].steps * args.budget_scale))
                path = job_path(out, name, method, seed)
                if path.exists():  # done, unless at another budget: that would pass its result off as this one
                    if json.loads(path.read_text()).get("budget") != budget:
                        other_budget.append(f"{name} {method} seed {seed}")
                    continue
                cell = args.extra_cell if "-" in method else None
                jobs.append((name, method, seed, budget, cell))
    if other_budget:
        raise SystemExit(
            f"error: {out} already holds {len(other_budget)} of these runs at another budget "
            f"({'; '.join(other_budget[:3])}{'; ...' if len(other_budget) > 3 else ''}): a run at --budget-scale "
            f"{args.budget_scale:g} would skip them and report theirs. Give this budget its own --out (as --preview "
            "does)."
        )
    total = len(jobs)
    print(f"memory suite: {total} job(s) to run in {out}, {args.jobs} at a time", flush=True)
    lock, done, started = threading.Lock(), [0], time.perf_counter()

    def one(job):
        name, method, seed, budget, cell = job
        path = job_path(out, name, method, seed)
        if path.exists() or not claim(path):
            msg = "done or running in another process"
        else:
            with lock:
                print(f"  start {name} {method} seed {seed} ({budget:,} steps)", flush=True)
            try:
                rec = run_job(name, method, seed, out, budget, cell)
                msg = f"final {rec['final']:.3f}  eval {rec['eval']:.3f}  {rec['wall_s'] / 60:.1f} min"
            except Exception as err:  # noqa: BLE001 - one failed job must not stop the others; it is reported
                msg = f"FAILED: {err}"
            finally:
                path.with_suffix(".lock").unlink(missing_ok=True)
        with lock:
            done[0] += 1
            elapsed = time.perf_counter() - started
            eta = elapsed / done[0] * (total - done[0])
            print(f"[{done[0]}/{total}] {name} {method} seed {seed}: {msg}  (elapsed {elapsed / 60:.0f} min, "
                  f"ETA {eta / 60:.0f} min)", flush=True)  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, jobs))
    report(out)


# ----------------------------------------------------------------------------------------------------------------
# report: markdown table + learning-curve figure
# ----------------------------------------------------------------------------------------------------------------
def load_records(out: Path) -> list[dict[str, Any]]:
    """Every finished run under ``out``, by env, method and seed (seed 10 after seed 9, not after seed 1)."""
    paths = (out / "runs").glob("*/*/seed*.json")
    order = sorted(paths, key=lambda p: (p.parent.parent.name, p.parent.name, int(p.stem.removeprefix("seed"))))
    return [json.loads(p.read_text()) for p in order]


def _mean_std(values: list[float]) -> str:
    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], dtype=float)
    if not len(v):
        return "–"
    return f"{v.mean():.3f} ± {v.std():.3f}" if len(v) > 1 else f"{v[0]:.3f}"


def report(out: Path) -> Path | None:
    records = load_records(out)
    if not records:
        print("no finished runs yet")
        return None
    envs = [e for e in ENVS if any(r["env"] == e for r in records)]
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    methods = sorted({r["method"] for r in records}, key=lambda m: (order.get(m, len(order)), m))
    lines = [
        "| env | method | seeds | budget (agent steps) | final | MMER | AUC | greedy eval | wall min / run | CPU min / run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for env in envs:
        for method in methods:
            rs = [r for r in records if r["env"] == env and r["method"] == method]
            if not rs:
                continue
            wall = np.mean([r["wall_s"] for r in rs]) / 60
            cpus = [r["cpu_s"] for r in rs if r.get("cpu_s") is not None]  # runs before it was recorded have none
            cpu = (
                "–"
                if not cpus
                else f"{np.mean(cpus) / 60:.1f}" + ("" if len(cpus) == len(rs) else f" ({len(cpus)} of {len(rs)})")
            )
            lines.append(
                f"| {env} | {method} | {len(rs)} ({', '.join(str(r['seed']) for r in rs)}) | {rs[0]['budget']:,} | "
                f"{_mean_std([r['final'] for r in rs])} | {_mean_std([r['mmer'] for r in rs])} | "
                f"{_mean_std([r['auc'] for r in rs])} | {_mean_std([r['eval'] for r in rs])} | {wall:.1f} | "
                f"{cpu} |"
            )
    table = out / "table.md"
    table.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    figure(records, envs, methods, out / "learning_curves.png")
    print(f"table: {table}\nfigure: {out / 'learning_curves.png'}")
    return table


def figure(records: list[dict[str, Any]], envs: list[str], methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(envs))
    rows = math.ceil(len(envs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    palette = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")
    colours = {m: palette(i % palette.N) for i, m in enumerate(methods)}  # a method keeps its colour in every panel
    for ax, env in zip(axes.flat, envs):
        for method in methods:
            rs = [r for r in records if r["env"] == env and r["method"] == method]
            if not rs:
                continue
            grid = np.asarray(rs[0]["grid"])
            ys = np.asarray([r["curve"] for r in rs], dtype=float)
            style = {"linestyle": "--", "linewidth": 1} if method in DASHED else {}
            with warnings.catch_warnings():  # points before any run's first episode are NaN on purpose: left blank
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, low, high = np.nanmean(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)
            ax.plot(grid, mean, label=f"{method} ({len(rs)})", color=colours[method], **style)
            if len(rs) > 1:
                ax.fill_between(grid, low, high, color=colours[method], alpha=0.15)
        if ENVS[env].random_return is not None:
            ax.axhline(ENVS[env].random_return, color="gray", linestyle=":", linewidth=1)
        ax.set_title(env)
        ax.set_xlabel("agent steps")
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:g}k" if x else "0")  # 200000 ran into its neighbours
        ax.set_ylabel(f"return (last {ENVS[env].window} episodes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(envs) :]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def one_of(kind: str, names: list[str]):
    """An argparse ``type`` that accepts one of ``names`` and names the closest one for a misspelt name (``choices``
    alone lists all of them with no hint)."""
    from onlinerec.rl.envs.gymnasium_envs import did_you_mean

    def parse(name: str) -> str:
        if name not in names:
            raise argparse.ArgumentTypeError(f"unknown {kind} {name!r}{did_you_mean(name, names)}; --help lists them")
        return name

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run every job that has no JSON yet, then report")
    run.add_argument("--out", default="runs/memory_suite")
    envs, methods, variants = list(ENVS), [*R2AC_METHODS, *SB3_METHODS], list(SB3_METHODS)
    run.add_argument(
        "--envs", nargs="+", default=SUITE_ENVS, choices=envs, type=one_of("env", envs), metavar="ENV",
        help=f"default: {' '.join(SUITE_ENVS)}; any of {', '.join(envs)}",
    )  # fmt: skip
    run.add_argument(
        "--methods", nargs="+", default=DEFAULT_METHODS, choices=methods, type=one_of("method", methods),
        metavar="METHOD", help=f"default: {' '.join(DEFAULT_METHODS)}; any of {', '.join(methods)}",
    )  # fmt: skip
    run.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    run.add_argument("--jobs", type=int, default=2)
    run.add_argument("--budget-scale", type=float, default=1.0, help="multiply every env's agent-step budget")
    run.add_argument("--preview", action="store_true", help="--budget-scale 0.25, results under <out>/preview")
    run.add_argument("--extra-cell", default=None, help="hook: also R2AC RTRL/TBPTT with this built-in cell")
    rep = sub.add_parser("report", help="aggregate table and figure of the finished runs")
    rep.add_argument("--out", default="runs/memory_suite")
    one = sub.add_parser("sb3", help="one RecurrentPPO run (what `run` calls)")
    one.add_argument("--env", required=True, choices=envs, type=one_of("env", envs))
    one.add_argument("--seed", type=int, required=True)
    one.add_argument("--steps", type=int, default=None)
    one.add_argument("--json", required=True)
    one.add_argument(
        "--variant", default="ppo_lstm", choices=variants, type=one_of("method", variants), help="RecurrentPPO's method"
    )
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.preview:
            args.budget_scale, args.out = 0.25, str(Path(args.out) / "preview")
        if any(seed < 0 for seed in args.seeds):
            parser.error(f"--seeds must be 0 or more (each names a run's env streams), got {args.seeds}")
        if not args.budget_scale > 0:
            parser.error(
                f"--budget-scale must be above 0 (a fraction or multiple of each env's budget), got {args.budget_scale:g}"
            )
        run_suite(args)
    elif args.command == "report":
        report(Path(args.out))
    else:
        steps = args.steps or ENVS[args.env].steps
        record = run_sb3(args.env, args.seed, Path(args.json), steps, args.variant)
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
