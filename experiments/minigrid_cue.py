"""Does an agent use MiniGrid-Memory's cue? Plays episodes with trained agents and splits them by what they saw.

In ``MiniGrid-Memory*`` the agent starts in a small room, facing the hallway, with the cue object (a key or a ball)
in the room's corner behind it. It sees the cue at its first step only when it starts on the room's first column
(about a fifth of the starts on ``MiniGrid-MemoryS7-v0``); otherwise it has to turn to see it. At the hallway's end it
sees both objects and must walk to the one that matches the cue; the other ends the episode with 0. So a policy that
walks to either object at random scores about 0.48-0.51 whatever it remembers, and a score above that needs memory.

With ``--references`` it first plays three hand-written policies (:class:`ScriptedAgent`): one that ignores the
cue, one that remembers it when it saw it at its first step, and one that turns to look at it first.

For each agent this prints, over ``--episodes`` episodes on env streams of their own (``run_env_seed(seed,
purpose="diagnostic")``: neither training's nor the evaluation's), with greedy and with sampled actions:

- how often the cue was in view at the first step, and at any step before the episode ended;
- the success rate (walked to the matching object) when the cue had been seen and when it had not, and the timeouts;
- for R2AC, its critic's value of the last step of the episodes in which it had seen the cue, split by success and
  failure: one step before the end the outcome is decided, so a critic that remembers the cue tells them apart (about
  0.97 against 0), and one that does not gives both the same value.

A policy that remembers the cue succeeds far more often when it saw it than when it did not (where it can only
guess: about 50 %); one that ignores it succeeds about as often either way. Usage::

    python experiments/minigrid_cue.py runs/memory_suite/r2ac/MiniGridMemoryS7/<arm>-seed0 \\
        runs/memory_suite/runs/MiniGridMemoryS7/ppo_lstm/seed0.zip

An R2AC agent is an ``onlinerec rl`` output folder (its ``config.json`` and ``checkpoints/last.ckpt``); a
RecurrentPPO agent is the ``seed<k>.zip`` that ``memory_suite.py`` saves beside the run's JSON (with its
``seed<k>.vecnormalize.pkl`` if the arm normalised observations).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np

ENV = "MiniGrid-MemoryS7-v0"


class R2ACAgent:
    """An ``onlinerec rl`` run's trained R2AC, acting on its own carried state (stream "cue")."""

    def __init__(self, run_dir: Path) -> None:
        from onlinerec.rl.r2ac import R2AC

        config = json.loads((run_dir / "config.json").read_text())
        ckpt = run_dir / "checkpoints" / "last.ckpt"
        if not ckpt.is_file():
            raise FileNotFoundError(f"{run_dir} has no checkpoints/last.ckpt: is it an onlinerec rl run folder?")
        self.env, self.seed = str(config["env"]).removeprefix("minigrid:"), int(config["seed"])
        self.env_kwargs = dict(config.get("env_kwargs") or {})  # its wrappers (e.g. CueInView) play here too
        self.model = R2AC.load_from_checkpoint(str(ckpt), map_location="cpu").eval()  # weights only: runs no code
        self.model.reset_streams("cue")

    def act(self, obs: np.ndarray, reward: np.ndarray, reset: np.ndarray, greedy: bool) -> np.ndarray:
        """``R2AC.act`` written out, keeping the critic's value of this step as :attr:`value`."""
        import torch

        m = self.model
        with torch.no_grad():
            x = m.features(torch.as_tensor(obs).unsqueeze(0), torch.as_tensor(reward).unsqueeze(0))
            params, value = m.heads(m(x, torch.as_tensor(reset).unsqueeze(0), "cue")[0])
        self.value = float(value[0])
        return (m.policy.mode(params) if greedy else m.policy.sample(params)).numpy()


class RecurrentPPOAgent:
    """A RecurrentPPO policy saved by ``memory_suite.py`` (``seed<k>.zip``, its JSON beside it)."""

    def __init__(self, path: Path) -> None:
        import pickle

        from sb3_contrib import RecurrentPPO

        record = json.loads(path.with_suffix(".json").read_text()) if path.with_suffix(".json").is_file() else {}
        self.record = record  # the run's JSON (its config and seed), for scripts that read other envs
        self.env = str(record.get("config", {}).get("env", ENV)).removeprefix("minigrid:")
        self.seed = int(record.get("seed", 0))
        self.model = RecurrentPPO.load(str(path), device="cpu")
        stats = path.with_suffix(".vecnormalize.pkl")
        self.normalize = pickle.loads(stats.read_bytes()).normalize_obs if stats.is_file() else None  # noqa: S301
        self.state = None

    def act(self, obs: np.ndarray, reward: np.ndarray, reset: np.ndarray, greedy: bool) -> np.ndarray:
        seen = obs if self.normalize is None else self.normalize(obs)
        action, self.state = self.model.predict(seen, state=self.state, episode_start=reset, deterministic=greedy)
        return np.asarray(action)


KEY, BALL = 5, 6  # MiniGrid's object indices
LEFT, RIGHT, FORWARD = 0, 1, 2


def cue_cell(memory_env: Any) -> tuple[int, int]:
    """Where ``MemoryEnv`` puts the cue: the start room's top-left corner."""
    return 1, memory_env.height // 2 - 1


class ScriptedAgent:
    """Hand-written MiniGrid-MemoryS7 policies whose scores say what memory is worth (``--references``):

    - ``ignore``: walks down the hallway and, at the split, always turns to the object on its left;
    - ``remember``: the same, but turns to the object that matches the cue when it saw the cue at its first step;
    - ``look``: first turns left, which brings the cue into view from any start, reads it, turns back, walks, and
      turns to the matching object.

    It reads the channels-first view ``obs[0][i][j]``, where the agent stands at (3, 6) facing up: (2, 6) is the cell
    on its left (the cue, for a start on the room's first column), (1, 6) and (5, 6) the cells two to each side (the
    two objects, at the split), and row 5 the cells one ahead (the cue at i <= 3 after the first left turn)."""

    def __init__(self, policy: str, env: str = ENV, seed: int = 0) -> None:
        if policy not in ("ignore", "remember", "look"):
            raise ValueError(f"policy must be 'ignore', 'remember' or 'look', got {policy!r}")
        self.policy, self.env, self.seed = policy, env, seed
        self.cue, self.phase = None, "walk"

    def act(self, obs: np.ndarray, reward: np.ndarray, reset: np.ndarray, greedy: bool) -> np.ndarray:
        view = obs[0, 0]
        if reset[0]:
            self.cue = view[2][6] if view[2][6] in (KEY, BALL) and self.policy == "remember" else None
            self.phase = "turned" if self.policy == "look" else "walk"
            return np.array([LEFT]) if self.policy == "look" else self._walk(view)
        if self.phase == "turned":  # facing the room's top wall: the cue is one row ahead, left of centre
            self.cue = next((v for v in view[:4, 5] if v in (KEY, BALL)), None)
            self.phase = "walk"
            return np.array([RIGHT])
        return self._walk(view)

    def _walk(self, view: np.ndarray) -> np.ndarray:
        if self.phase == "chosen":
            return np.array([FORWARD])
        if view[1][6] in (KEY, BALL) and view[5][6] in (KEY, BALL):  # at the split
            self.phase = "chosen"
            target = view[1][6] if self.cue is None else self.cue
            return np.array([LEFT if view[1][6] == target else RIGHT])
        return np.array([FORWARD])


class CueInView(gymnasium.Wrapper):
    """A gymnasium wrapper for MiniGrid-Memory that answers "is memory the obstacle?": when the agent sees the cue at
    its first step, the cue's object index is written into the top-left cell of every later view of that episode
    (a corner that otherwise shows wall or nothing), so using it needs no memory, only the comparison with the
    layout. Train with ``onlinerec rl ... --env_kwargs '{wrappers: [{class_path: minigrid_cue.CueInView}]}'`` (with
    ``experiments/`` on ``PYTHONPATH``); this script plays such a run with the same wrapper. A policy that uses the
    cue then scores like the ``remember`` script (0.62), one that does not like ``ignore`` (0.51)."""

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        u = self.env.unwrapped
        cell = cue_cell(u)
        self.cue = (KEY if u.grid.get(*cell).type == "key" else BALL) if u.agent_sees(*cell) else None
        return self._mark(obs), info

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._mark(obs), reward, terminated, truncated, info

    def _mark(self, obs: dict[str, Any]) -> dict[str, Any]:
        if self.cue is not None:
            obs = {**obs, "image": obs["image"].copy()}
            obs["image"][0, 0, 0] = self.cue
        return obs


def load_agent(path: Path) -> R2ACAgent | RecurrentPPOAgent:
    if path.suffix == ".zip":
        return RecurrentPPOAgent(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is neither an onlinerec rl run folder (config.json) nor a RecurrentPPO .zip")
    return R2ACAgent(path)


def cue_statistics(agent: Any, episodes: int, seed: int, *, greedy: bool) -> dict[str, float]:
    """Play ``episodes`` episodes of the agent's env (one env, its own seeded stream) and return the share of episodes
    in which the cue was seen (at the first step; before the end), the success rates with and without a sighting, the
    timeout share and the mean return."""
    import torch

    from onlinerec.rl.envs import make_vector_env

    torch.manual_seed(seed)  # both agents sample their actions with torch: the same figures on every call
    # the adapter both agents trained on (channels-first symbolic view), with the run's own wrappers
    env = make_vector_env(agent.env, 1, seed=seed, **getattr(agent, "env_kwargs", {}))
    inner = env.env.envs[0].unwrapped  # SameStepEnv -> SyncVectorEnv -> the MemoryEnv itself
    obs, _ = env.reset()
    if not hasattr(inner, "agent_sees") or not hasattr(inner, "success_pos"):
        raise ValueError(f"{agent.env} is not a MiniGrid-Memory env")
    rows = []
    reward, reset = np.zeros(1, np.float32), np.ones(1, bool)
    seen_first, seen, steps = None, False, 0
    while len(rows) < episodes:
        sighted = bool(inner.agent_sees(*cue_cell(inner)))
        seen_first = sighted if seen_first is None else seen_first
        seen = seen or sighted
        obs, reward, terminated, truncated, _ = env.step(agent.act(obs, reward, reset, greedy))
        steps += 1
        reset, reward = terminated | truncated, reward.astype(np.float32)
        if reset[0]:
            value = getattr(agent, "value", float("nan"))  # the critic's value of the last step (R2AC only)
            rows.append((seen_first, seen, float(reward[0]) > 0, bool(truncated[0]), float(reward[0]), steps, value))
            seen_first, seen, steps = None, False, 0
    env.close()
    first, ever, success, timeout, returns, lengths, values = (np.asarray(c) for c in zip(*rows, strict=True))

    nan = float("nan")

    def rate(mask: np.ndarray) -> float:
        return float(success[mask].mean()) if mask.any() else nan

    return {
        "episodes": len(rows),
        "cue_seen_first_step": float(first.mean()),
        "cue_seen": float(ever.mean()),
        "success_if_seen": rate(ever),
        "success_if_not_seen": rate(~ever),
        "success": float(success.mean()),
        "timeouts": float(timeout.mean()),
        "return": float(returns.mean()),
        "length": float(lengths.mean()),
        # a critic that remembers the cue knows, one step before a seen-cue episode ends, whether it will succeed
        "value_last_step_if_seen_success": float(values[ever & success].mean()) if (ever & success).any() else nan,
        "value_last_step_if_seen_failure": float(values[ever & ~success].mean()) if (ever & ~success).any() else nan,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("agents", nargs="*", type=Path, help="onlinerec rl run folders or RecurrentPPO .zip files")
    parser.add_argument("--references", action="store_true", help="also the scripted policies (ScriptedAgent)")
    parser.add_argument("--episodes", type=int, default=400)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--plot", type=Path, default=None, help="also draw the success rates here (a PNG)")
    args = parser.parse_args(argv)
    if not args.agents and not args.references:
        parser.error("name at least one agent (a run folder or a .zip), or --references")

    import torch

    from onlinerec.rl.envs import run_env_seed

    torch.set_num_threads(1)
    agents: list[tuple[str, Any]] = []  # every agent loaded and checked before any episode is played
    named: list[str | Path] = [*(p for p in ("ignore", "remember", "look") if args.references), *args.agents]
    for what in named:
        try:
            agent = ScriptedAgent(what) if isinstance(what, str) else load_agent(what)
        except (FileNotFoundError, ValueError, json.JSONDecodeError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if not agent.env.startswith("MiniGrid-Memory"):
            print(f"error: {what} trained on {agent.env}, not a MiniGrid-Memory env", file=sys.stderr)
            return 2
        if isinstance(what, str):
            label = f"scripted: {what}"
        else:  # the run's own name: <arm>-seed<k> for R2AC, <arm>/seed<k> for RecurrentPPO
            label = f"{what.parent.name}/{what.stem}" if what.suffix == ".zip" else what.name
        agents.append((label, agent))
    results: dict[str, Any] = {}
    print(
        "| agent | actions | cue seen at step 1 | cue seen | success if seen | success if not | timeouts | return | "
        "value of the last step if seen: success / failure |"
    )
    print("|" + "---|" * 9)
    for label, agent in agents:
        seed = run_env_seed(agent.seed, purpose="diagnostic")  # streams no training or evaluation used
        for greedy in (True, False) if not isinstance(agent, ScriptedAgent) else (True,):  # a script does not sample
            s = cue_statistics(agent, args.episodes, seed, greedy=greedy)
            kind = "greedy" if greedy else "sampled"
            results[f"{label}:{kind}"] = s
            shares = (s[k] for k in ("cue_seen_first_step", "cue_seen", "success_if_seen", "success_if_not_seen"))
            cells = " | ".join("–" if np.isnan(v) else f"{v:.0%}" for v in (*shares, s["timeouts"]))
            ends = " / ".join("–" if np.isnan(v) else f"{v:.3f}" for v in (s[k] for k in s if k.startswith("value_")))
            print(f"| {label} | {kind} | {cells} | {s['return']:.3f} | {ends} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.plot:
        plot_success(results, args.plot)
    return 0


def plot_success(results: dict[str, dict[str, float]], path: Path) -> None:
    """Bars of each agent's success rate with and without a sighting of the cue (sampled actions where the agent
    samples): a policy that remembers the cue has a taller first bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {k.rsplit(":", 1)[0]: v for k, v in results.items() if k.endswith(":sampled") or k.startswith("scripted")}
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows) + 2), 4.2))
    seen = [v["success_if_seen"] for v in rows.values()]
    unseen = [np.nan_to_num(v["success_if_not_seen"], nan=0.0) for v in rows.values()]
    ax.bar(x - 0.2, seen, 0.4, label="cue seen", color="tab:blue")
    ax.bar(x + 0.2, unseen, 0.4, label="cue not seen", color="tab:gray")
    ax.axhline(0.5, color="k", lw=0.8, ls=":")
    ax.set_xticks(x, list(rows), rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1.05)
    ax.set_title("MiniGrid-MemoryS7: success with and without a sighting of the cue")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
