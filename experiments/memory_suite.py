"""The memory suite with every setting tried on it: benchmarks/memory_suite.py's engine and methods, plus each other
R2AC and RecurrentPPO setting under the name its results in docs/results.md carry (experiments/log.md says what each
was for). The same interface as benchmarks/memory_suite.py:

    python experiments/memory_suite.py run --out runs/memory_suite --jobs 2   # the suite's first default methods
    python experiments/memory_suite.py run --envs CountRecallEasy --methods lru_mingru_sep ppo_lstm_e20_lam08
    python experiments/memory_suite.py run --envs AutoencodeEasy MultiarmedBanditEasy --methods popgym ppo_lstm
    python experiments/memory_suite.py report --out runs/memory_suite

``popgym``, ``long_segments`` and ``cartpole_novel`` are also here under their earlier names
(``lru_mingru_sep_obs_cont``, ``lru_mingru_long_sep_obs``, ``lru_mingru_ent3_boot``; ``SHIPPED``), with the same
``onlinerec rl`` config, so runs under either name measure the same thing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ENGINE = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_suite.py"


def _engine() -> ModuleType:
    """A copy of benchmarks/memory_suite.py of its own (the module ``memory_suite_with_experiments``), so that adding
    this file's settings leaves the shipped suite, imported elsewhere in the same process, as it ships."""
    name = "memory_suite_with_experiments"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ENGINE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


suite = _engine()

# ----------------------------------------------------------------------------------------------------------------
# R2AC's settings
# ----------------------------------------------------------------------------------------------------------------
_PASSES: dict[str, Any] = {
    "reward_norm": True, "advantage_norm": True, "loss_reduction": "mean", "optimizer": "adam",
    "lr": 1.0e-3, "adam_eps": 1.0e-5, "epochs": 4, "ppo_clip": 0.2, "grad_clip": 0.5,
}  # fmt: skip
"""The several-passes options, PPO's usual values (not tuned): returns and advantages normalised, mean losses, Adam
(eps 1e-5), 4 clipped-ratio passes over every segment from its start carry, gradient-norm clip 0.5."""
_ZOO: dict[str, Any] = {**_PASSES, "obs_norm": True, "discount": 0.98, "entropy_cost": 0.0}
"""``_PASSES`` with rl-zoo's CartPoleNoVel recipe where R2AC has the setting (observations normalised, gamma 0.98,
no entropy bonus): the ``lru_zoo*`` settings."""
_SLOW_LRU: dict[str, Any] = {"r_min": 0.95, "max_phase": 0.314}
"""The LRU initialised for long memory: |lambda| in [0.95, 1), phases up to pi/10 (``lru_slow_passes``)."""

_LRU_MINGRU: dict[str, Any] = {
    "cell": ["lru", "mingru"],
    "cell_kwargs": {"residual": True, "norm": "layer", "layer_kwargs": [{"slow_fraction": 0.5}, {}]},
    "r2ac": {**_PASSES, "advantage_norm": False, "entropy_cost": 3.0e-3, "baseline_cost": 0.1},
    "config": {"core_norm": True},
    "match_core_width": True,
}
"""The ``lru_mingru_*`` settings without their gradient method: an LRU on two rings under a minGRU, pre-LayerNorm
residual blocks, ``lru_mixed_norm_pg``'s R2AC settings, the stem one narrower than the core."""
_LONG_SEGMENTS: dict[str, Any] = {
    "method": "rtrl", **_LRU_MINGRU,
    "r2ac": {**_LRU_MINGRU["r2ac"], "epochs": 10, "minibatches": 4, "bootstrap_truncation": True, "baseline_cost": 0.5},
    "config": {**_LRU_MINGRU["config"], "M": 32},
}  # fmt: skip
"""``lru_mingru_long``: 32-step segments, 10 passes in 4 minibatches, the control weights."""
_SEP: dict[str, Any] = {
    "method": "rtrl", **_LRU_MINGRU,
    "r2ac": {**_LRU_MINGRU["r2ac"], "baseline_cost": 0.5, "bootstrap_truncation": True},
    "config": {**_LRU_MINGRU["config"], "separate_critic": True},
}  # fmt: skip
"""``lru_mingru_sep``: a critic of its own, value-loss weight 0.5, time-limit bootstrapping."""
_SEP_OBS_CONT: dict[str, Any] = {**_SEP, "r2ac": {**_SEP["r2ac"], "obs_norm": True, "obs_norm_skip_binary": True}}
"""``lru_mingru_sep_obs_cont``: ``_SEP`` with continuous features normalised, one-hot codes left alone (``popgym``)."""
_SEP_OBS_CONT_COUNT: dict[str, Any] = {
    **_SEP_OBS_CONT,
    "cell_kwargs": {
        **_SEP_OBS_CONT["cell_kwargs"],
        "layer_kwargs": [{"slow_fraction": 0.5, "slow_r_min": 0.99, "slow_max_phase": 0.01}, {}],
    },
}
"""``lru_mingru_sep_obs_cont_count``: the LRU's slow ring started as counters (|lambda| >= 0.99, phases <= 0.01)."""
_LONG_SEP: dict[str, Any] = {**_LONG_SEGMENTS, "config": {**_LONG_SEGMENTS["config"], "separate_critic": True}}
"""``lru_mingru_long_sep``: ``_LONG_SEGMENTS`` with a critic of its own."""
_LONG_SEP_OBS_CONT: dict[str, Any] = {
    **_LONG_SEP, "r2ac": {**_LONG_SEP["r2ac"], "obs_norm": True, "obs_norm_skip_binary": True},
}  # fmt: skip
"""``lru_mingru_long_sep_obs_cont``: ``_LONG_SEP`` with continuous features normalised, one-hot codes left alone."""

SETTINGS: dict[str, dict[str, Any]] = {
    # the several-passes options on the paper's eLSTM core, then with the LRU (RTRL and TBPTT at the same M)
    "rtrl_passes": {"method": "rtrl", "cell": "elstm", "r2ac": _PASSES},
    "lru_passes": {"method": "rtrl", "cell": "lru", "cell_kwargs": {}, "r2ac": _PASSES},
    "lru_tbptt_passes": {"method": "tbptt", "cell": "lru", "cell_kwargs": {}, "r2ac": _PASSES},
    # the LRU on its long-memory ring; on both rings; both rings with core_norm and no advantage normalisation
    "lru_slow_passes": {"method": "rtrl", "cell": "lru", "cell_kwargs": _SLOW_LRU, "r2ac": _PASSES},
    "lru_mixed_passes": {"method": "rtrl", "cell": "lru", "cell_kwargs": {"slow_fraction": 0.5}, "r2ac": _PASSES},
    "lru_mixed_norm": {
        "method": "rtrl", "cell": "lru", "cell_kwargs": {"slow_fraction": 0.5},
        "r2ac": {**_PASSES, "advantage_norm": False}, "config": {"core_norm": True},
    },
    # lru_passes with observations normalised (the observation half of rl-zoo's VecNormalize)
    "lru_obs_passes": {"method": "rtrl", "cell": "lru", "cell_kwargs": {}, "r2ac": {**_PASSES, "obs_norm": True}},
    # rl-zoo's CartPoleNoVel values that R2AC has; with time limits bootstrapped; with core_norm, raw advantages
    "lru_zoo_passes": {"method": "rtrl", "cell": "lru", "cell_kwargs": {}, "r2ac": _ZOO},
    "lru_zoo_boot_passes": {
        "method": "rtrl", "cell": "lru", "cell_kwargs": {}, "r2ac": {**_ZOO, "bootstrap_truncation": True},
    },
    "lru_zoo_norm_passes": {
        "method": "rtrl", "cell": "lru", "cell_kwargs": {},
        "r2ac": {**_ZOO, "advantage_norm": False}, "config": {"core_norm": True},
    },
    # lru_mixed_norm with entropy cost 1e-3; then value-loss weight 0.1 and entropy cost 3e-3
    "lru_mixed_norm_ent3": {
        "method": "rtrl", "cell": "lru", "cell_kwargs": {"slow_fraction": 0.5},
        "r2ac": {**_PASSES, "advantage_norm": False, "entropy_cost": 1.0e-3}, "config": {"core_norm": True},
    },
    "lru_mixed_norm_pg": {
        "method": "rtrl", "cell": "lru", "cell_kwargs": {"slow_fraction": 0.5},
        "r2ac": {**_PASSES, "advantage_norm": False, "entropy_cost": 3.0e-3, "baseline_cost": 0.1},
        "config": {"core_norm": True},
    },
    # a minGRU on top of the LRU, RTRL and TBPTT
    "lru_mingru_pg": {"method": "rtrl", **_LRU_MINGRU},
    "lru_mingru_tbptt_pg": {"method": "tbptt", **_LRU_MINGRU},
    # the control weights (value loss 0.5, entropy 1e-3), then with time limits bootstrapped (cartpole_novel)
    "lru_mingru_ent3": {
        "method": "rtrl", **_LRU_MINGRU,
        "r2ac": {**_PASSES, "advantage_norm": False, "entropy_cost": 1.0e-3},
    },
    "lru_mingru_ent3_boot": {
        "method": "rtrl", **_LRU_MINGRU,
        "r2ac": {**_PASSES, "advantage_norm": False, "entropy_cost": 1.0e-3, "bootstrap_truncation": True},
    },
    # for MiniGrid-MemoryS7: value loss 0.5; no reward normalisation; the paper's entropy cost; the one-hot grid
    # stem; M = 16; M = 16 with 2 passes
    "lru_mingru_bc5": {"method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "baseline_cost": 0.5}},
    "lru_mingru_pg_raw": {"method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "reward_norm": False}},
    "lru_mingru_bc5_raw": {
        "method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "baseline_cost": 0.5, "reward_norm": False},
    },
    "lru_mingru_raw_ent2": {
        "method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "reward_norm": False, "entropy_cost": 1.0e-2},
    },
    "lru_mingru_grid_raw": {
        "method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "reward_norm": False},
        "config": {**_LRU_MINGRU["config"], "stem": "grid"},
    },
    "lru_mingru_pg_raw_m16": {
        "method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "reward_norm": False},
        "config": {**_LRU_MINGRU["config"], "M": 16},
    },
    # lru_mingru_pg with time limits bootstrapped (lru_mingru_vdetach, the value head behind a stop-gradient, used
    # R2ACConfig.detach_value, which onlinerec no longer has: log.md keeps its result)
    "lru_mingru_pg_boot": {
        "method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "bootstrap_truncation": True},
    },
    "lru_mingru_pg_raw_m16_e2": {
        "method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "reward_norm": False, "epochs": 2},
        "config": {**_LRU_MINGRU["config"], "M": 16},
    },
    # long segments; a critic of its own; both
    "lru_mingru_long": _LONG_SEGMENTS,
    "lru_mingru_sep": _SEP,
    "lru_mingru_long_sep": _LONG_SEP,
    # V-trace's traces cut at lambda = 0.8
    "lru_mingru_sep_lam08": {**_SEP, "r2ac": {**_SEP["r2ac"], "trace_lambda": 0.8}},
    "lru_mingru_long_sep_lam08": {**_LONG_SEP, "r2ac": {**_LONG_SEP["r2ac"], "trace_lambda": 0.8}},
    # observations normalised (long_segments); continuous features only
    "lru_mingru_long_sep_obs": {**_LONG_SEP, "r2ac": {**_LONG_SEP["r2ac"], "obs_norm": True}},
    "lru_mingru_long_sep_obs_cont": _LONG_SEP_OBS_CONT,
    # shorter segments with ten passes (M 8 in 2 minibatches, M 16)
    "lru_mingru_m8_sep_obs_cont": {
        **_LONG_SEP_OBS_CONT, "r2ac": {**_LONG_SEP_OBS_CONT["r2ac"], "minibatches": 2},
        "config": {**_LONG_SEP_OBS_CONT["config"], "M": 8},
    },
    "lru_mingru_m16_sep_obs_cont": {**_LONG_SEP_OBS_CONT, "config": {**_LONG_SEP_OBS_CONT["config"], "M": 16}},
    # four passes over long segments, in 4 minibatches and in 8
    "lru_mingru_long4_sep_obs_cont": {**_LONG_SEP_OBS_CONT, "r2ac": {**_LONG_SEP_OBS_CONT["r2ac"], "epochs": 4}},
    "lru_mingru_long4mb8_sep_obs_cont": {
        **_LONG_SEP_OBS_CONT, "r2ac": {**_LONG_SEP_OBS_CONT["r2ac"], "epochs": 4, "minibatches": 8},
    },
    # lru_mingru_sep with continuous features normalised (popgym)
    "lru_mingru_sep_obs_cont": _SEP_OBS_CONT,
    # a slow ring of counters; MLP heads on it and on popgym; popgym with 8 passes and lambda 0.8
    "lru_mingru_sep_obs_cont_count": _SEP_OBS_CONT_COUNT,
    "lru_mingru_sep_obs_cont_count_mlp": {
        **_SEP_OBS_CONT_COUNT, "config": {**_SEP_OBS_CONT_COUNT["config"], "head_sizes": [64, 64]},
    },
    "lru_mingru_sep_obs_cont_mlp": {**_SEP_OBS_CONT, "config": {**_SEP_OBS_CONT["config"], "head_sizes": [64, 64]}},
    "lru_mingru_sep_obs_cont_e8_lam08": {
        **_SEP_OBS_CONT, "r2ac": {**_SEP_OBS_CONT["r2ac"], "epochs": 8, "trace_lambda": 0.8},
    },
    # the ablation: each of rtrl_passes' changes alone on top of the paper's R2AC-RTRL (rtrl)
    "rtrl_rnorm": {"method": "rtrl", "cell": "elstm", "r2ac": {"reward_norm": True}},
    "rtrl_anorm": {"method": "rtrl", "cell": "elstm", "r2ac": {"advantage_norm": True}},
    "rtrl_adam": {"method": "rtrl", "cell": "elstm", "r2ac": {
        "loss_reduction": "mean", "optimizer": "adam", "lr": 1.0e-3, "adam_eps": 1.0e-5, "grad_clip": 0.5,
    }},
    "rtrl_ppo": {"method": "rtrl", "cell": "elstm", "r2ac": {"epochs": 4, "ppo_clip": 0.2}},
}  # fmt: skip
"""Every R2AC setting beyond benchmarks/memory_suite.py's methods, by name (experiments/log.md)."""

SHIPPED = {"lru_mingru_sep_obs_cont": "popgym", "lru_mingru_long_sep_obs": "long_segments",
           "lru_mingru_ent3_boot": "cartpole_novel"}  # fmt: skip
"""Each setting that a config in examples/configs/ packages, and the suite's method that runs that config."""

# ----------------------------------------------------------------------------------------------------------------
# RecurrentPPO's settings
# ----------------------------------------------------------------------------------------------------------------
_ZOO_SB3 = suite.SB3_ZOO
SB3_TUNING: dict[str, dict[str, Any]] = {
    "ppo_lstm_ent01": {"ent_coef": 0.01},  # an entropy bonus (sb3-contrib's default has none)
    "ppo_lstm_lr1e3": {"learning_rate": 1.0e-3},  # rl-zoo's tuned CartPoleNoVel lr, held constant
    "ppo_lstm_zoo": _ZOO_SB3,  # rl-zoo's whole tuned CartPoleNoVel recipe on every env (the LSTM width stays matched)
    # one change at a time around the defaults and the recipe
    "ppo_lstm_n32": {"n_steps": 32},  # defaults, 4x shorter rollouts: 4x as many updates per frame
    "ppo_lstm_n32_lr1e3": {"n_steps": 32, "learning_rate": 1.0e-3},  # and rl-zoo's learning rate
    "ppo_lstm_zoo_raw": {**_ZOO_SB3, "normalize": False},  # the recipe without VecNormalize
    "ppo_lstm_zoo_lam95": {**_ZOO_SB3, "gamma": 0.99, "gae_lambda": 0.95},  # the recipe with longer credit
    "ppo_lstm_zoo_e10": {**_ZOO_SB3, "n_epochs": 10},  # the recipe with half its passes per rollout
    "ppo_lstm_zoo_ent3": {**_ZOO_SB3, "ent_coef": 3.0e-3},  # the recipe with popgym.yaml's entropy cost
    "ppo_lstm_ent3": {"ent_coef": 3.0e-3},
    "ppo_lstm_zoo_raw_ent3": {**_ZOO_SB3, "normalize": False, "ent_coef": 3.0e-3},
    # a third round, for as many RecurrentPPO settings as R2AC's
    "ppo_lstm_e20": {"n_epochs": 20},  # the recipe's 20 passes per rollout, on the defaults
    "ppo_lstm_lam08": {"gae_lambda": 0.8},  # the recipe's short credit assignment, on the defaults
    "ppo_lstm_n256": {"n_steps": 256},  # twice as long rollouts: longer sequences through the LSTM
    "ppo_lstm_b64": {"batch_size": 64},  # half-size minibatches: twice as many gradient steps per rollout
    "ppo_lstm_shared": {  # one LSTM for actor and critic, the layout R2AC's shared core has
        "policy_kwargs": {**suite.SB3_MATCHED["policy_kwargs"], "shared_lstm": True, "enable_critic_lstm": False},
    },
    "ppo_lstm_zoo_ent3_g099": {**_ZOO_SB3, "ent_coef": 3.0e-3, "gamma": 0.99},  # the suite's usual discount
    "ppo_lstm_zoo_ent3_n64": {**_ZOO_SB3, "ent_coef": 3.0e-3, "n_steps": 64},  # longer rollouts for the recipe
    "ppo_lstm_zoo_ent01": {**_ZOO_SB3, "ent_coef": 0.01},  # a larger entropy bonus for the recipe
    "ppo_lstm_e20_lam08": {"n_epochs": 20, "gae_lambda": 0.8},  # 20 epochs with the recipe's GAE 0.8
    "ppo_lstm_e30": {"n_epochs": 30},
}
"""RecurrentPPO with settings changed from the env's ``sb3`` values, by name (``ppo_lstm_zoo`` and
``ppo_lstm_e20_lam08`` are also benchmarks/memory_suite.py's)."""

# ----------------------------------------------------------------------------------------------------------------
# which runs by default, the report's order, the held-out envs
# ----------------------------------------------------------------------------------------------------------------
DEFAULT = ["rtrl", "tbptt", "ff", "rtrl_passes", "lru_passes", "lru_tbptt_passes", "lru_slow_passes",
           "lru_mixed_passes", "lru_mixed_norm", "lru_obs_passes", "ppo_lstm"]  # fmt: skip
"""What ``run`` runs without ``--methods``: the suite's first settings."""
ABLATION = ["rtrl_rnorm", "rtrl_anorm", "rtrl_adam", "rtrl_ppo"]
"""Each of the several-passes options alone on top of ``rtrl`` (drawn dashed)."""
_FIRST = [*DEFAULT[:-1], "lru_mingru_long_sep", "ppo_lstm"]
ORDER = [*_FIRST, *(name for name in SETTINGS if name not in _FIRST + ABLATION), *ABLATION, *SB3_TUNING]
"""The report's order of methods (its rows, the figure's legend and colours) as every figure of
docs/img/memory_suite*.png has it (``lru_mingru_long_sep`` among the first); benchmarks/memory_suite.py's own names
follow."""
HELD_OUT = [
    "AutoencodeEasy", "MultiarmedBanditEasy", "BattleshipEasy", "MineSweeperEasy", "HigherLowerEasy",
    "PositionOnlyCartPoleEasy", "NoisyPositionOnlyCartPoleEasy", "PositionOnlyPendulumEasy", "ConcentrationEasy",
    "VelocityOnlyCartPoleEasy", "LabyrinthEscapeEasy", "LabyrinthExploreEasy", "RepeatPreviousMedium",
    "NoisyPositionOnlyPendulumEasy", "AutoencodeMedium", "RepeatFirstMedium", "CountRecallMedium",
    "PositionOnlyCartPoleMedium", "PositionOnlyPendulumMedium", "VelocityOnlyCartPoleMedium",
    "NoisyPositionOnlyCartPoleMedium", "NoisyPositionOnlyPendulumMedium", "MultiarmedBanditMedium", "HigherLowerMedium",
    "BattleshipMedium", "ConcentrationMedium", "PositionOnlyCartPoleHard", "PositionOnlyPendulumHard",
    "MineSweeperMedium", "LabyrinthExploreMedium", "VelocityOnlyCartPoleHard", "NoisyPositionOnlyCartPoleHard",
    "LabyrinthEscapeMedium", "AutoencodeHard", "RepeatPreviousHard", "NoisyPositionOnlyPendulumHard",
    "RepeatFirstHard", "CountRecallHard", "MultiarmedBanditHard", "HigherLowerHard",
    "BattleshipHard", "ConcentrationHard", "MineSweeperHard", "LabyrinthExploreHard", "LabyrinthEscapeHard",
]  # fmt: skip
"""The POPGym envs on which no setting was chosen, in the order they were named (every env of ``suite.ENVS`` but the
suite's own five); run only when named (``--envs``)."""


def register() -> ModuleType:
    """Add every setting above to benchmarks/memory_suite.py (again: no change) and return it."""
    suite.register_methods(SETTINGS, SB3_TUNING, order=ORDER, default=DEFAULT, dashed=ABLATION, script=__file__)
    return suite


def main(argv: list[str] | None = None) -> int:
    return register().main(argv)


if __name__ == "__main__":
    sys.exit(main())
