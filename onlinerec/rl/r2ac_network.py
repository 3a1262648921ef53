"""R2AC's network, built from the env's spaces and the settings: stems, recurrent core(s), normaliser and heads.

:func:`build_network` makes every part (docs/r2ac.md#network) and :class:`~onlinerec.rl.r2ac.R2AC` registers them, in
the order they are built; how they run (``R2AC.features``, ``R2AC.heads``) stays with the module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from onlinerec.cells import ElementwiseCell, Parallel, make_cell
from onlinerec.rl.nets import DictStem, is_channels_last, is_image_spec, make_stem
from onlinerec.rl.normalize import ObservationNormalizer
from onlinerec.rl.policy import ActionHead, make_head
from onlinerec.rl.r2ac_config import R2ACConfig
from onlinerec.rl.spaces import unit_bounded_features

__all__ = ["R2ACNetwork", "build_network", "mlp", "observation_normalizer", "r2ac_stem"]


@dataclass
class R2ACNetwork:
    """The parts of an R2AC network (the attributes of the same names on :class:`~onlinerec.rl.r2ac.R2AC`)."""

    core: ElementwiseCell | None
    """The recurrent core: the actor's cell, or under ``separate_critic`` a :class:`~onlinerec.cells.Parallel` of
    the actor's and the critic's; None for the feed-forward baseline."""
    actor_core: ElementwiseCell | None
    """The policy's cell (the whole core without ``separate_critic``)."""
    obs_normalizer: ObservationNormalizer | None
    """``obs_norm``'s running statistics."""
    stem: nn.Module
    critic_stem: nn.Module | None
    """``separate_critic``: the critic's stem, built like the actor's."""
    core_norm: nn.Module
    """A LayerNorm on the core's output under ``core_norm``, else the identity."""
    critic_norm: nn.Module | None
    policy_mlp: nn.Module
    value_mlp: nn.Module
    policy: ActionHead
    baseline: nn.Linear
    split: tuple[int, int] | None
    """``separate_critic``: the widths of the actor's and the critic's core outputs."""
    head_sizes: list[int]
    """The widths of the MLPs before the heads, as plain ints."""


def mlp(width: int, sizes: list[int]) -> nn.Module:
    """Linear + tanh layers of the given widths (sb3's policy MLP); no layers: the identity (no parameters)."""
    layers: list[nn.Module] = []
    for out in sizes:
        layers += [nn.Linear(width, out), nn.Tanh()]
        width = out
    return nn.Sequential(*layers) if layers else nn.Identity()


def r2ac_stem(obs_spec: Any, obs_shape: Any, stem: str, fc_size: int) -> nn.Module:
    """The stem for the observations: one per key for Dict/Tuple observations or an HWC image
    (:class:`~onlinerec.rl.nets.DictStem`), else ``stem`` by name (:func:`~onlinerec.rl.nets.make_stem`)."""
    if obs_shape is None or (obs_spec is not None and is_image_spec(obs_spec) and is_channels_last(obs_shape)):
        return DictStem(obs_spec, fc_size, image_stem=stem)  # per key; or an HWC image
    return make_stem(stem, obs_shape, fc_size)


def observation_normalizer(
    config: R2ACConfig, obs_shape: Any, obs_spec: dict[str, Any] | None
) -> ObservationNormalizer | None:
    """``obs_norm``'s running statistics, after checking that the observations are flat vectors (not images, not
    Dict/Tuple observations, whose ``obs_shape`` is None); with ``obs_norm_skip_binary``, the mask of the
    features whose bounds are [0, 1]."""
    if not config.obs_norm:
        return None
    if obs_shape is None or len(obs_shape) != 1:
        seen = "Dict/Tuple observations" if obs_shape is None else f"observations of shape {tuple(obs_shape)}"
        raise ValueError(
            f"R2ACConfig.obs_norm normalises flat vector observations, but this agent reads {seen}. Image stems "
            "scale their pixels themselves: leave obs_norm off; for other observations normalise in the env "
            "(env_kwargs: {wrappers: [{class_path: gymnasium.wrappers.NormalizeObservation}]}). Vector observations of another shape, such as (1, n): flatten them first, and obs_norm works: env_kwargs: {wrappers: [{class_path: gymnasium.wrappers.FlattenObservation}]} (gymnasium:, popgym: and minigrid: ids; a factory wraps each stream's env itself)."
        )
    keep = unit_bounded_features(obs_spec, tuple(obs_shape)) if config.obs_norm_skip_binary else None
    keep = keep if keep is not None and bool(keep.any()) else None  # nothing to keep: plain obs_norm, exactly
    return ObservationNormalizer(tuple(obs_shape), clip=config.obs_clip, keep=keep)


def build_network(
    action_spec: dict[str, Any],
    obs_spec: dict[str, Any] | None,
    obs_shape: tuple[int, ...] | None,
    config: R2ACConfig,
    *,
    cell: ElementwiseCell | str | Sequence[str] | None,
    hidden_size: int,
    stem: str,
    fc_size: int,
    cell_kwargs: dict[str, Any] | None,
    head_sizes: Sequence[int],
    core_norm: bool,
    separate_critic: bool,
) -> R2ACNetwork:
    """Every part of an R2AC network, built in a fixed order (the core, the critic's core, the stems, the norms, the
    MLPs, the heads), so that a seed gives the same initial weights. The arguments are
    :class:`~onlinerec.rl.r2ac.R2AC`'s; ``action_spec``, ``obs_spec`` and ``obs_shape`` are resolved from its spaces
    (:mod:`onlinerec.rl.spaces`)."""
    head_sizes = [int(w) for w in head_sizes]
    if any(w < 1 for w in head_sizes):
        raise ValueError(f"head_sizes must be positive widths, got {head_sizes}.")
    core_in = fc_size + 1
    if separate_critic and isinstance(cell, ElementwiseCell):
        raise ValueError(
            "separate_critic=True builds the critic's core like the actor's from the cell's name; pass cell as a "
            f"name or a list of names (e.g. 'elstm' or ['lru', 'mingru']), not a built {type(cell).__name__}."
        )
    if isinstance(cell, (str, list, tuple)):  # a name, or a list of names (a stack of different cells)
        core: ElementwiseCell | None = make_cell(cell, core_in, hidden_size, **(cell_kwargs or {}))
    else:
        core = cell
    actor_core = core  # the policy's core (the whole core without separate_critic)
    if core is not None and core.input_size != core_in:
        raise ValueError(
            f"the cell's input_size is {core.input_size} but R2AC feeds it fc_size + 1 = {core_in} features."
        )
    if separate_critic and core is not None:  # the critic's core: built like the actor's, its own weights
        critic_core = make_cell(cell, core_in, hidden_size, **(cell_kwargs or {}))
        core = Parallel([core, critic_core])  # each reads its own stem's features (R2AC.features)
    obs_normalizer = observation_normalizer(config, obs_shape, obs_spec)
    actor_stem = r2ac_stem(obs_spec, obs_shape, stem, fc_size)
    critic_stem = r2ac_stem(obs_spec, obs_shape, stem, fc_size) if separate_critic else None
    head_in = core_in if actor_core is None else actor_core.output_size
    # a linear-recurrent core's output is unbounded (an LRU unit near |lambda| = 1 sums its inputs): normalised, its
    # growth cannot blow up the logits (docs/r2ac.md#the-networks-options)
    actor_norm: nn.Module = nn.LayerNorm(head_in) if core_norm else nn.Identity()
    critic_norm: nn.Module | None = None
    if separate_critic:
        critic_norm = nn.LayerNorm(head_in) if core_norm else nn.Identity()
    policy_mlp, value_mlp = mlp(head_in, head_sizes), mlp(head_in, head_sizes)
    width = head_sizes[-1] if head_sizes else head_in
    policy = make_head(
        action_spec,
        width,
        state_dependent_std=config.state_dependent_std,
        squash=config.squash_actions,
        log_std_init=config.log_std_init,
    )
    return R2ACNetwork(
        core=core,
        actor_core=actor_core,
        obs_normalizer=obs_normalizer,
        stem=actor_stem,
        critic_stem=critic_stem,
        core_norm=actor_norm,
        critic_norm=critic_norm,
        policy_mlp=policy_mlp,
        value_mlp=value_mlp,
        policy=policy,
        baseline=nn.Linear(width, 1),
        split=(head_in, head_in) if separate_critic else None,
        head_sizes=head_sizes,
    )
