"""ProcGen through the ``procgen`` module (the ``procgen-mirror`` wheel, which has a Python 3.11 build).

``procgen:<game>`` with kwargs ``distribution_mode`` (``"hard"`` by default, as in the paper; also easy, extreme,
memory, exploration), ``num_levels`` (0 = unlimited), ``start_level``, ``num_threads`` and any other
``ProcgenGym3Env`` option (``paint_vel_info``, ``use_backgrounds``, ``center_agent``, ...).

- One ``procgen.ProcgenGym3Env(num=num_envs, rand_seed=stream_seed(seed, 0))`` runs all streams in C++; gym3
  autoresets in SAME_STEP style natively (``first`` marks an episode start, there is no separate timeout flag, so
  every end is ``terminated``). Seeds: procgen takes one ``rand_seed`` for all its streams and derives each stream's
  level-seed generator from it; that one seed is derived from ``seed`` like any stream seed
  (:func:`~onlinerec.rl.envs.base.stream_seed`), so ``seed=0`` and ``seed=1`` share no stream, and the same ``seed``
  reproduces them.
- Observation ``uint8 (3, 64, 64)`` RGB (channels first); 15 actions; no frame skip, no stacking, raw rewards.
- Not every game has every distribution mode, and an unsupported (game, mode) pair aborts the whole Python
  process inside procgen's C++ code; ``check_procgen_mode`` rejects such pairs with a ``ValueError`` first.

procgen-mirror requires ``numpy<2`` and ``gym<1`` (pulled in by gym3), so it lives in the optional extra
``pip install 'onlinerec[procgen]'`` (which also pins ``opencv-python-headless<4.12`` so pip does not backtrack);
installing it downgrades numpy to 1.26 in that environment. envpool, the other ProcGen backend, cannot share an
environment with it.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space

from onlinerec.rl.envs.base import EpisodeTracker, MissingBackendError, same_step_metadata, stream_seed
from onlinerec.rl.envs.names import PROCGEN_GAMES

__all__ = ["PROCGEN_GAMES", "PROCGEN_MODES", "ProcgenVectorEnv", "check_procgen_mode", "make_procgen"]

INSTALL_HINT = (
    "ProcGen envs need the `procgen` module: pip install 'onlinerec[procgen]' "
    "(= procgen-mirror==0.10.7 and opencv-python-headless<4.12; it downgrades numpy to <2 and installs gym<1, "
    "so use a separate virtual environment if other packages need numpy 2)."
)


#: Games that support each distribution mode (measured with procgen-mirror 0.10.7; others abort or assert).
PROCGEN_MODES: dict[str, frozenset[str]] = {
    "easy": frozenset(PROCGEN_GAMES),
    "hard": frozenset(PROCGEN_GAMES),
    "extreme": frozenset({"chaser", "dodgeball", "leaper", "starpilot"}),
    "memory": frozenset({"caveflyer", "dodgeball", "heist", "jumper", "maze", "miner"}),
    "exploration": frozenset({"caveflyer", "climber", "coinrun", "heist", "jumper", "leaper", "maze", "ninja"}),
}


def check_procgen_mode(game: str, distribution_mode: str) -> None:
    """Raise ``ValueError`` for an unknown game or mode, or an unsupported (game, mode) pair."""
    if game not in PROCGEN_GAMES:
        raise ValueError(f"unknown ProcGen game {game!r}; games: {', '.join(PROCGEN_GAMES)}")
    if distribution_mode not in PROCGEN_MODES:
        raise ValueError(f"unknown ProcGen distribution_mode {distribution_mode!r}; modes: {', '.join(PROCGEN_MODES)}")
    if game not in PROCGEN_MODES[distribution_mode]:
        ok = ", ".join(sorted(PROCGEN_MODES[distribution_mode]))
        raise ValueError(
            f"ProcGen game {game!r} has no {distribution_mode!r} mode (procgen would abort the process); "
            f"games with it: {ok}"
        )


def _import_procgen():
    try:
        import procgen
    except ImportError as e:
        raise MissingBackendError(INSTALL_HINT) from e
    if not hasattr(procgen, "ProcgenGym3Env"):
        procgen = _import_shadowed_procgen(procgen)
    return procgen


def _import_shadowed_procgen(shadow):
    """A file named ``procgen.py`` shadows the package when its folder is on ``sys.path`` — as for
    ``python examples/procgen.py``, whose folder becomes ``sys.path[0]``. Import the real package from the rest."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    where = os.path.dirname(os.path.abspath(getattr(shadow, "__file__", "") or "."))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != where]
    spec = importlib.machinery.PathFinder.find_spec("procgen", path)
    if spec is None or spec.loader is None:
        raise MissingBackendError(
            f"`import procgen` found {getattr(shadow, '__file__', shadow)!r}, not ProcGen. {INSTALL_HINT}"
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules["procgen"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules["procgen"] = shadow
        raise
    return module


class ProcgenVectorEnv(VectorEnv):
    """A thin gymnasium ``VectorEnv`` over ``procgen.ProcgenGym3Env`` (SAME_STEP, channels-first uint8 frames)."""

    def __init__(self, game: str, num_envs: int, seed: int = 0, *, distribution_mode: str = "hard", **options):
        check_procgen_mode(game, distribution_mode)
        if distribution_mode == "exploration" and ({"num_levels", "start_level"} & set(options)):
            raise ValueError("ProcGen's exploration mode fixes num_levels and start_level itself; do not pass them")
        self._procgen = _import_procgen()
        self.game = game
        self.num_envs = int(num_envs)
        self.distribution_mode = distribution_mode
        self._options = dict(options)
        self._seed = int(seed)
        self._resets = 0
        self._env = None

        self.single_observation_space = spaces.Box(0, 255, shape=(3, 64, 64), dtype=np.uint8)
        self.single_action_space = spaces.Discrete(15)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = same_step_metadata({}, env_id=f"procgen:{game}", frames_per_step=1)
        self.tracker = EpisodeTracker(self.num_envs)

    def _make(self, seed: int):
        if self._env is not None:
            self._env.close() if hasattr(self._env, "close") else None
        self._env = self._procgen.ProcgenGym3Env(
            num=self.num_envs,
            env_name=self.game,
            distribution_mode=self.distribution_mode,
            rand_seed=int(seed),
            **self._options,
        )

    @staticmethod
    def _chw(rgb: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(rgb.transpose(0, 3, 1, 2))

    def reset(self, *, seed=None, options=None):
        """(Re)creates the gym3 env with ``rand_seed = stream_seed(seed, 0)``: ``seed`` if given, else the construction
        seed the first time; a later ``reset()`` without a seed derives a fresh one (``stream_seed(seed, 0, k)``)."""
        if options and options.get("reset_mask") is not None and not np.all(options["reset_mask"]):
            raise NotImplementedError("ProcGen streams cannot be reset one by one (gym3 autoresets them)")
        if seed is not None:
            self._seed, self._resets = int(seed), 0
        elif self._env is not None:
            self._resets += 1
        self.rand_seed = stream_seed(self._seed, 0, restart=self._resets)
        self._make(self.rand_seed)
        self.tracker.reset()
        _, obs, _ = self._env.observe()
        info = {"level_seed": np.array([i["level_seed"] for i in self._env.get_info()], dtype=np.int64)}
        return self._chw(obs["rgb"]), info

    def step(self, actions):
        if self._env is None:
            raise RuntimeError("call reset() before step()")
        self._env.act(np.asarray(actions, dtype=np.int32).reshape(self.num_envs))
        rew, obs, first = self._env.observe()
        first = np.asarray(first, dtype=bool)
        rewards = np.asarray(rew, dtype=np.float32)
        ret, length = self.tracker.step(rewards, first)
        info = {"episode_end": first, "episode_return": ret, "episode_length": length}
        return self._chw(obs["rgb"]), rewards, first.copy(), np.zeros(self.num_envs, dtype=bool), info

    def close_extras(self, **kwargs):
        self._env = None


def make_procgen(game: str, num_envs: int, seed: int = 0, *, backend: str = "procgen", **kwargs):
    """``procgen:<game>`` (see the module docstring)."""
    if backend != "procgen":
        raise ValueError(f"unknown ProcGen backend {backend!r}; available: 'procgen'")
    return ProcgenVectorEnv(game, num_envs, seed, **kwargs)
