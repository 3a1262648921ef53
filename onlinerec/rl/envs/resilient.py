"""A SAME_STEP vector env whose per-env workers are restarted when they crash or hang.

Each stream runs a single ``gymnasium.Env`` in its own worker process. A step waits at most ``step_timeout``
seconds for every worker; a worker that raised, died, or did not answer in time is killed and replaced by a fresh
env (built again from its ``env_fn`` and reset with a new seed). Its slot returns the fresh env's first
observation with reward 0 and ``truncated = True`` — under the SAME_STEP contract that flags the stream *reset
before the next step*, so the learner zeroes its carried state — and ``info["restarted"]`` is True there. The
other streams are untouched, the run continues, and the event is logged (``logging`` logger
``onlinerec.rl.envs.resilient``, level WARNING) and recorded in :attr:`ResilientVectorEnv.events`.

Used as the vector backend of single-env families (``vectorization="resilient"``); ale-py's native Atari vector
env has no per-env workers to restart.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import CloudpickleWrapper, batch_space, concatenate, create_empty_array

from onlinerec.rl.envs.base import stream_seed, stream_seeds

__all__ = ["EnvRestart", "ResilientVectorEnv"]

log = logging.getLogger("onlinerec.rl.envs.resilient")


@dataclass(frozen=True)
class EnvRestart:
    """One restart: when (the vector env's step count), which stream, why, and how often it has restarted."""

    step: int
    env_index: int
    reason: str
    restarts: int


def _worker(conn, env_fn: CloudpickleWrapper) -> None:
    env = None
    try:
        env = env_fn()
        while True:
            cmd, data = conn.recv()
            if cmd == "reset":
                seed, options = data
                conn.send(("ok", env.reset(seed=seed, options=options)))
            elif cmd == "step":
                obs, reward, terminated, truncated, info = env.step(data)
                if terminated or truncated:  # SAME_STEP: this step already shows the next episode's first observation
                    info = dict(info, final_obs=obs)
                    obs, _ = env.reset()
                conn.send(("ok", (obs, reward, terminated, truncated, info)))
            elif cmd == "spaces":
                conn.send(("ok", (env.observation_space, env.action_space, dict(env.metadata))))
            elif cmd == "close":
                conn.send(("ok", None))
                break
    except (EOFError, KeyboardInterrupt):
        pass
    except BaseException as err:  # noqa: BLE001  (every failure goes back to the parent, which restarts us)
        try:
            conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=5)}"))
        except (BrokenPipeError, OSError):
            pass
    finally:
        if env is not None:
            with contextlib.suppress(Exception):  # a worker that is going away anyway
                env.close()
        conn.close()


class _Failure(Exception):
    pass


class ResilientVectorEnv(VectorEnv):
    """SAME_STEP vector env over per-env worker processes that are restarted on a crash or a hang.

    Args:
        env_fns: one callable per stream that builds a single ``gymnasium.Env`` (called in the worker process).
        step_timeout: seconds a step (or reset) may take before the worker is declared hung and replaced.
        max_restarts: most restarts of one stream in a row without a successful step in between; beyond it
            the env is declared broken and ``RuntimeError`` is raised (a deterministic crash would otherwise
            loop forever). ``None``: no limit.
        seed: env seed; stream i is seeded with ``stream_seed(seed, i)`` and its k-th replacement env with
            ``stream_seed(stream_seed(seed, i), 0, restart=k)`` (deterministic, and unrelated to the crashed episode's).
        context: multiprocessing start method (``"fork"``, ``"spawn"``, ``"forkserver"``; default: the platform's).

    Attributes:
        restart_counts: restarts so far, per stream.
        events: every :class:`EnvRestart`, in order. ``info["restarted"]`` marks them step by step.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gymnasium.Env]],
        *,
        step_timeout: float = 60.0,
        max_restarts: int | None = 10,
        seed: int | None = None,
        context: str | None = None,
    ) -> None:
        super().__init__()
        if len(env_fns) < 1:
            raise ValueError("ResilientVectorEnv needs at least one env_fn.")
        if not step_timeout > 0:
            raise ValueError(f"step_timeout must be > 0 seconds, got {step_timeout!r}.")
        self.env_fns = list(env_fns)
        self.num_envs = len(self.env_fns)
        self.step_timeout = float(step_timeout)
        self.max_restarts = max_restarts
        self.base_seed = seed
        self._stream_seeds: list[int | None] = (
            [None] * len(self.env_fns) if seed is None else [int(s) for s in stream_seeds(seed, len(self.env_fns))]
        )
        self._ctx = mp.get_context(context)
        self.restart_counts = [0] * self.num_envs
        self._failures_in_a_row = [0] * self.num_envs
        self.events: list[EnvRestart] = []
        self._steps = 0
        self._actions: np.ndarray | None = None
        self._closed = False

        self._procs: list[Any] = [None] * self.num_envs
        self._conns: list[Any] = [None] * self.num_envs
        for i in range(self.num_envs):
            self._start(i)
        obs_space, act_space, meta = self._call(0, "spaces", None)
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.observation_space = batch_space(obs_space, self.num_envs)
        self.action_space = batch_space(act_space, self.num_envs)
        self.metadata = {**meta, "autoreset_mode": AutoresetMode.SAME_STEP}

    # -- workers ------------------------------------------------------------------------------------------------
    def _start(self, i: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child, CloudpickleWrapper(self.env_fns[i])), daemon=True)
        proc.start()
        child.close()
        self._procs[i], self._conns[i] = proc, parent

    def _kill(self, i: int) -> None:
        proc, conn = self._procs[i], self._conns[i]
        if conn is not None:
            conn.close()
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        self._procs[i] = self._conns[i] = None

    def _receive(self, i: int, deadline: float) -> Any:
        conn = self._conns[i]
        try:
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                raise _Failure(f"no reply within {self.step_timeout:g} s (hung)")
            status, payload = conn.recv()
        except (EOFError, OSError, BrokenPipeError) as err:
            code = None
            if self._procs[i] is not None:
                self._procs[i].join(1.0)  # reap it, to report how it ended
                code = self._procs[i].exitcode
            raise _Failure(f"worker process died (exit code {code})") from err
        if status == "error":
            raise _Failure(f"raised {payload.strip().splitlines()[0]}")
        return payload

    def _call(self, i: int, cmd: str, data: Any) -> Any:
        try:
            self._conns[i].send((cmd, data))
        except (BrokenPipeError, OSError) as err:
            raise _Failure("worker process died") from err
        return self._receive(i, time.monotonic() + self.step_timeout)

    def _restart(self, i: int, reason: str) -> tuple[Any, dict]:
        """Replace worker i until a fresh env resets; returns its first observation and info."""
        while True:
            self.restart_counts[i] += 1
            self._failures_in_a_row[i] += 1
            event = EnvRestart(self._steps, i, reason, self.restart_counts[i])
            self.events.append(event)
            log.warning(
                "env worker %d %s at vector step %d; restarted it (restart #%d), its stream is flagged reset.",
                i,
                reason,
                self._steps,
                self.restart_counts[i],
            )
            if self.max_restarts is not None and self._failures_in_a_row[i] > self.max_restarts:
                self._kill(i)
                raise RuntimeError(
                    f"env worker {i} failed {self._failures_in_a_row[i]} times in a row (last: {reason}); giving up. "
                    "Fix the env, or raise max_restarts / step_timeout of ResilientVectorEnv."
                )
            self._kill(i)
            self._start(i)
            base = self._stream_seeds[i]
            seed = None if base is None else stream_seed(base, 0, restart=self.restart_counts[i])
            try:
                return self._call(i, "reset", (seed, None))
            except _Failure as err:
                reason = f"{err} while restarting"

    # -- VectorEnv API ------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None):
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(s) for s in stream_seeds(int(seed), self.num_envs)]
            self.base_seed = int(seed)
            self._stream_seeds = list(seeds)
        else:
            seeds = [None if s is None else int(s) for s in seed]
            self._stream_seeds = [old if new is None else new for old, new in zip(self._stream_seeds, seeds)]
        if options is not None and "reset_mask" in options:
            raise NotImplementedError(
                "ResilientVectorEnv.reset(options={'reset_mask': ...}) is not supported; reset all streams."
            )
        failed: dict[int, str] = {}
        for i in range(self.num_envs):
            try:
                self._conns[i].send(("reset", (seeds[i], options)))
            except (BrokenPipeError, OSError):
                failed[i] = "worker process died"
        deadline = time.monotonic() + self.step_timeout
        results: dict[int, tuple[Any, dict]] = {}
        for i in range(self.num_envs):
            if i not in failed:
                try:
                    results[i] = self._receive(i, deadline)
                except _Failure as err:
                    failed[i] = str(err)
        restarted = np.zeros(self.num_envs, dtype=bool)
        for i, reason in failed.items():
            results[i] = self._restart(i, reason)
            restarted[i] = True
        obs = self._batch([results[i][0] for i in range(self.num_envs)])
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            infos = self._add_info(infos, results[i][1], i)
        infos["restarted"] = restarted
        return obs, infos

    def step(self, actions):
        actions = np.asarray(actions)
        if actions.shape[:1] != (self.num_envs,):
            raise ValueError(
                f"actions must have one entry per stream, shape ({self.num_envs}, ...); got {actions.shape}."
            )
        self._steps += 1
        failed: dict[int, str] = {}
        for i in range(self.num_envs):
            try:
                self._conns[i].send(("step", actions[i]))
            except (BrokenPipeError, OSError):
                failed[i] = "worker process died"
        deadline = time.monotonic() + self.step_timeout
        results: dict[int, Any] = {}
        for i in range(self.num_envs):
            if i in failed:
                continue
            try:
                results[i] = self._receive(i, deadline)
                self._failures_in_a_row[i] = 0
            except _Failure as err:
                failed[i] = str(err)
        restarted = np.zeros(self.num_envs, dtype=bool)
        for i, reason in failed.items():
            obs, info = self._restart(i, reason)
            results[i] = (obs, 0.0, False, True, dict(info))
            restarted[i] = True
        ordered = [results[i] for i in range(self.num_envs)]
        obs = self._batch([r[0] for r in ordered])
        rewards = np.array([r[1] for r in ordered], dtype=np.float64)
        terminated = np.array([r[2] for r in ordered], dtype=bool)
        truncated = np.array([r[3] for r in ordered], dtype=bool)
        infos: dict[str, Any] = {}
        for i, r in enumerate(ordered):
            infos = self._add_info(infos, r[4], i)
        infos["restarted"] = restarted
        return obs, rewards, terminated, truncated, infos

    def _batch(self, observations: list[Any]) -> Any:
        space = self.single_observation_space
        return concatenate(space, observations, create_empty_array(space, self.num_envs))

    def close_extras(self, **kwargs: Any) -> None:
        if self._closed:
            return
        self._closed = True
        for i in range(self.num_envs):
            if self._conns[i] is None:
                continue
            try:
                self._conns[i].send(("close", None))
                self._conns[i].poll(1.0)
            except (BrokenPipeError, OSError, EOFError):
                pass
            self._kill(i)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: modules may already be gone
            self.close()
