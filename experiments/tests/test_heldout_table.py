"""docs/results.md's table of every other POPGym env: every verdict is the rule's on the row's own numbers, and the
tally under the table counts those verdicts. The check must also catch a wrong row, a wrong tally and a duplicate."""

from __future__ import annotations

import re

import pytest

from tests.helpers import load_experiment

table = load_experiment("heldout_table")
TEXT = table.RESULTS.read_text()


def rows_of(text: str) -> list[str]:
    """The table's data rows, as written."""
    return [
        line
        for line in table.section(text).splitlines()
        if line.startswith("| ") and not line.startswith("| env ") and not line.startswith("|---")
    ]


def test_the_table_follows_the_rule_and_the_tally_counts_it():
    rows = table.read_rows(TEXT)
    assert rows and len(rows) == len(rows_of(TEXT))
    assert any(row.control for row in rows) and any(not row.control for row in rows)
    assert any(row.seen for row in rows) and any(not row.seen for row in rows)
    assert {row.verdict for row in rows} == {"win", "tie", "loss"}
    assert table.check(TEXT) == []


def test_the_rule():
    assert table.verdict((0.50, 0.01), (0.485, 0.001)) == "tie"  # a gap within the 0.02 floor
    assert table.verdict((0.50, 0.01), (0.47, 0.001)) == "win"
    assert table.verdict((0.40, 0.05), (0.50, 0.04)) == "loss"
    assert table.verdict((0.40, 0.15), (0.50, 0.04)) == "tie"  # within the larger spread


@pytest.mark.parametrize("said, other", [("win", "tie"), ("tie", "loss"), ("loss", "win")])
def test_a_wrong_verdict_is_found(said, other):
    row = next(line for line in rows_of(TEXT) if re.search(rf"\| \**{said}\** \|$", line))
    env = row.split()[1]
    wrong = TEXT.replace(row, re.sub(rf"\| \**{said}\** \|$", f"| {other} |", row))
    problems = table.check(wrong)
    assert any(p.startswith(f"{env}: the table says {other}, the rule gives {said}") for p in problems), problems


def test_a_changed_number_is_found():
    """A tie whose R2AC mean is moved far above RecurrentPPO's becomes a win by the rule, so its "tie" is wrong."""
    row = next(line for line in rows_of(TEXT) if line.endswith("| tie |"))
    env = row.split()[1]
    cells = row.split(" | ")
    mean = cells[1].split(" ± ")[0]
    moved = cells[1].replace(mean, "9.999", 1)
    wrong = TEXT.replace(row, row.replace(cells[1], moved, 1))
    assert any(p.startswith(f"{env}: the table says tie, the rule gives win") for p in table.check(wrong))


def test_a_wrong_tally_is_found():
    tally = re.search(r"\*\*Tally: (\d+) wins", TEXT)
    wrong = TEXT.replace(tally.group(0), f"**Tally: {int(tally.group(1)) + 1} wins")
    assert any(p.startswith("the all tally should read") for p in table.check(wrong))


def test_a_duplicate_row_is_found():
    row = rows_of(TEXT)[0]
    problems = table.check(TEXT.replace(row, row + "\n" + row))
    assert any("listed twice" in p for p in problems), problems


def test_the_command_line_exits_1_on_a_mismatch_and_draws_the_table(tmp_path):
    row = next(line for line in rows_of(TEXT) if line.endswith("| **win** |"))
    wrong = tmp_path / "results.md"
    wrong.write_text(TEXT.replace(row, row.replace("| **win** |", "| tie |")))
    assert table.main(["--results", str(wrong)]) == 1
    png = tmp_path / "glance.png"
    assert table.main(["--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_section_or_an_unreadable_row_stops_the_check():
    with pytest.raises(SystemExit, match="no heading"):
        table.read_rows(TEXT.replace(table.HEADING, "### Something else"))
    row = rows_of(TEXT)[0]
    with pytest.raises(SystemExit, match="does not parse"):
        table.read_rows(TEXT.replace(row, row.replace(" ± ", " +- ", 1)))
