"""End-to-end R2AC training throughput on Atari: RTRL vs TBPTT, vs the bare env, vs sb3-contrib's RecurrentPPO.

Configurations (same env construction for all: ``onlinerec.rl.envs.make_vector_env(env_id, B, seed)``, i.e.
ale-py's native vector env with 84x84 gray frames, a stack of 4, frame skip 4 with max-pool, episodic life):

- ``env``: the raw vector env stepped with uniformly random actions (no agent), in chunks of M steps.
- ``r2ac-rtrl`` / ``r2ac-tbptt``: R2AC trained by ``lightning.Trainer`` with ``RTRLStrategy(M)`` /
  ``TBPTTStrategy(M)``: Nature CNN stem (fc 256), eLSTM core of width 256, one update per segment of M steps
  (acting with the current weights, then one V-trace gradient pass, RMSProp, gradient clipping).
- ``recurrentppo``: sb3-contrib ``RecurrentPPO("CnnLstmPolicy")`` on the same env through a small SB3 ``VecEnv``
  adapter (:class:`SB3VecEnv`: terminated | truncated is SB3's ``done``; the env already resets in the same step
  as SB3 expects), with the network matched to R2AC's: SB3's NatureCNN with ``features_dim=256``, one LSTM layer
  of width 256 shared by policy and value (``shared_lstm=True, enable_critic_lstm=False``; ``--ppo-lstm separate``
  gives SB3's default of a second LSTM for the critic), linear heads (``net_arch=[]``), and one gradient pass per
  rollout: ``n_steps=M``, ``batch_size=M*B`` (one minibatch), ``n_epochs=1``.

The cores differ by design: R2AC's eLSTM (element-wise recurrence) against a full LSTM.

Frames are counted alike for all: agent steps x 4 (the frame skip), summed over the B envs. An update is the
whole cycle of collecting M steps from B envs and one gradient step, measured from the end of one update to the
end of the next (R2AC: consecutive Lightning ``on_train_batch_end`` hooks, so Lightning's loop is included;
RecurrentPPO: consecutive ``on_rollout_start`` callbacks, so SB3's logging is included). For the bare env an
"update" is M vector steps. The env share is the wall time inside the vector env's ``step`` over the update
time; the rollout share is the time to collect the M steps (acting + env + bookkeeping).

Every repetition runs each configuration in a fresh subprocess (``--warmup`` untimed updates, then ``--updates``
timed ones); the configurations are interleaved, with the order rotating every repetition, and the tables report
the median over repetitions of each run's median (and the minimum over all updates). Timings on a shared machine
are noisy: the load average is printed with the results, and a second ratios line uses process CPU time.
The script sets ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it (see the comment at the imports).

Usage::

    python benchmarks/r2ac_throughput.py                  # Breakout, 8 envs, M = 32, 5 repetitions x 12 updates
    python benchmarks/r2ac_throughput.py --quick          # smoke run (one process, 2 updates, M = 8)
    python benchmarks/r2ac_throughput.py --profile        # where R2AC's time goes (RTRL and TBPTT), see below
    python benchmarks/r2ac_throughput.py --env ALE/Pong-v5 --M 50 --threads 1 --reps 7

``--profile`` instruments one R2AC run per method (wrapping the module's act step, stem, core and V-trace, and
timing backward with a hook at the stem) and prints the share of each phase: acting (stem, core, heads per
step), env, rollout bookkeeping, learner forward (stem, core, V-trace, losses + logging), backward (core and
heads, stem), optimizer (gradient checks, clipping, RMSProp) and Lightning's loop.

The last line reads ``ratios r2ac/recurrentppo=<a> rtrl/tbptt_e2e=<b> env_overhead=<c>`` with
a = R2AC-RTRL frames/s / RecurrentPPO frames/s, b = R2AC-RTRL seconds per update / R2AC-TBPTT seconds per update
(the whole update, acting included), and c = raw env steps/s / R2AC-RTRL steps/s: how many times slower
training runs than the bare env (1 = training costs nothing beyond stepping the env). Needs ale-py and (for
``recurrentppo``) sb3-contrib: ``pip install -e '.[atari,bench]'``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

# libgomp's default busy-wait makes torch's 2-thread kernels up to ~60x slower when the cores are shared with other
# processes (measured: Nature CNN forward on 8 frames 185 ms instead of 3 ms at load average 5 on 2 cores).
# Waiting passively costs little on an idle machine; set OMP_WAIT_POLICY=ACTIVE to measure the default.
# Must be set before torch (and its OpenMP runtime) is loaded; the workers inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CONFIGS = ("env", "r2ac-rtrl", "r2ac-tbptt", "recurrentppo")
FRAME_SKIP = 4
_RESULT = "RESULT "  # prefix of a worker's result line on stdout


# ----------------------------------------------------------------------------------------------
# Env plumbing: a timing proxy, and an SB3 VecEnv over onlinerec's vector env
# ----------------------------------------------------------------------------------------------
class TimedEnv:
    """Delegates everything to a gymnasium vector env and adds up the wall time spent in ``step``."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.step_seconds = 0.0

    def step(self, actions):
        t0 = time.perf_counter()
        out = self.env.step(actions)
        self.step_seconds += time.perf_counter() - t0
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


def make_env(env_id: str, num_envs: int, seed: int) -> TimedEnv:
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from onlinerec.rl.envs import make_vector_env

    return TimedEnv(make_vector_env(env_id, num_envs, seed=seed))


def sb3_vec_env(env: TimedEnv):
    """SB3 ``VecEnv`` over a SAME_STEP gymnasium vector env (built here so SB3 is imported only when needed)."""
    import numpy as np
    from stable_baselines3.common.vec_env import VecEnv

    class SB3VecEnv(VecEnv):
        """SB3's VecEnv API over onlinerec's vector env: ``done = terminated | truncated``; the env has already
        reset a finished stream in the same step (SB3's convention). Truncations are flagged as
        ``TimeLimit.truncated`` (the env keeps no final observation, so SB3 does not bootstrap them)."""

        def __init__(self, inner: TimedEnv) -> None:
            self.inner = inner
            self._actions = None
            super().__init__(inner.num_envs, inner.single_observation_space, inner.single_action_space)

        @property
        def step_seconds(self) -> float:
            return self.inner.step_seconds

        def reset(self):
            obs, _ = self.inner.reset()
            return obs

        def step_async(self, actions) -> None:
            self._actions = np.asarray(actions).reshape(self.num_envs)

        def step_wait(self):
            obs, reward, terminated, truncated, _ = self.inner.step(self._actions)
            dones = np.logical_or(terminated, truncated)
            infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
            for i in np.flatnonzero(truncated):
                infos[i]["TimeLimit.truncated"] = True
            return obs, np.asarray(reward, dtype=np.float32), dones, infos

        def close(self) -> None:
            self.inner.close()

        def get_attr(self, attr_name, indices=None):
            return [getattr(self.inner, attr_name, None)] * len(self._get_indices(indices))

        def set_attr(self, attr_name, value, indices=None) -> None:
            raise NotImplementedError("SB3VecEnv cannot set attributes of the underlying envs")

        def env_method(self, method_name, *method_args, indices=None, **method_kwargs):
            raise NotImplementedError("SB3VecEnv cannot call methods of the underlying envs")

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * len(self._get_indices(indices))

    return SB3VecEnv(env)


# ----------------------------------------------------------------------------------------------
# Workers: one configuration, warm-up then timed updates
# ----------------------------------------------------------------------------------------------
@dataclass
class Options:
    """What every worker runs (passed to the subprocesses as JSON)."""

    env_id: str = "ALE/Breakout-v5"
    """Atari env id for ``make_vector_env``."""
    num_envs: int = 8
    """B, parallel envs."""
    M: int = 32
    """Agent steps per env per update: R2AC's segment length, RecurrentPPO's ``n_steps``."""
    warmup: int = 3
    """Untimed updates first (>= 1: the first one builds the envs and resets them)."""
    updates: int = 12
    """Timed updates."""
    threads: int = 2
    """``torch.set_num_threads``."""
    seed: int = 0
    """Seeds torch and the envs."""
    ppo_lstm: str = "shared"
    """RecurrentPPO: "shared" (one LSTM for policy and value, as R2AC's one core) or "separate" (SB3's default)."""


@dataclass
class RunResult:
    """Per-update samples of one run (seconds)."""

    config: str
    update: list[float] = field(default_factory=list)  # wall clock, whole update
    cpu: list[float] = field(default_factory=list)  # process CPU time (all threads, ALE's included)
    env: list[float] = field(default_factory=list)  # inside the vector env's step
    rollout: list[float] = field(default_factory=list)  # collecting the M steps (acting + env + bookkeeping)
    phases: dict[str, float] = field(default_factory=dict)  # --profile: seconds per phase over the timed updates


class _Marks:
    """Records (wall, cpu, env, rollout) at the start of the first update and at the end of every update, and keeps
    the differences of the updates after the warm-up ones."""

    def __init__(
        self, result: RunResult, warmup: int, env_seconds: Callable[[], float], rollout_seconds: Callable[[], float]
    ) -> None:
        self.result, self.warmup = result, warmup
        self.env_seconds, self.rollout_seconds = env_seconds, rollout_seconds
        self.count = 0
        self.last: tuple[float, float, float, float] | None = None

    def mark(self) -> bool:
        """End of an update (the first call: the start of the first); returns True if it was a timed one."""
        now = (time.perf_counter(), time.process_time(), self.env_seconds(), self.rollout_seconds())
        if self.last is None:
            self.last = now
            return False
        self.count += 1
        timed = self.count > self.warmup
        if timed:
            r, p = self.result, self.last
            r.update.append(now[0] - p[0])
            r.cpu.append(now[1] - p[1])
            r.env.append(now[2] - p[2])
            r.rollout.append(now[3] - p[3])
        self.last = now
        return timed


def run_env(opts: Options) -> RunResult:
    import numpy as np

    env = make_env(opts.env_id, opts.num_envs, opts.seed)
    result = RunResult("env")
    rng = np.random.default_rng(opts.seed)
    n = int(env.single_action_space.n)
    marks = _Marks(result, opts.warmup, lambda: env.step_seconds, lambda: env.step_seconds)
    env.reset()
    marks.mark()
    for _ in range(opts.warmup + opts.updates):
        for _ in range(opts.M):
            env.step(rng.integers(0, n, size=opts.num_envs))
        marks.mark()
    env.close()
    return result


def run_r2ac(opts: Options, method: str, profile: bool = False) -> RunResult:
    import lightning as L
    from lightning.pytorch.callbacks import Callback

    from onlinerec import RTRLStrategy, TBPTTStrategy
    from onlinerec.rl import R2AC, RolloutDataModule

    for noise in (
        ".*IterableDataset. has .__len__. defined.*",
        ".*does not have many workers.*",
        ".*no .val_dataloader.*",
        ".*LeafSpec.*",
    ):
        warnings.filterwarnings("ignore", message=noise)
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # no "GPU available" / tips on stdout
    L.seed_everything(opts.seed, verbose=False)

    class TimedRollouts(RolloutDataModule):
        """Adds up the time spent collecting segments."""

        rollout_seconds = 0.0

        def train_dataloader(self):
            loader = super().train_dataloader()
            stream = self.stream
            if not getattr(stream, "_timed", False):
                inner = stream.next_segment

                def next_segment(m: int):
                    t0 = time.perf_counter()
                    try:
                        return inner(m)
                    finally:
                        self.rollout_seconds += time.perf_counter() - t0

                stream.next_segment, stream._timed = next_segment, True
            return loader

    dm = TimedRollouts(lambda n, seed: make_env(opts.env_id, n, seed), num_envs=opts.num_envs, seed=opts.seed)
    obs_shape, num_actions, _ = dm.env_spaces()
    model = R2AC(num_actions, obs_shape, cell="elstm", hidden_size=256, stem="nature", fc_size=256)
    result = RunResult(f"r2ac-{method}")
    marks = _Marks(result, opts.warmup, lambda: dm.stream.env.step_seconds, lambda: dm.rollout_seconds)

    class Timer(Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            marks.mark()  # start of the first update (a warm-up one)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            marks.mark()

    callbacks: list[Any] = [Timer()]
    probe = None
    if profile:
        probe = PhaseProbe(model, marks)
        callbacks.append(probe.callback())
    strategy = (RTRLStrategy if method == "rtrl" else TBPTTStrategy)(M=opts.M)
    trainer = L.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_steps=opts.warmup + opts.updates,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    try:
        trainer.fit(model, dm)
    finally:
        if probe is not None:
            probe.close()
    if probe is not None:
        result.phases = probe.totals
    return result


def run_recurrentppo(opts: Options) -> RunResult:
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback

    torch.manual_seed(opts.seed)
    venv = sb3_vec_env(make_env(opts.env_id, opts.num_envs, opts.seed))
    separate = opts.ppo_lstm == "separate"
    policy_kwargs = {
        "features_extractor_kwargs": {"features_dim": 256},
        "lstm_hidden_size": 256,
        "n_lstm_layers": 1,
        "shared_lstm": not separate,
        "enable_critic_lstm": separate,
        "net_arch": [],
    }
    m, b = opts.M, opts.num_envs
    model = RecurrentPPO(
        "CnnLstmPolicy",
        venv,
        n_steps=m,
        batch_size=m * b,
        n_epochs=1,
        policy_kwargs=policy_kwargs,
        device="cpu",
        seed=opts.seed,
        verbose=0,
    )
    result = RunResult("recurrentppo")
    rollout = {"seconds": 0.0, "start": 0.0}
    marks = _Marks(result, opts.warmup, lambda: venv.step_seconds, lambda: rollout["seconds"])

    class Timer(BaseCallback):
        def _on_rollout_start(self) -> None:
            marks.mark()  # end of the previous update = start of this one (the first: start of the first)
            rollout["start"] = time.perf_counter()

        def _on_rollout_end(self) -> None:
            rollout["seconds"] += time.perf_counter() - rollout["start"]

        def _on_step(self) -> bool:
            return True

    # warmup + updates + 1 rollouts: the last rollout start closes the last timed update
    model.learn(total_timesteps=(opts.warmup + opts.updates + 1) * m * b, callback=Timer())
    return result


def run_config(config: str, opts: Options, profile: bool = False) -> RunResult:
    import torch

    torch.set_num_threads(opts.threads)
    if config == "env":
        return run_env(opts)
    if config in ("r2ac-rtrl", "r2ac-tbptt"):
        return run_r2ac(opts, config.split("-")[1], profile=profile)
    if config == "recurrentppo":
        return run_recurrentppo(opts)
    raise ValueError(f"unknown configuration {config!r}; choose from {CONFIGS}")


# ----------------------------------------------------------------------------------------------
# --profile: where R2AC's time goes
# ----------------------------------------------------------------------------------------------
PHASES = (
    ("act: stem", "stem forward on the B current frames, per agent step"),
    ("act: core", "one eLSTM step without sensitivities"),
    ("act: heads, sampling", "readout, policy/value heads, softmax sampling"),
    ("env step", "the vector env's step"),
    ("rollout bookkeeping", "tensor conversions, log-probabilities, stacking the M + 1 entries"),
    ("learner: stem fwd", "stem forward on the (M + 1) x B frames"),
    ("learner: core fwd", "core unroll (RTRL: with the sensitivity carry)"),
    ("learner: V-trace", "V-trace targets"),
    ("learner: heads, losses, logging", "readout, heads, bootstrap step, losses, self.log"),
    ("backward: core, heads", "from the loss down to the stem's output"),
    ("backward: stem", "stem backward"),
    ("optimizer", "finite checks, gradient clipping, RMSProp, LR schedule"),
    ("Lightning loop", "the rest: hooks, fetching the batch, progress tracking"),
)


class PhaseProbe:
    """Wraps R2AC's act step, stem, core unroll and V-trace with timers, and times backward with a pre-hook at the
    stem; adds up each phase over the timed updates (``marks`` says which updates are timed)."""

    def __init__(self, model: Any, marks: _Marks) -> None:
        import onlinerec.rl.r2ac as r2ac_module

        self.model, self.marks = model, marks
        self.acc: dict[str, float] = {}
        self.totals: dict[str, float] = {name: 0.0 for name, _ in PHASES}
        self.acting = False
        self.t: dict[str, float] = {}

        def timed(name: Callable[[], str], fn: Callable) -> Callable:
            def wrapper(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    key = name()
                    self.acc[key] = self.acc.get(key, 0.0) + time.perf_counter() - t0

            return wrapper

        act, stem_fwd, unroll = model.act, model.stem.forward, model.unroll

        def acting(*args, **kwargs):
            self.acting = True
            try:
                return act(*args, **kwargs)
            finally:
                self.acting = False

        self._vtrace = r2ac_module.vtrace
        model.act = timed(lambda: "act", acting)
        model.stem.forward = timed(lambda: "act: stem" if self.acting else "learner: stem fwd", stem_fwd)
        model.unroll = timed(lambda: "act: core" if self.acting else "learner: core fwd", unroll)
        r2ac_module.vtrace = timed(lambda: "learner: V-trace", r2ac_module.vtrace)
        model.stem.register_full_backward_pre_hook(lambda mod, grad_out: self._stamp("stem_bwd"))

    def close(self) -> None:
        """Puts back the module-level V-trace function (the wrappers on the model go with the model)."""
        import onlinerec.rl.r2ac as r2ac_module

        r2ac_module.vtrace = self._vtrace

    def _stamp(self, key: str) -> None:
        self.t[key] = time.perf_counter()

    def callback(self):
        from lightning.pytorch.callbacks import Callback

        probe = self

        class Phases(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
                probe._stamp("batch_start")

            def on_before_backward(self, trainer, pl_module, loss) -> None:
                probe._stamp("bwd_start")

            def on_after_backward(self, trainer, pl_module) -> None:
                probe._stamp("bwd_end")

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
                # runs after the Timer callback, whose mark() decided whether this update is timed
                probe._close()

        return Phases()

    def _close(self) -> None:
        r, t, a = self.marks.result, self.t, self.acc
        if self.marks.count > self.marks.warmup and len(r.update) > 0:
            update, env, rollout = r.update[-1], r.env[-1], r.rollout[-1]
            act = a.get("act", 0.0)
            act_stem, act_core = a.get("act: stem", 0.0), a.get("act: core", 0.0)
            forward = t["bwd_start"] - t["batch_start"]
            l_stem, l_core, l_vt = (
                a.get("learner: stem fwd", 0.0),
                a.get("learner: core fwd", 0.0),
                a.get("learner: V-trace", 0.0),
            )
            stem_bwd_at = t.get("stem_bwd", t["bwd_end"])
            phases = {
                "act: stem": act_stem,
                "act: core": act_core,
                "act: heads, sampling": act - act_stem - act_core,
                "env step": env,
                "rollout bookkeeping": rollout - act - env,
                "learner: stem fwd": l_stem,
                "learner: core fwd": l_core,
                "learner: V-trace": l_vt,
                "learner: heads, losses, logging": forward - l_stem - l_core - l_vt,
                "backward: core, heads": stem_bwd_at - t["bwd_start"],
                "backward: stem": t["bwd_end"] - stem_bwd_at,
                "optimizer": self.marks.last[0] - t["bwd_end"],
            }
            phases["Lightning loop"] = update - sum(phases.values())
            for k, v in phases.items():
                self.totals[k] += v
        self.acc.clear()
        self.t.clear()


# ----------------------------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------------------------
def run_subprocess(config: str, opts: Options, profile: bool = False) -> RunResult:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", config, "--worker-options", json.dumps(asdict(opts))]
    if profile:
        cmd.append("--profile")
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=REPO)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(_RESULT)]
    if out.returncode != 0 or not lines:
        sys.exit(f"FAIL: the {config} worker exited with {out.returncode}:\n{out.stderr[-4000:]}")
    return RunResult(**json.loads(lines[-1][len(_RESULT) :]))


@dataclass
class Summary:
    config: str
    update_s: float  # median over runs of each run's median
    min_s: float
    cpu_s: float
    env_share: float
    rollout_share: float
    runs: int


def summarise(config: str, runs: list[RunResult]) -> Summary:
    med = statistics.median
    per_run = [med(r.update) for r in runs]

    def share(part: str) -> float:
        return med([sum(getattr(r, part)) / sum(r.update) for r in runs])

    return Summary(
        config,
        med(per_run),
        min(min(r.update) for r in runs),
        med([med(r.cpu) for r in runs]),
        share("env"),
        share("rollout"),
        len(runs),
    )


def machine(threads: int) -> str:
    import torch

    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from rtrl_vs_tbptt import machine as describe

    torch.set_num_threads(threads)
    return f"{describe()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}"


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def print_profile(opts: Options, in_process: bool) -> None:
    print(
        f"where R2AC's time goes (one run per method, {opts.updates} updates after {opts.warmup} warm-up; seconds per update)"
    )
    res = {}
    for method in ("rtrl", "tbptt"):
        cfg = f"r2ac-{method}"
        res[method] = run_config(cfg, opts, profile=True) if in_process else run_subprocess(cfg, opts, profile=True)
    k = {m: len(r.update) for m, r in res.items()}
    tot = {m: sum(r.update) / k[m] for m, r in res.items()}
    print(f"{'phase':<34} {'rtrl s':>8} {'rtrl %':>7} {'tbptt s':>8} {'tbptt %':>8}  what")
    for name, what in PHASES:
        r, t = res["rtrl"].phases[name] / k["rtrl"], res["tbptt"].phases[name] / k["tbptt"]
        print(f"{name:<34} {r:>8.4f} {100 * r / tot['rtrl']:>6.1f}% {t:>8.4f} {100 * t / tot['tbptt']:>7.1f}%  {what}")
    print(f"{'whole update':<34} {tot['rtrl']:>8.4f} {100.0:>6.1f}% {tot['tbptt']:>8.4f} {100.0:>7.1f}%")
    per_step = {
        m: (r.phases["act: stem"] + r.phases["act: core"] + r.phases["act: heads, sampling"]) / (k[m] * opts.M)
        for m, r in res.items()
    }
    print(
        f"acting per agent step (B = {opts.num_envs}): rtrl {1e3 * per_step['rtrl']:.2f} ms, tbptt {1e3 * per_step['tbptt']:.2f} ms"
    )
    print(f"load average after: {load()}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--env", default="ALE/Breakout-v5", help="Atari env id (default ALE/Breakout-v5)")
    ap.add_argument("--num-envs", type=int, default=8, help="B, parallel envs (default 8)")
    ap.add_argument(
        "--M",
        type=int,
        default=None,
        help="rollout length = R2AC segment = RecurrentPPO n_steps (default 32, quick: 8)",
    )
    ap.add_argument("--updates", type=int, default=None, help="timed updates per run (default 12, quick: 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed updates first (default 3, quick: 1)")
    ap.add_argument("--reps", type=int, default=None, help="runs per configuration, interleaved (default 5, quick: 1)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ",".join(CONFIGS))
    ap.add_argument(
        "--ppo-lstm",
        choices=("shared", "separate"),
        default="shared",
        help="RecurrentPPO: one LSTM for policy and value (matched to R2AC's one core; default) or SB3's default second critic LSTM",
    )
    ap.add_argument(
        "--in-process", action="store_true", help="run every configuration in this process (default with --quick)"
    )
    ap.add_argument(
        "--profile", action="store_true", help="print where R2AC's time goes (RTRL and TBPTT) instead of the comparison"
    )
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: M = 8, 1 warm-up + 2 timed updates, 1 repetition, in process"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-options", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        opts = Options(**json.loads(args.worker_options))
        result = run_config(args.worker, opts, profile=args.profile)
        print(_RESULT + json.dumps(asdict(result)), flush=True)
        return

    q = args.quick
    opts = Options(
        env_id=args.env,
        num_envs=args.num_envs,
        M=args.M or (8 if q else 32),
        warmup=args.warmup if args.warmup is not None else (1 if q else 3),
        updates=args.updates or (2 if q else 12),
        threads=args.threads,
        seed=args.seed,
        ppo_lstm=args.ppo_lstm,
    )
    if opts.warmup < 1:
        ap.error("--warmup must be >= 1 (the first update includes building the envs and the first reset)")
    reps = args.reps or (1 if q else 5)
    in_process = args.in_process or q
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"unknown configuration {c!r}; choose from {CONFIGS}")
    if "recurrentppo" in configs:
        try:
            import sb3_contrib  # noqa: F401
        except ImportError:
            ap.error("recurrentppo needs sb3-contrib: pip install -e '.[bench]' (or leave it out with --configs)")

    print(f"machine: {machine(opts.threads)}")
    print(f"load average before: {load()}")
    print(
        f"setup: {opts.env_id}, B = {opts.num_envs} envs, M = {opts.M} steps per update ({opts.M * opts.num_envs * FRAME_SKIP} frames), "
        f"{opts.warmup} warm-up + {opts.updates} timed updates per run, {reps} interleaved runs per configuration"
        f"{' (in process)' if in_process else ' (fresh subprocess each)'}; RecurrentPPO LSTM: {opts.ppo_lstm}"
    )
    if args.profile:
        print_profile(opts, in_process)
        return

    runs: dict[str, list[RunResult]] = {c: [] for c in configs}
    for rep in range(reps):
        order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
        for c in order:
            runs[c].append(run_config(c, opts) if in_process else run_subprocess(c, opts))
    summaries = {c: summarise(c, rs) for c, rs in runs.items()}

    steps = opts.M * opts.num_envs
    print()
    print("per update (collect M steps from B envs + one gradient pass; env: M vector steps), medians over runs")
    print(
        f"{'config':<14} {'frames/s':>9} {'steps/s':>8} {'s/update':>9} {'min s':>7} {'cpu s':>7} {'env %':>6} {'rollout %':>9} {'/r2ac-rtrl':>10}"
    )
    base = summaries.get("r2ac-rtrl")
    for c, s in summaries.items():
        rel = f"{s.update_s / base.update_s:>10.2f}" if base else f"{'-':>10}"
        print(
            f"{c:<14} {steps * FRAME_SKIP / s.update_s:>9.0f} {steps / s.update_s:>8.0f} {s.update_s:>9.3f} {s.min_s:>7.3f} {s.cpu_s:>7.3f} "
            f"{100 * s.env_share:>5.1f}% {100 * s.rollout_share:>8.1f}% {rel}"
        )
    for c, rs in runs.items():
        print(f"  {c:<12} per-run medians s/update: " + " ".join(f"{statistics.median(r.update):.3f}" for r in rs))
    print(f"load average after: {load()}")

    def ratio(num: str, den: str, inverse: bool = False, attr: str = "update_s") -> str:
        if num not in summaries or den not in summaries:
            return "nan"
        a, b = getattr(summaries[num], attr), getattr(summaries[den], attr)
        return f"{(b / a if inverse else a / b):.2f}"

    # a: frames/s ratio = inverse ratio of seconds per update (equal frames per update); c: env steps/s over R2AC's
    print(
        "same ratios from process CPU time per update (less sensitive to waiting for a shared core): "
        f"r2ac/recurrentppo={ratio('r2ac-rtrl', 'recurrentppo', True, 'cpu_s')} rtrl/tbptt_e2e={ratio('r2ac-rtrl', 'r2ac-tbptt', attr='cpu_s')} "
        f"env_overhead={ratio('r2ac-rtrl', 'env', attr='cpu_s')}"
    )
    a = ratio("r2ac-rtrl", "recurrentppo", inverse=True)
    b = ratio("r2ac-rtrl", "r2ac-tbptt")
    c = ratio("r2ac-rtrl", "env")
    print(f"ratios r2ac/recurrentppo={a} rtrl/tbptt_e2e={b} env_overhead={c}")


if __name__ == "__main__":
    main()
