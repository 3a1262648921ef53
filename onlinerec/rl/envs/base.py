"""Shared pieces of the env adapters: episode statistics, the SAME_STEP wrapper, seeding, action spaces, errors."""

from __future__ import annotations

from typing import Any, Callable

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

__all__ = [
    "PURPOSES",
    "EpisodeTracker",
    "SameStepEnv",
    "MissingBackendError",
    "action_kind",
    "check_action_space",
    "ensure_contract",
    "run_env_seed",
    "same_step_metadata",
    "stream_seed",
    "stream_seeds",
]


class MissingBackendError(ImportError):
    """An optional env backend (ale-py, procgen, deepmind_lab, popgym, minigrid, ...) is not installed."""


PURPOSES: dict[str, int] = {"train": 0, "eval": 1, "diagnostic": 2}
"""What a run's envs are for (training; the greedy evaluation after it; analyses of a trained agent, such as
``experiments/minigrid_cue.py``); each purpose gets its own, disjoint env streams (:func:`run_env_seed`)."""


def _nonnegative(name: str, value: Any) -> int:
    value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer (numpy.random.SeedSequence entropy), got {value}")
    return value


def run_env_seed(seed: int, *, purpose: str = "train", rank: int = 0, restart: int = 0) -> int:
    """The env seed a run hands to :func:`~onlinerec.rl.envs.make_vector_env` (or an env factory).

    ``numpy.random.SeedSequence(entropy=seed, spawn_key=(PURPOSES[purpose], rank, restart))`` reduced to a 63-bit
    integer: runs with different seeds, training and evaluation, DDP ranks, and the envs rebuilt after each resume
    (``restart``) all draw unrelated streams, instead of the overlapping ``seed + i`` ranges of earlier versions.
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {sorted(PURPOSES)}, got {purpose!r}")
    key = (PURPOSES[purpose], _nonnegative("rank", rank), _nonnegative("restart", restart))
    state = np.random.SeedSequence(entropy=_nonnegative("seed", seed), spawn_key=key).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))


def stream_seed(seed: int, index: int, restart: int = 0) -> int:
    """Stream ``index``'s seed under env seed ``seed``: ``SeedSequence(entropy=seed, spawn_key=(index,))`` reduced
    to 31 bits (the widest seed every backend takes: ALE, DMLab's ``RandomState``, procgen). ``restart > 0`` gives the
    seed of the stream's ``restart``-th replacement env (:class:`~onlinerec.rl.envs.resilient.ResilientVectorEnv`)."""
    key = (_nonnegative("index", index),) + ((_nonnegative("restart", restart),) if restart else ())
    state = np.random.SeedSequence(entropy=_nonnegative("seed", seed), spawn_key=key).generate_state(1, np.uint32)
    return int(state[0] >> np.uint32(1))


def stream_seeds(seed: int, num_envs: int) -> np.ndarray:
    """Per-stream seeds ``[stream_seed(seed, i) for i in range(num_envs)]`` (int64). Stream ``i``'s seed does not
    depend on ``num_envs``; different ``seed`` values give unrelated seeds (no shared streams)."""
    return np.array([stream_seed(seed, i) for i in range(int(num_envs))], dtype=np.int64)


def same_step_metadata(base: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    """A fresh metadata dict (never the class-level one) for an env that meets the onlinerec contract:
    ``autoreset_mode = SAME_STEP`` and ``episode_statistics = True`` (``info`` has the episode keys on every step)."""
    meta = dict(base or {})
    meta.update(extra)
    meta["autoreset_mode"] = AutoresetMode.SAME_STEP
    meta["episode_statistics"] = True
    return meta


def autoreset_mode(env: Any) -> AutoresetMode:
    """The vector env's declared ``metadata["autoreset_mode"]``; a clear error where it declares none."""
    mode = (getattr(env, "metadata", None) or {}).get("autoreset_mode")
    if mode is None:
        raise ValueError(
            f"{type(env).__name__} does not declare metadata['autoreset_mode'], so onlinerec cannot tell on which step a new "
            "episode starts. Set it (gymnasium.vector.AutoresetMode.SAME_STEP, NEXT_STEP or DISABLED; gymnasium's "
            "SyncVectorEnv/AsyncVectorEnv set it from their autoreset_mode= argument)."
        )
    return AutoresetMode(mode)


def ensure_contract(env: Any, seed: int | None = None) -> Any:
    """``env`` if it already meets the onlinerec contract (see :mod:`onlinerec.rl.envs`), else wrapped so it does.

    A SAME_STEP env gains the episode statistics; a NEXT_STEP or DISABLED env (gymnasium's default is NEXT_STEP) is
    adapted: where an episode ends, the finished streams are reset at once (``reset(options={"reset_mask": ...})``)
    and the step returns the new episode's first observation, the terminal one going to ``info["final_obs"]``. A
    backend that cannot reset single streams is refused with an error that names its mode and the fix.
    ``seed``: where ``env`` gets wrapped, its first ``reset()`` seeds stream ``i`` with ``stream_seed(seed, i)``.
    """
    meta = getattr(env, "metadata", None) or {}
    if meta.get("episode_statistics") and autoreset_mode(env) == AutoresetMode.SAME_STEP:
        return env
    return SameStepEnv(env, seed=seed, env_id=meta.get("env_id"))


def _leaves(space: gymnasium.Space) -> list[gymnasium.Space]:
    if isinstance(space, gymnasium.spaces.Tuple):
        return [leaf for sub in space.spaces for leaf in _leaves(sub)]
    if isinstance(space, gymnasium.spaces.Dict):
        return [leaf for sub in space.spaces.values() for leaf in _leaves(sub)]
    return [space]


def action_kind(space: gymnasium.Space, env_id: str = "env") -> str:
    """How onlinerec passes actions of ``space`` to an env: ``"discrete"`` (``Discrete`` starting at 0: int64,
    shape ``(num_envs,)``), ``"multidiscrete"`` (int64, ``(num_envs, *nvec.shape)``) or ``"continuous"`` (a float
    ``Box``: float32, ``(num_envs, *shape)``; clipping or squashing into the bounds is the policy's business).
    Anything else raises ``ValueError`` — a Tuple/Dict mixing Discrete and Box parts included."""
    spaces = gymnasium.spaces
    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise ValueError(f"{env_id}: Discrete action space must start at 0, got start={space.start}")
        return "discrete"
    if isinstance(space, spaces.MultiDiscrete):
        return "multidiscrete"
    if isinstance(space, spaces.Box):
        if not np.issubdtype(space.dtype, np.floating):
            raise ValueError(
                f"{env_id}: a Box action space must have a float dtype, got {space.dtype} ({space}); use Discrete "
                "or MultiDiscrete for integer actions"
            )
        return "continuous"
    if isinstance(space, (spaces.Tuple, spaces.Dict)):
        leaves = _leaves(space)
        discrete = any(isinstance(s, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)) for s in leaves)
        continuous = any(isinstance(s, spaces.Box) for s in leaves)
        if discrete and continuous:
            raise ValueError(
                f"{env_id}: mixed Discrete/Box is not supported (action space {space}); onlinerec's policies are "
                "either categorical (Discrete) or Gaussian (Box). Wrap the env so it exposes one kind, e.g. a Box "
                "whose extra dimensions are thresholded into the discrete parts."
            )
        raise ValueError(
            f"{env_id}: {type(space).__name__} action spaces are not supported ({space}); wrap the env so it exposes "
            "one Discrete, MultiDiscrete or Box action space (gymnasium.spaces.flatten_space gives a Box)"
        )
    raise ValueError(f"{env_id}: unsupported action space {space}; onlinerec takes Discrete, MultiDiscrete or Box")


def check_action_space(space: gymnasium.Space, env_id: str = "env") -> gymnasium.Space:
    """``space`` if onlinerec's agents can act in it (:func:`action_kind`), else ``ValueError``."""
    action_kind(space, env_id)
    return space


def _cast_actions(actions: Any, kind: str, space: gymnasium.Space, num_envs: int) -> np.ndarray:
    if kind == "discrete":
        return np.asarray(actions, dtype=np.int64).reshape(num_envs)
    if kind == "multidiscrete":
        return np.asarray(actions, dtype=np.int64).reshape((num_envs, *space.shape))
    return np.asarray(actions, dtype=np.float32).reshape((num_envs, *space.shape))


class EpisodeTracker:
    """Accumulates per-stream returns and lengths (in agent steps) of *real* episodes.

    ``step(rewards, episode_end)`` adds this step's reward and one step, and returns
    ``(episode_return, episode_length)`` arrays that hold the finished episode's totals where
    ``episode_end`` is True (the last reward included) and 0 elsewhere; those streams restart at 0.
    """

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def reset(self, mask: np.ndarray | None = None) -> None:
        if mask is None:
            self.returns[:] = 0.0
            self.lengths[:] = 0
        else:
            self.returns[mask] = 0.0
            self.lengths[mask] = 0

    def step(self, rewards: np.ndarray, episode_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.returns += np.asarray(rewards, dtype=np.float64)
        self.lengths += 1
        end = np.asarray(episode_end, dtype=bool)
        ret = np.where(end, self.returns, 0.0).astype(np.float32)
        length = np.where(end, self.lengths, 0).astype(np.int64)
        self.reset(end)
        return ret, length


class SameStepEnv(VectorWrapper):
    """Wraps any gymnasium vector env and adds the onlinerec contract.

    - SAME_STEP resets: a SAME_STEP backend does them itself; for a NEXT_STEP or DISABLED backend the wrapper resets
      the streams whose episode just ended (``reset(options={"reset_mask": done})``, which gymnasium's vector envs
      support) and returns the new episodes' first observations in the same step; the terminal observations go to
      ``info["final_obs"]`` (an object array, None where no episode ended), as gymnasium's SAME_STEP mode does.
    - ``info["episode_end"]``, ``info["episode_return"]``, ``info["episode_length"]`` on every step;
      ``episode_end = end_fn(terminated, truncated, info)`` (default ``terminated | truncated``). Where the backend
      restarted a crashed worker (``info["restarted"]``, :class:`~onlinerec.rl.envs.resilient.ResilientVectorEnv`) the
      interrupted episode is dropped: its statistics restart at 0 and no finished episode is reported.
    - ``reset()`` without a seed uses the seed given at construction the first time (so
      ``make_vector_env(..., seed=s)`` alone fixes the streams' seeds), and ``None`` afterwards. An int seed ``s``
      (given here or to ``reset``) seeds stream ``i`` with :func:`stream_seed` ``(s, i)``; a sequence is passed to the
      backend unchanged.
    - ``metadata["autoreset_mode"] = SAME_STEP`` (a per-instance dict).
    - actions are cast by the action space (:func:`action_kind`): int64 ``(num_envs,)`` for Discrete, float32
      ``(num_envs, *shape)`` for Box; other action spaces are refused here.
    """

    def __init__(
        self,
        env: VectorEnv,
        *,
        seed: int | None = None,
        end_fn: Callable[[np.ndarray, np.ndarray, dict], np.ndarray] | None = None,
        env_id: str | None = None,
        **metadata: Any,
    ):
        super().__init__(env)
        self._backend_mode = autoreset_mode(env)
        metadata.setdefault("frames_per_step", env.metadata.get("frames_per_step", 1))
        self.metadata = same_step_metadata(env.metadata, env_id=env_id, **metadata)
        self._seed = seed
        self._seeded = False
        self._end_fn = end_fn
        self.tracker = EpisodeTracker(env.num_envs)
        env_name = env_id or type(env).__name__
        self._action_kind = action_kind(env.single_action_space, env_name)
        if self._backend_mode == AutoresetMode.NEXT_STEP and getattr(env.unwrapped, "shared_memory", True) is False:
            raise ValueError(
                f"{env_name}: an AsyncVectorEnv with shared_memory=False in NEXT_STEP mode keeps a stream's pending "
                "autoreset after reset(options={'reset_mask': ...}) (gymnasium 1.x), so onlinerec cannot adapt it to "
                "SAME_STEP: the stream would be reset twice. Build it with "
                "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP (or shared_memory=True)."
            )

    def reset(self, *, seed=None, options=None):
        if seed is None and not self._seeded and self._seed is not None:
            seed = int(self._seed)
        self._seeded = True
        mask = None if options is None else options.get("reset_mask")
        if mask is not None:
            mask = np.asarray(mask, dtype=np.bool_)
            options = {**options, "reset_mask": mask}  # gymnasium's vector envs pop the key from the caller's dict
        if isinstance(seed, (int, np.integer)):
            seed = self._backend_seed(stream_seeds(int(seed), self.num_envs), mask)
        obs, info = self.env.reset(seed=seed, options=options)
        self.tracker.reset(mask)
        self._on_reset(obs, info, mask)
        return obs, info

    def _backend_seed(self, seeds: np.ndarray, mask: np.ndarray | None) -> Any:
        """Per-stream seeds in the form the backend's ``reset(seed=...)`` takes: gymnasium's vector envs a list of
        ints, one per stream; ale-py's vector env an int64 array, one per stream being reset."""
        if type(self.env.unwrapped).__module__.startswith("ale_py"):
            return np.asarray(seeds if mask is None else seeds[mask], dtype=np.int64)
        return [int(s) for s in seeds]

    def _on_reset(self, obs, info, mask) -> None:  # hook for subclasses
        pass

    def episode_end(self, terminated: np.ndarray, truncated: np.ndarray, info: dict) -> np.ndarray:
        if self._end_fn is not None:
            return np.asarray(self._end_fn(terminated, truncated, info), dtype=bool)
        return np.logical_or(terminated, truncated)

    def step(self, actions):
        actions = _cast_actions(actions, self._action_kind, self.single_action_space, self.num_envs)
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        info = dict(info)
        done = np.logical_or(terminated, truncated)
        if self._backend_mode != AutoresetMode.SAME_STEP and done.any():
            obs = self._start_next_episodes(obs, done, info)
        end = self.episode_end(np.asarray(terminated, bool), np.asarray(truncated, bool), info)
        restarted = np.asarray(info.get("restarted", False), dtype=bool)
        end = end & ~restarted  # a crashed worker's episode did not finish: drop it
        ret, length = self.tracker.step(rewards, end)
        if restarted.any():
            self.tracker.reset(restarted)
        info["episode_end"] = end
        info["episode_return"] = ret
        info["episode_length"] = length
        return obs, rewards, terminated, truncated, info

    def _start_next_episodes(self, obs: Any, done: np.ndarray, info: dict) -> Any:
        """Reset the streams in ``done`` now (a NEXT_STEP/DISABLED backend would do it on the next step, or never)."""
        try:
            new_obs, reset_info = self.env.reset(options={"reset_mask": np.asarray(done, dtype=np.bool_)})
        except Exception as err:  # noqa: BLE001 - any failure: explain the contract and the fix
            raise ValueError(
                f"{type(self.env).__name__} autoresets in {self._backend_mode.name} mode and could not reset single streams "
                f"with reset(options={{'reset_mask': ...}}) ({type(err).__name__}: {err}). onlinerec needs SAME_STEP "
                "autoreset (a finished stream's step returns the next episode's first observation): build the env with "
                "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP."
            ) from err
        final = np.empty(len(done), dtype=object)
        for i in np.flatnonzero(done):
            final[i] = _row(obs, i)
        info["final_info"] = dict(info)  # the terminal step's info, as gymnasium's SAME_STEP mode keeps it
        info["final_obs"] = final
        for key, value in reset_info.items():  # the reset streams show their new episode's info, as in SAME_STEP
            old = info.get(key)
            if isinstance(old, np.ndarray) and isinstance(value, np.ndarray) and old.shape == value.shape:
                merged = old.copy()
                merged[done] = value[done]
                info[key] = merged
            else:
                info.setdefault(key, value)
        return new_obs


def _row(obs: Any, i: int) -> Any:
    """Stream i of a batched observation (an array, or a dict/tuple of arrays)."""
    if isinstance(obs, dict):
        return {k: _row(v, i) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_row(v, i) for v in obs)
    return np.array(obs[i], copy=True)


def discrete_actions(space: gymnasium.Space, env_id: str) -> int:
    """``n`` of a ``Discrete(n)`` action space starting at 0; ``ValueError`` for any other space (for code that
    needs a categorical policy; :func:`action_kind` also accepts Box)."""
    if not isinstance(space, gymnasium.spaces.Discrete):
        raise ValueError(f"{env_id}: this needs a Discrete action space, got {space}")
    action_kind(space, env_id)
    return int(space.n)


def unexpected_env_kwargs(env_id: str, kwargs: dict[str, Any], err: Exception) -> str:
    """The message for env_kwargs that ``env_id`` does not take (often a config's, meant for the env it names)."""
    return (
        f"{env_id} does not take env_kwargs {sorted(kwargs)} ({err}); leave them out (on the command line, "
        "--env_kwargs '{}' replaces a config file's)."
    )
