"""The ``onlinerec`` command: ``onlinerec demo`` plus Lightning's ``fit`` / ``validate`` / ``test`` / ``predict``.

``onlinerec demo [options]`` runs :mod:`onlinerec.tasks.demo`. Every other subcommand is a
:class:`~lightning.pytorch.cli.LightningCLI` over any LightningModule and LightningDataModule named by
``class_path`` (for example ``onlinerec fit --config examples/copy_task.yaml``); the trainer's strategy may be
``rtrl`` / ``tbptt`` / ``snap`` or a ``class_path: onlinerec.RTRLStrategy`` with ``init_args: {M: ...}``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning.pytorch.cli import LightningCLI

USAGE = """\
usage: onlinerec demo [--quick] [--seeds K] [--M M] [--delay STEPS] [--steps N] [--out-dir DIR] ...
       onlinerec {fit,validate,test,predict} --config CONFIG.yaml [--trainer.* ...] [--model.* ...] [--data.* ...]

  demo      train an eLSTM with exact RTRL and with truncated BPTT (same M) on a built-in delayed-recall
            task on CPU, and compare them (`onlinerec demo --help` lists its options)
  fit, validate, test, predict
            Lightning's command line (LightningCLI) for any onlinerec model and data module
            (`onlinerec fit --help`; example: `onlinerec fit --config examples/copy_task.yaml`)
"""


def lightning_cli(args: Sequence[str], run: bool = True) -> LightningCLI:
    """LightningCLI with subclass mode for model and data (``class_path`` in configs) and onlinerec's strategies."""
    from lightning.pytorch import LightningDataModule, LightningModule
    from lightning.pytorch.cli import LightningCLI

    import onlinerec  # noqa: F401  (registers the "rtrl" / "tbptt" / "snap" strategy aliases)

    return LightningCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=list(args),
        run=run,
        save_config_kwargs={"overwrite": True},
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "demo":
        from onlinerec.tasks.demo import main as demo_main

        return demo_main(args[1:])
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    lightning_cli(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
