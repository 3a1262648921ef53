"""What one step of the streaming actor-critic costs (act and learn; the env excluded), one torch thread.

- ``agent``: ``StreamAC`` with an RTU core of N units (exact RTRL), against ``hand``: the same math written by hand in
  plain torch (the linear RTU's RTRL recursion written out, the same layers, normalisers and ObGD); ``ff``: stream-x's
  feed-forward agent of the same width; ``tbptt``: the agent with one-step truncation; ``wired``: the agent with the
  RTU authors' wiring (the embedding before the core, the previous action and reward).
- ``loops``: the agent's step driven by a plain loop (what ``onlinerec stream`` runs), by Lightning's training loop
  (one ``training_step`` per env step, manual optimisation) and through Fabric (``fabric.backward``).
- ``scaling``: the agent's step at N = 16 ... 2048 and a least-squares line (a fixed cost per step plus a cost per
  unit), drawn to ``--plot``.

Timings are process CPU time (steady under other jobs), medians of ``--reps`` interleaved repetitions. Last line:
``ratios agent/hand=<a> agent/ff=<b> wired/agent=<c> lightning/plain=<d> fabric/plain=<e> steps_per_s_N64=<f>
steps_per_s_N256=<g>``.

    python benchmarks/streaming.py                 # everything (a few minutes)
    python benchmarks/streaming.py --quick         # a smoke test
    python benchmarks/streaming.py --sections scaling --plot docs/img/streaming_scaling.png
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

OBS = 8  # a POPGym-sized observation
ACTIONS = 4


def make_agent(n: int, cell: str | None = "rtu", method: str = "rtrl", width: int = 128, wired: bool = False):
    from gymnasium import spaces

    from onlinerec.rl.streaming.agent import StreamAC
    from onlinerec.rl.streaming.config import StreamACConfig

    torch.manual_seed(0)
    kwargs = {} if cell is None else {"hidden_size": n}
    return StreamAC(
        spaces.Box(-1.0, 1.0, (OBS,)), spaces.Discrete(ACTIONS),
        StreamACConfig(width=width, embed=wired, prev_action_reward=wired), cell=cell, method=method, **kwargs,
    )  # fmt: skip


def agent_step(agent, backward=None):
    """A closure: one act and one learn on synthetic observations and rewards."""
    gen = torch.Generator().manual_seed(1)
    obs = torch.randn(4096, OBS, generator=gen)
    rewards = torch.randn(4096, generator=gen).tolist()
    state = {"t": 0}

    def step():
        t = state["t"] % 4096
        state["t"] += 1
        x = agent.observe(obs[t])
        agent.act(x, reset=t == 0)
        agent.learn(rewards[t], agent.observe(obs[(t + 1) % 4096]), False, False, backward=backward)

    return step


# -- the same math by hand -----------------------------------------------------------------------------------------
class HandNet(nn.Module):
    """obs -> linear RTU (N units, RTRL by hand) -> Linear -> LayerNorm -> leaky ReLU -> Linear head."""

    def __init__(self, n: int, out: int, width: int = 128) -> None:
        super().__init__()
        self.n, self.width = n, width
        self.w = nn.Parameter(torch.randn(2 * n, OBS) / math.sqrt(OBS))
        self.nu = nn.Parameter(torch.log(-0.5 * torch.log(torch.rand(n))))
        self.theta = nn.Parameter(torch.log(6.28 * torch.rand(n)))
        self.hidden, self.head = nn.Linear(2 * n, width), nn.Linear(width, out)
        self.c = torch.zeros(2, n)
        self.s_w = torch.zeros(2, 2, n, OBS)  # dc_k / dW_g[n, :]
        self.s_nu, self.s_theta = torch.zeros(2, n), torch.zeros(2, n)

    @staticmethod
    def rotate_(s: torch.Tensor, g: torch.Tensor, phi: torch.Tensor) -> None:
        """s[0], s[1] <- g s[0] - phi s[1], g s[1] + phi s[0] (the unit's 2 x 2 block), in place."""
        first = s[0].clone()
        s[0].mul_(g).addcmul_(s[1], -phi)
        s[1].mul_(g).addcmul_(first, phi)

    def forward(self, x: torch.Tensor, peek: bool = False) -> torch.Tensor:
        with torch.no_grad():
            e, th = torch.exp(self.nu), torch.exp(self.theta)
            r = torch.exp(-e)
            g, phi, gamma = r * torch.cos(th), r * torch.sin(th), torch.sqrt(-torch.expm1(-2 * e))
            wx = (self.w @ x[0]).view(2, self.n)
            c1, c2 = self.c[0], self.c[1]
            rot1, rot2 = g * c1 - phi * c2, g * c2 + phi * c1
            a = torch.stack([rot1 + gamma * wx[0], rot2 + gamma * wx[1]])
            if peek:
                return self.head(F.leaky_relu(F.layer_norm(self.hidden(torch.relu(a).reshape(1, -1)), (self.width,))))
            self.rotate_(self.s_w, g[:, None], phi[:, None])
            self.s_w[0, 0].addcmul_(gamma[:, None], x)
            self.s_w[1, 1].addcmul_(gamma[:, None], x)
            self.rotate_(self.s_nu, g, phi)
            self.s_nu.add_(torch.stack([-e * rot1, -e * rot2]) + (e * torch.exp(-2 * e) / gamma) * wx)
            self.rotate_(self.s_theta, g, phi)
            self.s_theta.add_(torch.stack([-th * rot2, th * rot1]))
            self.c = a
        # the state, whose gradient with respect to the RTU's parameters is read off the sensitivities
        w = self.w.view(2, self.n, OBS)
        state = a + (self.s_w * (w - w.detach())).sum((1, 3))
        state = state + self.s_nu * (self.nu - self.nu.detach()) + self.s_theta * (self.theta - self.theta.detach())
        h = torch.relu(state).reshape(1, -1)
        return self.head(F.leaky_relu(F.layer_norm(self.hidden(h), (self.width,))))


def hand_step(n: int):
    """A closure: the agent's step written by hand (same layers, normalisers, objective and ObGD)."""
    torch.manual_seed(0)
    actor, critic = HandNet(n, ACTIONS), HandNet(n, 1)
    pa, pc = list(actor.parameters()), list(critic.parameters())
    za, zc = [torch.zeros_like(p) for p in pa], [torch.zeros_like(p) for p in pc]
    stats = {"mean": torch.zeros(OBS, dtype=torch.float64), "var": torch.ones(OBS, dtype=torch.float64), "n": 1e-4}
    ret = {"g": 0.0, "mean": 0.0, "var": 1.0, "n": 1e-4}
    gen = torch.Generator().manual_seed(1)
    obs = torch.randn(4096, OBS, generator=gen)
    rewards = torch.randn(4096, generator=gen).tolist()
    state = {"t": 0}

    def observe(o):
        x = o.double()
        n1 = stats["n"] + 1
        delta = x - stats["mean"]
        stats["var"] = (stats["var"] * stats["n"] + delta**2 * stats["n"] / n1) / n1
        stats["mean"] = stats["mean"] + delta / n1
        stats["n"] = n1
        return ((x - stats["mean"]) / (stats["var"] + 1e-8).sqrt()).float().reshape(1, -1)

    def obgd(params, traces, delta, kappa):
        with torch.no_grad():
            torch._foreach_mul_(traces, 0.99 * 0.8)
            torch._foreach_add_(traces, [p.grad for p in params])
            norm = torch.stack(torch._foreach_norm(traces, 1)).sum()
            step = 1.0 / (kappa * delta.abs().clamp_min(1.0) * norm).clamp_min(1.0)
            torch._foreach_add_(params, torch._foreach_mul(traces, step * delta))

    def step():
        t = state["t"] % 4096
        state["t"] += 1
        x = observe(obs[t])
        logits, v = actor(x), critic(x)
        logp = torch.log_softmax(logits, -1)
        a = torch.multinomial(logp.detach().exp(), 1)[0, 0]
        x_next = observe(obs[(t + 1) % 4096])
        with torch.no_grad():
            ret["g"] = 0.99 * ret["g"] + rewards[t]
            n1 = ret["n"] + 1
            d = ret["g"] - ret["mean"]
            ret["var"] = (ret["var"] * ret["n"] + d * d * ret["n"] / n1) / n1
            ret["mean"] += d / n1
            ret["n"] = n1
            r = rewards[t] / math.sqrt(ret["var"] + 1e-8)
            delta = r + 0.99 * critic(x_next, peek=True)[0, 0] - v.detach()[0, 0]
        entropy = -(logp.exp() * logp).sum()
        objective = logp[0, a] + 0.01 * torch.sign(delta) * entropy + v[0, 0]
        for p in pa + pc:
            p.grad = None
        objective.backward()
        obgd(pa, za, delta, 1.5)
        obgd(pc, zc, delta, 1.0)

    return step


# -- loops ---------------------------------------------------------------------------------------------------------
def lightning_seconds_per_step(agent, steps: int) -> float:
    """Process seconds per step of the agent driven by Lightning's training loop (manual optimisation)."""
    import lightning as L
    from torch.utils.data import IterableDataset

    class Steps(IterableDataset):
        def __iter__(self):
            while True:
                yield torch.zeros(())

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.agent = agent
            self.automatic_optimization = False
            self.step = agent_step(agent)

        def training_step(self, batch, batch_idx):
            self.step()

        def configure_optimizers(self):
            return None

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Steps(), batch_size=None)

    trainer = L.Trainer(
        max_steps=-1, max_epochs=1, limit_train_batches=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
    )  # fmt: skip
    start = time.process_time()
    trainer.fit(Module())
    return (time.process_time() - start) / steps


def fabric_step(agent):
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1)
    fabric.launch()
    return agent_step(fabric.setup_module(agent, move_to_device=False)._forward_module, backward=fabric.backward)


def seconds_per_step(step, steps: int, reps: int) -> float:
    for _ in range(max(10, steps // 10)):
        step()
    times = []
    for _ in range(reps):
        start = time.process_time()
        for _ in range(steps):
            step()
        times.append((time.process_time() - start) / steps)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: few steps")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sections", default="agent,loops,scaling")
    parser.add_argument("--plot", default=None, help="PNG path for the scaling section's figure")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    steps, reps = (20, 1) if args.quick else (args.steps, args.reps)
    sections = set(args.sections.split(","))
    ratios: dict[str, float] = {}
    if "agent" in sections:
        closures = {
            "agent": agent_step(make_agent(64)),
            "hand": hand_step(64),
            "ff": agent_step(make_agent(64, cell=None)),
            "tbptt": agent_step(make_agent(64, method="tbptt")),
            "wired": agent_step(make_agent(64, wired=True)),
        }
        interleaved = {name: [] for name in closures}
        for _ in range(reps):
            for name, step in closures.items():
                interleaved[name].append(seconds_per_step(step, steps, 1))
        t = {k: statistics.median(v) for k, v in interleaved.items()}
        for name, value in t.items():
            print(f"{name:8s} N=64  {value * 1e6:8.0f} us/step  {1 / value:7.0f} steps/s")
        ratios["agent/hand"] = t["agent"] / t["hand"]
        ratios["agent/ff"] = t["agent"] / t["ff"]
        ratios["wired/agent"] = t["wired"] / t["agent"]
    if "loops" in sections:
        plain = seconds_per_step(agent_step(make_agent(64)), steps, reps)
        fabric = seconds_per_step(fabric_step(make_agent(64)), steps, reps)
        lightning = statistics.median(lightning_seconds_per_step(make_agent(64), steps) for _ in range(reps))
        for name, value in (("plain", plain), ("fabric", fabric), ("lightning", lightning)):
            print(f"loop {name:10s} {value * 1e6:8.0f} us/step")
        ratios["lightning/plain"], ratios["fabric/plain"] = lightning / plain, fabric / plain
    if "scaling" in sections:
        sizes = [16, 64] if args.quick else [16, 32, 64, 128, 256, 512, 1024, 2048]
        closures = {n: agent_step(make_agent(n)) for n in sizes}
        runs = {n: [] for n in sizes}
        for _ in range(reps):  # interleaved, so that a busier minute falls on every size alike
            for n in sizes:
                runs[n].append(seconds_per_step(closures[n], steps, 1))
        per_step = {n: statistics.median(v) for n, v in runs.items()}
        for n, value in per_step.items():
            print(f"scaling N={n:4d} {value * 1e6:8.0f} us/step  {1 / value:7.0f} steps/s")
        fixed, per_unit = fit_line(per_step)
        print(f"scaling fit: {fixed * 1e6:.0f} us a step + {per_unit * 1e9:.0f} ns per unit")
        if 64 in per_step:
            ratios["steps_per_s N64"] = 1 / per_step[64]
        if 256 in per_step:
            ratios["steps_per_s N256"] = 1 / per_step[256]
        if args.plot:
            plot(per_step, args.plot)
    shown = {k.replace(" ", "_"): f"{v:.2f}" if v < 100 else f"{v:.0f}" for k, v in ratios.items()}  # steps/s whole
    print("ratios " + " ".join(f"{k}={v}" for k, v in shown.items()))
    return 0


def fit_line(per_step: dict[int, float]) -> tuple[float, float]:
    """Least squares t = fixed + per_unit * N."""
    n, t = list(per_step), list(per_step.values())
    slope = statistics.linear_regression(n, t).slope
    return statistics.fmean(t) - slope * statistics.fmean(n), slope


def plot(per_step: dict[int, float], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(per_step)
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    ax.plot(sizes, [per_step[n] * 1e3 for n in sizes], "o-", label="agent step (ms)")
    fixed, per_unit = fit_line(per_step)
    ax.plot(sizes, [(fixed + per_unit * n) * 1e3 for n in sizes], "--", color="gray",
            label=f"least squares: {fixed * 1e3:.1f} ms + {per_unit * 1e6:.2f} us per unit")  # fmt: skip
    ax.set_xlabel("N (RTU units of each network)")
    ax.set_ylabel("CPU ms per env step")
    ax.set_title("Streaming agent: cost of a step against N")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
