"""The RL runner's loggers (any Lightning logger from the config, as LightningCLI takes them; W&B and MLflow in
their offline modes) and evaluation videos (GIF of stream 0), with the CSV learning curves still working."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from lightning.pytorch.loggers import Logger

from onlinerec.rl import R2AC, R2ACConfig
from onlinerec.rl.curves import load_curve
from onlinerec.rl.envs import make_vector_env
from onlinerec.rl.evaluation import evaluate
from onlinerec.rl.experiment import ExperimentConfig
from onlinerec.rl.runner import make_logger, run_experiment


class RecordingLogger(Logger):
    """A stand-in for any third-party Lightning logger: keeps what it is given."""

    def __init__(self, save_dir: str = ".", tag: str = "") -> None:
        super().__init__()
        self.save_dir_given = save_dir
        self.tag = tag
        self.metrics: list[dict[str, float]] = []
        self.hparams: dict = {}

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        self.hparams = dict(params)

    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.append(dict(metrics))


def tiny_config(tmp_path, **kw):
    base = dict(
        env="memory:tmaze",
        env_kwargs={"length": 3},
        num_envs=4,
        M=4,
        total_frames=4 * 4 * 6,
        hidden_size=8,
        stem="mlp",
        fc_size=8,
        eval_episodes=2,
        eval_envs=2,
        out_dir=str(tmp_path / "run"),
        progress=False,
        log_every=1,
        tensorboard=False,
    )
    return ExperimentConfig(**{**base, **kw})


def test_make_logger_takes_class_paths_and_init_args(tmp_path):
    spec = {"class_path": f"{__name__}.RecordingLogger", "init_args": {"tag": "x"}}
    logger = make_logger(spec, tmp_path)
    assert isinstance(logger, RecordingLogger) and logger.tag == "x" and logger.save_dir_given == str(tmp_path)
    csv = make_logger("CSVLogger", tmp_path)  # a bare name: lightning.pytorch.loggers
    assert type(csv).__name__ == "CSVLogger" and csv.save_dir == str(tmp_path)
    with pytest.raises(ValueError, match="not a Lightning logger"):
        make_logger("torch.nn.Linear", tmp_path)
    with pytest.raises(ValueError, match="class_path"):
        make_logger({"init_args": {}}, tmp_path)


def test_runner_logs_to_a_configured_logger_and_keeps_the_csv_curves(tmp_path, monkeypatch):
    seen: list[RecordingLogger] = []
    original = RecordingLogger.__init__

    def remember(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append(self)

    monkeypatch.setattr(RecordingLogger, "__init__", remember)
    cfg = tiny_config(tmp_path, loggers=[{"class_path": f"{__name__}.RecordingLogger"}])
    run_experiment(cfg)
    (logger,) = seen
    assert any("train/loss" in m for m in logger.metrics) and any("frames" in m for m in logger.metrics)
    assert logger.hparams.get("hidden_size") == 8
    frames, returns = load_curve(cfg.run_dir)  # the CSV logger is still there
    assert frames and len(frames) == len(returns)


def test_wandb_and_mlflow_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # nothing from the machine's environment
    cfg = tiny_config(
        tmp_path,
        loggers=[
            {"class_path": "WandbLogger", "init_args": {"offline": True, "project": "onlinerec-test"}},
            {"class_path": "lightning.pytorch.loggers.MLFlowLogger", "init_args": {"experiment_name": "r2ac"}},
        ],
    )
    run_experiment(cfg)
    out = cfg.run_dir
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb"))  # W&B's offline run, ready for `wandb sync`
    client = mlflow.tracking.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("r2ac").experiment_id])
    assert "train/loss" in run.data.metrics and run.data.params["hidden_size"] == "8"
    assert load_curve(out)[0]


class Blocks(gym.Env):
    """A 16x16 RGB image env (no render): the video comes from the observations."""

    observation_space = gym.spaces.Box(0, 255, (3, 16, 16), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action), self.t >= 5, False, {}

    def _obs(self):
        obs = np.zeros((3, 16, 16), np.uint8)
        obs[self.t % 3, :, : 3 * self.t] = 255
        return obs


def test_evaluation_video_from_observations(tmp_path):
    from PIL import Image

    env = SyncVectorEnv([Blocks] * 2, autoreset_mode=AutoresetMode.SAME_STEP)
    model = R2AC(2, (3, 16, 16), hidden_size=8, stem="mlp", fc_size=8)
    result = evaluate(model, env, num_episodes=4, video=tmp_path / "eval.gif")
    gif = Image.open(result["video"])
    assert gif.n_frames == 10 and gif.size == (16, 16)  # stream 0's two episodes of 5 steps
    assert evaluate(model, SyncVectorEnv([Blocks], autoreset_mode=AutoresetMode.SAME_STEP), 1)["mean"] >= 0
    tmaze = R2AC(2, (4,), hidden_size=8, stem="mlp", fc_size=8)
    assert "video" not in evaluate(tmaze, make_vector_env("memory:tmaze", 2, length=3), 2)  # off by default


def test_runner_eval_video_renders_a_continuous_control_env(tmp_path):
    """One flag: the runner's evaluation renders stream 0 of a gymnasium env (render_mode rgb_array) into a GIF;
    the run also exercises Box actions through the runner."""
    from PIL import Image

    pytest.importorskip("pygame")  # gymnasium's classic-control rendering
    cfg = tiny_config(
        tmp_path,
        env="gymnasium:PendulumNoVel-v1",
        env_kwargs={},
        total_frames=4 * 4 * 2,
        eval_episodes=1,
        eval_video=True,
        r2ac=R2ACConfig(reward_scale=0.1, reward_clip=0.0),
    )
    result = run_experiment(cfg)
    gif = Image.open(cfg.run_dir / "eval.gif")
    assert result["eval"]["video"] == str(cfg.run_dir / "eval.gif")
    # one Pendulum episode of 200 steps in pygame's 500x500 frames (Pillow merges identical consecutive frames)
    assert 100 < gif.n_frames <= 200 and gif.size == (500, 500)
    assert torch.isfinite(torch.tensor(result["eval"]["mean"]))
