"""The tutorial's code runs as written, block after block, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("page", ["custom_cell.md"])
def test_tutorial_code_runs(page, capsys):
    blocks = python_blocks(DOCS / page)
    assert len(blocks) >= 4
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, f"{page}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "Mixing" in out  # the refusal names the user's cell
    loss = float(re.search(r"final training loss: ([0-9.e-]+)", out).group(1))
    assert loss < 0.1, f"the RTRL-trained tutorial cell did not learn the running sum (loss {loss})"
