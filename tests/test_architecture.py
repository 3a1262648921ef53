"""The package's layers: no import runs back up a layer, and none of the package's own private names cross modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "onlinerec"

# What each part may import from onlinerec (besides itself). The top-level package and the CLI may import anything.
ALLOWED = {
    "registry": set(),
    "config": set(),
    "cells": {"registry"},
    "gradients": {"registry", "cells"},
    "data": set(),
    "training": {"registry", "cells", "gradients", "data"},
    "tasks": {"registry", "config", "cells", "gradients", "data", "training"},
    "rl": {"registry", "config", "cells", "gradients", "data", "training"},
}


def onlinerec_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every ``import onlinerec...`` / ``from onlinerec... import ...`` in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "onlinerec":
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "onlinerec"]
    return found


def part_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return rel.parts[0]


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if part_of(p) not in ("__init__", "cli"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_back_up_a_layer(path):
    part = part_of(path)
    for line, module, names in onlinerec_imports(path):
        target = module.split(".")[1] if "." in module else None
        assert target is not None, (
            f"{path.name}:{line} imports the top-level onlinerec package (an import cycle); import the submodule"
        )
        assert target == part or target in ALLOWED[part], (
            f"{path.relative_to(PACKAGE)}:{line}: {part}/ must not import {module}"
        )


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_is_imported_across_modules(path):
    for line, module, names in onlinerec_imports(path):
        private = [n for n in names if n.startswith("_")]
        assert not private, f"{path.relative_to(PACKAGE)}:{line} imports private {private} from {module}"


def test_every_part_is_listed():
    assert {part_of(p) for p in SOURCES} <= set(ALLOWED)
