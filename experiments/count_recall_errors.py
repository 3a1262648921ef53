"""Where does a trained R2AC err on POPGym's CountRecall? Plays greedy episodes and compares each answer with the count.

In ``CountRecall*`` each step deals a card and asks for a kind of card (a colour in Easy, a suit in Medium, a rank in
Hard); the observation is two one-hot codes, [dealt kind | asked kind], and the right answer is how many cards of the
asked kind have been dealt so far, this step's included. An exact answer pays +1/T, any other -1/T (T the episode's
length), so the final return is 2 x (fraction exact) - 1.

For each run given, an ``onlinerec rl`` folder (its ``config.json`` and ``checkpoints/last.ckpt``) or a RecurrentPPO
policy saved by ``memory_suite.py`` (``seed<k>.zip``, its JSON beside it), this prints, over
``--episodes`` greedy episodes on env streams of their own (``run_env_seed(seed, purpose="diagnostic")``: neither
training's nor the evaluation's):

- how often the answer is exact, within one, and its mean absolute error, overall and by quarter of the episode;
- a linear probe: least squares from the policy's core features (R2AC: the core's output after its ``core_norm``,
  before any ``head_sizes`` MLP; RecurrentPPO: its actor LSTM's output, before its policy MLP) to each kind's count, fitted on the first half of the
  episodes and scored on the second (RMSE in cards, and how often the rounded prediction is exact); it says whether
  the core holds the counts, whatever the head makes of them;
- the same answer statistics, exact expected values, for three reference policies: one that counts each kind (every
  answer right, return +1), one that keeps no count and knows only the step ("a clock": the likeliest count given
  how many cards are dealt, from the hypergeometric law), and a clock that also sees whether this step's card is of
  the asked kind. An agent below the clock has not learnt to count, whatever its return against a random policy;
- for R2AC, the policy core's LRU units: for the slow ring (``slow_fraction``) and the fast ring, the median |lambda|^T (how
  much of a card dealt at the first step is left at the last) and the median phase x T (radians a unit turns over an
  episode). A unit that counts over an episode needs |lambda|^T near 1 and phase x T well below 1.

Usage::

    python experiments/count_recall_errors.py runs/memory_suite30/r2ac/CountRecallEasy/<arm>-seed0 \\
        runs/memory_suite30/runs/CountRecallEasy/ppo_lstm_e20_lam08/seed0.zip [<run> ...] [--plot errors.png]

``--plot`` draws the results per arm (run folders named ``<arm>-seed<k>``, as the memory suite names them, are
averaged over their seeds).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

QUARTERS = 4


def true_counts(observations: np.ndarray, kinds: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts of each kind dealt so far (this step's card included) along one episode's one-hot observations.

    ``observations``: (T, 2 * kinds), each row [dealt kind | asked kind]. Returns (counts (T, kinds), answers (T,)),
    the answer at step t being ``counts[t, asked kind at t]``."""
    obs = np.asarray(observations)
    if obs.ndim != 2 or obs.shape[1] != 2 * kinds:
        raise ValueError(f"expected one-hot observations of shape (T, {2 * kinds}), got {obs.shape}")
    dealt = obs[:, :kinds].argmax(1)
    asked = obs[:, kinds:].argmax(1)
    counts = np.cumsum(np.eye(kinds, dtype=np.int64)[dealt], axis=0)
    return counts, counts[np.arange(len(obs)), asked]


def hypergeometric(total: int, marked: int, draws: int, top: int) -> np.ndarray:
    """P(k marked cards among ``draws`` dealt without replacement from ``total``, ``marked`` of them marked), k = 0..top."""
    return np.array(
        [
            math.comb(marked, k) * math.comb(total - marked, draws - k) / math.comb(total, draws)
            if k <= marked and 0 <= draws - k <= total - marked
            else 0.0
            for k in range(top + 1)
        ]
    )


def deck_of(env_id: str) -> tuple[int, int]:
    """(cards in the deck, kinds of card) of a ``popgym:CountRecall*`` env; every kind has cards / kinds cards."""
    import popgym.envs

    name = env_id.removeprefix("popgym:")
    env = getattr(popgym.envs, name)()
    return int(env.value_deck.num_cards), int(env.num_distinct_cards)


def clock_law(cards: int, kinds: int, step: int, same: bool | None) -> tuple[int, np.ndarray]:
    """What a policy that keeps no count knows of the asked kind's count: it knows how many cards are dealt (``step``,
    this one included) and, unless ``same`` is None, whether this step's card is of the asked kind. Returns (offset,
    law): the count is offset + k with probability law[k]."""
    per = cards // kinds
    if same is None:
        return 0, hypergeometric(cards, per, step, per)
    return int(same), hypergeometric(cards - 1, per - int(same), step - 1, per)


def reference_answer(cards: int, kinds: int, step: int, same: bool | None) -> int:
    """The likeliest count for a policy that keeps no count (:func:`clock_law`)."""
    offset, law = clock_law(cards, kinds, step, same)
    return offset + int(law.argmax())


def references(env_id: str) -> dict[str, dict[str, Any]]:
    """Exact expected returns and exact answers by quarter of three reference policies: one that counts each kind
    (every answer right), one that knows only the step ("a clock": the likeliest count given the cards dealt), and
    a clock that also sees whether this step's card is of the asked kind (the asked kind is drawn from a deck of its
    own, so it matches with probability 1 / kinds)."""
    cards, kinds = deck_of(env_id)
    length = cards - 1
    clock = [clock_law(cards, kinds, t, None)[1].max() for t in range(1, length + 1)]
    card = [
        clock_law(cards, kinds, t, True)[1].max() / kinds + clock_law(cards, kinds, t, False)[1].max() * (1 - 1 / kinds)
        for t in range(1, length + 1)
    ]
    quarter = np.minimum(np.arange(length) * QUARTERS // length, QUARTERS - 1)
    out = {}
    for name, p in (
        ("counts each kind", np.ones(length)),
        ("a clock", np.array(clock)),
        ("a clock and this card", np.array(card)),
    ):
        out[name] = {
            "return": float(2 * p.mean() - 1),
            "exact": float(p.mean()),
            "exact_by_quarter": [float(p[quarter == q].mean()) for q in range(QUARTERS)],
        }
    return out


class R2ACPlayer:
    """An ``onlinerec rl`` run's trained R2AC (weights only), greedy on its own carried state (stream "count"); its
    features are what the policy's ``head_sizes`` MLP reads (its linear head where there is none): the core's
    output after ``core_norm``."""

    def __init__(self, run_dir: Path) -> None:
        from onlinerec.rl.r2ac import R2AC

        config_file, ckpt = run_dir / "config.json", run_dir / "checkpoints" / "last.ckpt"
        if not config_file.is_file() or not ckpt.is_file():
            raise FileNotFoundError(
                f"{run_dir} has no config.json or checkpoints/last.ckpt: give an `onlinerec rl` run folder (e.g. "
                "runs/memory_suite/r2ac/CountRecallEasy/<arm>-seed0) or a RecurrentPPO seed<k>.zip"
            )
        self.config = json.loads(config_file.read_text())
        self.env, self.seed = str(self.config["env"]), int(self.config["seed"])
        self.model = R2AC.load_from_checkpoint(str(ckpt), map_location="cpu").eval()
        self.seen: list[Any] = []
        self.hook = self.model.policy_mlp.register_forward_hook(lambda _m, i, _o: self.seen.append(i[0].detach()))
        self.model.reset_streams("count")

    def act(self, obs: np.ndarray, reward: np.ndarray, reset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch

        from onlinerec.rl.segment import obs_to_tensor

        self.seen.clear()
        with torch.no_grad():
            actions, _ = self.model.act(
                obs_to_tensor(obs, self.model.device),
                torch.as_tensor(reward),
                torch.as_tensor(reset),
                greedy=True,
                stream="count",
            )
        return actions.numpy(), self.seen[-1].numpy()

    def rings(self, length: int) -> dict[str, tuple[float, float]]:
        return lru_rings(self.model, self.config, length)

    def close(self) -> None:
        self.hook.remove()
        self.model.reset_streams("count")


class RecurrentPPOPlayer:
    """A RecurrentPPO policy saved by ``memory_suite.py`` (``seed<k>.zip``, its JSON beside it), greedy; its
    features are its actor LSTM's output, what its policy MLP reads. Loaded and stepped by ``minigrid_cue.py``'s
    :class:`RecurrentPPOAgent`."""

    def __init__(self, path: Path) -> None:
        here = str(Path(__file__).resolve().parent)
        if here not in sys.path:  # the sibling script, as benchmarks/memory.py imports its own
            sys.path.insert(0, here)
        from minigrid_cue import RecurrentPPOAgent

        if not path.is_file() or not path.with_suffix(".json").is_file():
            raise FileNotFoundError(
                f"{path} is not a RecurrentPPO seed<k>.zip saved by memory_suite.py (with its JSON)"
            )
        self.policy = RecurrentPPOAgent(path)
        stem = path.stem.removeprefix("seed")  # `memory_suite.py sb3` alone writes no seed; its file name has it
        record = self.policy.record
        self.env, self.seed = str(record["config"]["env"]), int(record.get("seed", stem if stem.isdigit() else 0))

    def act(self, obs: np.ndarray, reward: np.ndarray, reset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        actions = self.policy.act(obs, reward, reset, greedy=True)
        return actions, np.asarray(self.policy.state[0][-1])  # the last LSTM layer's output at this step

    def rings(self, length: int) -> dict[str, tuple[float, float]]:
        return {}

    def close(self) -> None:
        self.policy.state = None


def load_player(path: Path) -> R2ACPlayer | RecurrentPPOPlayer:
    """An R2AC run folder or a RecurrentPPO ``seed<k>.zip``, checked to be a CountRecall run."""
    player = RecurrentPPOPlayer(path) if path.suffix == ".zip" else R2ACPlayer(path)
    if not player.env.startswith("popgym:CountRecall"):
        player.close()
        raise ValueError(f"{path} trained on {player.env}; this diagnostic reads popgym:CountRecall* runs only")
    return player


def play(player: R2ACPlayer | RecurrentPPOPlayer, env: Any, episodes: int) -> dict[str, list[np.ndarray]]:
    """Greedy episodes on ``env`` (a vector env): each episode's observations, answers and the player's features."""
    n = int(env.num_envs)
    current: list[dict[str, list[Any]]] = [{"obs": [], "answer": [], "features": []} for _ in range(n)]
    finished: dict[str, list[np.ndarray]] = {"obs": [], "answer": [], "features": []}
    obs, _ = env.reset()
    reward, reset = np.zeros(n, dtype=np.float32), np.ones(n, dtype=bool)
    while len(finished["obs"]) < episodes:
        actions, features = player.act(np.asarray(obs), reward, reset)
        for i in range(n):
            current[i]["obs"].append(np.asarray(obs[i]))
            current[i]["answer"].append(int(actions[i]))
            current[i]["features"].append(features[i])
        obs, reward, terminated, truncated, _ = env.step(actions)
        reset = np.asarray(terminated) | np.asarray(truncated)
        for i in np.flatnonzero(reset):
            for key in finished:
                finished[key].append(np.stack(current[i][key]))
                current[i][key] = []
    return {key: value[:episodes] for key, value in finished.items()}


def lru_rings(model: Any, config: dict[str, Any], length: int) -> dict[str, tuple[float, float]]:
    """Median |lambda|^T and median phase x T of the policy core's first LRU, per ring (slow and fast)."""
    import torch

    from onlinerec.cells.lru import LRUCell

    lru = next((m for m in model.cell.modules() if isinstance(m, LRUCell)), None)
    if lru is None:
        return {}
    layer_kwargs = (config.get("cell_kwargs") or {}).get("layer_kwargs") or [{}]
    slow = round(float(layer_kwargs[0].get("slow_fraction", 0.0)) * lru.nu_log.numel())
    with torch.no_grad():
        radius = torch.exp(-torch.exp(lru.nu_log)).numpy()
        phase = torch.exp(lru.theta_log).numpy()
    rings = {"fast": slice(0, len(radius) - slow), "slow": slice(len(radius) - slow, len(radius))}
    return {
        name: (float(np.median(radius[s] ** length)), float(np.median(phase[s] * length)))
        for name, s in rings.items()
        if s.stop > s.start
    }


def diagnose(path: Path, episodes: int) -> dict[str, Any]:
    """Answer errors, the linear probe and (for R2AC) the LRU rings of one run (see the module docstring)."""
    from onlinerec.rl.envs import make_vector_env, run_env_seed

    player = load_player(path)
    env = make_vector_env(player.env, min(16, episodes), seed=run_env_seed(player.seed, purpose="diagnostic"))
    try:
        played = play(player, env, episodes)
    finally:
        env.close()
        player.close()
    kinds = played["obs"][0].shape[1] // 2
    errors, where, counts = [], [], []
    for obs, answers in zip(played["obs"], played["answer"]):
        c, right = true_counts(obs, kinds)
        errors.append(answers - right)
        where.append(np.minimum(np.arange(len(obs)) * QUARTERS // len(obs), QUARTERS - 1))
        counts.append(c)
    err, quarter = np.concatenate(errors), np.concatenate(where)
    result: dict[str, Any] = {
        "run": str(path),
        "env": player.env,
        "episodes": len(errors),
        "exact": float(np.mean(err == 0)),
        "within_one": float(np.mean(np.abs(err) <= 1)),
        "mean_abs_error": float(np.mean(np.abs(err))),
        "exact_by_quarter": [float(np.mean(err[quarter == q] == 0)) for q in range(QUARTERS)],
    }
    half = len(errors) // 2
    x = [np.concatenate([f, np.ones((len(f), 1))], 1) for f in played["features"]]
    fit_x, test_x = np.concatenate(x[:half]), np.concatenate(x[half:])
    fit_y, test_y = np.concatenate(counts[:half]), np.concatenate(counts[half:])
    weights, *_ = np.linalg.lstsq(fit_x.astype(np.float64), fit_y.astype(np.float64), rcond=None)
    pred = test_x @ weights
    result["probe_rmse"] = float(np.sqrt(np.mean((pred - test_y) ** 2)))
    result["probe_exact"] = float(np.mean(np.round(pred) == test_y))
    result["rings"] = player.rings(max(len(o) for o in played["obs"]))
    return result


def report(results: list[dict[str, Any]]) -> str:
    """A markdown table, one row per run, then one per reference policy of each env the runs played."""
    lines = [
        "| run | greedy return | exact | within one | mean abs. error | exact by quarter | probe RMSE (exact) | "
        "slow ring: r^T, phase x T | fast ring |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rings = {name: f"{mag:.2f}, {turn:.1f} rad" for name, (mag, turn) in r["rings"].items()}
        lines.append(
            f"| {r['run']} | {2 * r['exact'] - 1:.3f} | {r['exact']:.0%} | {r['within_one']:.0%} | "
            f"{r['mean_abs_error']:.2f} | "
            + " / ".join(f"{q:.0%}" for q in r["exact_by_quarter"])
            + f" | {r['probe_rmse']:.2f} ({r['probe_exact']:.0%}) | {rings.get('slow', '-')} | {rings.get('fast', '-')} |"
        )
    for env in dict.fromkeys(r["env"] for r in results):
        for name, ref in references(env).items():
            lines.append(
                f"| reference on {env}: {name} (expected) | {ref['return']:.3f} | {ref['exact']:.0%} | - | - | "
                + " / ".join(f"{q:.0%}" for q in ref["exact_by_quarter"])
                + " | - | - | - |"
            )
    return "\n".join(lines)


def arm_of(run: str) -> str:
    """A run's arm: an R2AC folder's name without the ``-seed<k>`` suffix that the memory suite gives it, or the
    folder that holds a RecurrentPPO ``seed<k>.zip`` (the memory suite's arm name)."""
    if run.endswith(".zip"):
        return Path(run).parent.name
    name = Path(run).name
    head, sep, tail = name.rpartition("-seed")
    return head if sep and tail.isdigit() else name


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Per arm (runs grouped by :func:`arm_of`, mean over them): how often the policy answers exactly and the probe
    reads the counts exactly (left), and the policy's exact answers by quarter of the episode (right); dashed, the
    clock reference (:func:`references`) of the first run's env."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        arms.setdefault(arm_of(r["run"]), []).append(r)
    names = list(arms)
    x = np.arange(len(names))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    bars = {"policy: exact answer": "exact", "policy: within one": "within_one", "probe: count exact": "probe_exact"}
    for k, (label, key) in enumerate(bars.items()):
        left.bar(x + (k - 1) * 0.27, [np.mean([r[key] for r in arms[a]]) for a in names], 0.27, label=label)
    left.set_xticks(x, [f"{a} ({len(arms[a])})" for a in names], rotation=25, ha="right", fontsize=8)
    left.set_ylim(0, 1)
    left.set_ylabel("fraction of steps")
    left.legend(fontsize=8, loc="upper left")
    left.set_title("answers and a linear probe of the core (runs per arm)", fontsize=10)
    for a in names:
        right.plot(range(1, QUARTERS + 1), np.mean([r["exact_by_quarter"] for r in arms[a]], 0), marker="o", label=a)
    clock = references(results[0]["env"])["a clock"]
    right.plot(range(1, QUARTERS + 1), clock["exact_by_quarter"], "k--", label="reference: a clock (no count kept)")
    left.axhline(clock["exact"], color="k", ls="--", lw=0.9)  # the clock's exact answers, for the first bars
    right.set_xticks(range(1, QUARTERS + 1), [f"quarter {q}" for q in range(1, QUARTERS + 1)])
    right.set_ylim(0, None)
    right.set_ylabel("exact answers")
    right.legend(fontsize=7)
    right.set_title("exact answers along the episode", fontsize=10)
    fig.suptitle(f"Greedy play on {results[0]['env']}", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "runs", nargs="+", type=Path, help="`onlinerec rl` folders or RecurrentPPO seed<k>.zip of popgym:CountRecall*"
    )
    parser.add_argument("--episodes", type=int, default=320, help="greedy episodes per run (half fit the probe)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    parser.add_argument("--plot", type=Path, default=None, help="also draw the results per arm to this PNG")
    args = parser.parse_args(argv)
    if args.episodes < 2:
        parser.error("--episodes must be at least 2: half the episodes fit the probe, half score it")
    import torch

    torch.set_num_threads(1)
    results = [diagnose(run, args.episodes) for run in args.runs]
    print(report(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    if args.plot is not None:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
