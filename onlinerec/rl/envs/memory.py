"""Built-in memory tasks (numpy only, vectorised, very fast): for tests and CPU-scale memory experiments.

``memory:tmaze`` — a passive T-maze / delayed-cue POMDP (Bakker 2002; "passive T-maze" of Ni et al. 2023).
Each *trial* lasts ``length + 1`` agent steps:

- step 0 shows a random cue ``k ∈ {0, …, num_cues−1}`` (one-hot);
- steps ``1 … length−1`` show the corridor (corridor flag only; actions there are ignored);
- step ``length`` shows the junction (junction flag); the action taken there is the choice:
  reward ``+1`` if ``action == k``, else ``wrong_reward`` (default 0). The trial ends on that step.

So the cue must be remembered for ``length`` steps, which can be set larger than the unroll length M.
Observation: ``uint8`` vector of shape ``(num_cues + 2,)`` = [cue one-hot, corridor flag, junction flag]
(with ``length == 0`` the cue and the junction flag appear together). Actions: ``Discrete(num_cues)``.
A random policy scores ``1/num_cues`` per trial.

``trials`` trials make one *episode* (a "game"). With ``episodic_life=True`` (default, like Atari's lives)
every trial end sets ``terminated`` (which resets the agent's recurrent state), but ``info["episode_end"]``,
``episode_return`` and ``episode_length`` describe the whole game. With ``episodic_life=False`` only the game
end is flagged, and trials follow each other inside one episode.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space

from onlinerec.rl.envs.base import EpisodeTracker, same_step_metadata, stream_seeds

__all__ = ["TMazeVectorEnv", "MEMORY_TASKS", "make_memory"]


class TMazeVectorEnv(VectorEnv):
    """Vectorised passive T-maze, SAME_STEP autoreset; stream ``i`` draws its cues from
    ``numpy.random.default_rng(stream_seed(seed, i))`` (:func:`~onlinerec.rl.envs.base.stream_seed`)."""

    def __init__(
        self,
        num_envs: int,
        seed: int = 0,
        *,
        length: int = 10,
        num_cues: int = 2,
        trials: int = 1,
        episodic_life: bool = True,
        wrong_reward: float = 0.0,
    ):
        if num_envs < 1:
            raise ValueError("num_envs must be >= 1")
        if length < 0:
            raise ValueError("length must be >= 0")
        if num_cues < 2:
            raise ValueError("num_cues must be >= 2")
        if trials < 1:
            raise ValueError("trials must be >= 1")
        self.num_envs = int(num_envs)
        self.length = int(length)
        self.num_cues = int(num_cues)
        self.trials = int(trials)
        self.episodic_life = bool(episodic_life)
        self.wrong_reward = float(wrong_reward)
        self._seed = int(seed)
        self._seeded = False

        self.single_observation_space = spaces.Box(0, 1, shape=(self.num_cues + 2,), dtype=np.uint8)
        self.single_action_space = spaces.Discrete(self.num_cues)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = same_step_metadata({}, env_id="memory:tmaze", frames_per_step=1)

        self._rngs = [np.random.default_rng(s) for s in stream_seeds(self._seed, self.num_envs)]
        self._t = np.zeros(self.num_envs, dtype=np.int64)
        self._cue = np.zeros(self.num_envs, dtype=np.int64)
        self._trial = np.zeros(self.num_envs, dtype=np.int64)
        self.tracker = EpisodeTracker(self.num_envs)
        self._arange = np.arange(self.num_envs)

    # --- internals -------------------------------------------------------------------------------
    def _draw_cues(self, idx: np.ndarray) -> None:
        for i in idx:
            self._cue[i] = self._rngs[i].integers(self.num_cues)

    def _obs(self) -> np.ndarray:
        obs = np.zeros((self.num_envs, self.num_cues + 2), dtype=np.uint8)
        start = self._t == 0
        obs[self._arange[start], self._cue[start]] = 1
        obs[:, self.num_cues] = (self._t > 0) & (self._t < self.length)
        obs[:, self.num_cues + 1] = self._t == self.length
        return obs

    # --- gymnasium API ---------------------------------------------------------------------------
    def reset(self, *, seed=None, options=None):
        if seed is None and not self._seeded:
            seed = self._seed
        self._seeded = True
        mask = None if options is None else options.get("reset_mask")
        idx = self._arange if mask is None else self._arange[np.asarray(mask, dtype=bool)]
        if seed is not None:
            if np.isscalar(seed):
                seeds = stream_seeds(int(seed), self.num_envs)[idx]
            else:  # one seed per stream (gymnasium's convention) or per stream being reset (ale-py's)
                seeds = np.asarray(seed, dtype=np.int64).reshape(-1)
                seeds = seeds[idx] if len(seeds) == self.num_envs and len(idx) != self.num_envs else seeds
                if len(seeds) != len(idx):
                    raise ValueError(f"reset(seed=...) needs {self.num_envs} or {len(idx)} seeds, got {len(seeds)}")
            for i, s in zip(idx, seeds):
                self._rngs[i] = np.random.default_rng(int(s))
        self._t[idx] = 0
        self._trial[idx] = 0
        self._draw_cues(idx)
        sel = np.zeros(self.num_envs, dtype=bool)
        sel[idx] = True
        self.tracker.reset(sel)
        return self._obs(), {"cue": self._cue.copy()}

    def step(self, actions):
        actions = np.asarray(actions, dtype=np.int64).reshape(self.num_envs)
        at_junction = self._t == self.length
        correct = actions == self._cue
        rewards = np.where(at_junction, np.where(correct, 1.0, self.wrong_reward), 0.0).astype(np.float32)
        trial_end = at_junction
        game_end = trial_end & (self._trial == self.trials - 1)
        terminated = game_end | (trial_end & self.episodic_life)
        truncated = np.zeros(self.num_envs, dtype=bool)

        self._t += 1
        ended = np.flatnonzero(trial_end)
        self._t[ended] = 0
        self._trial[ended] += 1
        self._trial[game_end] = 0
        self._draw_cues(ended)

        ret, length = self.tracker.step(rewards, game_end)
        info = {
            "cue": self._cue.copy(),
            "trial_end": trial_end,
            "episode_end": game_end,
            "episode_return": ret,
            "episode_length": length,
        }
        return self._obs(), rewards, terminated, truncated, info


MEMORY_TASKS = {"tmaze": TMazeVectorEnv}


def make_memory(name: str, num_envs: int, seed: int = 0, **kwargs) -> VectorEnv:
    try:
        cls = MEMORY_TASKS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown built-in memory task {name!r}; available: {sorted(MEMORY_TASKS)}") from None
    return cls(num_envs, seed, **kwargs)
