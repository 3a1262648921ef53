"""Stream AC(lambda) with a recurrent core learned by exact RTRL: one update per env step, from that step alone.

Elsayed, Vasan & Mahmood (2024), "Streaming Deep Reinforcement Learning Finally Works" (stream AC(lambda), ObGD,
sparse initialisation, LayerNorm, running normalisation), with the recurrent core of Farr, Reddi, D'Eramo & Peters
(2026): the core's share of each step's gradient comes through its carried RTRL sensitivities, so the eligibility
traces accumulate exact gradients over the whole history (docs/streaming.md derives it). Per env step t:

    x_t = normalise(o_t)                                            observe
    a_t ~ pi(. | x_1..t);  v_t = V(x_1..t)                          act       (actor and critic: networks of their own)
    r_t, o_{t+1} from the env
    delta_t = r_t / sigma_R + gamma (1 - terminated) V(x_1..t+1) - v_t                           learn
    z_pi <- gamma lambda z_pi + grad [log pi(a_t) + c sign(delta_t) H(pi_t)];  z_V <- gamma lambda z_V + grad v_t
    theta <- theta + alpha' delta_t z                               (ObGD, per network; traces zeroed at episode ends)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from onlinerec.cells import make_cell
from onlinerec.gradients import METHODS, GradientMethod, load_carry
from onlinerec.rl.normalize import ObservationNormalizer, ReturnNormalizer
from onlinerec.rl.policy import make_head
from onlinerec.rl.spaces import space_spec
from onlinerec.rl.streaming.config import StreamACConfig
from onlinerec.rl.streaming.network import StreamNet, action_features
from onlinerec.rl.streaming.obgd import ObGD

__all__ = ["StreamAC"]


class StreamAC(nn.Module):
    """The streaming actor-critic for one env stream (vector observations; Discrete or Box actions).

    Args:
        observation_space, action_space: the env's (gymnasium spaces or their ``space_spec``).
        config: the algorithm's settings.
        cell: the recurrent core of each network (a name, class path, list of names for a stack, or None for
            stream-x's feed-forward networks); ``hidden_size``, ``layers``, ``cell_kwargs`` as for
            :func:`onlinerec.cells.make_cell`.
        method: "rtrl" (exact, the default) or "tbptt" (one-step truncation: the baseline); SnAP's approximation is
            refused for element-wise cells, where it is RTRL.
    """

    def __init__(
        self,
        observation_space: Any,
        action_space: Any,
        config: StreamACConfig | None = None,
        *,
        cell: str | list[str] | None = "rtu",
        hidden_size: int = 64,
        layers: int | None = None,
        cell_kwargs: dict[str, Any] | None = None,
        method: str | GradientMethod = "rtrl",
    ) -> None:
        super().__init__()
        self.config = config = config or StreamACConfig()
        obs = space_spec(observation_space)
        if obs["type"] != "Box":
            raise ValueError(
                f"the streaming agent takes vector observations (a Box), got a {obs['type']} space; flatten it with "
                "gymnasium's FlattenObservation (env_kwargs: {wrappers: [{class_path: "
                "gymnasium.wrappers.FlattenObservation}]}), or train R2AC (onlinerec rl), whose stems read images and "
                "dict observations."
            )
        self.obs_size = int(math.prod(obs["shape"]))
        self.method = METHODS.resolve(method)() if isinstance(method, str) else method

        width = config.width
        self.extra_size = _action_features_size(action_space) + 1 if config.prev_action_reward else 0
        core_input = (width if config.embed else self.obs_size) + self.extra_size

        def core():
            if cell is None:
                return None
            kwargs = {**(cell_kwargs or {}), **({"layers": layers} if layers is not None else {})}
            return make_cell(cell, core_input, hidden_size, **kwargs)

        shape = dict(embed=config.embed, extra_size=self.extra_size)
        self.actor = StreamNet(
            self.obs_size, width, core(), make_head(action_space, width, state_dependent_std=True), config.sparsity,
            **shape,
        )  # fmt: skip
        self.critic = StreamNet(self.obs_size, width, core(), nn.Linear(width, 1), config.sparsity, **shape)
        self.obs_norm = ObservationNormalizer((self.obs_size,), clip=0.0) if config.obs_norm else None
        self.return_norm = ReturnNormalizer() if config.reward_norm else None
        self.register_buffer("running_return", torch.zeros((), dtype=torch.float64))
        if self.extra_size:  # the previous action's features and reward, as the next step's core reads them
            self.register_buffer("previous", torch.zeros(1, self.extra_size))
        self.actor_opt = ObGD(self.actor.parameters(), config.lr, config.discount, config.trace_lambda,
                              config.kappa_policy)  # fmt: skip
        self.critic_opt = ObGD(self.critic.parameters(), config.lr, config.discount, config.trace_lambda,
                               config.kappa_value)  # fmt: skip
        self.carries = {name: self._zero_carry(net) for name, net in self.networks().items()}
        self._parameters_list = list(self.parameters())  # the same objects after .to(): their data moves
        self._pending: tuple[Tensor, Tensor, Tensor] | None = None

    def networks(self) -> dict[str, StreamNet]:
        return {"actor": self.actor, "critic": self.critic}

    def _zero_carry(self, net: StreamNet):
        return None if net.core is None else self.method.init_carry(net.core, 1)

    # -- one env step --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def observe(self, obs: Any) -> Tensor:
        """One raw observation as the networks read it, (1, D): folded into the running statistics, then
        normalised by them (``obs_norm``)."""
        device = self.running_return.device
        if self.obs_norm is not None and device.type == "cpu":
            return self.obs_norm.update_and_normalize_one(obs)  # the same arithmetic in NumPy: a few microseconds
        # a copy from pageable host memory that does not wait for the device's queue (the source is staged first)
        x = torch.as_tensor(obs).to(device, non_blocking=True).reshape(1, self.obs_size).float()
        if self.obs_norm is None:
            return x
        self.obs_norm.update(x)
        return self.obs_norm(x)

    def act(self, x: Tensor, reset: bool) -> Tensor:
        """Sample an action for observation x (1, D) (``reset``: the first step of an episode) and keep what
        :meth:`learn` needs. Returns the action as the env takes it, (1, ...)."""
        flag = torch.full((1,), bool(reset), device=x.device)  # filled on the device: no copy from the host
        extra = None
        if self.extra_size:
            if reset:
                self.previous.zero_()
            extra = self.previous.clone()
        params, self.carries["actor"] = self.actor.step(x, flag, self.carries["actor"], self.method, extra)
        value, self.carries["critic"] = self.critic.step(x, flag, self.carries["critic"], self.method, extra)
        head = self.actor.head
        action = head.sample(params.detach())
        self._pending = (params, value[:, 0], action)
        return head.env_actions(action)

    def learn(
        self,
        reward: float,
        x_next: Tensor | None,
        terminated: bool,
        done: bool,
        backward: Callable[[Tensor], Any] | None = None,
    ) -> Tensor:
        """Update from the step :meth:`act` took: its reward, the next observation ``x_next`` (1, D) (the episode's
        last one if it ended by a time limit; None after a termination), and whether the episode ended (``done``:
        the traces are zeroed after the update). ``backward``: what differentiates the step's objective (e.g.
        ``fabric.backward``; default ``Tensor.backward``). Returns the TD error."""
        if self._pending is None:
            raise RuntimeError("learn() follows act(): call act(x, reset) for this step first.")
        params, value, action = self._pending
        self._pending = None
        cfg, head = self.config, self.actor.head
        with torch.no_grad():
            scaled = self._scaled(reward, terminated, value)
            extra = None
            if self.extra_size:  # what the next step reads: this action and reward
                extra = torch.cat([action_features(head, action, value.dtype), scaled.reshape(1, 1)], dim=-1)
                self.previous.copy_(extra)
            target = scaled
            if not terminated and x_next is not None:
                target = target + cfg.discount * self.critic.peek(x_next, self.carries["critic"], extra)[0, 0]
            delta = target - value.detach()[0]
        objective = head.log_prob(params, action) + cfg.entropy_cost * torch.sign(delta) * head.entropy(params) + value
        for p in self._parameters_list:
            p.grad = None
        (backward or Tensor.backward)(objective.sum())
        self.actor_opt.step(delta, done)
        self.critic_opt.step(delta, done)
        return delta

    @torch.no_grad()
    def _scaled(self, reward: float, terminated: bool, like: Tensor) -> Tensor:
        """The reward divided by the running std of the discounted return (``reward_norm``; the return is carried
        through time limits and restarts at terminations), as a 0-d tensor of ``like``'s dtype and device, computed
        there (nothing is read back to the host)."""
        if self.return_norm is None:
            return like.new_full((), float(reward))
        if like.device.type == "cpu":  # the same float64 arithmetic in Python floats: a few calls instead of twenty
            ret = self.running_return.item() * (self.config.discount * (1.0 - float(terminated))) + float(reward)
            self.running_return.fill_(ret)
            return torch.tensor(float(reward) / self.return_norm.update_scalar(ret), dtype=like.dtype)
        self.running_return.mul_(self.config.discount * (1.0 - float(terminated))).add_(float(reward))
        self.return_norm.update(self.running_return)
        std = self.return_norm.std
        return torch.full_like(std, float(reward)).div_(std).to(like.dtype)

    def export(self, path: Any, *, output: str = "action", greedy: bool = True):
        """The policy as one TorchScript file (:func:`~onlinerec.rl.streaming.policy.export_stream_policy`)."""
        from onlinerec.rl.streaming.policy import export_stream_policy

        return export_stream_policy(self, path, output=output, greedy=greedy)

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def learner_state(self) -> dict[str, Any]:
        """What the module's ``state_dict`` (weights, normaliser statistics, eligibility traces) does not hold: the
        cores' carries (state and sensitivities)."""
        return {"carries": {k: None if c is None else c.state_dict() for k, c in self.carries.items()}}

    def load_learner_state(self, state: dict[str, Any]) -> None:
        self.carries = {k: None if c is None else self._carry_here(c) for k, c in state["carries"].items()}

    def _apply(self, fn, recurse: bool = True):
        """``.to()``, ``.double()``, ...: the carries (not buffers) follow the parameters' device and dtype."""
        out = super()._apply(fn, recurse)
        if "carries" in self.__dict__:
            self.carries = {k: None if c is None else self._carry_here(c.state_dict()) for k, c in self.carries.items()}
        return out

    def _carry_here(self, state: dict[str, Any]):
        """A carry from its ``state_dict`` on the parameters' device, its floating tensors in their dtype."""
        ref = next(self.actor.parameters())

        def move(value: Any) -> Any:
            if isinstance(value, Tensor):
                return value.to(ref.device, ref.dtype if value.is_floating_point() else value.dtype)
            if isinstance(value, dict):
                return {k: move(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(move(v) for v in value)
            return value

        return load_carry(move(state))


def _action_features_size(action_space: Any) -> int:
    """Width of :func:`~onlinerec.rl.streaming.network.action_features` for ``action_space``'s actions (known before
    the head is built: the networks are built in the order their random initialisation has always drawn)."""
    spec = space_spec(action_space)
    return int(spec["n"]) if spec["type"] == "Discrete" else int(math.prod(spec.get("shape", (1,))))
