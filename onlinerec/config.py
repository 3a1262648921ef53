"""One way to configure every entry point: a typed dataclass, filled from YAML files and command-line options.

``onlinerec demo`` and ``onlinerec rl`` parse their dataclass (:class:`~onlinerec.tasks.demo.DemoConfig`,
:class:`~onlinerec.rl.experiment.ExperimentConfig`) with :func:`parse_config`, and ``onlinerec fit/validate/test`` use
Lightning's LightningCLI; both are jsonargparse, so ``--config file.yaml``, dotted overrides (``--r2ac.lr 1e-3``) and
``--help`` (every option with its field's docstring) work the same everywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["config_from_dict", "config_to_dict", "parse_config"]

T = TypeVar("T")


def parse_config(
    cls: type[T],
    argv: Sequence[str] | None = None,
    *,
    prog: str | None = None,
    description: str = "",
    default_config: str | Path | None = None,
    presets: Mapping[str, Mapping[str, Any]] | None = None,
) -> T:
    """Build a ``cls`` (a dataclass) from ``--config file.yaml`` and options named after its fields.

    Args:
        cls: the config dataclass; its attribute docstrings become the ``--help`` text.
        argv: the arguments (default ``sys.argv[1:]``). ``--some-name`` is accepted for ``--some_name``, and a bare
            ``--flag`` for ``--flag true`` (bool fields).
        prog, description: for ``--help``.
        default_config: a YAML file read before the options (its values are the defaults).
        presets: ``{bool field: {field: value}}``: when the bool field is true, these values become the defaults
            (options given explicitly still win), e.g. ``{"quick": {...}}`` for a smoke-test mode.
    """
    from jsonargparse import ActionConfigFile, ArgumentParser, DefaultHelpFormatter, set_parsing_settings

    class KeepLineBreaks(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
        """jsonargparse's help, with the description's own line breaks (usage examples stay one per line)."""

    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = ArgumentParser(
        prog=prog,
        description=description,
        default_config_files=[str(default_config)] if default_config else None,
        formatter_class=KeepLineBreaks,
    )
    parser.add_argument("--config", action=ActionConfigFile, help="A YAML file with any of the options below.")
    parser.add_class_arguments(cls, as_group=False)
    args = _normalise(list(sys.argv[1:] if argv is None else argv), _bool_fields(cls))
    misspelt = _misspelt_option(args, set(parser._option_string_actions))
    if misspelt:
        parser.error(misspelt)  # exits, naming the option it most likely means
    namespace = parser.parse_args(args)
    for name, given, path in _shadowed_options(args):  # jsonargparse applies them in order: the later file won
        print(
            f"warning: --{name} {given} is overridden by --config {path}, which comes after it and sets {name}: "
            f"{namespace.get(name)!r} is used. Options override a config file only when they come after it.",
            file=sys.stderr,
        )
    for flag, values in (presets or {}).items():
        if namespace.get(flag):
            parser.set_defaults(**dict(values))
            namespace = parser.parse_args(args)
    try:
        return _build(cls, namespace.as_dict())
    except (TypeError, ValueError) as err:  # a field's own check (__post_init__): usage and the reason, exit 2
        parser.error(str(err))
        raise  # unreachable: error() exits


def config_to_dict(config: Any) -> dict[str, Any]:
    """A config dataclass as plain data (nested dataclasses too), e.g. for config.json."""
    return dataclasses.asdict(config)


def config_from_dict(cls: type[T], values: Mapping[str, Any]) -> T:
    """A config dataclass from plain data (the inverse of :func:`config_to_dict`, e.g. a run's config.json); fields
    that ``values`` lacks keep their defaults."""
    return _build(cls, values)


def _bool_fields(cls: type) -> set[str]:
    hints = typing.get_type_hints(cls)
    return {f.name for f in dataclasses.fields(cls) if hints.get(f.name) is bool}


def _normalise(args: list[str], bools: set[str]) -> list[str]:
    """``--out-dir`` -> ``--out_dir``; a bare bool flag (``--quick``) -> ``--quick true``."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--") and "=" not in arg and arg != "--":
            arg = "--" + arg[2:].replace("-", "_")
        out.append(arg)
        name = arg[2:] if arg.startswith("--") else None
        following = args[i + 1] if i + 1 < len(args) else None
        if name in bools and (following is None or following.startswith("--")):
            out.append("true")
    return out


def _misspelt_option(args: list[str], known: set[str]) -> str | None:
    """A message for the first ``--name`` that no option takes but that is close to one that does (``--stream.kappa_polcy``
    -> ``--stream.kappa_policy``). A dotted name is checked only where its group lists its keys: a dict field
    (``--env_kwargs.x``) is left to jsonargparse, as is a name close to nothing."""
    import difflib

    for i, arg in enumerate(args):
        if not arg.startswith("--") or arg == "--" or (i > 0 and args[i - 1] == "--config"):
            continue
        option = arg.split("=", 1)[0]
        group = option.rsplit(".", 1)[0] + "." if "." in option else None
        if option in known or (group and not any(k.startswith(group) for k in known)):
            continue
        close = difflib.get_close_matches(option, sorted(known), n=1, cutoff=0.75)
        if close:
            return f"unrecognized option {option}: did you mean {close[0]}? (--help lists every option)"
    return None


def _shadowed_options(args: list[str]) -> list[tuple[str, str, str]]:
    """(name, value given, config file) for every ``--name value`` given before a ``--config`` file that sets ``name``
    too (``r2ac.lr`` for a nested key): jsonargparse applies both in order, so the later file's value silently wins."""
    import yaml

    found = []
    for i, arg in enumerate(args):
        if arg != "--config" and not arg.startswith("--config="):
            continue
        path = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue  # jsonargparse reports a missing or broken file itself
        keys = set(_flat_keys(data)) if isinstance(data, Mapping) else set()
        for j, option in enumerate(args[:i]):
            if not option.startswith("--"):
                continue
            name, _, value = option[2:].partition("=")
            if name != "config" and name in keys:
                found.append((name, value or (args[j + 1] if j + 1 < i else ""), path))
    return found


def _flat_keys(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``{"r2ac": {"lr": 1}}`` -> ``["r2ac", "r2ac.lr"]``."""
    keys = []
    for key, value in data.items():
        keys.append(prefix + str(key))
        if isinstance(value, Mapping):
            keys += _flat_keys(value, f"{prefix}{key}.")
    return keys


def _build(cls: type[T], values: Mapping[str, Any]) -> T:
    """``cls(**values)``, building nested dataclass fields from their dicts."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in values:
            continue
        value = values[f.name]
        kind = hints.get(f.name)
        if dataclasses.is_dataclass(kind) and isinstance(value, Mapping):
            value = _build(kind, value)  # type: ignore[arg-type]
        kwargs[f.name] = value
    return cls(**kwargs)
