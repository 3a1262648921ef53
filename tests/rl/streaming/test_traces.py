"""The streaming agent's eligibility traces against full backprop through time, in float64, on every device.

With the weights held fixed, after step t every trace must equal sum_k (gamma lambda)^(t - k) grad J_k, J_k being step
k's objective (the actor's log pi(a_k) + c sign(delta_k) H(pi_k), the critic's V_k), each gradient taken by full BPTT
over the episode so far; with one-step TBPTT each J_k's gradient stops at step k's core input. A stack's RTRL is exact
per layer (docs/concepts.md#stacked-layers): its top layer and everything above are checked against full BPTT, the
layers below it carry no sensitivity through the layers above, so they are left out of this comparison. An embedding
below the core (``embed``) learns from each step's own gradient: the reference holds the embedding's outputs at the
earlier steps constant, and nothing else.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gymnasium")
from gymnasium import spaces  # noqa: E402

from onlinerec.cells.composite import CompositeCell  # noqa: E402
from onlinerec.gradients import TBPTT  # noqa: E402
from onlinerec.rl.streaming.agent import StreamAC  # noqa: E402
from onlinerec.rl.streaming.config import StreamACConfig  # noqa: E402
from onlinerec.rl.streaming.network import StreamNet  # noqa: E402
from tests.helpers import rel_err  # noqa: E402

CORES = {
    "feed-forward": dict(cell=None),
    "rtu": dict(cell="rtu", hidden_size=5),
    "lru": dict(cell="lru", hidden_size=4),
    "mingru": dict(cell="mingru", hidden_size=4),
    "elstm": dict(cell="elstm", hidden_size=4),
    "stack": dict(cell=["lru", "mingru"], hidden_size=6, cell_kwargs={"residual": True}),
}
WIRING = {
    "plain": dict(),
    "embedded": dict(embed=True, prev_action_reward=True),  # the RTU authors' network, previous action and reward in
}
ACTIONS = {"discrete": spaces.Discrete(3), "continuous": spaces.Box(-2.0, 2.0, (2,))}


def run_fixed(agent: StreamAC, steps: int, seed: int = 0):
    """``steps`` agent steps of one episode with the weights held fixed (ObGD's step size 0): what each step saw and
    did, and the traces after the last."""
    agent.actor_opt.lr = agent.critic_opt.lr = 0.0
    gen = torch.Generator().manual_seed(seed)
    device = agent.running_return.device
    xs, extras, actions, signs = [], [], [], []
    for t in range(steps):
        x = torch.randn(1, agent.obs_size, generator=gen, dtype=torch.float64).to(device)
        if agent.extra_size:  # what the step reads besides x: zeros first, then the last step's action and reward
            extras.append(torch.zeros_like(agent.previous) if t == 0 else agent.previous.clone())
        agent.act(x, reset=t == 0)
        _, _, action = agent._pending
        delta = agent.learn(
            float(torch.randn((), generator=gen)),
            torch.randn(1, agent.obs_size, generator=gen, dtype=torch.float64).to(device),
            False,
            False,
        )
        xs.append(x)
        actions.append(action)
        signs.append(torch.sign(delta))
    return torch.cat(xs), (torch.cat(extras) if extras else None), actions, signs


def objectives(net: StreamNet, xs, extras, truncated: bool):
    """The network's output at every step of the episode: one segment of TBPTT over the whole episode (full BPTT), or
    one segment per step (each step's gradient stops at its own core input)."""
    if net.core is None:
        return net.step(xs, torch.zeros(xs.shape[0], dtype=torch.bool, device=xs.device), None, TBPTT(), extras)[0]
    if net.embed is not None:
        return embedded_objectives(net, xs, extras, truncated)
    if extras is not None:
        xs = torch.cat([xs, extras], dim=-1)
    steps = xs.shape[0]
    reset = torch.zeros(steps, 1, dtype=torch.bool, device=xs.device)
    reset[0] = True
    carry = TBPTT().init_carry(net.core, 1)
    if truncated:  # TBPTT carries the state detached from one segment to the next
        parts = []
        for t in range(steps):
            states, carry = TBPTT().unroll(net.core, xs[t : t + 1].unsqueeze(1), reset[t : t + 1], carry)
            parts.append(states)
        states = torch.cat(parts)
    else:
        states, _ = TBPTT().unroll(net.core, xs.unsqueeze(1), reset, carry)
    outs = states[:, 0] if isinstance(net.core, CompositeCell) else net.core.readout(states[:, 0], xs)
    return net.top(outs)


def embedded_objectives(net: StreamNet, xs, extras, truncated: bool):
    """As :func:`objectives` with an embedding below the core: step k's output from a fresh unroll over steps 0..k
    in which only step k's embedding keeps its graph (the earlier ones are constants)."""
    outputs = []
    for k in range(xs.shape[0]):
        u = torch.cat([net.core_input(xs[j : j + 1], extras[j : j + 1]) for j in range(k + 1)])
        u = torch.cat([u[:k].detach(), u[k:]])
        reset = torch.zeros(k + 1, 1, dtype=torch.bool, device=xs.device)
        reset[0] = True
        carry = TBPTT().init_carry(net.core, 1)
        if truncated:  # the state before step k is a constant
            if k:
                _, carry = TBPTT().unroll(net.core, u[:k].unsqueeze(1), reset[:k], carry)
            states, _ = TBPTT().unroll(net.core, u[k:].unsqueeze(1), reset[k:], carry)
        else:
            states, _ = TBPTT().unroll(net.core, u.unsqueeze(1), reset, carry)
        outputs.append(net.above_core(states[-1], u[k:]))
    return torch.cat(outputs)


def reference_traces(agent: StreamAC, xs, extras, actions, signs, truncated: bool):
    cfg, decay = agent.config, agent.config.discount * agent.config.trace_lambda
    t_max = xs.shape[0]
    actor_params, critic_params = list(agent.actor.parameters()), list(agent.critic.parameters())
    params = objectives(agent.actor, xs, extras, truncated)
    values = objectives(agent.critic, xs, extras, truncated)[:, 0]
    head = agent.actor.head
    z_actor = [torch.zeros_like(p) for p in actor_params]
    z_critic = [torch.zeros_like(p) for p in critic_params]
    for k in range(t_max):
        j_pi = head.log_prob(params[k : k + 1], actions[k]) + cfg.entropy_cost * signs[k] * head.entropy(
            params[k : k + 1]
        )
        g_pi = torch.autograd.grad(j_pi.sum(), actor_params, retain_graph=True, allow_unused=True)
        g_v = torch.autograd.grad(values[k], critic_params, retain_graph=True, allow_unused=True)
        for z, g in zip(z_actor, g_pi):
            z.mul_(decay).add_(0 if g is None else g)
        for z, g in zip(z_critic, g_v):
            z.mul_(decay).add_(0 if g is None else g)
    return z_actor, z_critic


@pytest.mark.parametrize("wiring", WIRING, ids=list(WIRING))
@pytest.mark.parametrize("action", ACTIONS, ids=list(ACTIONS))
@pytest.mark.parametrize("core", CORES, ids=list(CORES))
@pytest.mark.parametrize("method", ["rtrl", "tbptt"])
def test_traces_equal_the_discounted_sum_of_full_bptt_gradients(core, action, method, wiring, device):
    torch.manual_seed(0)
    config = StreamACConfig(width=6, **WIRING[wiring])
    agent = StreamAC(spaces.Box(-1.0, 1.0, (3,)), ACTIONS[action], config, method=method,
                     **CORES[core]).double().to(device)  # fmt: skip
    xs, extras, actions, signs = run_fixed(agent, steps=9)
    z_actor, z_critic = reference_traces(agent, xs, extras, actions, signs, truncated=method == "tbptt")
    for got, want, params in (
        (agent.actor_opt.traces, z_actor, agent.actor),
        (agent.critic_opt.traces, z_critic, agent.critic),
    ):
        for (name, _), g, w in zip(params.named_parameters(), got, want):
            if method == "rtrl" and name.startswith("core.layers.0."):
                continue  # a lower layer of a stack: exact per layer only (see the module docstring)
            assert rel_err(g, w) <= 1e-10, f"{method} {core} {action} {wiring}: {name}"
