"""The copy task (the paper's diagnostic, docs/copy_task.md) trained online: an eLSTM reads a bit pattern, waits, then
writes it back. A thin wrapper around ``onlinerec fit --config examples/copy_task.yaml``:

    python examples/copy_task.py                                         # RTRL, one update per token (M = 1), level 50
    python examples/copy_task.py --trainer.strategy.init_args.M 10       # any M
    python examples/copy_task.py --trainer.strategy tbptt --trainer.strategy.init_args.M 10    # another method
    python examples/copy_task.py --help                                  # every option, with its meaning

It ends with one line of validation metrics after the last update.
"""

from __future__ import annotations

import sys
from pathlib import Path

from onlinerec.cli import lightning_cli

CONFIG = Path(__file__).resolve().parent / "copy_task.yaml"

if __name__ == "__main__":
    if sys.argv[1:2] != ["fit"]:  # (DDP's launcher re-runs this script with the full command line)
        sys.argv[1:1] = ["fit", "--config", str(CONFIG)]
    cli = lightning_cli()
    trainer = cli.trainer
    metrics = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    print(f"copy task ({trainer.strategy!r}) after {trainer.global_step} updates: {metrics}")
