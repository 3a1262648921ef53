"""``onlinerec stream``: one run of the streaming actor-critic, a plain loop of env steps with an update at each.

A plain Python loop, not Lightning's: at one update per env step the loop's own overhead matters, and
``benchmarks/streaming.py`` measures Lightning's loop and Fabric's at several times this loop's cost per step.

A run writes to its folder: ``config.json``, ``metrics.csv`` (a row every ``log_every`` steps), ``checkpoints/last.ckpt``,
``learning_curve.png`` and ``eval.json``. Checkpoints are written at the first episode end after every
``checkpoint_every`` steps, with the agent's weights, normaliser statistics, eligibility traces, the cores' carries
(state and sensitivities) and the random generator's state; every episode starts from a seed of its own, so a run
resumed from a checkpoint continues bit for bit as if it had never stopped.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from onlinerec.rl.experiment import ConfigError
from onlinerec.rl.resume import RunFolderError, flat_settings
from onlinerec.rl.runner import run_reporting_usage_errors
from onlinerec.rl.streaming.experiment import StreamExperiment, parse_stream_experiment

__all__ = ["load_agent", "main", "run_stream"]

RESUMABLE = frozenset(
    {"total_frames", "eval_episodes", "eval_envs", "eval_greedy", "eval_max_steps", "checkpoint_every", "log_every",
     "progress", "threads", "tensorboard", "resume", "out_dir"}
)  # fmt: skip
"""Settings a resumed run may change: budgets and reporting. Any other change is a different experiment."""

COLUMNS = ("frames", "episodes", "return", "abs_td_error", "steps_per_second")


def episode_seed(run_seed: int, episode: int) -> int:
    """The env seed of the run's ``episode``-th training episode (a stream of its own per episode, so that a resumed run
    replays exactly what an uninterrupted one sees)."""
    from onlinerec.rl.envs.base import run_env_seed, stream_seed

    return stream_seed(run_env_seed(run_seed, purpose="train"), episode)


def run_stream(cfg: StreamExperiment) -> dict[str, Any]:
    """Train, checkpoint, evaluate and plot one streaming run; returns the evaluation's statistics and where the run
    wrote."""
    from onlinerec.rl.envs import make_vector_env
    from onlinerec.rl.monitor import ProgressLines
    from onlinerec.rl.streaming.agent import StreamAC
    from onlinerec.training.checkpoint import atomic_torch_save, load_checkpoint_file

    out = cfg.run_dir
    ckpt_path = out / "checkpoints" / "last.ckpt"
    config = _config_dict(cfg)
    resuming = _check_run_folder(out, config, ckpt_path, cfg.resume)
    finished = _finished_run(out, int(cfg.total_frames))
    if finished is not None:  # running it again would only replay it: its results stay as they are
        if "eval" not in finished and cfg.eval_episodes > 0:  # training ended but its evaluation did not
            finished["eval"] = _evaluate(cfg, load_agent(out))
            finished["evaluated_now"] = True
            (out / "eval.json").write_text(json.dumps(finished["eval"], indent=1))
            _plot(cfg, out)
        return finished
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    try:  # before anything is written: an env or settings that build no agent leave no folder behind
        env = make_vector_env(cfg.env, 1, seed=episode_seed(cfg.seed, 0), **cfg.env_kwargs)
        agent = StreamAC(
            env.single_observation_space,
            env.single_action_space,
            cfg.stream,
            cell=cfg.cell,
            hidden_size=cfg.hidden_size,
            layers=cfg.layers,
            cell_kwargs=dict(cfg.cell_kwargs),
            method=cfg.method,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from err
    frames, episodes, returns = 0, 0, deque(maxlen=cfg.return_window)
    if resuming:
        saved = load_checkpoint_file(ckpt_path, map_location="cpu")  # loaded into the agent wherever it is
        agent.load_state_dict(saved["agent"])
        agent.load_learner_state(saved["learner"])
        torch.set_rng_state(saved["rng"])
        frames, episodes = int(saved["frames"]), int(saved["episodes"])
        returns.extend(float(r) for r in saved["returns"])
        resumed_abs_delta = float(saved["abs_delta"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    log = _MetricsLog(out / "metrics.csv", keep_until=frames)
    total = int(cfg.total_frames)
    progress = ProgressLines(total) if cfg.progress else None
    abs_delta = resumed_abs_delta if resuming else 0.0  # the TD errors since the last row, which the next row averages
    next_log, next_ckpt = _next_multiple(frames, cfg.log_every), _next_multiple(frames, cfg.checkpoint_every)
    obs, _ = env.reset(seed=episode_seed(cfg.seed, episodes))
    x, reset = agent.observe(obs[0]), True
    start, start_frames = time.perf_counter(), frames
    while frames < total:
        action = agent.act(x, reset)
        obs, reward, terminated, truncated, info = env.step(action.cpu().numpy())
        frames += 1
        term, done = bool(terminated[0]), bool(terminated[0] or truncated[0])
        if term:
            x_next = None
        elif done:  # a time limit: the TD target bootstraps from the episode's last observation
            final = info.get("final_obs")
            x_next = agent.observe(final[0]) if final is not None and cfg.stream.bootstrap_truncation else None
        else:
            x_next = agent.observe(obs[0])
        delta = agent.learn(float(reward[0]), x_next, term or (done and x_next is None), done)
        abs_delta += abs(float(delta))
        episode_end = bool(info["episode_end"][0])
        if episode_end:  # every episode starts from a seed of its own (what makes a resumed run replay this one)
            episodes += 1
            returns.append(float(info["episode_return"][0]))
            obs, _ = env.reset(seed=episode_seed(cfg.seed, episodes))
        if frames >= next_log or frames == total:
            elapsed = time.perf_counter() - start
            mean_return = sum(returns) / len(returns) if returns else float("nan")
            rate = (frames - start_frames) / max(elapsed, 1e-9)
            log.write(frames, episodes, mean_return, abs_delta / max(1, frames - log.last_frames), rate)
            abs_delta, next_log = 0.0, _next_multiple(frames, cfg.log_every)
            if progress is not None:
                progress.update(frames, mean_return, force=frames == total)
        if episode_end and frames >= next_ckpt:  # between episodes: a resumed run needs nothing but the checkpoint
            next_ckpt = _next_multiple(frames, cfg.checkpoint_every)
            _save(atomic_torch_save, ckpt_path, agent, frames, episodes, returns, abs_delta)
            log.flush()
        if done:  # the next episode's (or life's) first observation
            x_next = agent.observe(obs[0])
        x, reset = x_next, done
    log.close()
    _save(atomic_torch_save, out / "checkpoints" / "final.ckpt", agent, frames, episodes, returns, abs_delta)
    result = {"frames": frames, "episodes": episodes, "run_dir": str(out)}
    if cfg.eval_episodes > 0:
        result["eval"] = _evaluate(cfg, agent)
        (out / "eval.json").write_text(json.dumps(result["eval"], indent=1))
    _plot(cfg, out)
    env.close()
    return result


def load_agent(run_dir: str | Path, checkpoint: str = "final"):
    """The agent a run trained, rebuilt from its folder's ``config.json`` and ``checkpoints/<checkpoint>.ckpt``
    ("final": where training ended; "last": the last checkpoint between episodes), e.g. to export its policy."""
    from onlinerec.config import config_from_dict
    from onlinerec.rl.envs import spaces
    from onlinerec.rl.streaming.agent import StreamAC
    from onlinerec.training.checkpoint import load_checkpoint_file

    run_dir = Path(run_dir)
    cfg = config_from_dict(StreamExperiment, json.loads((run_dir / "config.json").read_text()))
    observation_space, action_space = spaces(cfg.env, **cfg.env_kwargs)
    agent = StreamAC(
        observation_space, action_space, cfg.stream, cell=cfg.cell, hidden_size=cfg.hidden_size, layers=cfg.layers,
        cell_kwargs=dict(cfg.cell_kwargs), method=cfg.method,
    )  # fmt: skip
    saved = load_checkpoint_file(run_dir / "checkpoints" / f"{checkpoint}.ckpt", map_location="cpu")
    agent.load_state_dict(saved["agent"])
    agent.load_learner_state(saved["learner"])
    return agent


def _config_dict(cfg: StreamExperiment) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(cfg), default=str))


def _check_run_folder(out: Path, config: dict[str, Any], ckpt_path: Path, resume: bool) -> bool:
    """Whether to resume: a folder with a checkpoint of the same experiment (only :data:`RESUMABLE` settings may
    differ). A folder with another experiment, or any run when ``resume`` is off, is refused before anything is
    written."""
    stored_path = out / "config.json"
    if not stored_path.exists():
        return False
    if not resume:
        raise RunFolderInUse(
            f"{out} already holds a run; give this run a folder of its own (--out_dir), or continue that one "
            "(--resume true)."
        )
    stored = json.loads(stored_path.read_text())
    # a setting added to the algorithm after that run was made: the run had its default
    stored["stream"] = {**_config_dict(StreamExperiment())["stream"], **stored.get("stream", {})}
    old, new = flat_settings(stored, ("stream",)), flat_settings(config, ("stream",))
    changed = [k for k in sorted(set(old) | set(new)) if k not in RESUMABLE and old.get(k) != new.get(k)]
    if changed:
        detail = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed)
        raise RunFolderInUse(
            f"{out} holds a run with other settings ({detail}); only budgets and reporting may change when a run "
            "continues. Give this run a folder of its own (--out_dir)."
        )
    return ckpt_path.exists()


def _finished_run(out: Path, total: int) -> dict[str, Any] | None:
    """What ``out`` holds if the same experiment already finished there with at least ``total`` frames (the caller
    has checked that the folder holds this experiment), else None."""
    from onlinerec.training.checkpoint import load_checkpoint_file

    final = out / "checkpoints" / "final.ckpt"
    if not (out / "config.json").exists() or not final.exists():
        return None
    saved = load_checkpoint_file(final, map_location="cpu")
    if int(saved["frames"]) < total:
        return None
    result = {"frames": int(saved["frames"]), "episodes": int(saved["episodes"]), "run_dir": str(out),
              "finished_before": True}  # fmt: skip
    if (out / "eval.json").exists():
        result["eval"] = json.loads((out / "eval.json").read_text())
    return result


class RunFolderInUse(RunFolderError):
    """The run's folder holds another experiment (a usage error: ``onlinerec stream`` exits with status 2)."""


def _next_multiple(frames: int, every: int) -> int:
    return (frames // every + 1) * every


def _save(save, path: Path, agent, frames: int, episodes: int, returns, abs_delta: float) -> None:
    save(
        {
            "abs_delta": abs_delta,
            "agent": agent.state_dict(),
            "learner": agent.learner_state(),
            "rng": torch.get_rng_state(),
            "frames": frames,
            "episodes": episodes,
            "returns": list(returns),
        },
        path,
    )


class _MetricsLog:
    """``metrics.csv``: a row every ``log_every`` steps. A resumed run first drops the rows its checkpoint does not
    cover (they are logged again, identically, as the run replays them)."""

    def __init__(self, path: Path, keep_until: int) -> None:
        rows = []
        if path.exists() and keep_until > 0:
            with open(path, newline="") as fh:
                rows = [r for r in csv.DictReader(fh) if float(r["frames"]) <= keep_until]
        tmp = path.with_suffix(".csv.tmp")  # the kept rows are on disk before the old file goes: a crash loses nothing
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, path)
        self.fh = open(path, "a", newline="")  # noqa: SIM115 - kept open for the run
        self.writer = csv.DictWriter(self.fh, fieldnames=COLUMNS)
        self.last_frames = int(float(rows[-1]["frames"])) if rows else 0

    def write(self, frames: int, episodes: int, mean_return: float, abs_td_error: float, steps_per_second: float):
        self.writer.writerow(
            {"frames": frames, "episodes": episodes, "return": mean_return, "abs_td_error": abs_td_error,
             "steps_per_second": round(steps_per_second, 1)}
        )  # fmt: skip
        self.last_frames = frames

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def _evaluate(cfg: StreamExperiment, agent) -> dict[str, Any]:
    """Greedy (or sampled) episodes on evaluation streams of their own, the policy's weights fixed."""
    from onlinerec.rl.envs import make_vector_env
    from onlinerec.rl.envs.base import run_env_seed
    from onlinerec.rl.evaluation import evaluate
    from onlinerec.rl.streaming.policy import EvaluationActor

    env = make_vector_env(
        cfg.env, cfg.eval_envs, seed=run_env_seed(cfg.seed, purpose="eval"), **{**cfg.env_kwargs, **cfg.eval_env_kwargs}
    )
    try:
        return evaluate(
            EvaluationActor(agent), env, cfg.eval_episodes, greedy=cfg.eval_greedy, max_steps=cfg.eval_max_steps
        )
    finally:
        env.close()


def _plot(cfg: StreamExperiment, out: Path) -> None:
    from onlinerec.rl.curves import plot_learning_curves

    label = f"{cfg.method} {cfg.cell if cfg.cell is not None else 'feed-forward'}"
    try:
        plot_learning_curves({label: [out]}, out / "learning_curve.png", title=f"{cfg.env} (streaming)")
    except ValueError:  # no finished episode to draw
        pass


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_stream_experiment(argv)
    status, result = run_reporting_usage_errors("onlinerec stream", cfg.env, lambda: run_stream(cfg))
    if status:
        return status
    if result.get("evaluated_now"):
        print(
            f"onlinerec stream: {result['run_dir']} holds this run, trained to {result['frames']:,} frames; evaluated it."
        )
    elif result.get("finished_before"):
        print(
            f"onlinerec stream: {result['run_dir']} already holds this run, finished at {result['frames']:,} frames; "
            "nothing to do (a larger --total_frames continues it, a new --out_dir starts another)."
        )
    evaluation = result.get("eval")
    summary = f"; evaluation {evaluation['mean']:.3f} +- {evaluation['std']:.3f}" if evaluation else ""
    print(
        f"onlinerec stream: {result['frames']:,} steps, {result['episodes']:,} episodes{summary}; in {result['run_dir']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
