"""End-to-end R2AC training throughput on Atari: RTRL vs TBPTT, vs the bare env, vs sb3-contrib's RecurrentPPO.

Configurations (same env construction for onlinerec's and SB3's: ``onlinerec.rl.envs.make_vector_env(env_id, B,
seed, backend="native", fire_on_life_loss=False)``, i.e. ale-py's C++ vector env with 84x84 gray frames, a stack of
4, frame skip 4 with max-pool, episodic life, FIRE pressed at reset only; ``--atari-backend torchbeast`` builds the
paper's Python wrapper stack instead, the library's default for games with FIRE, which also presses FIRE after a lost
life, ~2x the env's CPU cost):

- ``env``: the raw vector env stepped with uniformly random actions (no agent), in chunks of M steps.
- ``r2ac-rtrl`` / ``r2ac-tbptt``: R2AC trained by ``lightning.Trainer`` with ``RTRLStrategy(M)`` /
  ``TBPTTStrategy(M)``: Nature CNN stem (fc 256), eLSTM core of width 256, one update per segment of M steps
  (acting with the current weights, then one V-trace gradient pass, RMSProp, gradient clipping).
- ``r2ac-rtrl-async``: ``r2ac-rtrl`` with ``RolloutDataModule(async_actor=True)``: a copy of the agent collects the
  next segment on a thread while the learner updates on the current one (acting with weights one update old).
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
    python benchmarks/r2ac_throughput.py --device cuda --configs env,r2ac-rtrl,r2ac-tbptt,recurrentppo

``--device cuda`` puts R2AC (learner and actor) and RecurrentPPO on the GPU; the envs step on the CPU, and the peers
(sample-factory, cleanrl) run on the CPU as configured. Each update's end is then marked after
``torch.cuda.synchronize()``, so an update's time includes the device work it queued.

``--profile`` instruments one R2AC run per method (wrapping the module's act step, stem, core and V-trace, and
timing backward with a hook at the stem) and prints the share of each phase: acting (stem, core, heads per
step), env, rollout bookkeeping, learner forward (stem, core, V-trace, losses + logging), backward (core and
heads, stem), optimizer (gradient checks, clipping, RMSProp) and Lightning's loop.

The last line reads ``ratios r2ac/recurrentppo=<a> rtrl/tbptt_e2e=<b> env_overhead=<c>`` with
a = R2AC-RTRL frames/s / RecurrentPPO frames/s, b = R2AC-RTRL seconds per update / R2AC-TBPTT seconds per update
(the whole update, acting included), and c = raw env steps/s / R2AC-RTRL steps/s: how many times slower
training runs than the bare env (1 = training costs nothing beyond stepping the env). With ``r2ac-rtrl-async`` it
gains ``async/plain=<x>`` (its frames/s over R2AC-RTRL's) and ``r2ac_async/<peer>=<y>`` for every peer that ran. Needs ale-py and (for
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
import tempfile
import textwrap
import time
import types
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

# libgomp's default busy-wait makes torch's 2-thread kernels up to ~60x slower when the cores are shared with other
# processes (measured: Nature CNN forward on 8 frames 185 ms instead of 3 ms at load average 5 on 2 cores).
# Waiting passively costs little on an idle machine; set OMP_WAIT_POLICY=ACTIVE to measure the default.
# Must be set before torch (and its OpenMP runtime) is loaded; the workers inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CONFIGS = ("env", "r2ac-rtrl", "r2ac-rtrl-async", "r2ac-tbptt", "recurrentppo")  # the default set (no peer installed)
PEERS_SF = ("sample-factory", "env-sf")  # run with the sample-factory virtualenv's interpreter
PEERS_CLEANRL = ("cleanrl-matched", "cleanrl", "env-cleanrl")  # run with the cleanrl virtualenv's interpreter
OPTIONAL = ("r2ac-rtrl-nchw", *PEERS_SF, *PEERS_CLEANRL)
ENV_OF = {  # the bare env stack each configuration's env cost is taken from (env-subtracted cost)
    "r2ac-rtrl": "env",
    "r2ac-tbptt": "env",
    "r2ac-rtrl-nchw": "env",
    "r2ac-rtrl-async": "env",
    "recurrentppo": "env",
    "sample-factory": "env-sf",
    "cleanrl": "env-cleanrl",
    "cleanrl-matched": "env-cleanrl",
}
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


def make_env(env_id: str, num_envs: int, seed: int, backend: str = "native") -> TimedEnv:
    """onlinerec's Atari vector env for the env, R2AC and RecurrentPPO configurations (``Options.atari_backend``)."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from onlinerec.rl.envs import make_vector_env

    # ale-py's native vector env cannot press FIRE for one stream after a lost life: the agent learns to press it
    kwargs = {"backend": "native", "fire_on_life_loss": False} if backend == "native" else {"backend": "torchbeast"}
    if backend == "torchbeast-async":  # the Python stack in one worker process per env
        kwargs["vectorization"] = "async"
    return TimedEnv(make_vector_env(env_id, num_envs, seed=seed, **kwargs))


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


def nchw_stem_forward(stem: Any, obs: Any) -> Any:
    """``NatureStem`` / ``ImpalaStem`` forward with contiguous NCHW activations, scaling by a
    division after the conversion: the ``r2ac-rtrl-nchw`` configuration, to measure what the channels-last stems
    and the one-op scaling changed. Same parameters, same outputs to ~1e-7."""
    import torch

    x = obs.to(stem.fc.weight.dtype) / 255.0 if obs.dtype == torch.uint8 else obs.to(stem.fc.weight.dtype)
    x = stem.convs(x)
    if type(stem).__name__ == "ImpalaStem":
        x = torch.relu(x)
    return torch.relu(stem.fc(x.flatten(1)))


# ----------------------------------------------------------------------------------------------
# Workers: one configuration, warm-up then timed updates
# ----------------------------------------------------------------------------------------------
@dataclass
class Options:
    """What every worker runs (passed to the subprocesses as JSON)."""

    env_id: str = "ALE/Breakout-v5"
    """Atari env id for ``make_vector_env``."""
    atari_backend: str = "native"
    """onlinerec's Atari backend (env, R2AC, RecurrentPPO): "native" (ale-py's C++ vector env; FIRE is pressed at
    reset only, so after a lost life the agent presses it itself), "torchbeast" (the paper's Python wrapper stack,
    which also presses FIRE after a lost life, as the peers' wrappers do; the library's default for games with FIRE)
    or "torchbeast-async" (that stack with one worker process per env; their CPU time is counted)."""
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
    stem: str = "nature"
    """R2AC's stem: "nature" (matched to the peers' Nature CNN) or "impala" (the paper's)."""
    cleanrl_dir: str = ""
    """cleanrl checkout (holds cleanrl/ppo_atari_lstm.py and cleanrl_utils/), for the cleanrl configurations."""
    sf_workers: int = 2
    """sample-factory rollout worker processes; each steps num_envs / sf_workers envs."""
    sf_splits: int = 2
    """sample-factory ``worker_num_splits``: 2 = double-buffered sampling (half a worker's envs step while the
    other half waits for actions)."""
    device: str = "cpu"
    """Where R2AC and RecurrentPPO learn and act: "cpu" or "cuda[:index]" (the envs and the peers stay on the CPU)."""


@dataclass
class RunResult:
    """Per-update samples of one run (seconds)."""

    config: str
    frames_per_update: int = 0  # env frames (agent steps x 4) per update
    update: list[float] = field(default_factory=list)  # wall clock, whole update
    # CPU time of all threads (ALE's included; sample-factory: all its processes)
    cpu: list[float] = field(default_factory=list)
    env: list[float] = field(default_factory=list)  # inside the vector env's step
    rollout: list[float] = field(default_factory=list)  # collecting the M steps (acting + env + bookkeeping)
    phases: dict[str, float] = field(default_factory=dict)  # --profile: seconds per phase over the timed updates


class _Marks:
    """Records (wall, cpu, env, rollout) at the start of the first update and at the end of every update, and keeps
    the differences of the updates after the warm-up ones."""

    def __init__(
        self,
        result: RunResult,
        warmup: int,
        env_seconds: Callable[[], float],
        rollout_seconds: Callable[[], float],
        cpu_seconds: Callable[[], float] = time.process_time,
        device: str = "cpu",
    ) -> None:
        self.result, self.warmup = result, warmup
        self.env_seconds, self.rollout_seconds, self.cpu_seconds = env_seconds, rollout_seconds, cpu_seconds
        self.device = device
        self.count = 0
        self.last: tuple[float, float, float, float] | None = None

    def mark(self) -> bool:
        """End of an update (the first call: the start of the first); returns True if it was a timed one. On a GPU the
        device first finishes the work the update queued."""
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)
        now = (time.perf_counter(), self.cpu_seconds(), self.env_seconds(), self.rollout_seconds())
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
    env = make_env(opts.env_id, opts.num_envs, opts.seed, opts.atari_backend)
    env.reset()
    return time_random_actions(env, "env", opts)


def time_random_actions(env, name: str, opts: Options) -> RunResult:
    """An env stack alone (already reset): uniformly random actions for as many segments as a run's updates."""
    import numpy as np

    result = RunResult(name, opts.M * opts.num_envs * FRAME_SKIP)
    rng = np.random.default_rng(opts.seed)
    n = int(env.single_action_space.n)
    marks = _Marks(
        result, opts.warmup, lambda: env.step_seconds, lambda: env.step_seconds, cpu_seconds=onlinerec_cpu_clock(opts)
    )
    marks.mark()
    for _ in range(opts.warmup + opts.updates):
        for _ in range(opts.M):
            env.step(rng.integers(0, n, size=opts.num_envs))
        marks.mark()
    env.close()
    return result


def run_r2ac(
    opts: Options, method: str, profile: bool = False, nchw_stem: bool = False, async_actor: bool = False
) -> RunResult:
    import lightning as L
    import torch
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

    dm = TimedRollouts(
        lambda n, seed: make_env(opts.env_id, n, seed, opts.atari_backend),
        num_envs=opts.num_envs,
        seed=opts.seed,
        async_actor=async_actor,
    )
    obs_shape, num_actions, _ = dm.env_spaces()
    model = R2AC(num_actions, obs_shape, cell="elstm", hidden_size=256, stem=opts.stem, fc_size=256)
    if nchw_stem:  # the NCHW stem, for comparison with the channels-last one
        model.stem.forward = types.MethodType(nchw_stem_forward, model.stem)
    name = f"r2ac-{method}" + ("-nchw" if nchw_stem else "") + ("-async" if async_actor else "")
    result = RunResult(name, opts.M * opts.num_envs * FRAME_SKIP)
    marks = _Marks(
        result,
        opts.warmup,
        lambda: dm.stream.env.step_seconds,
        lambda: dm.rollout_seconds,
        cpu_seconds=onlinerec_cpu_clock(opts),
        device=opts.device,
    )

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
    device = torch.device(opts.device)
    trainer = L.Trainer(
        strategy=strategy,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=[device.index] if device.index is not None else 1,
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
    venv = sb3_vec_env(make_env(opts.env_id, opts.num_envs, opts.seed, opts.atari_backend))
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
        device=opts.device,
        seed=opts.seed,
        verbose=0,
    )
    result = RunResult("recurrentppo", m * b * FRAME_SKIP)
    rollout = {"seconds": 0.0, "start": 0.0}
    marks = _Marks(
        result,
        opts.warmup,
        lambda: venv.step_seconds,
        lambda: rollout["seconds"],
        cpu_seconds=onlinerec_cpu_clock(opts),
        device=opts.device,
    )

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


# ----------------------------------------------------------------------------------------------
# Peers in their own virtual environments (gymnasium 0.29, ale-py 0.9.1, numpy < 2): these workers run under the
# peer's interpreter (--peers / --sf-python / --cleanrl-python); the orchestrator only reads their RESULT line.
# ----------------------------------------------------------------------------------------------
def atari_game(env_id: str) -> str:
    """The game of an ALE id, "ALE/Breakout-v5" -> "Breakout" (the peers use gymnasium 0.29's v4 ids and their own wrapper stacks)."""
    return env_id.split("/", 1)[-1].split("-", 1)[0]


def tree_cpu_seconds() -> float:
    """CPU time (user + system) of this process and all its live descendants (sample-factory's workers, the env
    workers of ``--atari-backend torchbeast-async``), from /proc on Linux (no psutil needed); elsewhere this process's."""
    total = time.process_time()
    if not os.path.isdir("/proc"):
        return total
    tick, parent, cpu = os.sysconf("SC_CLK_TCK"), {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except OSError:  # a process that just exited
            continue
        pid = int(entry)  # fields: state, ppid, ..., utime (12), stime (13)
        parent[pid], cpu[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
    descendants, generation = set(), {os.getpid()}
    while generation:  # children, then their children, ...
        generation = {pid for pid, ppid in parent.items() if ppid in generation}
        descendants |= generation
    return total + sum(cpu[pid] for pid in descendants)


def onlinerec_cpu_clock(opts: Options) -> Callable[[], float]:
    """The CPU clock for the env, R2AC and RecurrentPPO configurations: with env worker processes their CPU counts."""
    return tree_cpu_seconds if opts.atari_backend.endswith("-async") else time.process_time


def sf_make_atari_env(env_name, cfg, env_config, render_mode=None):
    """sample-factory's own Atari env (sf_examples.atari.atari_utils.make_atari_env); imports ale_py first, which
    registers the v4 ids with gymnasium 0.29. Module level, so that sample-factory's spawned workers can unpickle it."""
    import ale_py  # noqa: F401
    from sf_examples.atari.atari_utils import make_atari_env

    return make_atari_env(env_name, cfg, env_config, render_mode=render_mode)


def sf_config(opts: Options, updates: int):
    """sample-factory 2.1.1 APPO matched to R2AC: Nature CNN (convnet_atari) with fc 256, one LSTM layer of 256,
    4 stacked 84x84 gray frames scaled by 1/255 (no running input normalisation), opts.num_envs envs in
    ``sf_workers`` processes, rollout = recurrence = M, one batch of M x B samples per training iteration, one epoch.
    ``with_vtrace=False``: V-trace crashes in 2.1.1, so this is PPO's clipped loss with GAE. Asynchronous (the
    workers keep stepping while the learner trains; sample-factory's default for Atari is synchronous)."""
    from sample_factory.envs.env_utils import register_env
    from sf_examples.atari.train_atari import parse_atari_args

    name = f"atari_{atari_game(opts.env_id).lower()}"
    register_env(name, sf_make_atari_env)
    if opts.num_envs % opts.sf_workers:
        raise ValueError(f"num_envs = {opts.num_envs} is not a multiple of sf_workers = {opts.sf_workers}")
    m, b = opts.M, opts.num_envs
    argv = [
        f"--env={name}",
        "--experiment=r2ac_throughput",
        f"--train_dir={tempfile.mkdtemp(prefix='sf-bench-')}",
        "--device=cpu",
        f"--seed={opts.seed}",
        f"--num_workers={opts.sf_workers}",
        f"--num_envs_per_worker={b // opts.sf_workers}",
        f"--worker_num_splits={opts.sf_splits}",
        f"--rollout={m}",
        f"--recurrence={m}",
        f"--batch_size={m * b}",
        "--num_epochs=1",
        "--num_batches_per_epoch=1",
        "--use_rnn=True",
        "--rnn_type=lstm",
        "--rnn_size=256",
        "--rnn_num_layers=1",
        "--encoder_conv_mlp_layers",
        "256",
        "--normalize_input=False",
        "--with_vtrace=False",
        "--async_rl=True",
        "--serial_mode=False",
        f"--train_for_env_steps={(updates + 2) * m * b * FRAME_SKIP}",
        "--save_every_sec=1000000",
        "--save_best_every_sec=1000000",
        "--experiment_summaries_interval=1000000",
    ]
    return name, parse_atari_args(argv)


def run_sample_factory(opts: Options) -> RunResult:
    """sample-factory's APPO (see :func:`sf_config`); an update is one training iteration (one batch of M x B agent
    steps), timed in the runner process by an ``AlgoObserver.on_training_step`` from one to the next; CPU time is the
    whole process tree's (runner, learner, inference and rollout workers)."""
    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.train import make_runner

    total = opts.warmup + opts.updates
    _, cfg = sf_config(opts, total)
    cfg, runner = make_runner(cfg)
    result = RunResult("sample-factory", opts.M * opts.num_envs * FRAME_SKIP)
    marks = _Marks(result, opts.warmup, lambda: 0.0, lambda: 0.0, cpu_seconds=tree_cpu_seconds)

    class Timer(AlgoObserver):
        def on_training_step(self, runner, training_iteration_since_resume: int) -> None:
            if len(result.update) < opts.updates:
                marks.mark()  # the first call: end of the first iteration = start of the first warm-up one

    runner.register_observer(Timer())
    status = runner.init()
    if status == 0:
        status = runner.run()
    if status != 0 or len(result.update) < opts.updates:
        raise RuntimeError(f"sample-factory exited with status {status} after {len(result.update)} timed updates")
    result.env = result.rollout = []  # inside the workers: not measured
    return result


def run_env_sf(opts: Options) -> RunResult:
    """sample-factory's env stack alone: num_envs of its Atari envs (gymnasium 0.29 + its wrappers, frame stack 4)
    stepped one after another with random actions in one process, M steps each per "update"."""
    import numpy as np

    name, cfg = sf_config(opts, 1)
    envs = [sf_make_atari_env(name, cfg, None) for _ in range(opts.num_envs)]
    for i, e in enumerate(envs):
        e.reset(seed=opts.seed + i)
    rng = np.random.default_rng(opts.seed)
    result = RunResult("env-sf", opts.M * opts.num_envs * FRAME_SKIP)
    clock = {"env": 0.0}
    marks = _Marks(result, opts.warmup, lambda: clock["env"], lambda: clock["env"])
    marks.mark()
    n = int(envs[0].action_space.n)
    for _ in range(opts.warmup + opts.updates):
        for _ in range(opts.M):
            t0 = time.perf_counter()
            for e, a in zip(envs, rng.integers(0, n, size=len(envs))):
                _, _, term, trunc, _ = e.step(int(a))
                if term or trunc:
                    e.reset()
            clock["env"] += time.perf_counter() - t0
        marks.mark()
    for e in envs:
        e.close()
    return result


# cleanrl's ppo_atari_lstm.py with R2AC's network: 4 stacked frames into the Nature CNN, fc 256, LSTM 256. Exact
# substrings of the script (commit fe8d8a03); each must occur once, else the worker stops with a message.
CLEANRL_MATCHED_EDITS = (
    ("gym.wrappers.FrameStack(env, 1)", "gym.wrappers.FrameStack(env, 4)"),
    ("nn.Conv2d(1, 32, 8, stride=4)", "nn.Conv2d(4, 32, 8, stride=4)"),
    ("nn.Linear(64 * 7 * 7, 512)", "nn.Linear(64 * 7 * 7, 256)"),
    ("nn.LSTM(512, 128)", "nn.LSTM(256, 256)"),
    ("nn.Linear(128, envs.single_action_space.n)", "nn.Linear(256, envs.single_action_space.n)"),
    ("nn.Linear(128, 1)", "nn.Linear(256, 1)"),
)
CLEANRL_SCRIPT = os.path.join("cleanrl", "ppo_atari_lstm.py")
CLEANRL_STEPS = 128  # the script's num_steps (its rollout length per env)


def cleanrl_source(opts: Options, matched: bool) -> tuple[str, str]:
    path = os.path.join(opts.cleanrl_dir, CLEANRL_SCRIPT)
    with open(path) as fh:
        src = fh.read()
    if matched:
        for old, new in CLEANRL_MATCHED_EDITS:
            if src.count(old) != 1:
                raise RuntimeError(
                    f"{path}: expected {old!r} once (cleanrl commit fe8d8a03), found {src.count(old)}; "
                    "the matched-network edit does not apply to this version of the script"
                )
            src = src.replace(old, new)
    return path, src


def exec_as_module(src: str, path: str, name: str) -> dict[str, Any]:
    """Runs ``src`` as the module ``name`` (registered in ``sys.modules`` while it runs, as dataclasses and tyro need;
    the previous entry is put back) and returns its namespace."""
    module = types.ModuleType(name)
    module.__file__ = path
    previous = sys.modules.get(name)
    sys.modules[name] = module
    try:
        exec(compile(src, path, "exec"), module.__dict__)  # noqa: S102  (the peer's script, by the user's choice)
    finally:
        if previous is not None:
            sys.modules[name] = previous
    return module.__dict__


def run_cleanrl(opts: Options, matched: bool, quick: bool = False) -> RunResult:
    """cleanrl's ppo_atari_lstm.py, executed unchanged (``matched=False``: its network and hyper-parameters, 128 steps
    x 8 envs, 4 epochs x 4 minibatches) or with R2AC's network (:data:`CLEANRL_MATCHED_EDITS`) and one gradient pass
    per rollout of M steps (``--num-steps M --num-minibatches 1 --update-epochs 1``). Its own env stack: gymnasium
    0.29 ``SyncVectorEnv`` of ``<Game>NoFrameskip-v4`` with its Python wrappers. An update is one iteration of its
    loop (rollout + GAE + optimisation), marked at its first ``SummaryWriter.add_scalar`` after the optimisation."""
    import ale_py  # noqa: F401  (registers the v4 ids)
    import gymnasium as gym
    from torch.utils.tensorboard import SummaryWriter

    path, src = cleanrl_source(opts, matched)
    steps = opts.M if matched else (4 * opts.M if quick else CLEANRL_STEPS)
    if not matched and not quick:  # its iterations are 4x longer (128 steps, 4 epochs): about the same frames in all
        opts = replace(opts, warmup=max(1, opts.warmup // 3), updates=max(3, opts.updates * opts.M // steps))
    iterations = 1 + opts.warmup + opts.updates  # the first one ends before the first mark
    argv = [
        path,
        "--env-id",
        f"{atari_game(opts.env_id)}NoFrameskip-v4",
        "--num-envs",
        str(opts.num_envs),
        "--num-steps",
        str(steps),
        "--total-timesteps",
        str(iterations * steps * opts.num_envs),
        "--seed",
        str(opts.seed),
    ]
    if matched:
        argv += ["--num-minibatches", "1", "--update-epochs", "1"]
    result = RunResult("cleanrl-matched" if matched else "cleanrl", steps * opts.num_envs * FRAME_SKIP)
    clock = {"env": 0.0, "rollout": 0.0, "last_step_end": None, "mark": None}
    marks = _Marks(result, opts.warmup, lambda: clock["env"], lambda: clock["rollout"])

    step = gym.vector.SyncVectorEnv.step

    def timed_step(self, actions):
        t0 = time.perf_counter()
        try:
            return step(self, actions)
        finally:
            clock["last_step_end"] = now = time.perf_counter()
            clock["env"] += now - t0

    add_scalar = SummaryWriter.add_scalar

    def marking_add_scalar(self, tag, *args, **kwargs):
        if tag == "charts/learning_rate":  # the first scalar written after an iteration's optimisation
            if clock["mark"] is not None and clock["last_step_end"] is not None:
                clock["rollout"] += clock["last_step_end"] - clock["mark"]  # mark -> last env step of the rollout
            marks.mark()
            clock["mark"] = time.perf_counter()
        return add_scalar(self, tag, *args, **kwargs)

    gym.vector.SyncVectorEnv.step = timed_step
    SummaryWriter.add_scalar = marking_add_scalar
    sys.path.insert(0, opts.cleanrl_dir)  # cleanrl_utils.atari_wrappers
    old_argv, old_cwd = sys.argv, os.getcwd()
    with tempfile.TemporaryDirectory(prefix="cleanrl-bench-") as tmp:
        sys.argv = argv
        os.chdir(tmp)  # the script writes runs/<name>/ (TensorBoard) into the working directory
        try:
            exec_as_module(src, path, "__main__")
        finally:
            sys.argv = old_argv
            os.chdir(old_cwd)
    return result


def run_env_cleanrl(opts: Options) -> RunResult:
    """cleanrl's env stack alone (its ``make_env`` with 4 stacked frames, as in the matched configuration, in a
    ``SyncVectorEnv``), stepped with random actions, M vector steps per "update"."""
    import ale_py  # noqa: F401
    import gymnasium as gym

    path, src = cleanrl_source(opts, matched=True)
    sys.path.insert(0, opts.cleanrl_dir)
    ns = exec_as_module(
        src, path, "cleanrl_ppo_atari_lstm"
    )  # defines make_env, Agent, ...; its main block does not run
    env_id = f"{atari_game(opts.env_id)}NoFrameskip-v4"
    env = TimedEnv(gym.vector.SyncVectorEnv([ns["make_env"](env_id, i, False, "bench") for i in range(opts.num_envs)]))
    env.reset(seed=opts.seed)
    return time_random_actions(env, "env-cleanrl", opts)


def run_config(config: str, opts: Options, profile: bool = False, quick: bool = False) -> RunResult:
    import torch

    torch.set_num_threads(opts.threads)
    if config == "env":
        return run_env(opts)
    if config in ("r2ac-rtrl", "r2ac-tbptt", "r2ac-rtrl-nchw", "r2ac-rtrl-async"):
        method = config.split("-")[1]
        return run_r2ac(
            opts, method, profile=profile, nchw_stem=config.endswith("-nchw"), async_actor=config.endswith("-async")
        )
    if config == "recurrentppo":
        return run_recurrentppo(opts)
    if config == "sample-factory":
        return run_sample_factory(opts)
    if config == "env-sf":
        return run_env_sf(opts)
    if config in ("cleanrl", "cleanrl-matched"):
        return run_cleanrl(opts, matched=config == "cleanrl-matched", quick=quick)
    if config == "env-cleanrl":
        return run_env_cleanrl(opts)
    raise ValueError(f"unknown configuration {config!r}; choose from {CONFIGS + OPTIONAL}")


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
def run_subprocess(
    config: str,
    opts: Options,
    profile: bool = False,
    python: str | None = None,
    quick: bool = False,
    timeout: float | None = None,
) -> RunResult:
    """One run of ``config`` in a fresh process of ``python`` (default: this interpreter) running this script."""
    cmd = [
        python or sys.executable,
        os.path.abspath(__file__),
        "--worker",
        config,
        "--worker-options",
        json.dumps(asdict(opts)),
    ]
    if profile:
        cmd.append("--profile")
    if quick:
        cmd.append("--quick")
    try:
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=REPO, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        sys.exit(f"FAIL: the {config} worker did not finish within {timeout:.0f} s:\n{err[-4000:]}")
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(_RESULT)]
    if out.returncode != 0 or not lines:
        sys.exit(f"FAIL: the {config} worker exited with {out.returncode}:\n{out.stderr[-4000:]}")
    return RunResult(**json.loads(lines[-1][len(_RESULT) :]))


@dataclass
class Summary:
    config: str
    frames_per_update: int
    update_s: float  # median over runs of each run's median
    min_s: float
    cpu_s: float  # median over runs of each run's median CPU time per update
    env_share: float | None  # None where not measured (sample-factory steps its envs in other processes)
    rollout_share: float | None
    runs: int
    fps_runs: list[float]  # each run's frames/s (from its median update)

    @property
    def fps(self) -> float:
        return self.frames_per_update / self.update_s

    @property
    def cpu_per_k(self) -> float:
        """CPU seconds per 1 k frames."""
        return 1000.0 * self.cpu_s / self.frames_per_update


def summarise(config: str, runs: list[RunResult]) -> Summary:
    med = statistics.median
    per_run = [med(r.update) for r in runs]

    def share(part: str) -> float | None:
        if not all(getattr(r, part) for r in runs):
            return None
        return med([sum(getattr(r, part)) / sum(r.update) for r in runs])

    frames = runs[0].frames_per_update
    return Summary(
        config,
        frames,
        med(per_run),
        min(min(r.update) for r in runs),
        med([med(r.cpu) for r in runs]),
        share("env"),
        share("rollout"),
        len(runs),
        [frames / u for u in per_run],
    )


def machine(threads: int, device: str = "cpu") -> str:
    import torch

    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from rtrl_vs_tbptt import machine as describe

    torch.set_num_threads(threads)
    return f"{describe(device)}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}"


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


def resolve_peers(args: argparse.Namespace) -> tuple[str | None, str | None, str | None]:
    """(sample-factory python, cleanrl python, cleanrl checkout) from --peers DIR and the explicit options."""
    sf_python, cleanrl_python, cleanrl_dir = args.sf_python, args.cleanrl_python, args.cleanrl_dir
    if args.peers:
        root = os.path.expanduser(args.peers)
        found = lambda *parts: p if os.path.exists(p := os.path.join(root, *parts)) else None  # noqa: E731
        sf_python = sf_python or found("sf-venv", "bin", "python")
        cleanrl_python = cleanrl_python or found("cleanrl-venv", "bin", "python")
        cleanrl_dir = cleanrl_dir or found("cleanrl")
    if cleanrl_dir and not os.path.exists(os.path.join(cleanrl_dir, CLEANRL_SCRIPT)):
        cleanrl_dir = None
    return sf_python, cleanrl_python, (cleanrl_dir if cleanrl_python else None)


PEER_SETUP = """the peers live in their own virtualenvs (see benchmarks/README.md#peers), e.g.
  python3 -m venv ~/peers/sf-venv && ~/peers/sf-venv/bin/pip install torch==2.13.0 sample-factory==2.1.1 gymnasium==0.29.1 ale-py==0.9.1 'numpy<2'
  python3 -m venv ~/peers/cleanrl-venv && ~/peers/cleanrl-venv/bin/pip install torch==2.13.0 gymnasium==0.29.1 ale-py==0.9.1 'numpy<2' tyro opencv-python-headless tensorboard
  git clone https://github.com/vwxyzjn/cleanrl ~/peers/cleanrl && git -C ~/peers/cleanrl checkout fe8d8a03
then pass --peers ~/peers (or set ONLINEREC_PEERS)"""


def not_like_for_like(atari_backend: str) -> str:
    """What differs between the systems beyond speed (printed under the tables)."""
    env = (
        "onlinerec ale-py's C++ vector env on ALE/<Game>-v5 (FIRE pressed at reset only: after a lost life the agent "
        "presses it itself, where the peers' wrappers press it; --atari-backend torchbeast gives the paper's Python "
        "stack, which does)"
        if atari_backend == "native"
        else "onlinerec the paper's Python wrapper stack (torchbeast's, FIRE after a lost life) over ALE/<Game>-v5"
        + (", one worker process per env" if atari_backend.endswith("-async") else "")
    )
    text = (
        "not like for like: sample-factory is asynchronous (its 2 rollout worker processes keep stepping while the "
        "learner trains; policy lag), as is r2ac-rtrl-async (one actor thread, one update behind); sample-factory's "
        "learner and workers use 1 torch thread each; the peers use gymnasium 0.29's Python Atari wrappers on "
        f"<Game>NoFrameskip-v4, {env}; no sticky actions anywhere; cores: R2AC an eLSTM, the peers a full LSTM; "
        "losses: R2AC V-trace actor-critic with RMSProp, the peers PPO's clipped loss with GAE and Adam; cleanrl as "
        "shipped: its own network (1 frame, fc 512, LSTM 128), 128 steps and 4 epochs x 4 minibatches per rollout. "
        "Compare the env-subtracted CPU cost for the agents."
    )
    return textwrap.fill(text, width=118, subsequent_indent="  ")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=PEER_SETUP
    )
    ap.add_argument("--env", default="ALE/Breakout-v5", help="Atari env id (default ALE/Breakout-v5)")
    ap.add_argument(
        "--atari-backend",
        choices=("native", "torchbeast", "torchbeast-async"),
        default="native",
        help="onlinerec's Atari env for env, R2AC and RecurrentPPO: ale-py's C++ vector env (default; no FIRE after "
        "a lost life) or the paper's Python wrapper stack (FIRE after a lost life, as the peers' wrappers), in this "
        "process or (torchbeast-async) in one worker process per env",
    )
    ap.add_argument("--num-envs", type=int, default=8, help="B, parallel envs (default 8)")
    ap.add_argument(
        "--M",
        type=int,
        default=None,
        help="rollout length = R2AC segment = RecurrentPPO n_steps = sample-factory rollout (default 32, quick: 8)",
    )
    ap.add_argument("--updates", type=int, default=None, help="timed updates per run (default 12, quick: 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed updates first (default 3, quick: 1)")
    ap.add_argument("--reps", type=int, default=None, help="runs per configuration, interleaved (default 5, quick: 1)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)")
    ap.add_argument(
        "--configs",
        default=None,
        help="comma-separated subset of: "
        + ",".join(CONFIGS + OPTIONAL)
        + " (default: "
        + ",".join(CONFIGS)
        + ", plus the peers that --peers finds)",
    )
    ap.add_argument(
        "--stem", choices=("nature", "impala"), default="nature", help="R2AC's stem (default nature, the peers' CNN)"
    )
    ap.add_argument(
        "--peers",
        default=os.environ.get("ONLINEREC_PEERS"),
        metavar="DIR",
        help="folder with sf-venv/, cleanrl-venv/ and a cleanrl checkout cleanrl/ (default $ONLINEREC_PEERS); "
        "adds the peers found there to the default configurations",
    )
    ap.add_argument("--sf-python", default=None, help="python of a virtualenv with sample-factory 2.1.1")
    ap.add_argument("--cleanrl-python", default=None, help="python of a virtualenv for cleanrl's ppo_atari_lstm.py")
    ap.add_argument("--cleanrl-dir", default=None, help="cleanrl checkout (cleanrl/ppo_atari_lstm.py, cleanrl_utils/)")
    ap.add_argument(
        "--sf-workers", type=int, default=2, help="sample-factory rollout worker processes (default 2, x 4 envs each)"
    )
    ap.add_argument(
        "--ppo-lstm",
        choices=("shared", "separate"),
        default="shared",
        help="RecurrentPPO: one LSTM for policy and value (matched to R2AC's one core; default) or SB3's default second critic LSTM",
    )
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="run onlinerec's and SB3's configurations in this process (default with --quick; peers always run in their own interpreter)",
    )
    ap.add_argument(
        "--profile", action="store_true", help="print where R2AC's time goes (RTRL and TBPTT) instead of the comparison"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: M = 8, 1 warm-up + 2 timed updates, 1 repetition, in process (cleanrl as shipped: 32 steps)",
    )
    ap.add_argument(
        "--worker-timeout", type=float, default=1200.0, help="seconds before a worker run is abandoned (default 1200)"
    )
    ap.add_argument(
        "--save",
        default=None,
        metavar="JSONL",
        help="append every run's per-update samples to this file as it finishes (a long run that fails keeps them)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--device",
        default="cpu",
        help="cpu (default) or cuda[:index]: where R2AC and RecurrentPPO learn and act (the envs step on the CPU)",
    )
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-options", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        opts = Options(**json.loads(args.worker_options))
        result = run_config(args.worker, opts, profile=args.profile, quick=args.quick)
        print(_RESULT + json.dumps(asdict(result)), flush=True)
        return

    sf_python, cleanrl_python, cleanrl_dir = resolve_peers(args)
    q = args.quick
    opts = Options(
        env_id=args.env,
        atari_backend=args.atari_backend,
        num_envs=args.num_envs,
        M=args.M or (8 if q else 32),
        warmup=args.warmup if args.warmup is not None else (1 if q else 3),
        updates=args.updates or (2 if q else 12),
        threads=args.threads,
        seed=args.seed,
        ppo_lstm=args.ppo_lstm,
        stem=args.stem,
        cleanrl_dir=os.path.abspath(cleanrl_dir) if cleanrl_dir else "",
        sf_workers=args.sf_workers,
        device=args.device,
    )
    if args.device != "cpu":
        if HERE not in sys.path:
            sys.path.insert(0, HERE)
        from rtrl_vs_tbptt import resolve_device

        resolve_device(args.device)
        if args.profile:
            ap.error(
                "--profile times R2AC's phases by the host's clock, which a GPU's queued work escapes: profile on the CPU"
            )
    if opts.warmup < 1:
        ap.error("--warmup must be >= 1 (the first update includes building the envs and the first reset)")
    reps = args.reps or (1 if q else 5)
    in_process = args.in_process or q
    if args.configs is None:
        configs = list(CONFIGS) + (list(PEERS_SF) if sf_python else []) + (list(PEERS_CLEANRL) if cleanrl_dir else [])
    else:
        configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS + OPTIONAL:
            ap.error(f"unknown configuration {c!r}; choose from {CONFIGS + OPTIONAL}")
        if c in PEERS_SF and not sf_python:
            ap.error(f"{c} needs sample-factory in its own virtualenv: --sf-python or --peers.\n{PEER_SETUP}")
        if c in PEERS_CLEANRL and not cleanrl_dir:
            ap.error(
                f"{c} needs cleanrl's script and a virtualenv for it: --cleanrl-python/--cleanrl-dir or --peers.\n{PEER_SETUP}"
            )
    if "recurrentppo" in configs:
        try:
            import sb3_contrib  # noqa: F401
        except ImportError:
            ap.error("recurrentppo needs sb3-contrib: pip install -e '.[bench]' (or leave it out with --configs)")
    python_of = {c: sf_python for c in PEERS_SF} | {c: cleanrl_python for c in PEERS_CLEANRL}

    print(f"machine: {machine(opts.threads, opts.device)}")
    print(f"load average before: {load()}")
    print(
        f"setup: {opts.env_id}, B = {opts.num_envs} envs, M = {opts.M} steps per update ({opts.M * opts.num_envs * FRAME_SKIP} frames), "
        f"{opts.warmup} warm-up + {opts.updates} timed updates per run, {reps} interleaved runs per configuration"
        f"{' (in process)' if in_process else ' (fresh subprocess each)'}; onlinerec Atari env: {opts.atari_backend}; R2AC stem: {opts.stem}; RecurrentPPO LSTM: {opts.ppo_lstm}; device: {opts.device}"
    )
    if sf_python or cleanrl_dir:
        print(f"peers: sample-factory {sf_python or '-'}; cleanrl {cleanrl_python or '-'} with {cleanrl_dir or '-'}")
    if args.profile:
        print_profile(opts, in_process)
        return

    def run_one(c: str) -> RunResult:
        if c in python_of:
            return run_subprocess(c, opts, python=python_of[c], quick=q, timeout=args.worker_timeout)
        if in_process:
            return run_config(c, opts, quick=q)
        return run_subprocess(c, opts, quick=q, timeout=args.worker_timeout)

    runs: dict[str, list[RunResult]] = {c: [] for c in configs}
    for rep in range(reps):
        order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
        for c in order:
            runs[c].append(run_one(c))
            if args.save:
                with open(args.save, "a") as fh:
                    fh.write(json.dumps({"rep": rep, **asdict(runs[c][-1])}) + "\n")
    summaries = {c: summarise(c, rs) for c, rs in runs.items()}
    report(summaries, runs, opts)


def report(summaries: dict[str, Summary], runs: dict[str, list[RunResult]], opts: Options) -> None:
    base = summaries.get("r2ac-rtrl")
    pct = lambda x: f"{'-':>6}" if x is None else f"{100 * x:>5.1f}%"  # noqa: E731

    def env_subtracted(c: str) -> float | None:
        env = summaries.get(ENV_OF.get(c, ""))
        return None if env is None or c.startswith("env") else summaries[c].cpu_per_k - env.cpu_per_k

    print()
    print(
        "per update (collect the rollout + one learner step; env*: M vector steps of random actions), medians over runs;"
        " cpu = CPU time of all threads (sample-factory: all its processes)"
    )
    print(
        f"{'config':<16} {'frames/s':>8} {'runs min..max':>13} {'frames':>6} {'s/update':>8} {'min s':>6} {'cpu s':>6} "
        f"{'cpu s/1k fr':>11} {'-env /1k':>8} {'env %':>6} {'rollout':>7} {'fps/rtrl':>8}"
    )
    for c, s in summaries.items():
        rel = f"{s.fps / base.fps:>8.2f}" if base else f"{'-':>8}"
        sub = env_subtracted(c)
        print(
            f"{c:<16} {s.fps:>8.0f} {min(s.fps_runs):>6.0f}..{max(s.fps_runs):<6.0f} {s.frames_per_update:>6} {s.update_s:>8.3f} "
            f"{s.min_s:>6.3f} {s.cpu_s:>6.3f} {s.cpu_per_k:>11.3f} {('-' if sub is None else f'{sub:.3f}'):>8} "
            f"{pct(s.env_share)} {pct(s.rollout_share):>7} {rel}"
        )
    for c, rs in runs.items():
        print(f"  {c:<14} per-run medians s/update: " + " ".join(f"{statistics.median(r.update):.3f}" for r in rs))
    print(f"load average after: {load()}")
    if any(c in summaries for c in PEERS_SF + PEERS_CLEANRL):
        print(not_like_for_like(opts.atari_backend))

    def fps_ratio(num: str, den: str, attr: str = "fps") -> str:
        if num not in summaries or den not in summaries:
            return "nan"
        a, b = summaries[num], summaries[den]
        if attr == "cpu":  # frames per CPU second
            return f"{b.cpu_per_k / a.cpu_per_k:.2f}"
        return f"{a.fps / b.fps:.2f}"

    def time_ratio(num: str, den: str, attr: str) -> str:
        if num not in summaries or den not in summaries:
            return "nan"
        return f"{getattr(summaries[num], attr) / getattr(summaries[den], attr):.2f}"

    peers = [("sample-factory", "sample_factory"), ("cleanrl-matched", "cleanrl"), ("cleanrl", "cleanrl_shipped")]
    extra_cpu = "".join(f" r2ac/{key}={fps_ratio('r2ac-rtrl', c, 'cpu')}" for c, key in peers if c in summaries)
    print(
        "same ratios from CPU time (frames per CPU second; less sensitive to waiting for a shared core): "
        f"r2ac/recurrentppo={fps_ratio('r2ac-rtrl', 'recurrentppo', 'cpu')} rtrl/tbptt_e2e={time_ratio('r2ac-rtrl', 'r2ac-tbptt', 'cpu_s')} "
        f"env_overhead={time_ratio('r2ac-rtrl', 'env', 'cpu_s')}{extra_cpu}"
    )
    costs = {c: env_subtracted(c) for c in summaries if env_subtracted(c) is not None}
    if costs:
        print(
            "env-subtracted CPU s per 1k frames (acting + learning, the env stack's own cost taken out): "
            + " ".join(f"{c}={v:.3f}" for c, v in costs.items())
        )
    goals = []
    for mine, key in (("r2ac-rtrl", "r2ac"), ("r2ac-rtrl-async", "r2ac_async")):
        if mine not in summaries:
            continue
        if "recurrentppo" in summaries:
            v = float(fps_ratio(mine, "recurrentppo"))
            goals.append(f"{key}/recurrentppo={v:.2f} (>= 2: {'met' if v >= 2 else 'not met'})")
        if "sample-factory" in summaries:
            v = float(fps_ratio(mine, "sample-factory"))
            goals.append(f"{key}/sample_factory={v:.2f} (>= 1.5: {'met' if v >= 1.5 else 'not met'})")
        if costs.get(mine) is not None and costs.get("cleanrl-matched"):
            v = costs[mine] / costs["cleanrl-matched"]
            goals.append(f"cost {key}/cleanrl_matched={v:.2f} (<= 0.8: {'met' if v <= 0.8 else 'not met'})")
    if goals:
        print("goals (wall-clock frames/s; cost: env-subtracted CPU): " + " ".join(goals))
    a = fps_ratio("r2ac-rtrl", "recurrentppo")
    b = time_ratio("r2ac-rtrl", "r2ac-tbptt", "update_s")
    c = time_ratio("r2ac-rtrl", "env", "update_s")
    extra = "".join(f" r2ac/{key}={fps_ratio('r2ac-rtrl', cfg)}" for cfg, key in peers if cfg in summaries)
    if "r2ac-rtrl-async" in summaries:
        extra += f" async/plain={fps_ratio('r2ac-rtrl-async', 'r2ac-rtrl')}"
        extra += "".join(
            f" r2ac_async/{key}={fps_ratio('r2ac-rtrl-async', cfg)}"
            for cfg, key in [("recurrentppo", "recurrentppo"), *peers]
            if cfg in summaries
        )
    print(f"ratios r2ac/recurrentppo={a} rtrl/tbptt_e2e={b} env_overhead={c}{extra}")


if __name__ == "__main__":
    main()
