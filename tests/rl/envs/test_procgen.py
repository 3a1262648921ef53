"""ProcGen (optional: procgen-mirror; skipped where it is not installed): the (game, mode) check made before the
backend is imported, shapes and SAME_STEP, seeds, an import shadowed by a ``procgen.py`` script, and the install hint
when it is missing."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from onlinerec.rl.envs import MissingBackendError, make_vector_env, num_actions


def test_invalid_procgen_mode_rejected_before_creation():
    # No procgen needed: the (game, mode) pair is checked before the backend is imported (procgen would abort).
    from onlinerec.rl.envs.procgen import check_procgen_mode

    with pytest.raises(ValueError, match="no 'memory' mode"):
        make_vector_env("procgen:chaser", 2, distribution_mode="memory")
    with pytest.raises(ValueError, match="no 'extreme' mode"):
        check_procgen_mode("maze", "extreme")
    with pytest.raises(ValueError, match="unknown ProcGen game"):
        check_procgen_mode("pacman", "hard")
    with pytest.raises(ValueError, match="unknown ProcGen distribution_mode"):
        check_procgen_mode("chaser", "nightmare")
    check_procgen_mode("maze", "memory")
    check_procgen_mode("chaser", "hard")


def test_procgen_shapes_and_same_step():
    pytest.importorskip("procgen")
    env = make_vector_env("procgen:chaser", 3, seed=0, num_levels=10, start_level=0)
    obs, info = env.reset()
    assert obs.shape == (3, 3, 64, 64) and obs.dtype == np.uint8
    assert env.single_action_space.n == 15 == num_actions("procgen:chaser")
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert len(set(info["level_seed"].tolist())) > 1 or True  # 10 levels: may repeat
    rng = np.random.default_rng(0)
    total, steps, ended = np.zeros(3), np.zeros(3, dtype=np.int64), False
    for _ in range(3000):
        obs, r, term, trunc, info = env.step(rng.integers(15, size=3))
        total += r
        steps += 1
        end = info["episode_end"]
        np.testing.assert_array_equal(end, term | trunc)
        if end.any():
            np.testing.assert_allclose(info["episode_return"][end], total[end], rtol=1e-5)
            np.testing.assert_array_equal(info["episode_length"][end], steps[end])
            total[end], steps[end], ended = 0, 0, True
    assert ended
    env.close()


def test_procgen_memory_mode_and_seeds():
    pytest.importorskip("procgen")
    a = make_vector_env("procgen:maze", 4, seed=3, distribution_mode="memory")
    b = make_vector_env("procgen:maze", 4, seed=3, distribution_mode="memory")
    la, lb = a.reset()[1]["level_seed"], b.reset()[1]["level_seed"]
    assert len(set(la.tolist())) == 4  # distinct per stream
    np.testing.assert_array_equal(la, lb)  # reproducible from the seed
    a.close(), b.close()


def test_procgen_import_survives_a_shadowing_procgen_py(tmp_path, monkeypatch):
    """`python examples/procgen.py` puts examples/ first on sys.path, so `import procgen` finds the script."""
    import importlib.machinery
    import importlib.util

    (tmp_path / "procgen.py").write_text("SCRIPT = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # Recorded before it is removed, so that the module the import below loads (the script, or ProcGen) goes with the
    # test: monkeypatch puts back what was there, and removes the entry where there was none.
    monkeypatch.setitem(sys.modules, "procgen", sys.modules.get("procgen"))
    monkeypatch.delitem(sys.modules, "procgen")
    real = importlib.util.find_spec("procgen", None) is not None and any(
        importlib.machinery.PathFinder.find_spec("procgen", [p]) for p in sys.path[1:] if p != str(tmp_path)
    )
    if real:
        env = make_vector_env("procgen:chaser", 1, seed=0)
        assert env.reset()[0].shape == (1, 3, 64, 64)
        env.close()
    else:
        with pytest.raises(MissingBackendError, match="onlinerec\\[procgen\\]"):
            make_vector_env("procgen:chaser", 1, seed=0)


def test_procgen_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "procgen", None)
    with pytest.raises(MissingBackendError, match="onlinerec\\[procgen\\]"):
        make_vector_env("procgen:chaser", 1)
