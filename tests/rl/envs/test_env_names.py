"""An env id that names a known env without the prefix onlinerec needs gets the prefixed id in its error."""

from __future__ import annotations

import sys

import pytest

from onlinerec.rl.envs import make_vector_env, parse_env_id
from onlinerec.rl.envs.names import suggest_env_id


def error_of(env_id: str) -> str:
    with pytest.raises(ValueError) as info:
        parse_env_id(env_id)
    return str(info.value)


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("CartPole-v1", "gymnasium:CartPole-v1"),
        ("cartpole-v1", "gymnasium:CartPole-v1"),
        ("gym:CartPole-v1", "gymnasium:CartPole-v1"),
        ("CartPoleNoVel-v1", "gymnasium:CartPoleNoVel-v1"),
        ("coinrun", "procgen:coinrun"),
    ],
)
def test_a_gymnasium_or_procgen_name_without_its_prefix_gets_the_prefixed_id(typed, meant):
    message = error_of(typed)
    assert f"unknown env id {typed!r} (did you mean {meant!r}?)" in message
    assert "Known families" in message


@pytest.mark.parametrize("typed", ["Pong-v5", "PongNoFrameskip-v4", "atari:Pong", "pong"])
def test_an_atari_name_gets_its_ale_id(typed):
    pytest.importorskip("ale_py")
    assert "(did you mean 'ALE/Pong-v5'?)" in error_of(typed)


def test_popgym_and_minigrid_names_without_their_prefix():
    pytest.importorskip("popgym")
    pytest.importorskip("minigrid")
    assert "(did you mean 'popgym:RepeatPreviousEasy'?)" in error_of("RepeatPreviousEasy")
    assert "(did you mean 'MiniGrid-MemoryS7-v0'?)" in error_of("MemoryS7-v0")
    assert "(did you mean 'MiniGrid-MemoryS7-v0'?)" in error_of("Minigrid-MemoryS7-v0")


def test_the_suggestion_followed_works():
    env = make_vector_env(suggest_env_id("CartPole-v1"), 2, seed=0)
    assert env.num_envs == 2
    env.close()


def test_nothing_close_suggests_nothing():
    message = error_of("NoSuchEnv-v0")
    assert "did you mean" not in message and "Known families" in message


def test_suggestions_work_without_gymnasium(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)  # import gymnasium now fails
    assert "(did you mean 'procgen:coinrun'?)" in error_of("coinrun")
    assert "did you mean" not in error_of("CartPole-v1")
