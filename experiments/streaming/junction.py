"""What a streaming T-maze run's networks do at the junction: the policy's probability of each turn and the critic's
value, by cue, with the weights of a checkpoint held fixed (sampled actions, episodes of their own).

    python experiments/streaming/junction.py runs/stream_evidence/tmaze64/rtrl-seed0 [--checkpoint final] [--episodes 200]

A run at chance whose policy always turns the same way while its value tracks the cue (about 1 for one cue, 0 for the
other) has a critic that remembers the cue and an actor that stopped learning: the TD error at the junction is zero,
so the policy gradient δ ∇log π is too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from onlinerec.gradients import TBPTT
from onlinerec.rl.envs import make_vector_env
from onlinerec.rl.streaming.runner import load_agent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--checkpoint", default="final", help="final or last")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=12345, help="the cue stream (not one training used)")
    args = parser.parse_args(argv)
    agent = load_agent(args.run_dir, args.checkpoint)
    config = json.loads((Path(args.run_dir) / "config.json").read_text())
    length = config["env_kwargs"].get("length", 10)
    env = make_vector_env(config["env"], 1, seed=args.seed, **config["env_kwargs"])
    rows = []  # (cue, p(turn 0), p(turn 1), value, reward)
    with torch.no_grad():
        obs, info = env.reset()
        carries, reset, cue = {"actor": None, "critic": None}, True, -1
        for _ in range(args.episodes):
            for t in range(length + 1):
                x = torch.as_tensor(obs).reshape(1, -1).float()
                x = agent.obs_norm(x) if agent.obs_norm is not None else x
                out = {}
                for name, net in agent.networks().items():
                    carry = carries[name] or TBPTT().init_carry(net.core, 1)
                    out[name], carries[name] = net.step(x, torch.tensor([reset]), carry, TBPTT())
                reset = False
                if t == 0:
                    cue = int(info["cue"][0])
                action = agent.actor.head.sample(out["actor"])
                obs, reward, terminated, truncated, info = env.step(agent.actor.head.env_actions(action).numpy())
                if t == length:
                    p = torch.softmax(out["actor"][0], -1).numpy()
                    rows.append((cue, *p[:2], float(out["critic"][0, 0]), float(reward[0])))
            reset = True
    rows = np.array(rows)
    print(f"{args.run_dir} ({args.checkpoint}), {len(rows)} episodes at the junction:")
    for cue in (0, 1):
        r = rows[rows[:, 0] == cue]
        print(f"  cue {cue}: p(turn 0) {r[:, 1].mean():.3f}  p(turn 1) {r[:, 2].mean():.3f}  value (reward scale) {r[:, 3].mean():+.3f}"
              f"  reward {r[:, 4].mean():.3f}  ({len(r)} episodes)")  # fmt: skip


if __name__ == "__main__":
    main()
