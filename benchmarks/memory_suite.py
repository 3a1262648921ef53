"""Memory benchmark suite (issue 12): R2AC (RTRL, TBPTT at the same M, feed-forward) against sb3-contrib's
RecurrentPPO on memory tasks nobody here wrote, with the same env construction, agent-step budgets and seeds.

Every job is one (env, method, seed) and runs in its own subprocess; its result is one JSON file
``<out>/runs/<env>/<method>/seed<k>.json``. A job whose JSON exists is skipped, so an interrupted suite continues
where it stopped (an interrupted R2AC run also resumes from its last checkpoint). ``--jobs 2`` runs two at a time;
several ``run`` processes may share one ``--out`` (each job is claimed with a lock file).

- **R2AC arms** are ``onlinerec rl`` runs: the suite writes an ``ExperimentConfig`` YAML per job
  (``<out>/r2ac/<env>/<method>-seed<k>/config.yaml``) and runs ``python -m onlinerec.cli rl --config <it>``; the
  command is stored in the job's JSON, so any row can be re-run by hand.
- **R2AC with issue 13's options** (``rtrl_passes``): RTRL with return and advantage normalisation, mean losses,
  Adam and 4 clipped-ratio passes per segment, one setting fixed before any run (``R2AC_METHODS``).
- **The same options with the LRU** (``lru_passes``; ``lru_tbptt_passes`` is TBPTT at the same M with the same
  options): ``LRUCell`` with its paper's defaults, the best-performing built-in cell in a one-seed preview.
- **The LRU initialised for long memory** (``lru_slow_passes``): |lambda| in [0.95, 1) and phases up to pi/10 instead
  of the whole unit disc, with the same options; chosen after a one-seed probe on CountRecallEasy (tuned there only).
- **Both rings** (``lru_mixed_passes``): half the LRU's units on its default ring, half on the long-memory one
  (``slow_fraction: 0.5``), same options; chosen after one seed-0 probe on each of CountRecallEasy and
  RepeatPreviousEasy.
- **Both rings, normalised** (``lru_mixed_norm``): ``lru_mixed_passes`` with a LayerNorm on the core's output
  (``core_norm``) and without advantage normalisation, against the collapse of every multi-pass LRU arm on
  MiniGrid-MemoryS7; chosen after seed-0 probes on MiniGridMemoryS7, CountRecallEasy and RepeatPreviousEasy.
- **Observations normalised** (``lru_obs_passes``): ``lru_passes`` with ``obs_norm`` (running per-feature mean and
  std, clipped at 10), the observation half of the ``VecNormalize`` that rl-zoo's tuned RecurrentPPO uses on
  CartPoleNoVel; set from that recipe before any run.
- **rl-zoo's discount and entropy** (``lru_zoo_passes``, not run by default): ``lru_obs_passes`` with discount 0.98
  and no entropy bonus, the other two values of rl-zoo's tuned CartPoleNoVel recipe that R2AC has; for CartPoleNoVel.
- **Time limits bootstrapped** (``lru_zoo_boot_passes``, not run by default): ``lru_zoo_passes`` with
  ``bootstrap_truncation``, so that CartPole's 500-step limit is not taught as a failure (RecurrentPPO bootstraps there
  through sb3); added after the other CartPoleNoVel arms were seen to reach 500 and fall back.
- **The anti-collapse pair on CartPoleNoVel** (``lru_zoo_norm_passes``, not run by default): ``lru_zoo_passes`` with
  ``core_norm`` and without advantage normalisation, as ``lru_mixed_norm``; added after the CartPoleNoVel collapses.
- **One setting for every env** (``lru_mixed_norm_ent3``, not run by default; ``examples/configs/popgym.yaml`` in
  session 11): ``lru_mixed_norm`` with entropy cost 1e-3 instead of 0.01; chosen after seed-0 probes on
  CountRecallEasy, MiniGridMemoryS7 and CartPoleNoVel.
- **More of the core for the policy** (``lru_mixed_norm_pg``, not run by default; ``examples/configs/popgym.yaml``
  since session 12): ``lru_mixed_norm_ent3`` with value-loss weight 0.1 instead of 0.5 and entropy cost 3e-3;
  chosen after seed-0 probes on CountRecallEasy.
- **The ablation** (``--methods rtrl_rnorm rtrl_anorm rtrl_adam rtrl_ppo``, not run by default): each of those
  changes alone on top of the paper's R2AC-RTRL (return normalisation; advantage normalisation; mean losses with
  Adam; 4 clipped-ratio passes).
- **Held-out envs** (``--envs AutoencodeEasy MultiarmedBanditEasy BattleshipEasy MineSweeperEasy HigherLowerEasy``,
  and a second batch named in session 17, ``PositionOnlyCartPoleEasy NoisyPositionOnlyCartPoleEasy
  PositionOnlyPendulumEasy ConcentrationEasy``; not run by default): POPGym envs on which no setting of any arm was
  chosen, for the POPGym configs (``lru_mixed_passes``, ``lru_mixed_norm_ent3``, ``lru_mixed_norm_pg``, then
  ``lru_mingru_pg``, then ``lru_mingru_sep``) against RecurrentPPO; a third batch named in session 18, a fourth
  in session 19, a fifth in session 21, run in session 22, a sixth in session 23, run for ``lru_mingru_sep``
  alone, a seventh in session 24, an eighth in session 25, a ninth in session 26, a tenth in session 27 and an
  eleventh, POPGym's last five, in session 28, finished in session 29 (``HELD_OUT`` lists all;
  ``benchmarks/heldout_table.py`` checks docs/results.md's table of them).
- **A critic of its own** (``lru_mingru_sep``, not run by default; ``examples/configs/popgym.yaml`` in sessions
  19-27): ``lru_mingru_pg`` with ``separate_critic`` (a stem and core each for the policy and the value head),
  value-loss weight 0.5 and time-limit bootstrapping; set before any run and chosen over ``lru_mingru_pg`` by a rule
  fixed beforehand, on the held-out envs.
- **Long segments with a critic of its own** (``lru_mingru_long_sep``, not run by default): ``lru_mingru_long``'s
  segments of 32 steps and 10 passes in 4 minibatches with ``lru_mingru_sep``'s separate critic; set before any run,
  with a rule for replacing ``popgym.yaml`` (session 21), which it missed; run on the fifth held-out batch under a
  second rule (session 22): one win, three losses, so no control config ships.
- **Shorter traces** (``lru_mingru_sep_lam08``, ``lru_mingru_long_sep_lam08``, not run by default): the last two
  with V-trace's traces cut at lambda = 0.8 (``R2ACConfig.trace_lambda``; on-policy these are GAE 0.8's targets, the
  lambda of rl-zoo's recipe and of RecurrentPPO's best CountRecallEasy setting); set before any run, with a rule
  (session 23); both failed its gates (each worse than its parent on one env), so neither ran held out.
- **Normalised observations with long segments** (``lru_mingru_long_sep_obs``, not run by default):
  ``lru_mingru_long_sep`` with ``obs_norm``, after seed-0 probes on PositionOnlyCartPoleMedium; set with a rule
  before its suite runs (session 24). It lifted PositionOnlyCartPoleMedium (0.933 against 0.858) but was above its
  parent on 2 of the 4 control envs, not the 3 its gate asked, so it cannot replace ``popgym.yaml``. A second rule
  ran it on the seventh held-out batch: one win (PositionOnlyPendulumHard), two ties, no loss, so by that rule it is
  ``examples/configs/long_segments.yaml`` since session 24 (``lru_mingru_long`` was before). Run afterwards on the
  suite's POPGym envs as evidence only, it loses CountRecallEasy to ``popgym.yaml`` (-0.608 against -0.562).
- **One-hot codes left alone** (``lru_mingru_long_sep_obs_cont``, not run by default): ``lru_mingru_long_sep_obs``
  with ``obs_norm_skip_binary``. POPGym's memory games observe only one-hot codes and its control envs only
  continuous features, so it computes exactly ``lru_mingru_long_sep`` on the former and ``lru_mingru_long_sep_obs``
  on the latter (weights bit-identical after 8,192 steps); set with a rule before any run on the eighth held-out
  batch (session 25). There it tied three envs and lost NoisyPositionOnlyCartPoleHard (0.170 against 0.198), so by
  that rule nothing ships.
- **Shorter segments with ten passes** (``lru_mingru_m8_sep_obs_cont``, ``lru_mingru_m16_sep_obs_cont``, not run by
  default): the last at M = 8 (2 minibatches) and M = 16; seed-0 probes on LabyrinthExploreMedium under a rule
  (session 26) ended at 0.089 and -0.120, below its bar of 0.5, so neither ran again.
- **Four passes over long segments** (``lru_mingru_long4_sep_obs_cont``, ``lru_mingru_long4mb8_sep_obs_cont``, not run
  by default): ``lru_mingru_long_sep_obs_cont`` with 4 passes in 4 minibatches, then in 8 minibatches of 2 streams;
  each set with a rule before any run (session 27). The first lost CountRecallEasy to ``popgym.yaml`` (-0.641 against
  -0.562), the second counted level (-0.559) and missed the maze bar (LabyrinthExploreMedium -0.053 against 0.5), so
  neither ran held out.
- **``popgym.yaml`` with continuous features normalised** (``lru_mingru_sep_obs_cont``, not run by default):
  ``lru_mingru_sep`` with ``obs_norm`` and ``obs_norm_skip_binary``, so exactly ``lru_mingru_sep`` on every POPGym
  memory game and ``lru_mingru_sep`` with normalised observations on every control env; set with a rule before any
  run (session 28). On the 15 control envs it was better than ``lru_mingru_sep`` on 5 and worse on none, so by that
  rule it is ``examples/configs/popgym.yaml`` since session 28.
- **A slow ring of counters** (``lru_mingru_sep_obs_cont_count``, not run by default): ``popgym.yaml``'s arm with
  the LRU's slow units started at |lambda| >= 0.99 and phases <= 0.01 rad, so they sum over an episode instead of
  turning; after a diagnostic of ``popgym.yaml``'s CountRecallEasy errors, set with a rule before any run (session
  30). With sb3's recurrent-policy heads (two 64-unit tanh layers before the policy and the value head), on top of
  it and on top of ``popgym.yaml``'s arm (``lru_mingru_sep_obs_cont_count_mlp``, ``lru_mingru_sep_obs_cont_mlp``):
  set with an addendum to that rule after two of its seeds. With RecurrentPPO's winning pair on CountRecallEasy, twice
  the passes and a trace of 0.8 (``lru_mingru_sep_obs_cont_e8_lam08``): set with a second addendum.
- **RecurrentPPO's tuning runs** (``--methods ppo_lstm_ent01 ppo_lstm_lr1e3 ppo_lstm_zoo ...``, not run by
  default): ``ppo_lstm`` with one setting changed (entropy bonus 0.01; learning rate 1e-3), rl-zoo's whole tuned
  CartPoleNoVel recipe on every env, and session 17's sweep of one change at a time around the defaults and the
  recipe (``ppo_lstm_n32``, ``ppo_lstm_n32_lr1e3``, ``ppo_lstm_zoo_raw``, ``ppo_lstm_zoo_lam95``,
  ``ppo_lstm_zoo_e10``, ``ppo_lstm_zoo_ent3``; then ``ppo_lstm_ent3``, ``ppo_lstm_zoo_raw_ent3``), and session
  20's (``ppo_lstm_e20``, ``ppo_lstm_lam08``, ``ppo_lstm_n256``, ``ppo_lstm_b64``, ``ppo_lstm_shared``,
  ``ppo_lstm_zoo_ent3_g099``, ``ppo_lstm_zoo_ent3_n64``, ``ppo_lstm_zoo_ent01``; then ``ppo_lstm_e20_lam08``,
  ``ppo_lstm_e30``), 22 settings in all, level with R2AC's tuning arms (``SB3_TUNING``).
- **RecurrentPPO arm** (``ppo_lstm``): ``python benchmarks/memory_suite.py sb3 --env <name> --seed <k> --out ...``.
  Its envs are onlinerec's (``onlinerec.rl.envs.make_vector_env`` with the same env id and kwargs, behind a thin
  sb3 ``VecEnv`` adapter; SAME_STEP autoreset is sb3's own convention), seeded with the same
  ``run_env_seed(seed, purpose=...)`` streams as the R2AC runs. Hyper-parameters: rl-zoo's ``ppo_lstm.yml`` where
  it has the env (CartPoleNoVel-v1), otherwise sb3-contrib's defaults with the LSTM width matched to R2AC's
  (``SB3`` below says which, per env).
- **Scores** (the same for every arm): the learning curve is the mean undiscounted return of the last ``window``
  training episodes (sampled actions), read at ``POINTS`` evenly spaced agent-step counts. ``final`` is its last
  value (POPGym: "mean episodic return at the end of training"), ``mmer`` its maximum over the points (POPGym's
  max-mean episodic return), ``auc`` its mean over the points (normalised area under the curve, in return units).
  ``eval`` is the mean return of ``eval_episodes`` episodes with greedy (argmax / deterministic) actions on the
  evaluation streams, after training.

Usage::

    python benchmarks/memory_suite.py run --out runs/memory_suite --jobs 2      # everything not done yet
    python benchmarks/memory_suite.py run --envs CartPoleNoVel --methods rtrl ppo_lstm --seeds 0
    python benchmarks/memory_suite.py run --preview                             # 1/4 of the budgets (a preview)
    python benchmarks/memory_suite.py report --out runs/memory_suite           # table (markdown) + figure (PNG)
    python benchmarks/memory_suite.py run --extra-cell <name>    # the hook: R2AC-RTRL/TBPTT with another cell

Needs ``pip install -e ".[suite]"`` (popgym, minigrid, sb3-contrib).
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
POINTS = 50
"""Learning-curve points per run (evenly spaced in agent steps)."""


@dataclass(frozen=True)
class EnvSpec:
    """One benchmark env: its onlinerec id, the agent-step budget, and each arm's settings."""

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
# entropy 0.01, discount 0.99) except the learning rate (small nets learn faster with 2e-3, as on the T-maze).
_R2AC_COMMON: dict[str, Any] = {
    "num_envs": 16,
    "M": 4,
    "hidden_size": 64,
    "fc_size": 64,
    "stem": "mlp",
    "cell_kwargs": {"forget_bias": 1.0},
    "r2ac": {"lr": 2.0e-3},
}

# sb3-contrib RecurrentPPO defaults (n_steps 128, batch 128, 10 epochs, lr 3e-4, gamma 0.99, GAE 0.95, clip 0.2,
# ent 0) with an LSTM as wide as R2AC's, on as many streams as R2AC.
_SB3_MATCHED: dict[str, Any] = {"n_envs": 16, "policy_kwargs": {"lstm_hidden_size": 64}}

# rl-zoo's tuned RecurrentPPO for CartPoleNoVel-v1 (hyperparams/ppo_lstm.yml; "lin_" = linear decay to 0), with its
# VecNormalize of observations and rewards (normalize: true).
_SB3_ZOO: dict[str, Any] = {
    "n_envs": 8, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
    "ent_coef": 0.0, "learning_rate": "lin_0.001", "clip_range": "lin_0.2", "normalize": True,
}  # fmt: skip

# Budget: 100,000 agent steps per run for every env and arm (rl-zoo's CartPoleNoVel budget). sb3-contrib's
# RecurrentPPO runs at about 70-125 agent steps per CPU-second here (10-20 epochs over every rollout), R2AC at about
# 1,000: 15 (env, seed) pairs cost about 5.5 CPU-hours, i.e. about 3 hours on the 2-core machine when it is idle.
BUDGET = 100_000


def _popgym(name: str, random_return: float | None, window: int = 100) -> EnvSpec:
    """A POPGym env with the suite's budget, R2AC's common settings and RecurrentPPO's matched defaults."""
    return EnvSpec(
        f"popgym:{name}", steps=BUDGET, window=window, r2ac=_R2AC_COMMON, sb3=_SB3_MATCHED, random_return=random_return
    )


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
        sb3=_SB3_ZOO,
        sb3_source="rl-zoo ppo_lstm.yml (CartPoleNoVel-v1), with its VecNormalize (normalize: true)",
        random_return=22.0,
    ),
    # held out: POPGym memory envs on which no R2AC setting was chosen (issue 13's "envs it was not tuned on");
    # run only when named (--envs), random returns measured with 8 x 3,000 uniform actions
    "AutoencodeEasy": _popgym("AutoencodeEasy", -0.5),
    "MultiarmedBanditEasy": _popgym("MultiarmedBanditEasy", 0.0, window=50),
    # three more POPGym games, named before any run on them (the first two need the previous action, which the
    # adapter adds since the bandit showed it missing)
    "BattleshipEasy": _popgym("BattleshipEasy", -0.456),
    "MineSweeperEasy": _popgym("MineSweeperEasy", -0.229),
    "HigherLowerEasy": _popgym("HigherLowerEasy", 0.006),
    # a second held-out batch, named in session 17 before any run on them: POPGym's partially observed control
    # (pendulum with continuous actions) and its card-matching game
    "PositionOnlyCartPoleEasy": _popgym("PositionOnlyCartPoleEasy", 0.112),
    "NoisyPositionOnlyCartPoleEasy": _popgym("NoisyPositionOnlyCartPoleEasy", 0.111),
    "PositionOnlyPendulumEasy": _popgym("PositionOnlyPendulumEasy", 0.253),
    "ConcentrationEasy": _popgym("ConcentrationEasy", -0.198),
    # a third held-out batch, named in session 18 before any run on them and before the shipped config was changed:
    # cart-pole from velocities only, POPGym's two mazes (episodes of up to 1,024 steps, so a shorter window), and the
    # Medium Repeat task; random returns measured as above
    "VelocityOnlyCartPoleEasy": _popgym("VelocityOnlyCartPoleEasy", 0.109),
    "LabyrinthEscapeEasy": _popgym("LabyrinthEscapeEasy", -0.289, window=32),
    "LabyrinthExploreEasy": _popgym("LabyrinthExploreEasy", -0.374, window=32),
    "RepeatPreviousMedium": _popgym("RepeatPreviousMedium", -0.494),
    # a fourth held-out batch, named in session 19 by a rule fixed before any run on them and before the third batch's
    # results of the separate-critic arm were read: the first four envs of POPGym's own list (popgym.envs.ALL) that no
    # arm had run on; random returns measured as above
    "NoisyPositionOnlyPendulumEasy": _popgym("NoisyPositionOnlyPendulumEasy", 0.229),
    "AutoencodeMedium": _popgym("AutoencodeMedium", -0.495),
    "RepeatFirstMedium": _popgym("RepeatFirstMedium", -0.496),
    "CountRecallMedium": _popgym("CountRecallMedium", -0.925),
    # a fifth held-out batch, named in session 21 with the rule for lru_mingru_long_sep and before any run on them:
    # the next four envs of popgym.envs.ALL that no arm had run on (all four partially observed control); random
    # returns measured as above
    "PositionOnlyCartPoleMedium": _popgym("PositionOnlyCartPoleMedium", 0.056),
    "PositionOnlyPendulumMedium": _popgym("PositionOnlyPendulumMedium", 0.268),
    "VelocityOnlyCartPoleMedium": _popgym("VelocityOnlyCartPoleMedium", 0.056),
    "NoisyPositionOnlyCartPoleMedium": _popgym("NoisyPositionOnlyCartPoleMedium", 0.111),
    # a sixth held-out batch, named in session 23 by the rule for the trace-lambda arms and before any run on them:
    # the next four envs of popgym.envs.ALL that no arm had run on (the bandit's episodes run about 430 steps, so a
    # shorter window, as for the Easy bandit); random returns measured as above
    "NoisyPositionOnlyPendulumMedium": _popgym("NoisyPositionOnlyPendulumMedium", 0.261),
    "MultiarmedBanditMedium": _popgym("MultiarmedBanditMedium", -0.007, window=50),
    "HigherLowerMedium": _popgym("HigherLowerMedium", -0.003),
    "BattleshipMedium": _popgym("BattleshipMedium", -0.427),
    # a seventh held-out batch, named in session 24 by the rule for lru_mingru_long_sep_obs and before any run on them:
    # the next env of popgym.envs.ALL that no arm had run on, and the first two partially observed control envs in
    # that order that no arm had run on; random returns measured as above
    "ConcentrationMedium": _popgym("ConcentrationMedium", -0.183),
    "PositionOnlyCartPoleHard": _popgym("PositionOnlyCartPoleHard", 0.036),
    "PositionOnlyPendulumHard": _popgym("PositionOnlyPendulumHard", 0.261),
    # an eighth held-out batch, named in session 25 by the rule for lru_mingru_long_sep_obs_cont and before any run on
    # them: the next two envs of popgym.envs.ALL that no arm had run on (the maze's episodes run over 1,000 steps, so
    # a shorter window, as for the Easy mazes), and the next two partially observed control envs in that order that
    # no arm had run on; random returns measured as above
    "MineSweeperMedium": _popgym("MineSweeperMedium", -0.403),
    "LabyrinthExploreMedium": _popgym("LabyrinthExploreMedium", -0.66, window=32),
    "VelocityOnlyCartPoleHard": _popgym("VelocityOnlyCartPoleHard", 0.038),
    "NoisyPositionOnlyCartPoleHard": _popgym("NoisyPositionOnlyCartPoleHard", 0.111),
    # a ninth held-out batch, named in session 26 by the rule for the shorter-segment arms and before any run on them:
    # the next three envs of popgym.envs.ALL that no arm had run on (the maze's episodes run over 1,000 steps, so a
    # shorter window) and the last partially observed control env that no arm had run on; random returns measured as
    # above
    "LabyrinthEscapeMedium": _popgym("LabyrinthEscapeMedium", -0.935, window=32),
    "AutoencodeHard": _popgym("AutoencodeHard", -0.502),
    "RepeatPreviousHard": _popgym("RepeatPreviousHard", -0.5),
    "NoisyPositionOnlyPendulumHard": _popgym("NoisyPositionOnlyPendulumHard", 0.252),
    # a tenth held-out batch, named in session 27 by the rule for lru_mingru_long4_sep_obs_cont and before any run on
    # them: the next four envs of popgym.envs.ALL that no arm had run on (RepeatFirstHard's and MultiarmedBanditHard's
    # episodes run 600-1,000 steps, so a shorter window); random returns measured as above
    "RepeatFirstHard": _popgym("RepeatFirstHard", -0.499, window=32),
    "CountRecallHard": _popgym("CountRecallHard", -0.884),
    "MultiarmedBanditHard": _popgym("MultiarmedBanditHard", 0.013, window=32),
    "HigherLowerHard": _popgym("HigherLowerHard", -0.002),
    # an eleventh held-out batch, named in session 28 with the rule for lru_mingru_sep_obs_cont and before any run on
    # them: the last five envs of popgym.envs.ALL that no arm had run on, all memory games (the mazes' episodes run
    # about 1,000 steps, so a shorter window); random returns measured as above
    "BattleshipHard": _popgym("BattleshipHard", -0.381),
    "ConcentrationHard": _popgym("ConcentrationHard", -0.842),
    "MineSweeperHard": _popgym("MineSweeperHard", -0.431),
    "LabyrinthExploreHard": _popgym("LabyrinthExploreHard", -0.747, window=32),
    "LabyrinthEscapeHard": _popgym("LabyrinthEscapeHard", -0.904, window=32),
}  # fmt: skip
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
"""Envs no setting was chosen on; not part of the default suite (``--envs`` names them)."""

_PASSES: dict[str, Any] = {
    "reward_norm": True, "advantage_norm": True, "loss_reduction": "mean", "optimizer": "adam",
    "lr": 1.0e-3, "adam_eps": 1.0e-5, "epochs": 4, "ppo_clip": 0.2, "grad_clip": 0.5,
}  # fmt: skip
"""Issue 13's options, one setting fixed before any run (PPO's usual values; not tuned)."""
_ZOO: dict[str, Any] = {**_PASSES, "obs_norm": True, "discount": 0.98, "entropy_cost": 0.0}
"""``_PASSES`` with rl-zoo's CartPoleNoVel recipe where R2AC has the setting (observations normalised, gamma 0.98,
no entropy bonus): the ``lru_zoo*`` arms."""
_SLOW_LRU: dict[str, Any] = {"r_min": 0.95, "max_phase": 0.314}
"""LRUCell initialised for long memory (the ``lru_slow_passes`` arm)."""

_LRU_MINGRU: dict[str, Any] = {
    "cell": ["lru", "mingru"],
    "cell_kwargs": {"residual": True, "norm": "layer", "layer_kwargs": [{"slow_fraction": 0.5}, {}]},
    "r2ac": {**_PASSES, "advantage_norm": False, "entropy_cost": 3.0e-3, "baseline_cost": 0.1},
    "config": {"core_norm": True},
    "match_core_width": True,
}
"""The ``lru_mingru_*`` arms without their method: an LRU on two rings under a minGRU, pre-LayerNorm residual blocks,
``lru_mixed_norm_pg``'s R2AC settings; the stem one narrower than the core (see ``r2ac_config``)."""

_LONG_SEGMENTS: dict[str, Any] = {
    "method": "rtrl", **_LRU_MINGRU,
    "r2ac": {**_LRU_MINGRU["r2ac"], "epochs": 10, "minibatches": 4, "bootstrap_truncation": True, "baseline_cost": 0.5},
    "config": {**_LRU_MINGRU["config"], "M": 32},
}  # fmt: skip
"""``lru_mingru_long`` (``examples/configs/long_segments.yaml`` until session 24): 32-step segments, 10 passes in 4
minibatches, the control weights; ``lru_mingru_long_sep`` adds a critic of its own."""
_SEP: dict[str, Any] = {
    "method": "rtrl", **_LRU_MINGRU,
    "r2ac": {**_LRU_MINGRU["r2ac"], "baseline_cost": 0.5, "bootstrap_truncation": True},
    "config": {**_LRU_MINGRU["config"], "separate_critic": True},
}  # fmt: skip
"""``lru_mingru_sep`` (``examples/configs/popgym.yaml`` in sessions 19-27): a critic of its own, value-loss weight
0.5, time-limit bootstrapping; the parent of ``lru_mingru_sep_lam08`` and ``lru_mingru_sep_obs_cont``."""
_SEP_OBS_CONT: dict[str, Any] = {**_SEP, "r2ac": {**_SEP["r2ac"], "obs_norm": True, "obs_norm_skip_binary": True}}
"""``lru_mingru_sep_obs_cont`` (``examples/configs/popgym.yaml`` since session 28); the parent of
``lru_mingru_sep_obs_cont_count``."""
_SEP_OBS_CONT_COUNT: dict[str, Any] = {
    **_SEP_OBS_CONT,
    "cell_kwargs": {
        **_SEP_OBS_CONT["cell_kwargs"],
        "layer_kwargs": [{"slow_fraction": 0.5, "slow_r_min": 0.99, "slow_max_phase": 0.01}, {}],
    },
}
"""``lru_mingru_sep_obs_cont_count``: ``_SEP_OBS_CONT`` with the LRU's slow ring started as counters (|lambda| >=
0.99, phases <= 0.01 rad); the parent of ``lru_mingru_sep_obs_cont_count_mlp`` (session 30)."""
_LONG_SEP: dict[str, Any] = {**_LONG_SEGMENTS, "config": {**_LONG_SEGMENTS["config"], "separate_critic": True}}
"""``lru_mingru_long_sep``: ``_LONG_SEGMENTS`` with a critic of its own; the parent of ``lru_mingru_long_sep_lam08``
and ``lru_mingru_long_sep_obs`` (``examples/configs/long_segments.yaml`` since session 24)."""
_LONG_SEP_OBS_CONT: dict[str, Any] = {
    **_LONG_SEP, "r2ac": {**_LONG_SEP["r2ac"], "obs_norm": True, "obs_norm_skip_binary": True},
}  # fmt: skip
"""``lru_mingru_long_sep_obs_cont``: ``_LONG_SEP`` with the continuous features normalised and one-hot codes left
alone; the parent of the shorter-segment arms (session 26)."""

R2AC_METHODS: dict[str, dict[str, Any]] = {
    "rtrl": {"method": "rtrl", "cell": "elstm"},
    "tbptt": {"method": "tbptt", "cell": "elstm"},
    "ff": {"method": "tbptt", "cell": None},  # feed-forward: no core; the method only sets M for the rollouts
    # R2AC-RTRL with issue 13's options, one setting fixed before any run (PPO's usual values; not tuned): returns
    # normalised, advantages normalised, mean losses, Adam (eps 1e-5), 4 clipped-ratio passes over every segment
    # from its start carry, gradient-norm clip 0.5 (PPO's, for mean losses).
    "rtrl_passes": {"method": "rtrl", "cell": "elstm", "r2ac": _PASSES},
    # the same options with the LRU (complex diagonal units, its paper's defaults): the best-performing built-in cell on
    # RepeatPreviousEasy in one preview run (seed 0: final +1.00 against eLSTM's -0.29), and TBPTT at the same M with
    # the same options, for RTRL against TBPTT at equal M
    "lru_passes": {"method": "rtrl", "cell": "lru", "cell_kwargs": {}, "r2ac": _PASSES},
    "lru_tbptt_passes": {"method": "tbptt", "cell": "lru", "cell_kwargs": {}, "r2ac": _PASSES},
    # the LRU initialised for long memory (|lambda| in [0.95, 1), phase <= pi/10: Orvieto et al.'s long-range setting)
    # instead of its ring over the whole unit disc, same options: picked after a one-seed, 60 k-step probe on
    # CountRecallEasy (-0.83 against -0.92 with the default ring; a step counter needs units that neither fade nor
    # rotate), so it is tuned on that env and untuned on the others
    "lru_slow_passes": {"method": "rtrl", "cell": "lru", "cell_kwargs": _SLOW_LRU, "r2ac": _PASSES},
    # half the units on the default ring (fast), half on the long-memory ring above: picked after one seed-0 probe on
    # each of CountRecallEasy (-0.64) and RepeatPreviousEasy (+0.99), where each single ring lost one of them
    "lru_mixed_passes": {"method": "rtrl", "cell": "lru", "cell_kwargs": {"slow_fraction": 0.5}, "r2ac": _PASSES},
    # both rings with a LayerNorm on the core's output (core_norm) and no advantage normalisation: on MiniGrid the
    # LRU's output grew until the policy was deterministic (core rms 1.5 -> 23), and per-step advantage normalisation
    # blew the value noise of reward-free segments up to unit size; picked after seed-0 probes on MiniGridMemoryS7
    # (0.53; 0.00 with either change alone), CountRecallEasy (-0.70) and RepeatPreviousEasy (+0.99)
    "lru_mixed_norm": {
        "method": "rtrl", "cell": "lru", "cell_kwargs": {"slow_fraction": 0.5},
        "r2ac": {**_PASSES, "advantage_norm": False}, "config": {"core_norm": True},
    },
    # lru_passes with the observations normalised (obs_norm: running mean and std per feature, clipped at 10), as
    # rl-zoo's tuned RecurrentPPO does on CartPoleNoVel with VecNormalize (without it RecurrentPPO reached 182, not
    # 419); set from that recipe before any run, not tuned
    "lru_obs_passes": {"method": "rtrl", "cell": "lru", "cell_kwargs": {}, "r2ac": {**_PASSES, "obs_norm": True}},
    # lru_obs_passes with the rest of rl-zoo's CartPoleNoVel values that R2AC has: discount 0.98 and no entropy bonus
    # (its tuned RecurrentPPO's gamma and ent_coef); set from that recipe before any run, for CartPoleNoVel only
    "lru_zoo_passes": {
        "method": "rtrl", "cell": "lru", "cell_kwargs": {},
        "r2ac": _ZOO,
    },
    # lru_zoo_passes bootstrapping where CartPole's 500-step time limit cuts an episode (bootstrap_truncation), as
    # RecurrentPPO does through sb3's TimeLimit.truncated; added after lru_zoo_passes and lru_obs_passes were seen to
    # reach 500 and fall back, CartPoleNoVel only
    "lru_zoo_boot_passes": {
        "method": "rtrl", "cell": "lru", "cell_kwargs": {},
        "r2ac": {**_ZOO, "bootstrap_truncation": True},
    },
    # lru_zoo_passes with the anti-collapse pair of lru_mixed_norm (core_norm, no advantage normalisation): when the
    # pole stays up, a segment's advantages are value noise that per-step normalisation blows up to unit size; added
    # after the CartPoleNoVel collapses, CartPoleNoVel only
    "lru_zoo_norm_passes": {
        "method": "rtrl", "cell": "lru", "cell_kwargs": {},
        "r2ac": {**_ZOO, "advantage_norm": False},
        "config": {"core_norm": True},
    },
    # lru_mixed_norm with a tenth of the entropy bonus: without advantage normalisation the bonus (0.01) is no longer
    # small against the policy gradient, and lru_mixed_norm's CountRecallEasy policy stayed stochastic (final -0.70,
    # greedy -0.56); a candidate for one setting on every env (run only when named), examples/configs/popgym.yaml in
    # session 11
    "lru_mixed_norm_ent3": {
        "method": "rtrl", "cell": "lru", "cell_kwargs": {"slow_fraction": 0.5},
        "r2ac": {**_PASSES, "advantage_norm": False, "entropy_cost": 1.0e-3}, "config": {"core_norm": True},
    },
    # lru_mixed_norm_ent3 with the policy given more of the shared core and more exploration: a fifth of the value
    # loss (baseline_cost 0.1) and entropy cost 3e-3; without advantage normalisation the value loss shapes the core
    # and CountRecallEasy's policy settled early on wrong counts (greedy = sampled, -0.71). Picked after seed-0 probes
    # on CountRecallEasy (-0.607; -0.659 and -0.675 with either change alone, -0.683 with baseline_cost 0.25, -0.730
    # with 0.03), run only when named; session 12
    "lru_mixed_norm_pg": {
        "method": "rtrl", "cell": "lru", "cell_kwargs": {"slow_fraction": 0.5},
        "r2ac": {**_PASSES, "advantage_norm": False, "entropy_cost": 3.0e-3, "baseline_cost": 0.1},
        "config": {"core_norm": True},
    },
    # lru_mixed_norm_pg with a minGRU layer on top of the LRU (a pre-LayerNorm residual stack of the two): the LRU's
    # recurrence is linear and does not read its input in its decay, so it cannot keep the first card of
    # RepeatFirstEasy apart from the later ones; the minGRU's gate reads the LRU's output and can close after the
    # first step. The stem is one narrower than the core (match_core_width: fc_size = hidden_size - 1, as the core
    # also reads the reward) so that both layers keep the width and both residuals apply. Picked after seed-0 probes
    # (a minGRU as wide as the LRU's 65 features, same otherwise: RepeatFirstEasy +0.29, CountRecallEasy -0.57,
    # RepeatPreviousEasy +0.997; without the minGRU's residual CountRecallEasy fell to -0.77; two minGRU layers
    # solved RepeatFirstEasy, +0.99, and lost CountRecallEasy, -0.86); session 13
    "lru_mingru_pg": {"method": "rtrl", **_LRU_MINGRU},
    # lru_mingru_pg with TBPTT at the same M: RTRL against TBPTT for this core, where the span (RepeatFirstEasy: 51
    # steps) is far beyond M = 4; set before any run of it
    "lru_mingru_tbptt_pg": {"method": "tbptt", **_LRU_MINGRU},
    # lru_mingru_pg with the value loss at its usual weight and entropy cost 1e-3 (lru_mixed_norm_ent3's loss
    # weights), for control and sparse-reward envs, where the LRU alone had needed them; picked after seed-0 probes
    # (CartPoleNoVel 500, CountRecallEasy -0.692 against lru_mingru_pg's -0.635); session 13
    "lru_mingru_ent3": {
        "method": "rtrl", **_LRU_MINGRU,
        "r2ac": {**_PASSES, "advantage_norm": False, "entropy_cost": 1.0e-3},
    },
    # lru_mingru_ent3 bootstrapping where a time limit cuts an episode (bootstrap_truncation), as RecurrentPPO does
    # through sb3's TimeLimit.truncated: at 3x the steps lru_mingru_ent3 reached 500 on CartPoleNoVel and fell back
    # (seed 0: 500 at 120 k steps, 82 at the end), and CartPole's 500-step limit is only reached once solved, where
    # scoring the cut as terminal teaches the solved policy that its last step fails; set before any run of it; session 14
    "lru_mingru_ent3_boot": {
        "method": "rtrl", **_LRU_MINGRU,
        "r2ac": {**_PASSES, "advantage_norm": False, "entropy_cost": 1.0e-3, "bootstrap_truncation": True},
    },
    # lru_mingru_pg with the value loss at its usual weight (0.5) and the entropy cost kept at 3e-3: on MiniGrid-MemoryS7
    # lru_mingru_pg dipped for tens of thousands of steps before it walked to an object (a slow value function),
    # and lru_mingru_ent3 walked there at once but one seed of three settled on a policy that never arrives (entropy
    # 1e-3); for sparse-reward navigation, chosen after those runs; session 14
    "lru_mingru_bc5": {"method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "baseline_cost": 0.5}},
    # lru_mingru_pg and lru_mingru_bc5 without reward normalisation: MiniGrid pays one reward in [0.1, 1] per episode,
    # already on the +-1 scale, and dividing it by the running std of mostly-zero returns made a rare success worth up
    # to the clip (10); lru_mingru_bc5's seed 0 then collapsed with value loss 7-8 and a near-uniform policy; set after
    # that run, for MiniGrid-MemoryS7; session 14
    "lru_mingru_pg_raw": {"method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "reward_norm": False}},
    "lru_mingru_bc5_raw": {
        "method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "baseline_cost": 0.5, "reward_norm": False},
    },
    # lru_mingru_pg_raw with the paper's entropy cost (0.01): at 3x the steps every MiniGrid-MemoryS7 run of the arms
    # above ended near what walking to one of the two objects at random scores, i.e. the choice at the corridor's end
    # had settled on one side before the cue was linked to it; a larger bonus keeps trying both; set after those runs
    "lru_mingru_raw_ent2": {
        "method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "reward_norm": False, "entropy_cost": 1.0e-2},
    },
    # lru_mingru_pg_raw reading MiniGrid's symbolic view one-hot (stem "grid") instead of as magnitudes through the
    # MLP stem: the cue differs from the other object by one unit of one input among 147 (a key is 5, a ball 6); an
    # agent-side change (RecurrentPPO keeps sb3's MLP on the same view); MiniGrid-MemoryS7 only; session 14
    "lru_mingru_grid_raw": {
        "method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "reward_norm": False},
        "config": {**_LRU_MINGRU["config"], "stem": "grid"},
    },
    # lru_mingru_pg_raw with M = 16: V-trace's targets look M steps ahead, so MiniGrid's one reward at the episode's
    # end reaches the value of earlier steps in fewer updates (RecurrentPPO's GAE looks up to 128 steps ahead);
    # MiniGrid-MemoryS7 only; session 14
    "lru_mingru_pg_raw_m16": {
        "method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "reward_norm": False},
        "config": {**_LRU_MINGRU["config"], "M": 16},
    },
    # lru_mingru_pg (examples/configs/popgym.yaml) bootstrapping where a time limit cuts an episode: one config for
    # POPGym and CartPoleNoVel if it holds CartPole's 500 at 3x the steps as lru_mingru_ent3_boot does (POPGym's
    # episodes end terminated, never truncated, so there it is lru_mingru_pg exactly); set before any run; session 15
    "lru_mingru_pg_boot": {
        "method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "bootstrap_truncation": True},
    },
    # lru_mingru_pg_boot with the value head reading the core through a stop-gradient (detach_value) at the value
    # loss's usual weight (0.5): the POPGym config keeps the value loss small so that it does not shape the shared
    # core, the CartPole config needs a good value function (lru_mingru_pg_boot: 284 +- 48 on CartPoleNoVel at 3x,
    # against lru_mingru_ent3_boot's 500); a critic that does not shape the core may serve both; set before any run
    # of it; session 15
    "lru_mingru_vdetach": {
        "method": "rtrl", **_LRU_MINGRU,
        "r2ac": {**_LRU_MINGRU["r2ac"], "baseline_cost": 0.5, "detach_value": True, "bootstrap_truncation": True},
    },
    # lru_mingru_pg_raw_m16 with 2 passes per segment instead of 4: on MiniGrid-MemoryS7 every run of both agents ends
    # near walking to a random one of the two objects, and more env steps at the same CPU time may matter more there
    # than more passes per step; MiniGrid-MemoryS7 only, at RecurrentPPO's CPU time; session 15
    "lru_mingru_pg_raw_m16_e2": {
        "method": "rtrl", **_LRU_MINGRU, "r2ac": {**_LRU_MINGRU["r2ac"], "reward_norm": False, "epochs": 2},
        "config": {**_LRU_MINGRU["config"], "M": 16},
    },
    # longer segments with more passes (M 32, 10 passes in 4 minibatches) with the control weights (time-limit
    # bootstrapping, value-loss weight 0.5): found on PositionOnlyPendulumEasy in session 17, then run unchanged
    # with `onlinerec rl` on the suite's POPGym envs (docs/results.md); this arm runs it on the rest
    "lru_mingru_long": _LONG_SEGMENTS,
    # lru_mingru_pg with a critic of its own (separate_critic: a second stem and lru/mingru core for the value head,
    # RecurrentPPO's default layout), so the value loss at its usual weight (0.5) no longer shapes the policy's core:
    # popgym.yaml keeps that weight at 0.1 for the policy's sake, and control wants a good critic (lru_mingru_long:
    # 0.5). With time-limit bootstrapping (POPGym's episodes end terminated, so there it changes nothing). Set before
    # any run of it, and run on every held-out env with a rule fixed beforehand; session 19
    "lru_mingru_sep": _SEP,
    # both of the last two: lru_mingru_long's segments and passes (best of R2AC's settings on the CartPoles) with
    # lru_mingru_sep's critic of its own (popgym.yaml: best on the memory tasks), so the long setting's value-loss
    # weight of 0.5 no longer shapes the policy's core (its BattleshipEasy collapse). Set before any run of it, with a
    # rule for what follows (session 21)
    "lru_mingru_long_sep": _LONG_SEP,
    # the last two with V-trace's traces cut at lambda = 0.8 (R2ACConfig.trace_lambda; on-policy, GAE 0.8's targets):
    # the short GAE of rl-zoo's recipe and of RecurrentPPO's best CountRecallEasy setting, which R2AC lacked. Set
    # before any run of them, with a rule for what follows (session 23)
    "lru_mingru_sep_lam08": {**_SEP, "r2ac": {**_SEP["r2ac"], "trace_lambda": 0.8}},
    "lru_mingru_long_sep_lam08": {**_LONG_SEP, "r2ac": {**_LONG_SEP["r2ac"], "trace_lambda": 0.8}},
    # lru_mingru_long_sep with the observations normalised (obs_norm, the observation half of the VecNormalize in
    # rl-zoo's recipe): CartPole's pole angle spans +-0.2 rad against the cart's +-2.4 m, so the stem saw it ten times
    # smaller. Chosen after seed-0 probes on PositionOnlyCartPoleMedium (0.967 against 0.807); set with a rule for
    # what follows before its suite runs (session 24)
    "lru_mingru_long_sep_obs": {**_LONG_SEP, "r2ac": {**_LONG_SEP["r2ac"], "obs_norm": True}},
    # the last with the one-hot features left as they are (obs_norm_skip_binary): every POPGym memory game's
    # observation is one-hot codes and every control env's is continuous, so on the former this arm computes exactly
    # lru_mingru_long_sep and on the latter exactly lru_mingru_long_sep_obs; for one config on memory and control,
    # after lru_mingru_long_sep_obs lost CountRecallEasy (-0.608 against its parent's -0.563); session 25
    "lru_mingru_long_sep_obs_cont": _LONG_SEP_OBS_CONT,
    # lru_mingru_long_sep_obs_cont with shorter segments, the same 10 passes: on LabyrinthExploreMedium its clip
    # fraction stayed at 0.2-0.46 and its entropy near 0.5 while popgym.yaml (4-step segments) fell to 0.06 and
    # learnt the maze, so the clip may cap how far the policy moves per 512-step segment; 8 and 16 steps let it move
    # 4 and 2 times as often per frame at the same passes per frame. Seed-0 probes on LabyrinthExploreMedium and
    # PositionOnlyCartPoleMedium (both seen); session 26
    "lru_mingru_m8_sep_obs_cont": {
        **_LONG_SEP_OBS_CONT, "r2ac": {**_LONG_SEP_OBS_CONT["r2ac"], "minibatches": 2},
        "config": {**_LONG_SEP_OBS_CONT["config"], "M": 8},
    },
    "lru_mingru_m16_sep_obs_cont": {**_LONG_SEP_OBS_CONT, "config": {**_LONG_SEP_OBS_CONT["config"], "M": 16}},
    # lru_mingru_long_sep_obs_cont with 4 passes instead of 10 (the 4 minibatches kept): after the probes above, a
    # diagnostic on two seen envs (seeds 0-2, outside any rule) learnt LabyrinthExploreMedium (0.385 against -0.213
    # with 10 passes; clip fraction 0.19 against 0.45) and kept PositionOnlyCartPoleMedium (0.934 against 0.933), at
    # half the CPU time; set with a rule before any suite run (session 27)
    "lru_mingru_long4_sep_obs_cont": {**_LONG_SEP_OBS_CONT, "r2ac": {**_LONG_SEP_OBS_CONT["r2ac"], "epochs": 4}},
    # the last with 8 minibatches of 2 streams instead of 4 of 4: it failed its memory gate on CountRecallEasy (-0.641
    # against popgym.yaml's -0.562; 10 passes: -0.563), and across the three long-segment settings counting tracked
    # optimiser steps per frame (popgym.yaml 4 per 64 frames, 10 passes 5, 4 passes 2); 8 minibatches make it 4, each
    # on 64 samples like popgym.yaml's, with 4 passes over 32-step segments; set with a rule before any run (session 27)
    "lru_mingru_long4mb8_sep_obs_cont": {
        **_LONG_SEP_OBS_CONT, "r2ac": {**_LONG_SEP_OBS_CONT["r2ac"], "epochs": 4, "minibatches": 8},
    },
    # popgym.yaml with the continuous features normalised and one-hot codes left alone (obs_norm_skip_binary): every
    # POPGym memory game observes one-hot codes only, so there it computes exactly lru_mingru_sep, and on the control
    # envs, where popgym.yaml loses 13 of 15, it adds the obs_norm that lifted long segments' CartPole; after session
    # 27 found no long-segment setting that counts and learns the maze. Set with a rule before any run (session 28)
    "lru_mingru_sep_obs_cont": _SEP_OBS_CONT,
    # popgym.yaml with its slow ring made of counters: |lambda| >= 0.99 (was 0.95) and phases <= 0.01 rad (was pi/10).
    # On CountRecallEasy popgym.yaml's answers were mostly one off (seed 0: 21 % exact, 56 % within one), a linear
    # probe of its core read the counts to +-1.0-1.3, and its trained slow units turned 0.05-0.3 rad a step: over a
    # 51-step episode they oscillate instead of summing. Set with a rule before any run (session 30)
    "lru_mingru_sep_obs_cont_count": _SEP_OBS_CONT_COUNT,
    # the last, and popgym.yaml's arm, each with sb3's recurrent-policy heads (a 64-64 tanh MLP before the policy
    # head and another before the value head; RecurrentPPO has them, popgym.yaml's heads are linear): on
    # CountRecallEasy the counters held the counts better (a linear probe's error 0.69 cards against 1.11) and answered
    # worse (17 % exact against 21 %), so the linear head could not pick the asked kind's count and map it to one of
    # 27 answers. Set with an addendum to session 30's rule, after two seeds of the counters, before any run of these
    "lru_mingru_sep_obs_cont_count_mlp": {
        **_SEP_OBS_CONT_COUNT, "config": {**_SEP_OBS_CONT_COUNT["config"], "head_sizes": [64, 64]},
    },
    "lru_mingru_sep_obs_cont_mlp": {**_SEP_OBS_CONT, "config": {**_SEP_OBS_CONT["config"], "head_sizes": [64, 64]}},
    # popgym.yaml's arm with the two changes that made RecurrentPPO's best CountRecallEasy setting (twice its passes
    # per rollout, GAE 0.8): 8 passes per segment instead of 4, and V-trace's lambda 0.8. With MLP heads the core
    # held each kind's count to 0.47 cards (a linear probe, 74 % exact when rounded) while the policy answered 14 %
    # exactly, so learning the answer from the reward, not holding the count, is where R2AC falls short. Set with a
    # second addendum to session 30's rule, before any run of it
    "lru_mingru_sep_obs_cont_e8_lam08": {
        **_SEP_OBS_CONT, "r2ac": {**_SEP_OBS_CONT["r2ac"], "epochs": 8, "trace_lambda": 0.8},
    },
    # the ablation: each of rtrl_passes' changes alone on top of the paper's R2AC-RTRL (the rtrl arm)
    "rtrl_rnorm": {"method": "rtrl", "cell": "elstm", "r2ac": {"reward_norm": True}},
    "rtrl_anorm": {"method": "rtrl", "cell": "elstm", "r2ac": {"advantage_norm": True}},
    "rtrl_adam": {"method": "rtrl", "cell": "elstm", "r2ac": {
        "loss_reduction": "mean", "optimizer": "adam", "lr": 1.0e-3, "adam_eps": 1.0e-5, "grad_clip": 0.5,
    }},
    "rtrl_ppo": {"method": "rtrl", "cell": "elstm", "r2ac": {"epochs": 4, "ppo_clip": 0.2}},
}  # fmt: skip
SB3_TUNING: dict[str, dict[str, Any]] = {
    "ppo_lstm_ent01": {"ent_coef": 0.01},  # an entropy bonus (sb3-contrib's default has none)
    "ppo_lstm_lr1e3": {"learning_rate": 1.0e-3},  # rl-zoo's tuned CartPoleNoVel lr, held constant
    # rl-zoo's whole tuned CartPoleNoVel recipe (the only tuned RecurrentPPO for a vector-observation discrete env)
    # on every env, its VecNormalize included; the LSTM width stays matched; set before any run; session 15
    "ppo_lstm_zoo": _SB3_ZOO,
    # session 17's sweep: one change at a time around RecurrentPPO's two best settings so far (its defaults on
    # CountRecallEasy, rl-zoo's recipe on the Repeat tasks), all set before any run of them
    "ppo_lstm_n32": {"n_steps": 32},  # defaults, 4x shorter rollouts: 4x as many updates per frame
    "ppo_lstm_n32_lr1e3": {"n_steps": 32, "learning_rate": 1.0e-3},  # and rl-zoo's learning rate
    "ppo_lstm_zoo_raw": {**_SB3_ZOO, "normalize": False},  # the recipe without VecNormalize
    "ppo_lstm_zoo_lam95": {**_SB3_ZOO, "gamma": 0.99, "gae_lambda": 0.95},  # the recipe with longer credit
    "ppo_lstm_zoo_e10": {**_SB3_ZOO, "n_epochs": 10},  # the recipe with half its passes per rollout
    "ppo_lstm_zoo_ent3": {**_SB3_ZOO, "ent_coef": 3.0e-3},  # the recipe with popgym.yaml's entropy cost
    # its second round, set after the first's seed-0 results: the entropy cost that won RepeatFirstEasy on the
    # defaults (which win CountRecallEasy), and with the recipe's other change that helped CountRecallEasy
    "ppo_lstm_ent3": {"ent_coef": 3.0e-3},
    "ppo_lstm_zoo_raw_ent3": {**_SB3_ZOO, "normalize": False, "ent_coef": 3.0e-3},
    # session 20's third round, to bring RecurrentPPO's tuning budget level with R2AC's: one change at a time that
    # the earlier rounds left untried, around the same two settings (the defaults, best on CountRecallEasy; the
    # recipe with entropy 3e-3, best on RepeatFirstEasy), all set before any run of them
    "ppo_lstm_e20": {"n_epochs": 20},  # the recipe's 20 passes per rollout, on the defaults
    "ppo_lstm_lam08": {"gae_lambda": 0.8},  # the recipe's short credit assignment, on the defaults
    "ppo_lstm_n256": {"n_steps": 256},  # twice as long rollouts: longer sequences through the LSTM
    "ppo_lstm_b64": {"batch_size": 64},  # half-size minibatches: twice as many gradient steps per rollout
    "ppo_lstm_shared": {  # one LSTM for actor and critic, the layout R2AC's shared core has
        "policy_kwargs": {**_SB3_MATCHED["policy_kwargs"], "shared_lstm": True, "enable_critic_lstm": False},
    },
    "ppo_lstm_zoo_ent3_g099": {**_SB3_ZOO, "ent_coef": 3.0e-3, "gamma": 0.99},  # the suite's usual discount
    "ppo_lstm_zoo_ent3_n64": {**_SB3_ZOO, "ent_coef": 3.0e-3, "n_steps": 64},  # longer rollouts for the recipe
    "ppo_lstm_zoo_ent01": {**_SB3_ZOO, "ent_coef": 0.01},  # a larger entropy bonus for the recipe
    # its fourth round, set after the third's seed-0 results (20 epochs won CountRecallEasy, -0.567 against the
    # defaults' -0.684, and lifted RepeatFirstEasy from -0.536 to -0.023): 20 epochs with the recipe's GAE 0.8 (the
    # pair that solves RepeatFirstEasy in the recipe, session 17), and the same direction one step further
    "ppo_lstm_e20_lam08": {"n_epochs": 20, "gae_lambda": 0.8},
    "ppo_lstm_e30": {"n_epochs": 30},
}
"""RecurrentPPO with some settings changed from the env's ``sb3`` values: its tuning runs (issue 13 asks for the same
budget of tuning runs as R2AC's), set before any run; run only when named (``--methods``)."""
SB3_ARMS: dict[str, dict[str, Any]] = {"ppo_lstm": {}, **SB3_TUNING}
"""Every RecurrentPPO arm and its change to the env's ``sb3`` values."""
ABLATION = ["rtrl_rnorm", "rtrl_anorm", "rtrl_adam", "rtrl_ppo"]
"""Arms that are run only when named (``--methods``): not part of the default suite."""
ENV_SPECIFIC = ["lru_zoo_passes", "lru_zoo_boot_passes", "lru_zoo_norm_passes"]
"""Arms set from one env's tuned recipe, run only when named (``--methods``)."""
CANDIDATES = [
    "lru_mixed_norm_ent3", "lru_mixed_norm_pg", "lru_mingru_pg", "lru_mingru_tbptt_pg", "lru_mingru_ent3",
    "lru_mingru_ent3_boot", "lru_mingru_bc5", "lru_mingru_pg_raw", "lru_mingru_bc5_raw",
    "lru_mingru_raw_ent2", "lru_mingru_grid_raw", "lru_mingru_pg_raw_m16", "lru_mingru_pg_boot",
    "lru_mingru_vdetach", "lru_mingru_pg_raw_m16_e2", "lru_mingru_long", "lru_mingru_sep",
    "lru_mingru_sep_lam08", "lru_mingru_long_sep_lam08", "lru_mingru_long_sep_obs", "lru_mingru_long_sep_obs_cont",
    "lru_mingru_m8_sep_obs_cont", "lru_mingru_m16_sep_obs_cont", "lru_mingru_long4_sep_obs_cont",
    "lru_mingru_long4mb8_sep_obs_cont", "lru_mingru_sep_obs_cont", "lru_mingru_sep_obs_cont_count",
    "lru_mingru_sep_obs_cont_count_mlp", "lru_mingru_sep_obs_cont_mlp", "lru_mingru_sep_obs_cont_e8_lam08",
]  # fmt: skip
"""Candidates for one setting on every env, run only when named (``--methods``)."""
SHIPPED_POPGYM_ARM = "lru_mingru_sep_obs_cont"
"""The arm that ``examples/configs/popgym.yaml`` packages (a test keeps them equal)."""
SHIPPED_CONFIGS: dict[str, tuple[str, str, float]] = {
    "popgym.yaml": ("RepeatPreviousEasy", SHIPPED_POPGYM_ARM, 1.0),
    "cartpole_novel.yaml": ("CartPoleNoVel", "lru_mingru_ent3_boot", 3.0),
    "long_segments.yaml": ("PositionOnlyPendulumEasy", "lru_mingru_long_sep_obs", 1.0),
}
"""Each config in ``examples/configs/`` that packages an arm: its env, the arm and the budget scale it ran at."""
NAMED_ONLY = ENV_SPECIFIC + CANDIDATES + ABLATION + list(SB3_TUNING)
"""Every arm outside the default suite."""
METHODS = [*(m for m in R2AC_METHODS if m not in NAMED_ONLY), "ppo_lstm"]
EVAL_EPISODES = 32


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
# R2AC arms: onlinerec rl
# ----------------------------------------------------------------------------------------------------------------
def r2ac_config(name: str, method: str, seed: int, out: Path, steps: int, cell: str | None = None) -> dict[str, Any]:
    spec = ENVS[name]
    arm = dict(R2AC_METHODS[method.split("-")[0]])
    cfg = {k: v for k, v in spec.r2ac.items() if k != "r2ac"}
    if "cell_kwargs" in arm:  # an arm with a cell of its own: that cell's settings
        cfg["cell_kwargs"] = arm["cell_kwargs"]
    if cell is not None:  # the hook: another built-in cell, with its own defaults
        arm["cell"] = cell
        cfg.pop("cell_kwargs", None)
    cfg.update(
        env=spec.env,
        env_kwargs=dict(spec.env_kwargs),
        method=arm["method"],
        cell=arm["cell"],
        total_frames=steps,
        seed=seed,
        r2ac={**spec.r2ac.get("r2ac", {}), **arm.get("r2ac", {}), "return_window": spec.window},
        eval_episodes=EVAL_EPISODES,
        eval_envs=16,
        eval_max_steps=20_000,
        out_dir=str(out / "r2ac" / name / f"{method}-seed{seed}"),
        checkpoint_every=500,
        log_every=max(1, steps // (spec.r2ac["M"] * spec.r2ac["num_envs"] * 4 * POINTS)),
        threads=1,
        progress=False,
        tensorboard=False,
    )
    cfg.update(arm.get("config", {}))  # an arm's own ExperimentConfig fields (e.g. core_norm)
    if arm.get("match_core_width"):  # the core reads fc_size + 1 features (with the reward): every layer's width
        cfg["fc_size"] = cfg["hidden_size"] - 1
    if arm["cell"] is None:
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

    from onlinerec.rl.runner import load_curve

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
# RecurrentPPO arm: sb3-contrib on onlinerec's envs
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
    """RecurrentPPO's settings for env ``name``: the env's ``sb3`` values, with a ``SB3_TUNING`` variant's change."""
    return {**ENVS[name].sb3, **SB3_ARMS[method]}


def make_sb3_model(name: str, seed: int, method: str = "ppo_lstm") -> tuple[Any, Any, Any]:
    """RecurrentPPO with arm ``method``'s settings on env ``name``'s training streams: ``(model, env, raw)``, where
    ``env`` is what the model trains on (``raw`` behind rl-zoo's ``VecNormalize`` where the arm has it)."""
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
    """Train RecurrentPPO (``method``: ``ppo_lstm`` or a ``SB3_TUNING`` variant) for ``steps`` agent steps, evaluate
    it deterministically, return the job's record."""
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
    model.save(out_json.with_suffix(".zip"))  # the trained policy, for analyses (benchmarks/minigrid_cue.py)
    if env is not raw:
        env.save(str(out_json.with_suffix(".vecnormalize.pkl")))  # its observation statistics go with it
    env.close()
    return {
        "command": shlex.join(
            ["python", "benchmarks/memory_suite.py", "sb3", *sb3_args(name, seed, steps, out_json, method)]
        ),
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
def job_path(out: Path, name: str, method: str, seed: int) -> Path:
    return out / "runs" / name / method / f"seed{seed}.json"


def run_job(name: str, method: str, seed: int, out: Path, steps: int, cell: str | None) -> dict[str, Any]:
    path = job_path(out, name, method, seed)
    start = time.perf_counter()
    if method in SB3_ARMS:
        path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "sb3",
            *sb3_args(name, seed, steps, path.with_suffix(".partial"), method),
        ]
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
    methods = sorted({r["method"] for r in records}, key=lambda m: (METHODS + NAMED_ONLY + [m]).index(m))
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
    colours = {m: palette(i % palette.N) for i, m in enumerate(methods)}  # an arm keeps its colour in every panel
    for ax, env in zip(axes.flat, envs):
        for method in methods:
            rs = [r for r in records if r["env"] == env and r["method"] == method]
            if not rs:
                continue
            grid = np.asarray(rs[0]["grid"])
            ys = np.asarray([r["curve"] for r in rs], dtype=float)
            style = {"linestyle": "--", "linewidth": 1} if method in ABLATION else {}  # the ablation: dashed
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
    envs, methods, variants = list(ENVS), [*METHODS, *NAMED_ONLY], list(SB3_ARMS)
    run.add_argument(
        "--envs", nargs="+", default=[e for e in ENVS if e not in HELD_OUT], choices=envs, type=one_of("env", envs)
    )
    run.add_argument("--methods", nargs="+", default=METHODS, choices=methods, type=one_of("arm", methods))
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
        "--variant", default="ppo_lstm", choices=variants, type=one_of("arm", variants), help="a tuning run's change"
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
