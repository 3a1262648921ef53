"""experiments/tests run from anywhere (``python -m pytest experiments/tests``): the repository's root goes on the
path, for tests/helpers.py (which loads the scripts of benchmarks/ and experiments/ as modules), and one torch thread."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYTHONHASHSEED", "0")
torch.set_num_threads(1)
