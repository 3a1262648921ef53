"""A trained R2AC as a self-contained recurrent policy: one TorchScript file that loads with torch alone.

::

    import torch

    policy = torch.jit.load("policy.pt")              # no onlinerec needed
    state = policy.initial_state(num_envs)            # list of zero tensors
    action, state = policy(obs, reset, state, reward) # one step for every stream

``obs`` is a batch of observations as the env gives them (``(B, *obs_shape)``; a Dict/Tuple observation as the flat
dict of :func:`~onlinerec.rl.segment.obs_to_tensor`, text values as their CRC-32 ids), ``reset`` (B,) bool marks
streams whose observation starts an episode (their state is zeroed first), ``reward`` (B,) is the reward that
arrived with ``obs`` (the agent reads it; omitted: zeros). The step goes through the modules' own single-step code:
the stem, :meth:`R2AC.features` (scaled and clipped reward), one step of the module's own unroll (the method R2AC
acts with, which runs the cell's input projection and recurrence), the cell's ``readout``, the policy head. The state
is the module's carry, flattened: ``c`` (``(B, N)``, or ``(B, K, N)`` for units of K components) and the input window
of cells that read several inputs, layer after layer for a stack of cells; a feed-forward agent's state is one empty
(B, 0) tensor. (A stack of layers has no single-step ``forward`` of its own, so the step goes through the unroll.)

``output="action"``: greedy actions in the env's action space (Discrete: int64 (B,); Box: float (B, *shape) inside
the bounds) or, with ``greedy=False``, sampled ones; ``output="params"``: the distribution's parameters (logits, or
[mean; log-std]). The file also holds ``onlinerec.json`` (``torch.jit.load(path, _extra_files={"onlinerec.json":
""})``): the spaces, the observation keys and the output kind.

TorchScript is used (``torch.jit.trace`` of the step inside a scripted wrapper) because it keeps the extra method
``initial_state``; PyTorch marks ``torch.jit`` deprecated in favour of ``torch.export``, whose programs have a
single entry point. The export suppresses those deprecation warnings.
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple  # noqa: UP035 - TorchScript reads these annotations

import torch
from torch import Tensor, nn

from onlinerec.gradients.tbptt import TBPTT

__all__ = ["export_policy", "flatten_carry", "unflatten_carry", "write_policy"]


class _Step(nn.Module):
    """One agent step of a copy of an R2AC's modules: (obs, reward, reset, state) -> (output, new state)."""

    def __init__(self, agent: Any, output: str, greedy: bool, template: Any) -> None:
        super().__init__()
        self.template = template  # the carry's structure (a Carry, or a StackCarry of them), for rebuilding it
        self.__dict__["agent"] = agent  # not a submodule: the tracer would probe the LightningModule's properties
        self.stem, self.cell, self.policy = agent.stem, agent.cell, agent.policy  # their parameters, registered
        self.policy_mlp, self.core_norm = agent.policy_mlp, agent.core_norm
        if agent.critic_stem is not None:  # separate_critic: features() runs both stems (the critic's core too)
            self.critic_stem = agent.critic_stem
        self.output = output
        self.greedy = greedy

    def forward(self, obs: Any, reward: Tensor, reset: Tensor, state: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        agent = self.agent
        obs1 = {k: v.unsqueeze(0) for k, v in obs.items()} if isinstance(obs, dict) else obs.unsqueeze(0)
        x = agent.features(obs1, reward.unsqueeze(0))  # (1, B, D): stem, reward scaling and clipping, cell dtype
        cell = agent.cell
        if cell is None:  # feed-forward: the state is one empty (B, 0) tensor, passed through
            h = x[0]
            new_state = list(state)
        else:  # one step of the module's own unroll (what R2AC.act runs), from the carry rebuilt from ``state``
            carry, _ = unflatten_carry(self.template, state, 0)
            states, carry = _STEP_METHOD.unroll(cell, x, reset.unsqueeze(0), carry)
            h = cell.readout(states, x)[0]
            new_state = flatten_carry(carry)
        params = agent.policy_params(h)
        if self.output == "params":
            return params, new_state
        head = agent.policy
        actions = head.mode(params) if self.greedy else head.sample(params)
        return head.env_actions(actions), new_state


class _TensorPolicy(nn.Module):
    def __init__(self, step: nn.Module, shapes: list[list[int]], dtype: torch.dtype, metadata: str) -> None:
        super().__init__()
        self.step = step
        self.shapes = shapes
        self.dtype = dtype
        self.metadata = metadata

    def forward(
        self, observation: Tensor, reset: Tensor, state: List[Tensor], reward: Optional[Tensor] = None
    ) -> Tuple[Tensor, List[Tensor]]:
        if reward is None:
            reward = torch.zeros(reset.shape[0], device=reset.device)
        return self.step(observation, reward.float(), reset.to(torch.bool), state)

    @torch.jit.export
    def initial_state(self, batch_size: int) -> List[Tensor]:
        """Zero state for ``batch_size`` streams (what a stream's reset also gives)."""
        return [torch.zeros([batch_size] + s, dtype=self.dtype) for s in self.shapes]


class _DictPolicy(_TensorPolicy):
    def forward(  # type: ignore[override]
        self, observation: Dict[str, Tensor], reset: Tensor, state: List[Tensor], reward: Optional[Tensor] = None
    ) -> Tuple[Tensor, List[Tensor]]:
        if reward is None:
            reward = torch.zeros(reset.shape[0], device=reset.device)
        return self.step(observation, reward.float(), reset.to(torch.bool), state)


def export_policy(agent: Any, path: str | Path, *, output: str = "action", greedy: bool = True) -> Path:
    """Write ``agent`` (an :class:`~onlinerec.rl.R2AC`) as a TorchScript policy at ``path`` (module docstring).

    Args:
        agent: the trained agent; it is not modified (its modules are copied to the CPU, in eval mode).
        path: the file to write (conventionally ``.pt``).
        output: "action" (actions the env takes) or "params" (the distribution's parameters, e.g. the logits).
        greedy: with ``output="action"``: the argmax / the Gaussian's mean (True) or a sample (False).

    Returns:
        The path written.
    """
    if output not in ("action", "params"):
        raise ValueError(f"output must be 'action' or 'params', got {output!r}.")
    # A copy of the agent without its Trainer (and whatever hangs off it), on the CPU, in eval mode.
    memo = {id(v): None for v in (getattr(agent, "_trainer", None), getattr(agent, "_fabric", None)) if v is not None}
    model = copy.deepcopy(agent, memo).cpu().eval()
    model.requires_grad_(False)  # outputs a deployment can hand to numpy (no autograd graph behind them)
    model.reset_streams()

    dtype = next(model.parameters()).dtype
    shapes: list[list[int]] = [[0]]  # feed-forward: one empty tensor (a trace needs a non-empty state list)
    template = None
    if model.cell is not None:
        template = _STEP_METHOD.init_carry(model.cell, 1, device="cpu", dtype=dtype)
        shapes = [list(t.shape[1:]) for t in flatten_carry(template)]
    step = _Step(model, output, greedy, template).eval()
    batch = 2
    obs = _example_observation(model, batch)
    metadata = {
        "format": "onlinerec R2AC policy v1",
        "output": output,
        "greedy": greedy,
        "action_space": model.action_space_spec,
        "observation_space": model.observation_space_spec,
        "obs_shape": None if model.obs_shape is None else list(model.obs_shape),
        "observation_keys": sorted(obs) if isinstance(obs, dict) else None,
    }
    return write_policy(step, obs, shapes, dtype, metadata, path)


def write_policy(
    step: nn.Module, example_obs: Any, shapes: list[list[int]], dtype: torch.dtype, metadata: dict[str, Any], path
) -> Path:
    """Trace ``step`` (``(obs, reward, reset, state) -> (output, new_state)`` for a batch of streams, ``state`` a list of
    tensors of ``shapes`` per stream) on ``example_obs`` (a batch of 2), wrap it with ``initial_state`` and save it as
    one TorchScript file with ``metadata`` (plus the state shapes and the call signature) as ``onlinerec.json``."""
    batch = 2
    state = [torch.zeros([batch] + s, dtype=dtype) for s in shapes]
    example = (example_obs, torch.zeros(batch), torch.tensor([True, False]), state)
    info = json.dumps(
        {
            **metadata,
            "state_shapes": shapes,
            "forward": "forward(observation, reset, state, reward=None) -> (output, new_state)",
        }
    )
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # torch.jit's deprecation notices, tracer notes on shape arithmetic
        traced = torch.jit.trace(step, example, strict=False, check_trace=False)
        wrapper_cls = _DictPolicy if isinstance(example_obs, dict) else _TensorPolicy
        scripted = torch.jit.script(wrapper_cls(traced, shapes, dtype, info))
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.jit.save(scripted, str(path), _extra_files={"onlinerec.json": info})
    return path


_STEP_METHOD = TBPTT()  # what the module runs for its acting streams (no sensitivities)


def flatten_carry(carry: Any) -> list[Tensor]:
    """A carry's state tensors in a fixed order: ``c`` then the input window (if any), layer after layer for a
    stack (``carry.layers``)."""
    if hasattr(carry, "layers"):
        return [t for layer in carry.layers for t in flatten_carry(layer)]
    return [carry.c] + ([] if carry.window is None else [carry.window])


def unflatten_carry(template: Any, tensors: list[Tensor], pos: int) -> tuple[Any, int]:
    """The inverse of :func:`_flatten`, shaped like ``template``; returns the carry and the next position."""
    if hasattr(template, "layers"):
        layers = []
        for layer in template.layers:
            rebuilt, pos = unflatten_carry(layer, tensors, pos)
            layers.append(rebuilt)
        return type(template)(layers), pos
    if template.window is None:
        return type(template)(c=tensors[pos]), pos + 1
    return type(template)(c=tensors[pos], window=tensors[pos + 1]), pos + 2


def _example_observation(model: Any, batch: int) -> Any:
    """A batch of zero observations of the model's space (for tracing)."""
    if model.obs_shape is not None and not isinstance(model.stem, _dict_stem_type()):
        dtype = _numpy_dtype_to_torch((model.observation_space_spec or {}).get("dtype", "uint8"))
        if model.observation_space_spec is None:  # built from obs_shape: images are uint8, vectors float
            dtype = torch.uint8 if len(model.obs_shape) == 3 else torch.float32
        return torch.zeros((batch, *model.obs_shape), dtype=dtype)
    from onlinerec.rl.nets import flat_spaces

    out = {}
    for key, spec in flat_spaces(model.observation_space_spec).items():
        if key not in model.stem.keys:
            continue
        kind = spec["type"]
        if kind == "Box":
            out[key] = torch.zeros((batch, *spec["shape"]), dtype=_numpy_dtype_to_torch(spec["dtype"]))
        elif kind == "MultiBinary":
            out[key] = torch.zeros((batch, *spec["shape"]), dtype=torch.int8)
        elif kind == "MultiDiscrete":
            out[key] = torch.zeros((batch, len(spec["nvec"])), dtype=torch.int64)
        else:  # Discrete, Text ids
            out[key] = torch.full((batch,), int(spec.get("start", 0)), dtype=torch.int64)
    if len(out) == 1 and model.observation_space_spec["type"] not in ("Dict", "Tuple"):
        return next(iter(out.values()))
    return out


def _dict_stem_type() -> type:
    from onlinerec.rl.nets import DictStem

    return DictStem


def _numpy_dtype_to_torch(name: str) -> torch.dtype:
    import numpy as np

    return torch.from_numpy(np.zeros(0, dtype=np.dtype(name))).dtype
