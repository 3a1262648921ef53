"""DeepMind Lab through the ``deepmind_lab`` Python module, following the paper's wrapper (docs/r2ac.md#dmlab).

``dmlab:<level>`` loads ``contributed/dmlab30/<level>`` (a name containing ``/`` is used as given), e.g.
``dmlab:rooms_watermaze``, ``dmlab:rooms_select_nonmatching_object``, ``dmlab:rooms_keys_doors_puzzle``.

- Observation ``RGB_INTERLEAVED`` at 96×72 (config ``width='96', height='72', logLevel='WARN'``), returned as
  ``uint8 (3, 72, 96)``; no grayscale, no stacking.
- 9 discrete actions, each a 7-dim ``np.intc`` DMLab action (look_lr, look_ud, strafe_lr, move_fb, fire, jump,
  crouch): forward, backward, strafe left, strafe right, look left, look right, look left+forward,
  look right+forward, fire (``DMLAB_ACTIONS``).
- Action repeat 4 (``action_repeat``): the reward is summed over the repeats, the frame is the element-wise max
  of the last two frames; if the episode ends inside the repeat, the step ends there with ``terminated=True``
  and (SAME_STEP) the returned frame is the next episode's first.
- Seeds: stream ``i`` owns ``numpy.random.RandomState(stream_seed(seed, i))`` (:func:`~onlinerec.rl.envs.base.stream_seed`)
  and seeds every level reset with ``randint(2**31 - 1)`` from it (the official code gave every env server the same
  seed; here streams differ, and runs with different seeds share none).

``deepmind_lab`` is not on PyPI and cannot be pip-installed: build it from source with Bazel
(https://github.com/google-deepmind/lab, ``docs/users/build.md``; the Python module is the
``//:deepmind_lab.so`` target, or a wheel from ``//python/pip_package:build_pip_package``) and install it into
the same environment. onlinerec's CI never runs the real engine; the adapter logic is tested against a stand-in
that follows the documented ``deepmind_lab.Lab`` API.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from onlinerec.rl.envs.base import MissingBackendError

__all__ = ["DMLAB_ACTIONS", "DMLabEnv", "make_dmlab", "dmlab_level"]

INSTALL_HINT = (
    "DeepMind Lab needs the `deepmind_lab` Python module, which is not on PyPI: build it from source with Bazel "
    "(https://github.com/google-deepmind/lab, docs/users/build.md — e.g. `bazel build -c opt "
    "//python/pip_package:build_pip_package` then pip-install the wheel it produces) into this Python environment."
)

#: The paper's 9 actions as 7-dim DMLab action vectors (look_lr, look_ud, strafe_lr, move_fb, fire, jump, crouch).
DMLAB_ACTIONS = np.array(
    [
        (0, 0, 0, 1, 0, 0, 0),  # forward
        (0, 0, 0, -1, 0, 0, 0),  # backward
        (0, 0, -1, 0, 0, 0, 0),  # strafe left
        (0, 0, 1, 0, 0, 0, 0),  # strafe right
        (-20, 0, 0, 0, 0, 0, 0),  # look left
        (20, 0, 0, 0, 0, 0, 0),  # look right
        (-20, 0, 0, 1, 0, 0, 0),  # look left + forward
        (20, 0, 0, 1, 0, 0, 0),  # look right + forward
        (0, 0, 0, 0, 1, 0, 0),  # fire
    ],
    dtype=np.intc,
)


def _import_dmlab():
    try:
        import deepmind_lab
    except ImportError as e:
        raise MissingBackendError(INSTALL_HINT) from e
    return deepmind_lab


def dmlab_level(name: str) -> str:
    return name if "/" in name else f"contributed/dmlab30/{name}"


class DMLabEnv(gymnasium.Env):
    """One DeepMind Lab level as a gymnasium env (no autoreset; the vector env resets it)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        level: str,
        *,
        width: int = 96,
        height: int = 72,
        action_repeat: int = 4,
        renderer: str = "software",
        config: dict[str, str] | None = None,
    ):
        lab_module = _import_dmlab()
        self.level = dmlab_level(level)
        self.action_repeat = int(action_repeat)
        cfg = {"width": str(width), "height": str(height), "logLevel": "WARN"}
        cfg.update({k: str(v) for k, v in (config or {}).items()})
        self._lab = lab_module.Lab(self.level, ["RGB_INTERLEAVED"], config=cfg, renderer=renderer)
        self.observation_space = spaces.Box(0, 255, shape=(3, int(height), int(width)), dtype=np.uint8)
        self.action_space = spaces.Discrete(len(DMLAB_ACTIONS))
        self._seed_rng = np.random.RandomState()
        self._last = np.zeros(self.observation_space.shape, dtype=np.uint8)

    def _frame(self) -> np.ndarray:
        rgb = np.asarray(self._lab.observations()["RGB_INTERLEAVED"], dtype=np.uint8)  # (H, W, 3)
        return np.ascontiguousarray(np.transpose(rgb, (2, 0, 1)))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._seed_rng = np.random.RandomState(int(seed))
        level_seed = int(self._seed_rng.randint(2**31 - 1))
        self._lab.reset(seed=level_seed)
        self._last = self._frame()
        return self._last, {"level_seed": level_seed}

    def step(self, action):
        act = DMLAB_ACTIONS[int(action)]
        reward = 0.0
        frames = []
        done = False
        for _ in range(self.action_repeat):
            reward += float(self._lab.step(act, num_steps=1))
            if not self._lab.is_running():
                done = True
                break
            frames.append(self._frame())
        if frames:
            obs = frames[-1] if len(frames) == 1 else np.maximum(frames[-2], frames[-1])
            self._last = obs
        else:
            obs = self._last  # the episode ended on the first repeat: no new frame exists
        return obs, reward, done, False, {}

    def close(self):
        lab, self._lab = getattr(self, "_lab", None), None
        if lab is not None:
            lab.close()


def make_dmlab(
    level: str,
    num_envs: int,
    seed: int = 0,
    *,
    vectorization: str = "async",
    action_repeat: int = 4,
    width: int = 96,
    height: int = 72,
    renderer: str = "software",
    config: dict[str, str] | None = None,
):
    """``num_envs`` DMLab streams (``AsyncVectorEnv`` — one process per Lab — unless ``vectorization="sync"``)."""
    _import_dmlab()  # clear error here, before any worker starts
    from onlinerec.rl.envs.gymnasium_envs import vectorize

    def fn():
        return DMLabEnv(
            level, width=width, height=height, action_repeat=action_repeat, renderer=renderer, config=config
        )

    return vectorize(
        [fn] * num_envs,
        seed=seed,
        env_id=f"dmlab:{level}",
        vectorization=vectorization,
        frames_per_step=action_repeat,
    )
