"""Stand-ins for the env tests: a gymnasium env that records the actions it is given (registered as
``OnlinerecTest/Recorder-v0``), and a class that follows the documented API of DeepMind Lab's ``deepmind_lab.Lab``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Recorder(gym.Env):
    """Records the actions it is given; observation space and action space chosen by the test."""

    def __init__(self, action_space=None, observation_space=None, length=3):
        self.action_space = action_space or spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.observation_space = observation_space or spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.length = length
        self.actions = []

    def _obs(self):
        self.observation_space.seed(int(self.np_random.integers(2**31)))  # observations follow the env's seed
        return self.observation_space.sample()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.actions.append(action)
        self.t += 1
        return self._obs(), 0.0, self.t >= self.length, False, {}


gym.register("OnlinerecTest/Recorder-v0", entry_point=Recorder)


class FakeLab:
    """Follows deepmind_lab.Lab: (level, observations, config, renderer); reset(seed=); step(action, num_steps=)
    -> reward; is_running(); observations() -> {'RGB_INTERLEAVED': (H, W, 3) uint8}; close(). An episode lasts
    `episodeFrames` frames (a level option, passed through config as DMLab does for unknown keys)."""

    instances: list = []

    def __init__(self, level, observations, config=None, renderer="software"):
        assert observations == ["RGB_INTERLEAVED"]
        assert all(isinstance(v, str) for v in config.values())  # DMLab wants string config values
        self.level, self.config, self.renderer = level, dict(config), renderer
        self.w, self.h = int(config["width"]), int(config["height"])
        self.episode_frames = int(config.get("episodeFrames", 10))
        self.seeds, self.actions = [], []
        self.frame, self.running = 0, False
        FakeLab.instances.append(self)

    @staticmethod
    def pixel(seed, frame):
        return (seed * 7 + (frame * 37 if frame % 2 else 250 - frame)) % 256

    def reset(self, episode=-1, seed=None):
        self.seeds.append(seed)
        self.frame, self.running = 0, True

    def step(self, action, num_steps=1):
        assert action.dtype == np.intc and action.shape == (7,)
        assert self.running
        self.actions.append(action.copy())
        reward = 0.0
        for _ in range(num_steps):
            self.frame += 1
            reward += 1.0 + action[3]  # 2 per frame when moving forward
            if self.frame >= self.episode_frames:
                self.running = False
                break
        return reward

    def is_running(self):
        return self.running

    def observations(self):
        if not self.running:
            raise RuntimeError("DMLab has no observations once the episode ended")
        img = np.zeros((self.h, self.w, 3), dtype=np.uint8)
        img[..., 0] = self.pixel(self.seeds[-1], self.frame)
        img[0, 0, 1] = self.frame
        return {"RGB_INTERLEAVED": img}

    def close(self):
        self.running = False
