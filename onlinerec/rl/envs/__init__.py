"""Environment adapters for onlinerec's RL agents: every env family as a ``gymnasium.vector.VectorEnv``.

Contract (what the learner may rely on, whatever the backend)
------------------------------------------------------------
``make_vector_env(env_id, num_envs, seed=0, **kwargs) -> gymnasium.vector.VectorEnv`` (``env_id`` may also be a
factory ``(num_envs, seed) -> VectorEnv``; ``spaces(env_id, **kwargs)`` gives one stream's observation and action
spaces).

- **Actions**: ``single_action_space`` is ``Discrete(n)`` (start 0; ``step`` takes int64 ``(num_envs,)``;
  ``num_actions(env_id, **kwargs)`` returns ``n``) for every built-in family; a gymnasium env may also have a float
  ``Box`` (``step`` takes float32 ``(num_envs, *shape)``, passed unclipped: bounds are the policy's business) or a
  ``MultiDiscrete`` (flattened into one Discrete). Tuple/Dict action spaces — mixed Discrete/Box included — are
  refused with a ``ValueError`` (``base.action_kind``).
- **Observations**: pixel envs give ``uint8`` channels-first images: Atari ``(4, 84, 84)`` (4 stacked gray
  frames), ProcGen ``(3, 64, 64)`` RGB, DMLab ``(3, 72, 96)`` RGB. Non-pixel memory tasks give small vectors or
  grids: the T-maze and MiniGrid ``uint8``, POPGym ``float32`` (see each family below). ``gymnasium:<id>`` passes
  the env's own observations through, ``Dict`` and ``Tuple`` included (batched as dicts / tuples of arrays), as does
  MiniGrid with ``dict_obs=True``.
- **Autoreset = SAME_STEP** (torchbeast semantics; docs/r2ac.md#episode-resets-and-autoreset), ``metadata["autoreset_mode"] ==
  AutoresetMode.SAME_STEP``: when an episode ends at a step, that step returns the *first* observation of the
  next episode, ``terminated | truncated`` is True for that stream, and the reward is the old episode's last
  reward. So the learner flags "reset before the next step" exactly where ``terminated | truncated``.
  With episodic life (Atari's lives, the built-in task's trials) ``terminated`` is also set where a life ends.
- **Episode statistics** in every step's ``info``: ``info["episode_end"]`` (bool ``(num_envs,)``, True where a
  *real* episode ended — game over for Atari with episodic life, not a lost life), ``info["episode_return"]``
  (float32, the full episode's undiscounted, unclipped return) and ``info["episode_length"]`` (int64, agent steps),
  both valid where ``episode_end`` and 0 elsewhere.
- **Seeds** (``numpy.random.SeedSequence`` all the way down, so no two of these share a stream):

  - stream ``i`` of ``make_vector_env(env_id, n, seed=s)`` is seeded with ``stream_seed(s, i)`` =
    ``SeedSequence(entropy=s, spawn_key=(i,))`` reduced to 31 bits. ``seed=0`` and ``seed=1`` share no stream; stream
    ``i``'s seed does not depend on ``n``. The first ``reset()`` without a seed uses ``s``; ``reset(seed=t)`` reseeds
    stream ``i`` with ``stream_seed(t, i)``. ProcGen takes one ``rand_seed`` for all its streams: it is
    ``stream_seed(s, 0)``, and procgen derives the streams from it. DMLab's per-stream level-seed generator is
    ``RandomState(stream_seed(s, i))``.
  - a run (``onlinerec rl``, ``RolloutDataModule``) does not pass its own seed: it passes
    ``run_env_seed(seed, purpose=..., rank=..., restart=...)`` = ``SeedSequence(entropy=seed, spawn_key=(purpose,
    rank, restart))`` reduced to 63 bits, with purpose ``"train"`` (0) or ``"eval"`` (1), the DDP rank, and the
    number of times the run was resumed. So runs with different seeds, training and evaluation, DDP ranks and a
    run's successive resumes all get disjoint streams. (Before: ``seed + i``, evaluation ``seed + 10000 + i``, rank
    offset ``rank * num_envs`` — runs with seeds 0 and 1 shared 15 of 16 streams.)
- ``metadata`` also carries ``env_id`` and ``frames_per_step`` (emulator frames per agent step, for frame counts:
  Atari 4, DMLab 4, the others 1).

ALE kwargs also include ``fire_on_life_loss`` (True: press FIRE after a lost life, as the paper's torchbeast code)
and ``backend`` ("auto" / "native" / "torchbeast"; see ``atari.py`` and docs/envs.md for every preprocessing
difference from the paper's).

Env ids (``FAMILIES`` maps each family to its maker; unknown ids raise ``ValueError`` listing them)
------------------------------------------------------------------------------------------------
- ``"ALE/<Game>-v5"`` — Atari via ale-py's native vector env (``atari.py``). kwargs: ``full_action_space``,
  ``episodic_life`` (True), ``noop_max`` (30), ``frameskip`` (4), ``max_episode_frames`` (108 000), ``num_threads``.
  obs ``uint8 (4, 84, 84)``; minimal action set (Pong 6, Breakout 4, Qbert 6, Gravitar/Seaquest 18, MsPacman 9).
- ``"procgen:<game>"`` — ProcGen via the ``procgen`` module (``procgen-mirror`` wheel; ``procgen.py``).
  kwargs ``distribution_mode`` (easy/hard/memory/exploration/extreme; checked against the game before creating),
  ``num_levels``, ``start_level``. obs ``uint8 (3, 64, 64)``, 15 actions.
- ``"dmlab:<level>"`` — DeepMind Lab ``contributed/dmlab30/<level>`` via ``deepmind_lab`` (``dmlab.py``; not on
  PyPI). obs ``uint8 (3, 72, 96)``, 9 actions, action repeat 4; one subprocess per stream
  (``vectorization="async"``, the default here; ``"sync"`` runs them in-process; ``"resilient"`` restarts a Lab
  that crashes or hangs).
- ``"popgym:<Env>"`` — POPGym (e.g. ``popgym:RepeatPreviousEasy``); obs flattened to a ``float32`` vector
  (documented per env by its space). ``"MiniGrid-MemoryS7-v0"`` (or ``"minigrid:<id>"``) — MiniGrid memory rooms;
  obs the ``uint8 (3, 7, 7)`` partial view (channels first; ``dict_obs=True`` adds the direction, as a Dict).
  ``"gymnasium:<id>"`` — any registered gymnasium env with Discrete, MultiDiscrete or Box actions (obs passed
  through), including rl-zoo's masked-velocity ``CartPoleNoVel-v1`` and ``PendulumNoVel-v1``. All three take
  ``wrappers=[{class_path, init_args}, ...]`` (gymnasium wrappers for each stream's env) and go through
  ``gymnasium_envs.py``
  (``SyncVectorEnv``/``AsyncVectorEnv`` with SAME_STEP autoreset; ``vectorization="async"`` for subprocesses,
  ``vectorization="resilient"`` for subprocesses that are restarted when they crash or hang — the stream is
  flagged reset, ``info["restarted"]`` is True there, and the interrupted episode is not reported).
- ``"memory:tmaze"`` — built-in passive T-maze (numpy only, vectorised; ``memory.py``). kwargs ``length`` (10),
  ``num_cues`` (2), ``trials`` (1), ``episodic_life`` (True), ``wrong_reward`` (0). obs ``uint8 (num_cues+2,)``,
  ``num_cues`` actions.
- ``"factory:<module>.<function>"`` — your own: ``function(num_envs, seed, **kwargs)`` returns any gymnasium vector
  env (any autoreset mode; NEXT_STEP/DISABLED are adapted, an env that cannot be is refused with the fix). A Python
  callable ``(num_envs, seed) -> VectorEnv`` is accepted wherever an env id is. The first time a factory builds
  more than one stream, a copy of its env is stepped with random actions, and a warning says so if all streams
  show the same observations (streams that ignore their seed; ``checks.py``).
- Every family takes ``vector_wrappers=[{class_path, init_args}, ...]``: gymnasium vector wrappers applied to the
  finished vector env (e.g. ``gymnasium.wrappers.vector.ClipReward``). gymnasium's vector *observation* wrappers
  refuse SAME_STEP autoreset: transform observations with ``wrappers`` (``gymnasium.wrappers.FlattenObservation``,
  ``NormalizeObservation``), or, for a factory, inside the factory.

envpool (Atari and ProcGen) was measured against these backends (``benchmarks/env_throughput.py``: ratios 1.01
and 0.93 on 2 CPUs) and is not offered: no clear gain, and it cannot share an environment with procgen-mirror.

Optional backends are imported lazily; a missing one raises ``MissingBackendError`` (an ``ImportError``) that
says how to install it (``pip install 'onlinerec[atari]'``, ``[procgen]``, ``[memory]``; DMLab from source).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from onlinerec.rl.envs.base import (
    PURPOSES,
    EpisodeTracker,
    MissingBackendError,
    SameStepEnv,
    action_kind,
    ensure_contract,
    run_env_seed,
    stream_seed,
    stream_seeds,
    unexpected_env_kwargs,
)

__all__ = [
    "FAMILIES",
    "PURPOSES",
    "EnvFamily",
    "EpisodeTracker",
    "MissingBackendError",
    "SameStepEnv",
    "action_kind",
    "ensure_contract",
    "make_vector_env",
    "num_actions",
    "parse_env_id",
    "run_env_seed",
    "spaces",
    "stream_seed",
    "stream_seeds",
]


@dataclasses.dataclass(frozen=True)
class EnvFamily:
    """One env family: how its ids look, and where its maker lives (imported lazily)."""

    name: str
    id_format: str
    module: str
    maker: str
    install: str

    def make(self, env_id: str, num_envs: int, seed: int = 0, **kwargs: Any):
        fn: Callable = getattr(importlib.import_module(self.module), self.maker)
        return fn(env_id, num_envs, seed, **kwargs)


FAMILIES: dict[str, EnvFamily] = {
    "atari": EnvFamily(
        "atari", "ALE/<Game>-v5", "onlinerec.rl.envs.atari", "make_atari", "pip install 'onlinerec[atari]'"
    ),
    "procgen": EnvFamily(
        "procgen", "procgen:<game>", "onlinerec.rl.envs.procgen", "make_procgen", "pip install 'onlinerec[procgen]'"
    ),
    "dmlab": EnvFamily(
        "dmlab", "dmlab:<level>", "onlinerec.rl.envs.dmlab", "make_dmlab", "build deepmind_lab from source (Bazel)"
    ),
    "popgym": EnvFamily(
        "popgym", "popgym:<Env>", "onlinerec.rl.envs.gymnasium_envs", "make_popgym", "pip install 'onlinerec[memory]'"
    ),
    "minigrid": EnvFamily(
        "minigrid",
        "MiniGrid-<...>-v0 or minigrid:<id>",
        "onlinerec.rl.envs.gymnasium_envs",
        "make_minigrid",
        "pip install 'onlinerec[memory]'",
    ),
    "gymnasium": EnvFamily(
        "gymnasium", "gymnasium:<id>", "onlinerec.rl.envs.gymnasium_envs", "make_gymnasium", "pip install gymnasium"
    ),
    "memory": EnvFamily("memory", "memory:tmaze", "onlinerec.rl.envs.memory", "make_memory", "built in (numpy)"),
    "factory": EnvFamily(
        "factory", "factory:<module>.<function>", "onlinerec.rl.envs", "_make_from_factory", "your own module"
    ),
}

#: Families whose maker builds each stream from a single gymnasium env, so per-env ``wrappers`` apply.
SINGLE_ENV_FAMILIES = frozenset({"gymnasium", "popgym", "minigrid"})


_FACTORY_WRAPPERS = (
    "wrappers= wraps the single gymnasium env of each stream, and {what} builds its streams itself: wrap each stream's "
    "env inside the factory, e.g. SyncVectorEnv([lambda: gymnasium.wrappers.FlattenObservation(MyEnv()) for _ in "
    "range(num_envs)]). vector_wrappers= wraps the vector env the factory returns, with gymnasium's vector wrappers "
    "that take SAME_STEP autoreset (rewards and actions, e.g. gymnasium.wrappers.vector.ClipReward; its vector "
    "observation wrappers refuse SAME_STEP)."
)


def _make_from_factory(path: str, num_envs: int, seed: int = 0, **kwargs: Any):
    from onlinerec.rl.envs.gymnasium_envs import resolve_callable

    return resolve_callable(path)(num_envs, seed, **kwargs)


def _check_streams(make: Callable[[], Any], num_envs: int, factory: Any) -> None:
    """Warn once per factory whose streams all show the same observations (:mod:`onlinerec.rl.envs.checks`)."""
    from onlinerec.rl.envs.checks import warn_if_streams_identical

    name = factory if isinstance(factory, str) else f"the env factory {getattr(factory, '__qualname__', factory)!s}"
    key: Any = factory
    try:
        hash(key)
    except TypeError:  # an unhashable callable: checked each time
        key = object()
    warn_if_streams_identical(make, num_envs, name, key)


def parse_env_id(env_id: str) -> tuple[EnvFamily, str]:
    """Split an env id into its family and the name the family's maker receives."""
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"env_id must be a non-empty string, got {env_id!r}")
    if env_id.startswith("ALE/"):
        return FAMILIES["atari"], env_id
    if env_id.startswith("MiniGrid-"):
        return FAMILIES["minigrid"], env_id
    prefix, sep, rest = env_id.partition(":")
    if sep and prefix.lower() in FAMILIES and prefix.lower() != "atari" and rest:
        return FAMILIES[prefix.lower()], rest
    from onlinerec.rl.envs.names import suggest_env_id

    known = "; ".join(f"{f.name}: {f.id_format}" for f in FAMILIES.values())
    meant = suggest_env_id(env_id)
    hint = f" (did you mean {meant!r}?)" if meant and meant != env_id else ""
    raise ValueError(f"unknown env id {env_id!r}{hint}. Known families — {known}")


def make_vector_env(env_id: str | Callable[..., Any], num_envs: int, seed: int = 0, **kwargs: Any):
    """Make ``num_envs`` streams of ``env_id`` as a SAME_STEP gymnasium vector env (see the module docstring).

    ``env_id`` may be a factory ``(num_envs, seed, **kwargs) -> VectorEnv``; its env is adapted to the contract
    (:func:`~onlinerec.rl.envs.base.ensure_contract`, streams seeded from ``seed`` if the factory left them unseeded).
    ``wrappers`` (single-env families) and ``vector_wrappers`` (all) are lists of ``{class_path, init_args}``.
    """
    if int(num_envs) < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    vector_wrappers = kwargs.pop("vector_wrappers", None)
    num_envs, seed = int(num_envs), int(seed)
    if callable(env_id):
        if "wrappers" in kwargs:
            raise ValueError(_FACTORY_WRAPPERS.format(what="an env factory"))
        factory = env_id
        env = ensure_contract(factory(num_envs, seed, **kwargs), seed=seed)
        _check_streams(lambda: ensure_contract(factory(num_envs, seed, **kwargs), seed=seed), num_envs, factory)
    else:
        family, name = parse_env_id(env_id)
        if kwargs.get("wrappers") and family.name == "factory":
            raise ValueError(_FACTORY_WRAPPERS.format(what=f"factory:{name}"))
        if kwargs.get("wrappers") and family.name not in SINGLE_ENV_FAMILIES:
            raise ValueError(
                f"wrappers= wraps each stream's single gymnasium env, which the {family.name} family does not build "
                f"(it is a vector env already); use vector_wrappers=, or a gymnasium:/popgym:/minigrid: id"
            )
        try:
            env = family.make(name, num_envs, seed, **kwargs)
        except TypeError as err:
            if "unexpected keyword argument" not in str(err):
                raise
            raise ValueError(unexpected_env_kwargs(env_id, kwargs, err)) from err
        if family.name == "factory":
            env = ensure_contract(env, seed=seed)
            _check_streams(
                lambda: ensure_contract(family.make(name, num_envs, seed, **kwargs), seed=seed), num_envs, env_id
            )
    if vector_wrappers:
        from onlinerec.rl.envs.gymnasium_envs import apply_wrappers, check_wrappers

        env = apply_wrappers(env, check_wrappers(vector_wrappers))
    return env


def spaces(env_id: str | Callable[..., Any], **kwargs: Any) -> tuple[Any, Any]:
    """(observation space, action space) of one stream of ``env_id`` with these kwargs (builds one env)."""
    env = make_vector_env(env_id, 1, 0, **kwargs)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()


_STATIC_ACTIONS = {"procgen": 15, "dmlab": 9}


def num_actions(env_id: str, **kwargs: Any) -> int:
    """Number of discrete actions of ``env_id`` with these kwargs (builds one env when it must)."""
    family, name = parse_env_id(env_id)
    if family.name in _STATIC_ACTIONS:
        return _STATIC_ACTIONS[family.name]
    if family.name == "memory":
        return int(kwargs.get("num_cues", 2))
    if family.name == "atari":
        from onlinerec.rl.envs.atari import atari_num_actions

        return atari_num_actions(name, **kwargs)
    _, space = spaces(env_id, **kwargs)
    if not hasattr(space, "n"):
        raise ValueError(f"{env_id} has no discrete action count: its action space is {space} (see spaces())")
    return int(space.n)
