"""The repository speaks to its users about the project alone, and its docs hold no placeholders.

Every text file git tracks (and every untracked file it does not ignore, so a new file counts too) is searched for
words about how the project was made: numbered sessions and issues, rules named by a commit hash, addenda, tuning
arms, held-out batches and the names of AI assistants. Where users read (README, CHANGELOG, docs, examples,
benchmarks and the package) "arm" for a setting is refused as well: say "setting", "config" or "action". The docs
and the README hold no placeholder (a line that is only an all-caps token, or TODO / TBD / FIXME).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

PROCESS_WORDS = {
    "a numbered session": r"\bsessions? \d+",
    "a numbered issue": r"\bissues? #?\d+",
    "a rule named by a commit": r"\brules? [0-9a-f]{7,40}\b",
    "an addendum": r"\baddend(?:um|a)\b",
    "a tuning arm": r"\btuning arms?\b",
    "a held-out batch": r"\bheld-out batch(?:es)?\b",
    "an AI assistant": r"\b(?:claude|anthropic|chatgpt|copilot|sub-?agents?)\b",
}
USER_FACING_WORDS = {"'arm' for a setting": r"\barms?\b"}
USER_FACING = ("README.md", "CHANGELOG.md", "docs/", "examples/", "benchmarks/", "onlinerec/")

PLACEHOLDERS = {
    "a line that is only an all-caps token": r"^\s*[`*_<\[({]*[A-Z][A-Z0-9_]+[`*_>\])}]*:?\s*$",
    "a TODO, TBD or FIXME": r"\b(?:TODO|TBD|FIXME)\b",
}


def _compile(patterns: dict[str, str], flags: int = 0) -> list[tuple[str, re.Pattern]]:
    return [(what, re.compile(pattern, flags)) for what, pattern in patterns.items()]


PROCESS = _compile(PROCESS_WORDS, re.IGNORECASE)
USER = _compile(USER_FACING_WORDS, re.IGNORECASE)
PLACEHOLDER = _compile(PLACEHOLDERS)


def voice_problems(path: str, text: str) -> list[str]:
    """``path:line: what ('match')`` for every process word in ``text`` (and "arm" where users read)."""
    checks = PROCESS + (USER if path.startswith(USER_FACING) else [])
    return [
        f"{path}:{number}: {what} ({found.group(0)!r})"
        for number, line in enumerate(text.splitlines(), 1)
        for what, pattern in checks
        for found in pattern.finditer(line)
    ]


def placeholder_problems(path: str, text: str) -> list[str]:
    """``path:line: what`` for every placeholder line in ``text``."""
    return [
        f"{path}:{number}: {what}: {line.strip()!r}"
        for number, line in enumerate(text.splitlines(), 1)
        for what, pattern in PLACEHOLDER
        if pattern.search(line)
    ]


def repository_files() -> list[str]:
    """Tracked files plus untracked files that git does not ignore, relative to the root, that exist on disk."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return sorted({name for name in listed.split("\0") if name and (ROOT / name).is_file()})


def read_text(path: str) -> str | None:
    """The file's text, or None for a binary file."""
    data = (ROOT / path).read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_the_repository_names_nothing_of_how_it_was_made():
    files = [path for path in repository_files() if path != THIS]
    assert any(path.startswith("onlinerec/") for path in files) and "README.md" in files
    problems = [
        problem for path in files if (text := read_text(path)) is not None for problem in voice_problems(path, text)
    ]
    assert not problems, f"{len(problems)} process words:\n" + "\n".join(problems)


def test_the_docs_and_readme_hold_no_placeholder():
    files = [path for path in repository_files() if path == "README.md" or path.startswith("docs/")]
    assert any(path.endswith(".md") and path.startswith("docs/") for path in files)
    problems = [
        problem
        for path in files
        if (text := read_text(path)) is not None
        for problem in placeholder_problems(path, text)
    ]
    assert not problems, f"{len(problems)} placeholders:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "line",
    [
        "Measured in session 31 on three seeds.",
        "Sessions 4 and 5 re-ran it.",
        "As issue 13 asks, R2AC wins.",
        "See Issue #7.",
        "Chosen under rule f815171 before its runs.",
        "The addendum moves the budget; the addenda agree.",
        "The tuning arms of RecurrentPPO.",
        "Scored on a held-out batch of seeds.",
        "Written with Claude, Anthropic's model.",
        "A ChatGPT answer.",
        "Copilot wrote it.",
        "A subagent moved the file.",
    ],
)
def test_each_process_word_is_found(line):
    assert voice_problems("tests/x.py", f"first line\n{line}\n")[0].startswith("tests/x.py:2: ")


def test_arm_is_refused_only_where_users_read():
    text = "The lru_mingru_sep arm wins."
    for path in ("README.md", "CHANGELOG.md", "docs/results.md", "examples/configs/popgym.yaml", "onlinerec/cli.py"):
        assert voice_problems(path, text) == [f"{path}:1: 'arm' for a setting ('arm')"]
    assert voice_problems("benchmarks/memory_suite.py", "# three arms") != []
    assert voice_problems("tests/rl/test_envs.py", text) == []
    for fine in ("popgym:MultiarmedBanditEasy", "an armed guard", "aarch64 or arm64 wheels", "session cookies"):
        assert voice_problems("docs/envs.md", fine) == []


@pytest.mark.parametrize("line", ["VERIFY_TABLE", "  TBD  ", "`RESULTS_HERE`", "TODO: the table", "the figure (FIXME)"])
def test_each_placeholder_is_found(line):
    assert placeholder_problems("docs/x.md", f"text\n{line}\n")[0].startswith("docs/x.md:2: ")


@pytest.mark.parametrize(
    "line", ["| cell | M |", "```bash", "N = 64", "a todo list", "## T-maze: RTRL against TBPTT", "A"]
)
def test_ordinary_lines_are_not_placeholders(line):
    assert placeholder_problems("docs/x.md", line) == []
