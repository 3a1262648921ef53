"""The previous action and reward as the streaming agent's core reads them (``prev_action_reward``): in training, in
the evaluation actor and in the exported policy, zeros at an episode's first step."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gymnasium")
from gymnasium import spaces  # noqa: E402

from onlinerec.rl.streaming.agent import StreamAC  # noqa: E402
from onlinerec.rl.streaming.config import StreamACConfig  # noqa: E402
from onlinerec.rl.streaming.policy import EvaluationActor  # noqa: E402

ACTIONS = {"discrete": spaces.Discrete(3), "continuous": spaces.Box(-2.0, 2.0, (2,))}


def agent(action: str, **config) -> StreamAC:
    torch.manual_seed(0)
    config = StreamACConfig(width=8, embed=True, prev_action_reward=True, **config)
    return StreamAC(spaces.Box(-1.0, 1.0, (3,)), ACTIONS[action], config, hidden_size=4)


def test_each_step_reads_the_last_action_and_reward_and_zeros_after_a_reset(monkeypatch):
    a = agent("discrete", reward_norm=False)
    seen = []
    step = a.actor.step
    monkeypatch.setattr(a.actor, "step", lambda x, reset, carry, method, extra: seen.append(extra) or step(
        x, reset, carry, method, extra))  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    taken = []
    for t, (reward, done) in enumerate([(0.5, False), (-1.0, False), (2.0, True), (0.25, False)]):
        x = torch.randn(1, 3, generator=gen)
        a.act(x, reset=t in (0, 3))
        taken.append(a._pending[2])
        a.learn(reward, x, False, done)
    assert torch.equal(seen[0], torch.zeros(1, 4)) and torch.equal(seen[3], torch.zeros(1, 4))
    for t, reward in ((1, 0.5), (2, -1.0)):
        want = torch.cat([torch.nn.functional.one_hot(taken[t - 1], 3).float(), torch.tensor([[reward]])], -1)
        assert torch.equal(seen[t], want)


def test_the_reward_is_divided_by_the_returns_running_std():
    a = agent("discrete")
    x = torch.zeros(1, 3)
    a.act(x, reset=True)
    a.learn(3.0, x, False, False)
    assert torch.allclose(a.previous[0, -1], torch.tensor(3.0) / a.return_norm.std.float())


@pytest.mark.parametrize("action", ACTIONS)
def test_the_evaluation_actor_and_the_exported_policy_act_alike(action, tmp_path):
    a = agent(action)
    x = a.observe(torch.randn(3).numpy())
    for t in range(20):  # statistics and weights away from their start
        a.act(x, reset=t == 0)
        a.learn(float(t % 3) - 1.0, x, False, False)
    policy = torch.jit.load(str(a.export(tmp_path / "policy.pt")))
    actor, state = EvaluationActor(a), policy.initial_state(2)
    gen = torch.Generator().manual_seed(1)
    reset, reward = torch.tensor([True, True]), torch.zeros(2)
    for t in range(6):
        obs = torch.randn(2, 3, generator=gen)
        exported, state = policy(obs, reset, state, reward)
        actions, _ = actor.act(obs, reward, reset)
        assert torch.allclose(exported, a.actor.head.env_actions(actions), atol=1e-6)
        reset, reward = torch.tensor([False, t == 2]), torch.randn(2, generator=gen)


def test_a_policy_that_reads_its_last_action_does_not_export_parameters_only(tmp_path):
    with pytest.raises(ValueError, match="output='action'"):
        agent("discrete").export(tmp_path / "policy.pt", output="params")


@pytest.mark.parametrize("action", ACTIONS)
def test_the_evaluation_actor_reads_what_training_reads(action):
    """With the weights and statistics fixed, the evaluation actor given training's actions and rewards computes the
    same policy outputs as training, resets included."""
    a = agent(action, reward_norm=False, obs_norm=False)
    a.actor_opt.lr = a.critic_opt.lr = 0.0
    actor = EvaluationActor(a)
    gen = torch.Generator().manual_seed(2)
    reward, resets = torch.zeros(1), [True, False, False, True, False]
    for t, reset in enumerate(resets):
        x = torch.randn(1, 3, generator=gen)
        a.act(x, reset=reset)
        params, _, taken = a._pending
        _, evaluated = actor.act(x, reward, torch.tensor([reset]), greedy=True)
        assert torch.allclose(evaluated, params.detach(), atol=1e-6), t
        r = float(torch.randn((), generator=gen))
        a.learn(r, x, False, resets[t + 1] if t + 1 < len(resets) else False)
        actor.previous_actions["eval"] = a.previous[:, :-1].clone()  # the action training took, as features
        reward = torch.tensor([r])
