"""Env ids that onlinerec knows under another name: ``"CartPole-v1"`` is ``"gymnasium:CartPole-v1"``, ``"Pong-v5"`` is
``"ALE/Pong-v5"``, ``"coinrun"`` is ``"procgen:coinrun"``. :func:`suggest_env_id` finds the id a user most likely
meant, for the error about an unknown id. It reads gymnasium's registry (a dict) after importing the installed
backends that register their envs there (ale-py, popgym, minigrid), and works, with fewer suggestions, without any of
them, gymnasium included."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import re
from typing import Any

__all__ = ["PROCGEN_GAMES", "suggest_env_id"]

PROCGEN_GAMES = (
    "bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball", "fruitbot",
    "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot",
)  # fmt: skip

_REGISTERING = ("ale_py", "popgym", "minigrid", "onlinerec.rl.envs.gymnasium_envs")
"""Modules that add ids to gymnasium's registry when imported (the last one: ``CartPoleNoVel-v1`` and the like)."""

_VERSION = re.compile(r"-v\d+$")
_ATARI_SUFFIX = re.compile(r"(NoFrameskip|Deterministic)?(-v\d+)?$")


def _registry() -> dict[str, Any]:
    """gymnasium's registered ids (empty without gymnasium), the installed backends' included."""
    try:
        import gymnasium
    except ImportError:
        return {}
    for module in _REGISTERING:
        with contextlib.suppress(Exception):  # a missing or broken backend just gives fewer suggestions
            importlib.import_module(module)
    return dict(gymnasium.registry)


def _known_ids() -> dict[str, str]:
    """Lower-cased names a user may type -> the onlinerec id of that env."""
    known: dict[str, str] = {}
    registry = _registry()
    for env_id in registry:  # any registered env: gymnasium:<id>
        known[env_id.lower()] = f"gymnasium:{env_id}"
    for game in PROCGEN_GAMES:
        for name in (game, f"procgen-{game}-v0", f"procgen:{game}"):
            known[name] = f"procgen:{game}"
    for env_id in registry:
        if env_id.startswith("popgym-"):  # popgym-RepeatPreviousEasy-v0
            name = _VERSION.sub("", env_id[len("popgym-") :])
            for key in (env_id, name, f"popgym:{name}"):
                known[key.lower()] = f"popgym:{name}"
        elif env_id.startswith("MiniGrid-"):  # already an onlinerec id; also without its prefix
            for key in (env_id[len("MiniGrid-") :], _VERSION.sub("", env_id[len("MiniGrid-") :])):
                known.setdefault(key.lower(), env_id)
            known[env_id.lower()] = env_id
    for env_id in registry:  # Atari: every gym-era and ALE name of a game -> ALE/<Game>-v5
        base = env_id[len("ALE/") :] if env_id.startswith("ALE/") else env_id
        game = _ATARI_SUFFIX.sub("", base)
        if f"ALE/{game}-v5" in registry and (env_id.startswith("ALE/") or _is_atari(registry[env_id])):
            for key in (env_id, base, game, f"atari:{game}", f"ale:{game}", f"ale/{game}"):
                known[key.lower()] = f"ALE/{game}-v5"
    return known


def _is_atari(spec: Any) -> bool:
    return str(getattr(spec, "entry_point", "")).startswith("ale_py")


def suggest_env_id(env_id: str) -> str | None:
    """The onlinerec id that ``env_id`` most likely means (a known env without its family's prefix, a prefix
    misspelt, or a close misspelling), or None."""
    known = _known_ids()
    key = env_id.lower()
    if key in known:
        return known[key]
    prefix, sep, rest = key.partition(":")
    if sep and rest in known:  # a prefix onlinerec does not use: "gym:CartPole-v1", "atari:Pong"
        return known[rest]
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.85)
    return known[close[0]] if close else None
