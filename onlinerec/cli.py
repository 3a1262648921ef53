"""The ``onlinerec`` command: ``demo``, ``rl`` and Lightning's ``fit`` / ``validate`` / ``test`` / ``predict``.

Every subcommand is configured the same way (jsonargparse; :mod:`onlinerec.config`): ``--config file.yaml``, dotted
overrides, and ``--help`` listing every option with its docstring.

- ``onlinerec demo [options]``: :mod:`onlinerec.tasks.demo` (:class:`~onlinerec.tasks.demo.DemoConfig`).
- ``onlinerec rl --config file.yaml [options]``: one R2AC experiment (:class:`~onlinerec.rl.experiment.ExperimentConfig`).
- ``onlinerec stream --config file.yaml [options]``: one run of the streaming actor-critic
  (:class:`~onlinerec.rl.streaming.experiment.StreamExperiment`).
- ``onlinerec fit|validate|test|predict --config file.yaml``: a :class:`~lightning.pytorch.cli.LightningCLI` over any
  LightningModule and LightningDataModule named by ``class_path`` (``onlinerec fit --config examples/copy_task.yaml``);
  the trainer's strategy may be ``rtrl`` / ``tbptt`` / ``snap`` or ``class_path: onlinerec.RTRLStrategy`` with
  ``init_args: {M: ...}``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning.pytorch.cli import LightningCLI

USAGE = """\
usage: onlinerec demo [--quick] [--seeds K] [--M M] [--delay STEPS] [--steps N] [--out_dir DIR] ...
       onlinerec rl --config CONFIG.yaml [--method rtrl|tbptt|snap] [--M M] [--r2ac.lr LR] ...
       onlinerec stream --config CONFIG.yaml [--method rtrl|tbptt] [--cell CELL] [--stream.lr LR] ...
       onlinerec {fit,validate,test,predict} --config CONFIG.yaml [--trainer.* ...] [--model.* ...] [--data.* ...]

  demo      train an eLSTM with exact RTRL and with truncated BPTT (same M) on a built-in delayed-recall
            task on CPU, and compare them (`onlinerec demo --help` lists its options)
  rl        train R2AC (the real-time recurrent actor-critic) on an env from a YAML config
            (`onlinerec rl --help`; example: `onlinerec rl --config examples/configs/memory_tmaze.yaml`)
  stream    train the streaming actor-critic (an update at every env step, exact RTRL) on an env from a YAML
            config (`onlinerec stream --help`; example: `onlinerec stream --config examples/configs/stream_memory.yaml`)
  fit, validate, test, predict
            Lightning's command line (LightningCLI) for any onlinerec model and data module
            (`onlinerec fit --help`; example: `onlinerec fit --config examples/copy_task.yaml`)
"""


def lightning_cli(args: Sequence[str] | None = None, run: bool = True) -> LightningCLI:
    """LightningCLI with subclass mode for model and data (``class_path`` in configs) and onlinerec's strategies.

    ``args=None`` reads ``sys.argv`` (as a console script does; DDP's launcher re-runs the same command line)."""
    from lightning.pytorch import LightningDataModule, LightningModule
    from lightning.pytorch.cli import LightningCLI

    import onlinerec  # noqa: F401  (registers the "rtrl" / "tbptt" / "snap" strategy aliases)

    return LightningCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=None if args is None else list(args),
        run=run,
        save_config_kwargs={"overwrite": True},
    )


def strategy_by_class_path(args: Sequence[str]) -> list[str]:
    """``--trainer.strategy tbptt`` -> ``--trainer.strategy.class_path onlinerec.TBPTTStrategy``.

    Given by its alias, jsonargparse replaces the whole strategy and drops the config's ``init_args`` (so ``M`` would
    fall back to 50 without a word); given by class path, the arguments the new strategy also takes (``M``) are kept.
    """
    from onlinerec.training.strategies import STRATEGIES

    out, i = [], 0
    while i < len(args):
        arg, value = args[i], None
        if arg.startswith("--trainer.strategy="):
            arg, value = arg.split("=", 1)
        elif arg == "--trainer.strategy" and i + 1 < len(args):
            i, value = i + 1, args[i + 1]
        if value is None:
            out.append(arg)
        elif value.lower() in STRATEGIES:
            out += ["--trainer.strategy.class_path", f"onlinerec.{STRATEGIES[value.lower()].__name__}"]
        else:
            out += [arg, value]
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "demo":
        from onlinerec.tasks.demo import main as demo_main

        return demo_main(rest)
    if command == "rl":
        from onlinerec.rl.runner import main as rl_main

        return rl_main(rest)
    if command == "stream":
        from onlinerec.rl.streaming.runner import main as stream_main

        return stream_main(rest)
    if command not in ("fit", "validate", "test", "predict") and not command.startswith("-"):
        import difflib

        known = ["demo", "rl", "stream", "fit", "validate", "test", "predict"]
        close = difflib.get_close_matches(command, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"{USAGE}\nonlinerec: error: unknown command {command!r}{hint}; commands: {', '.join(known)}.",
              file=sys.stderr)  # fmt: skip
        return 2
    args = strategy_by_class_path(args)
    if argv is None:  # LightningCLI reads sys.argv itself (and DDP's launcher re-runs it): rewrite it in place
        sys.argv[1:] = args
        lightning_cli()
    else:
        lightning_cli(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
