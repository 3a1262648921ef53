"""What several test modules share: a relative error, the boring model, a quiet trainer, a benchmark or experiment
script as a module."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L
import pytest
import torch

from onlinerec import ELSTMCell, OnlineRecurrentModule

ROOT = Path(__file__).resolve().parents[1]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (b = 0 counts as a tiny norm, so equal zeros give 0)."""
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


class Regressor(OnlineRecurrentModule):
    """The boring model: a cell (eLSTM 2 -> 5 by default), a linear head, mean-squared error on ``segment.targets``."""

    def __init__(self, cell: Any = None, lr: float = 1e-2, **kwargs: Any) -> None:
        super().__init__(cell if cell is not None else ELSTMCell(2, 5), lr=lr, **kwargs)
        self.head = torch.nn.Linear(self.cell.output_size, 1)

    def segment_loss(self, outputs, segment):
        return torch.nn.functional.mse_loss(self.head(outputs), segment.targets)


needs_cuda = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
"""The marks of a test (or a case) that runs on a CUDA device: ``pytestmark = needs_cuda``, ``pytest.param(..., marks=
needs_cuda)``. ``python -m pytest -m cuda`` runs every such test: the ``device`` fixture's CUDA cases and the tests that
move a run between the CPU and a GPU; without a GPU they skip."""


def on(device: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors moved to ``device`` (a test's ``device`` fixture), in order."""
    return tuple(t.to(device) for t in tensors)


def accelerator(device: Any) -> str:
    """Lightning's accelerator name for a torch device: "gpu" for CUDA, else "cpu"."""
    return "gpu" if str(device).startswith("cuda") else "cpu"


def quiet_trainer(strategy: Any = "rtrl", **kwargs: Any) -> L.Trainer:
    """A CPU trainer with no logger, checkpoints, progress bar or summary unless asked for."""
    defaults = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    return L.Trainer(strategy=strategy, **{**defaults, **kwargs})


TINY_RL = ["--num_envs", "2", "--M", "4", "--hidden_size", "8", "--fc_size", "16"]
TINY_RL += ["--progress", "false", "--tensorboard", "false", "--threads", "1"]
"""``onlinerec rl`` options for an agent small enough for a test: 2 streams, M 4, 8 units, no progress bar or
TensorBoard, one thread."""


def tiny_copy_task_fit(root_dir: Any, steps: int, level: int, train_size: int, val_size: int) -> list[str]:
    """``onlinerec fit`` arguments for the copy task's YAML at test size: ``steps`` updates (validated at the last),
    no progress bar, summary or logger, 2 streams of 4 units."""
    from pathlib import Path

    config = Path(__file__).resolve().parents[1] / "examples" / "copy_task.yaml"
    return ["fit", "--config", str(config), "--trainer.max_steps", str(steps)]  + [
        "--trainer.val_check_interval", str(steps), "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", "--trainer.logger", "false", "--trainer.default_root_dir", str(root_dir),
        "--data.init_args.level", str(level), "--data.init_args.train_size", str(train_size),
        "--data.init_args.val_size", str(val_size), "--data.init_args.num_streams", "2",
        "--model.init_args.hidden_size", "4",
    ]  # fmt: skip


def load_script(path: str, module: str | None = None) -> ModuleType:
    """The repository's ``<path>.py`` ("benchmarks/memory", "experiments/minigrid_cue"; the scripts are not a package)
    imported as the module ``module`` (default: its file name), once per process."""
    module = module or Path(path).name
    if module in sys.modules:
        return sys.modules[module]
    spec = importlib.util.spec_from_file_location(module, ROOT / f"{path}.py")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[module] = loaded  # its dataclasses look their module up there, and class paths name it
    spec.loader.exec_module(loaded)
    return loaded


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as the module ``name``."""
    return load_script(f"benchmarks/{name}")


def load_experiment(name: str, module: str | None = None) -> ModuleType:
    """``experiments/<name>.py`` imported as the module ``module`` (default ``name``). Give experiments/memory_suite.py
    another name: ``memory_suite`` is benchmarks/memory_suite.py, which it imports."""
    return load_script(f"experiments/{name}", module)


def run_quick(path: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """The repository's script ``path`` ("benchmarks/memory.py") run with ``--quick`` and one torch thread, its output
    captured."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / path), "--quick", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
