"""Atari through ale-py's native C++ vector env (``ale_py.vector_env.AtariVectorEnv``).

The paper's preprocessing (docs/r2ac.md#atari) is built into that env, so nothing is re-implemented here:
``ALE/<Game>-v5`` ROM with sticky actions 0 (``repeat_action_probability=0``), up to 30 no-ops on reset,
frame skip 4 with a max-pool over the last two frames (rewards summed), 84×84 grayscale, a stack of 4 frames,
fire on reset for games with FIRE, the minimal action set (``full_action_space=True`` for all 18).

Observations: ``uint8`` ``(4, 84, 84)``. Rewards: raw game score (unclipped; clip in the loss).
Autoreset: SAME_STEP (native option of the ALE vector env).

Episodic life (default on, as in the paper): a lost life sets ``terminated`` (so the agent's recurrent state is
reset) while the game goes on; game over (or the frame limit) resets the game. ``info["episode_end"]``,
``episode_return`` and ``episode_length`` (agent steps) describe whole games. Differences from torchbeast's
gym wrapper stack (``EpisodicLifeEnv`` + ``FireResetEnv``): after a lost life the native env does not press FIRE
or take the extra no-op, and keeps the frame stack; a full reset does both. torchbeast's ``NoFrameskip-v4`` cut
games at 400 000 frames, ALE v5 (and this adapter's default ``max_episode_frames``) at 108 000.

Trap: ale-py's own ``episodic_life=True`` restarts the *whole game* on every lost life (measured with ale-py
0.12.1), which is not the paper's wrapper; this adapter uses ``life_loss_info=True`` instead.
"""

from __future__ import annotations

import re

import numpy as np

from onlinerec.rl.envs.base import MissingBackendError, SameStepEnv

__all__ = ["make_atari", "atari_num_actions", "atari_rom_id", "AtariEpisodicLife"]

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


def atari_num_actions(env_id: str, full_action_space: bool = False, **_: object) -> int:
    """Size of the game's minimal action set (or 18 with ``full_action_space``), read from the ROM."""
    if full_action_space:
        atari_rom_id(env_id)
        return 18
    ale_py, _ = _import_ale()
    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.loadROM(ale_py.roms.get_rom_path(atari_rom_id(env_id)))
    return len(ale.getMinimalActionSet())


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


def make_atari(
    env_id: str,
    num_envs: int,
    seed: int = 0,
    *,
    full_action_space: bool = False,
    episodic_life: bool = True,
    noop_max: int = 30,
    frameskip: int = 4,
    stack_num: int = 4,
    img_size: int = 84,
    grayscale: bool = True,
    use_fire_reset: bool = True,
    repeat_action_probability: float = 0.0,
    max_episode_frames: int = 108_000,
    num_threads: int = 0,
):
    """Vector env for ``ALE/<Game>-v5`` with the paper's preprocessing (see the module docstring).

    ``max_episode_frames`` counts emulator frames (108 000 = 30 min of play, ALE's v5 default).
    ``num_threads=0`` lets ALE pick (one per core).
    """
    rom = atari_rom_id(env_id)
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
