"""Atari: ale-py's native C++ vector env (``ale_py.vector_env.AtariVectorEnv``), or torchbeast's wrapper stack.

The paper's preprocessing (docs/r2ac.md#atari) is built into the native env, so nothing is re-implemented there:
``ALE/<Game>-v5`` ROM with sticky actions 0 (``repeat_action_probability=0``), up to 30 no-ops on reset,
frame skip 4 with a max-pool over the last two frames (rewards summed), 84×84 grayscale, a stack of 4 frames,
fire on reset for games with FIRE, the minimal action set (``full_action_space=True`` for all 18).

Observations: ``uint8`` ``(4, 84, 84)``. Rewards: raw game score (unclipped; clip in the loss).
Autoreset: SAME_STEP. Seeds: stream ``i`` of env seed ``s`` is seeded with ``stream_seed(s, i)`` (both backends).

Episodic life (default on, as in the paper): a lost life sets ``terminated`` (so the agent's recurrent state is
reset) while the game goes on; game over (or the frame limit) resets the game. ``info["episode_end"]``,
``episode_return`` and ``episode_length`` (agent steps) describe whole games; ``info["life_lost"]`` marks lost lives.

What happens after a lost life (``fire_on_life_loss``, default True as in the paper's code):

- ``backend="torchbeast"``: the paper's gym wrapper order, rebuilt on gymnasium's ``ALE/<Game>-v5`` with
  ``frameskip=1`` and :class:`AtariFrames` (gymnasium's ``AtariPreprocessing`` without OpenCV: no-op reset, skip 4
  with max-pool, 84×84 gray): ``EpisodicLifeEnv``
  (a lost life is ``done``; the "reset" that follows is one no-op step, not a new game), ``FireResetEnv`` (after
  every reset, lost lives included, press FIRE then action 2 — when ``fire_on_life_loss``; after a new game when
  ``use_fire_reset``), ``FrameStack(4)`` (refilled with the new frame at every reset, lost lives included). The
  agent sees none of these extra steps and their rewards are dropped, as in torchbeast. One Python env per stream
  (``vectorization`` "sync" or "async"), about half the native env's speed.
- ``backend="native"``: after a lost life the native env neither presses FIRE nor takes the extra no-op, and keeps
  the frame stack; a new game gets both. It cannot press FIRE for one stream alone, so it refuses
  ``fire_on_life_loss=True`` for a game with FIRE under episodic life.
- ``backend="auto"`` (default): torchbeast's stack where that makes a difference (episodic life, ``fire_on_life_loss``
  and a game whose minimal action set has FIRE: Breakout, Qbert, Seaquest, Gravitar, ...), the native env
  otherwise (MsPacman, Pong without FIRE in its set, or ``fire_on_life_loss=False``).

Every difference from the paper's preprocessing, per backend, is tabulated in docs/envs.md#atari-preprocessing.
torchbeast's ``NoFrameskip-v4`` cut games at 400 000 frames, ALE v5 (and this adapter's default
``max_episode_frames``) at 108 000.

Trap: ale-py's own ``episodic_life=True`` restarts the *whole game* on every lost life (measured with ale-py
0.12.1), which is not the paper's wrapper; this adapter uses ``life_loss_info=True`` instead.
"""

from __future__ import annotations

import re

import gymnasium
import numpy as np

from onlinerec.rl.envs.base import MissingBackendError, SameStepEnv

__all__ = [
    "ATARI_BACKENDS",
    "AtariEpisodicLife",
    "AtariFrames",
    "TorchbeastLife",
    "atari_has_fire",
    "atari_num_actions",
    "atari_rom_id",
    "make_atari",
]

ATARI_BACKENDS = ("auto", "native", "torchbeast")

INSTALL_HINT = "pip install 'onlinerec[atari]'  (ale-py>=0.11 and gymnasium>=1.1; the ROMs ship with ale-py)"

_ID = re.compile(r"^ALE/(?P<game>[A-Za-z0-9]+)-v5$")


def _import_ale():
    try:
        import ale_py
        from ale_py.vector_env import AtariVectorEnv
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise MissingBackendError(f"Atari envs need ale-py: {INSTALL_HINT}") from e
    return ale_py, AtariVectorEnv


def atari_rom_id(env_id_or_game: str) -> str:
    """``"ALE/MsPacman-v5"`` or ``"MsPacman"`` → ale-py's snake_case ROM id ``"ms_pacman"``; checks it exists."""
    m = _ID.match(env_id_or_game)
    game = m.group("game") if m else env_id_or_game
    if "/" in game or "-" in game:
        raise ValueError(f"Atari ids look like 'ALE/<Game>-v5' (e.g. 'ALE/Breakout-v5'), got {env_id_or_game!r}")
    rom = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", game).lower() if not game.islower() else game
    ale_py, _ = _import_ale()
    roms = ale_py.roms.get_all_rom_ids()
    if rom not in roms:
        raise ValueError(f"unknown Atari game {game!r} (ROM id {rom!r}); ale-py ships: {', '.join(sorted(roms))}")
    return rom


def _action_set(env_id: str, full_action_space: bool = False) -> list:
    ale_py, _ = _import_ale()
    rom = atari_rom_id(env_id)
    if full_action_space:
        return list(ale_py.Action.__members__.values())[:18]
    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.loadROM(ale_py.roms.get_rom_path(rom))
    return list(ale.getMinimalActionSet())


def atari_num_actions(env_id: str, full_action_space: bool = False, **_: object) -> int:
    """Size of the game's minimal action set (or 18 with ``full_action_space``), read from the ROM."""
    if full_action_space:
        atari_rom_id(env_id)
        return 18
    return len(_action_set(env_id))


def atari_has_fire(env_id: str, full_action_space: bool = False) -> bool:
    """Whether the game needs FIRE to (re)start: action 1 is FIRE and there are at least 3 actions (the test of
    torchbeast's / baselines' ``FireResetEnv``)."""
    ale_py, _ = _import_ale()
    actions = _action_set(env_id, full_action_space)
    return len(actions) >= 3 and actions[1] == ale_py.Action.FIRE


class AtariEpisodicLife(SameStepEnv):
    """Adds whole-game episode statistics on top of the ALE vector env's life-loss terminations.

    With ``life_loss_info`` the env sets ``terminated`` on a lost life and keeps playing; on game over it
    resets (SAME_STEP), so the returned ``lives`` jump back up. A real episode end is therefore a truncation,
    or a termination where ``lives`` did not drop or the episode frame counter went back.
    """

    def __init__(self, env, *, episodic_life: bool, **kw):
        super().__init__(env, **kw)
        self.episodic_life = episodic_life
        self._lives = np.zeros(env.num_envs, dtype=np.int64)
        self._frames = np.zeros(env.num_envs, dtype=np.int64)

    def _on_reset(self, obs, info, mask):
        lives = np.asarray(info["lives"], dtype=np.int64)
        frames = np.asarray(info["episode_frame_number"], dtype=np.int64)
        if mask is None:
            self._lives[:], self._frames[:] = lives, frames
        else:
            self._lives[mask], self._frames[mask] = lives[mask], frames[mask]

    def episode_end(self, terminated, truncated, info):
        lives = np.asarray(info["lives"], dtype=np.int64)
        frames = np.asarray(info["episode_frame_number"], dtype=np.int64)
        if self.episodic_life:
            game_restarted = (lives >= self._lives) | (frames < self._frames)
            end = truncated | (terminated & game_restarted)
        else:
            end = terminated | truncated
        self._lives, self._frames = lives, frames
        info["life_lost"] = terminated & ~end
        return end


class TorchbeastLife(gymnasium.Wrapper):
    """torchbeast's ``EpisodicLifeEnv`` + ``FireResetEnv`` for one gymnasium Atari env (below the frame stack).

    ``step``: a lost life sets ``terminated`` (``info["life_lost"]``). ``reset`` after a lost life is one hidden no-op
    step instead of a new game (``info["new_game"]`` False); after game over or truncation it is a real reset
    (``info["new_game"]`` True). Then, for games with FIRE, FIRE and action 2 are pressed (hidden, rewards dropped):
    after a new game when ``fire_on_reset``, after a lost life when ``fire_on_life_loss``.
    """

    def __init__(self, env, *, episodic_life: bool = True, fire_on_reset: bool = True, fire_on_life_loss: bool = True):
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        self.has_fire = len(meanings) >= 3 and meanings[1] == "FIRE"
        self.episodic_life = episodic_life
        self.fire_on_reset = fire_on_reset
        self.fire_on_life_loss = fire_on_life_loss
        self.lives = 0
        self.real_done = True

    def _ale_lives(self) -> int:
        return int(self.env.unwrapped.ale.lives())

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.real_done = bool(terminated or truncated)
        lives = self._ale_lives()
        life_lost = self.episodic_life and 0 < lives < self.lives and not self.real_done
        self.lives = lives
        info = dict(info, new_game=False, life_lost=life_lost)
        return obs, reward, bool(terminated or life_lost), truncated, info

    def reset(self, *, seed=None, options=None):
        new_game = self.real_done or seed is not None
        if new_game:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)  # torchbeast: a no-op step, not a new game
            if terminated or truncated:
                obs, info = self.env.reset()
                new_game = True
        if self.has_fire and (self.fire_on_reset if new_game else self.fire_on_life_loss):
            for action in (1, 2):
                obs, _, terminated, truncated, info = self.env.step(action)
                if terminated or truncated:  # as FireResetEnv: a game that ends here starts again
                    obs, info = self.env.reset()
                    new_game = True
        self.real_done = False
        self.lives = self._ale_lives()
        return obs, dict(info, new_game=new_game, life_lost=False)


def _area_weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Box-filter taps: output j averages input cells [j·s, (j+1)·s), s = n_in / n_out, with fractional overlaps
    (OpenCV's INTER_AREA for a downscale). Returns (index, weight), both (n_out, taps); unused taps have weight 0."""
    scale = n_in / n_out
    taps = int(np.ceil(scale)) + 1
    index = np.zeros((n_out, taps), dtype=np.int64)
    weight = np.zeros((n_out, taps), dtype=np.float32)
    for j in range(n_out):
        lo, hi = j * scale, (j + 1) * scale
        for k, i in enumerate(range(int(np.floor(lo)), min(n_in, int(np.ceil(hi))))):
            index[j, k], weight[j, k] = i, (min(hi, i + 1) - max(lo, i)) / scale
    return index, weight


class AtariFrames(gymnasium.Wrapper):
    """gymnasium's ``AtariPreprocessing`` without OpenCV, for an ``ALE/<Game>-v5`` env made with ``frameskip=1``:
    1..``noop_max`` no-ops on reset, ``frame_skip`` repeats (rewards summed, stop at an episode end) with the max over
    the last two frames, gray (or RGB) screen area-resized to ``size``×``size`` uint8."""

    def __init__(self, env, *, noop_max: int = 30, frame_skip: int = 4, size: int = 84, grayscale: bool = True):
        super().__init__(env)
        self.ale = env.unwrapped.ale
        self.noop_max, self.frame_skip, self.grayscale = int(noop_max), int(frame_skip), bool(grayscale)
        h, w = self.ale.getScreenDims()
        self._rows = _area_weights(h, size)
        self._cols = _area_weights(w, size)
        self._buf = np.zeros((2, h, w) if grayscale else (2, h, w, 3), dtype=np.uint8)
        shape = (size, size) if grayscale else (size, size, 3)
        self.observation_space = gymnasium.spaces.Box(0, 255, shape=shape, dtype=np.uint8)
        self._frame = self._ale_frame if self._direct() else self._env_frame  # decided once: the env does not change

    def _grab(self, k: int) -> None:
        if self.grayscale:
            self.ale.getScreenGrayscale(self._buf[k])
        else:
            self.ale.getScreenRGB(self._buf[k])

    def _obs(self) -> np.ndarray:
        frame = np.maximum(self._buf[0], self._buf[1]).astype(np.float32)  # (H, W) or (H, W, 3)
        (ri, rw), (ci, cw) = self._rows, self._cols  # sparse taps: no BLAS threads for a 210x160 frame
        tall = np.einsum("jk,jk...->j...", rw, frame[ri])  # (size, W, ...)
        small = np.einsum("ik,jik...->ji...", cw, tall[:, ci])  # (size, size, ...)
        return np.clip(np.rint(small), 0, 255).astype(np.uint8)

    def _direct(self) -> bool:
        """Whether ``step`` may drive the emulator itself: ale-py's own env with one frame and one discrete action per
        step and no sound, which is what ``make_atari`` builds."""
        base = self.env.unwrapped
        return (
            type(base).__module__.startswith("ale_py")
            and getattr(base, "_frameskip", None) == 1
            and not getattr(base, "continuous", True)
            and not getattr(base, "sound_obs", True)
            and hasattr(base, "_action_set")
        )

    def _env_frame(self, action) -> tuple[float, bool, bool, dict | None]:
        """One frame through ale-py's gymnasium env: (reward, terminated, truncated, info)."""
        _, reward, terminated, truncated, info = self.env.step(action)
        return float(reward), terminated, truncated, info

    def _ale_frame(self, action) -> tuple[float, bool, bool, dict | None]:
        """One frame by ``ale.act``, as ale-py's ``AtariEnv.step`` does it, without rendering a screen that the
        max-pool does not read and without gymnasium's per-frame wrapper calls (about 15 % less env CPU time on
        Breakout); the info is read once, after the last frame."""
        ale = self.ale
        reward = float(ale.act(self.env.unwrapped._action_set[action], 1.0))
        return reward, ale.game_over(with_truncation=False), ale.game_truncated(), None

    def step(self, action):
        total, terminated, truncated, info = 0.0, False, False, None
        for t in range(self.frame_skip):
            reward, terminated, truncated, info = self._frame(action)
            total += reward
            if terminated or truncated:
                self._grab(0)
                self._buf[1] = self._buf[0]
                break
            if t == self.frame_skip - 2:
                self._grab(1)
            elif t == self.frame_skip - 1:
                self._grab(0)
        if info is None:
            info = self.env.unwrapped._get_info()
        return self._obs(), total, terminated, truncated, info

    def reset(self, *, seed=None, options=None):
        _, info = self.env.reset(seed=seed, options=options)
        noops = int(self.env.unwrapped.np_random.integers(1, self.noop_max + 1)) if self.noop_max > 0 else 0
        for _ in range(noops):
            _, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                _, info = self.env.reset()
        self._grab(0)
        self._buf[1].fill(0)
        return self._obs(), info


def _torchbeast_atari(
    env_id: str,
    num_envs: int,
    seed: int,
    *,
    full_action_space: bool,
    episodic_life: bool,
    fire_on_life_loss: bool,
    noop_max: int,
    frameskip: int,
    stack_num: int,
    img_size: int,
    grayscale: bool,
    use_fire_reset: bool,
    repeat_action_probability: float,
    max_episode_frames: int,
    vectorization: str,
):
    ale_py, _ = _import_ale()
    gymnasium.register_envs(ale_py)
    from gymnasium.wrappers import FrameStackObservation

    from onlinerec.rl.envs.gymnasium_envs import vectorize

    def fn():
        env = gymnasium.make(
            env_id,
            obs_type="grayscale" if grayscale else "rgb",
            frameskip=1,
            repeat_action_probability=repeat_action_probability,
            full_action_space=full_action_space,
            max_num_frames_per_episode=max_episode_frames,
        )
        env = AtariFrames(env, noop_max=noop_max, frame_skip=frameskip, size=img_size, grayscale=grayscale)
        env = TorchbeastLife(
            env, episodic_life=episodic_life, fire_on_reset=use_fire_reset, fire_on_life_loss=fire_on_life_loss
        )
        return FrameStackObservation(env, stack_num, padding_type="reset")

    def episode_end(terminated, truncated, info):
        done = terminated | truncated
        end = done & np.asarray(info.get("new_game", done), dtype=bool)  # SAME_STEP: the reset's info where done
        info["life_lost"] = done & ~end
        return end

    return vectorize(
        [fn] * num_envs,
        seed=seed,
        env_id=env_id,
        vectorization=vectorization,
        end_fn=episode_end,
        frames_per_step=frameskip,
    )


def make_atari(
    env_id: str,
    num_envs: int,
    seed: int = 0,
    *,
    full_action_space: bool = False,
    episodic_life: bool = True,
    fire_on_life_loss: bool = True,
    backend: str = "auto",
    noop_max: int = 30,
    frameskip: int = 4,
    stack_num: int = 4,
    img_size: int = 84,
    grayscale: bool = True,
    use_fire_reset: bool = True,
    repeat_action_probability: float = 0.0,
    max_episode_frames: int = 108_000,
    num_threads: int = 0,
    vectorization: str = "sync",
):
    """Vector env for ``ALE/<Game>-v5`` with the paper's preprocessing (see the module docstring).

    ``fire_on_life_loss``: press FIRE after a lost life, as torchbeast does (needs ``backend`` "torchbeast" or
    "auto" for games with FIRE). ``backend``: "auto", "native" (ale-py's C++ vector env; ``num_threads``, 0 = one per
    core) or "torchbeast" (the paper's wrapper stack; ``vectorization`` "sync" or "async").
    ``max_episode_frames`` counts emulator frames (108 000 = 30 min of play, ALE's v5 default).
    """
    rom = atari_rom_id(env_id)
    if backend not in ATARI_BACKENDS:
        raise ValueError(f"Atari backend must be one of {ATARI_BACKENDS}, got {backend!r}")
    fire_matters = episodic_life and fire_on_life_loss and atari_has_fire(env_id, full_action_space)
    if backend == "native" and fire_matters:
        raise ValueError(
            f"{env_id}: fire_on_life_loss=True needs FIRE pressed for single streams after a lost life, which ale-py's "
            "native vector env cannot do. Use backend='torchbeast' (or 'auto'), or fire_on_life_loss=False."
        )
    if backend == "torchbeast" or (backend == "auto" and fire_matters):
        return _torchbeast_atari(
            env_id,
            num_envs,
            seed,
            full_action_space=full_action_space,
            episodic_life=episodic_life,
            fire_on_life_loss=fire_on_life_loss,
            noop_max=noop_max,
            frameskip=frameskip,
            stack_num=stack_num,
            img_size=img_size,
            grayscale=grayscale,
            use_fire_reset=use_fire_reset,
            repeat_action_probability=repeat_action_probability,
            max_episode_frames=max_episode_frames,
            vectorization=vectorization,
        )
    _, AtariVectorEnv = _import_ale()
    from gymnasium.vector import AutoresetMode

    env = AtariVectorEnv(
        rom,
        num_envs,
        num_threads=num_threads,
        max_num_frames_per_episode=max_episode_frames,
        repeat_action_probability=repeat_action_probability,
        full_action_space=full_action_space,
        autoreset_mode=AutoresetMode.SAME_STEP,
        img_height=img_size,
        img_width=img_size,
        grayscale=grayscale,
        stack_num=stack_num,
        frameskip=frameskip,
        maxpool=True,
        noop_max=noop_max,
        episodic_life=False,  # ALE's episodic_life restarts the whole game on a lost life: not the paper's
        life_loss_info=episodic_life,  # terminated on a lost life, the game goes on
        reward_clipping=False,
        use_fire_reset=use_fire_reset,
    )
    return AtariEpisodicLife(
        env,
        seed=seed,
        episodic_life=episodic_life,
        env_id=env_id,
        frames_per_step=frameskip,
    )
