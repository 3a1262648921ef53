"""Evaluation: play real episodes with an agent's current weights, greedy (argmax / Gaussian mean) by default, and
optionally save stream 0's episodes as a GIF."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from onlinerec.rl.envs.base import ensure_contract
from onlinerec.rl.segment import obs_to_tensor

__all__ = ["VideoRecorder", "evaluate"]


@torch.no_grad()
def evaluate(
    agent: Any,
    env: Any,
    num_episodes: int = 10,
    *,
    greedy: bool = True,
    max_steps: int | None = None,
    stream: str = "eval",
    video: str | Path | None = None,
    video_fps: int = 30,
    video_max_frames: int = 3000,
) -> dict[str, Any]:
    """Play ``num_episodes`` real episodes of ``env`` (a vector env) with ``agent.act``; return their statistics.

    The streams share the episodes: each env contributes ``ceil(num_episodes / num_envs)`` at most, so short episodes
    do not crowd out long ones. The agent carries its own state under ``stream`` (forgotten before and after).
    ``max_steps`` caps the agent steps (per env); the episodes finished by then are reported, and ``truncated`` says
    whether the cap cut the evaluation short. Episode statistics are the env's (``info["episode_return"]`` where
    ``info["episode_end"]``: whole games, not lives; see :func:`~onlinerec.rl.envs.base.ensure_contract`).
    Actions go to the env through ``agent.env_actions`` where the agent has it (continuous actions: into the bounds).

    ``video``: a path (``.gif``; other suffixes need ``imageio``) where stream 0's episodes are saved, at most
    ``video_max_frames`` frames at ``video_fps`` (:class:`VideoRecorder`: the env's ``render()`` of stream 0 when it
    renders ``rgb_array`` frames, else stream 0's image observation).

    Returns:
        ``{"mean", "std", "returns", "lengths", "truncated"}`` (mean and std NaN if no episode finished), and
        ``"video"`` (the path written, or None when no frame could be recorded) when ``video`` is given.
    """
    if num_episodes < 1:
        raise ValueError("num_episodes must be >= 1")
    env = ensure_contract(env)
    was_training = agent.training
    agent.eval()
    agent.reset_streams(stream)
    device = agent.device
    to_env = getattr(agent, "env_actions", None)
    n = int(env.num_envs)
    quota = np.full(n, math.ceil(num_episodes / n))
    obs, _ = env.reset()
    recorder = VideoRecorder(env, video, fps=video_fps, max_frames=video_max_frames) if video else None
    reward = np.zeros(n, dtype=np.float32)
    reset = np.ones(n, dtype=bool)
    returns: list[float] = []
    lengths: list[int] = []
    step = 0
    try:
        while len(returns) < num_episodes and (max_steps is None or step < max_steps):
            step += 1
            if recorder is not None and quota[0] > 0:
                recorder.capture(obs)
            actions, _ = agent.act(
                obs_to_tensor(obs, device),
                torch.as_tensor(reward, dtype=torch.float32, device=device),
                torch.as_tensor(reset, device=device),
                greedy=greedy,
                stream=stream,
            )
            if to_env is not None:
                actions = to_env(actions)
            obs, reward, terminated, truncated, info = env.step(actions.cpu().numpy())
            reward = np.asarray(reward, dtype=np.float32)
            reset = np.logical_or(terminated, truncated)
            for i in np.flatnonzero(info["episode_end"]):
                if quota[i] > 0 and len(returns) < num_episodes:
                    quota[i] -= 1
                    returns.append(float(info["episode_return"][i]))
                    lengths.append(int(info["episode_length"][i]))
    finally:
        agent.reset_streams(stream)
        agent.train(was_training)
    arr = np.asarray(returns, dtype=np.float64)
    mean, std = (float(arr.mean()), float(arr.std())) if len(arr) else (float("nan"), float("nan"))
    result = {
        "mean": mean,
        "std": std,
        "returns": returns,
        "lengths": lengths,
        "truncated": len(returns) < num_episodes,
    }
    if recorder is not None:
        written = recorder.save()
        result["video"] = None if written is None else str(written)
    return result


class VideoRecorder:
    """Frames of stream 0 of a vector env, saved as a GIF (Pillow) or, for other suffixes, with ``imageio``.

    A frame is, in this order of preference: ``render()`` of stream 0's env (a gymnasium ``SyncVectorEnv`` made with
    ``render_mode="rgb_array"``: only that env renders; other vector envs: their ``render()``'s first frame); else
    stream 0's observation when it is an image (channels-first RGB, or the newest of stacked gray frames, as Atari's
    ``(4, 84, 84)``; a Dict observation's first image key). Envs with neither record nothing (``save`` returns None).
    """

    def __init__(self, env: Any, path: str | Path, *, fps: int = 30, max_frames: int = 3000) -> None:
        self.env = env
        self.path = Path(path)
        self.fps = int(fps)
        self.max_frames = int(max_frames)
        self.frames: list[np.ndarray] = []
        self._render_ok = True

    def capture(self, obs: Any) -> None:
        if len(self.frames) >= self.max_frames:
            return
        frame = self._render() if self._render_ok else None
        if frame is None:
            self._render_ok = False
            frame = _image_of(obs)
        if frame is not None:
            self.frames.append(frame)

    def _render(self) -> np.ndarray | None:
        try:
            sub = _first_sub_env(self.env)
            out = sub.render() if sub is not None else self.env.render()
        except Exception:  # noqa: BLE001 - an env that cannot render: fall back to the observations
            return None
        if isinstance(out, (list, tuple)):
            out = out[0] if out else None
        if out is None:
            return None
        frame = np.asarray(out)
        return frame.astype(np.uint8) if frame.ndim == 3 and frame.shape[-1] in (3, 4) else None

    def save(self) -> Path | None:
        """Write the frames (None, and no file, when there are none)."""
        if not self.frames:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        duration = max(1, round(1000 / max(self.fps, 1)))
        if self.path.suffix.lower() == ".gif":
            from PIL import Image

            images = [Image.fromarray(f) for f in self.frames]
            images[0].save(self.path, save_all=True, append_images=images[1:], duration=duration, loop=0)
        else:
            import imageio.v3 as iio

            iio.imwrite(self.path, np.stack(self.frames), fps=self.fps)
        return self.path


def _first_sub_env(env: Any) -> Any:
    """Stream 0's single env inside (wrappers of) a SyncVectorEnv, if there is one."""
    seen = 0
    while env is not None and seen < 16:
        envs = getattr(env, "envs", None)
        if isinstance(envs, (list, tuple)) and envs:
            return envs[0] if getattr(envs[0], "render_mode", None) == "rgb_array" else None
        env = getattr(env, "env", None)
        seen += 1
    return None


def _image_of(obs: Any) -> np.ndarray | None:
    """Stream 0's observation as an RGB uint8 frame (H, W, 3), if it is an image."""
    if isinstance(obs, dict):
        for value in obs.values():
            frame = _image_of(value)
            if frame is not None:
                return frame
        return None
    arr = np.asarray(obs.cpu() if isinstance(obs, torch.Tensor) else obs)
    if arr.ndim != 4 or arr.dtype.kind not in "uif":
        return None
    img = arr[0]
    if img.shape[0] in (1, 3, 4) and img.shape[-1] not in (1, 3, 4):
        img = np.moveaxis(img, 0, -1)  # channels first -> last
    if img.shape[-1] == 3:
        rgb = img
    elif img.shape[-1] in (1, 4):
        rgb = np.repeat(img[..., -1:], 3, axis=-1)  # gray, or the newest of 4 stacked gray frames
    else:
        return None
    if rgb.dtype != np.uint8:
        rgb = np.clip(rgb * (255.0 if rgb.max() <= 1.0 else 1.0), 0, 255)
    return rgb.astype(np.uint8)
