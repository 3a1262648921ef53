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
        exec(compile(block, f"{page}", "exec"), namespace)  # noqa: S102  (the tutorial's own code)
    out = capsys.readouterr().out
    assert "Mixing" in out  # the refusal names the user's cell
    loss = float(re.search(r"final training loss: ([0-9.e-]+)", out).group(1))
    assert loss < 0.1, f"the RTRL-trained tutorial cell did not learn the running sum (loss {loss})"


def slug(heading: str) -> str:
    """GitHub's heading anchor (what mkdocs.yml's slugify also produces): lower case, punctuation dropped, spaces -> -."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M)}


ROOT = DOCS.parent
CITING = sorted(
    p for d in ("onlinerec", "examples", "benchmarks") for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".yaml")
)


def test_every_docs_reference_in_the_code_resolves():
    """The code cites the docs as docs/<page>.md#<anchor>; each page and heading must exist."""
    missing = []
    for path in CITING:
        for page, anchor in re.findall(r"(?<![\w/.])docs/([\w/]+\.md)(?:#([\w-]+))?", path.read_text()):
            target = DOCS / page
            if not target.parent.is_dir():  # another project's docs folder (e.g. DeepMind Lab's docs/users/)
                continue
            if not target.exists() or (anchor and anchor not in anchors(target)):
                missing.append(f"{path.relative_to(ROOT)}: docs/{page}#{anchor}")
    assert CITING and not missing, missing


def load_heldout_table():
    from tests.helpers import load_benchmark

    return load_benchmark("heldout_table")


def test_heldout_table_follows_its_rule():
    """results.md's held-out table: every verdict is the rule's on its numbers, and the tallies count those verdicts."""
    table = load_heldout_table()
    text = (DOCS / "results.md").read_text()
    rows = table.read_rows(text)
    assert len(rows) >= 41 and any(row.control for row in rows) and any(row.seen for row in rows)
    assert table.check(text) == []


def test_heldout_table_check_finds_a_wrong_verdict_and_tally():
    table = load_heldout_table()
    assert table.verdict((0.50, 0.01), (0.485, 0.001)) == "tie"  # within the 0.02 floor
    assert table.verdict((0.50, 0.01), (0.47, 0.001)) == "win"
    assert table.verdict((0.40, 0.05), (0.50, 0.04)) == "loss"
    text = (DOCS / "results.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| RepeatPreviousHard ("))
    assert "| **win** |" in row
    wrong = text.replace(row, row.replace("| **win** |", "| tie |"))
    problems = table.check(wrong)
    assert any("RepeatPreviousHard: the table says tie, the rule gives win" in p for p in problems), problems
    tally = re.search(r"Over these \d+ envs `popgym.yaml` has \*\*\d+ wins", text).group(0)
    assert any("tally paragraph" in p for p in table.check(text.replace(tally, tally.replace("wins", "wins,"))))
