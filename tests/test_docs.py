"""The docs hold: the tutorial's code runs as written, every link and every docs reference in the code resolves, and
the site builds with ``mkdocs build --strict``."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


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


def test_readme_tour_learns_the_delay_with_rtrl(tmp_path, monkeypatch, capsys):
    """The README's custom cell, trained as the README shows, answers the delayed recall (TBPTT would sit at 25 %)."""
    (tour,) = [b for b in python_blocks(ROOT / "README.md") if "class LeakyCell" in b]
    monkeypatch.chdir(tmp_path)  # the Trainer writes lightning_logs/ here
    exec(compile(tour, "README.md", "exec"), {})  # noqa: S102  (the README's own code)
    acc = float(re.search(r"'test/acc': ([0-9.]+)", capsys.readouterr().out).group(1))
    assert acc > 0.9, f"the README's cell did not learn the delay with RTRL (test accuracy {acc})"


def slug(heading: str) -> str:
    """GitHub's heading anchor (what mkdocs.yml's slugify also produces): the heading's text in lower case (markup,
    links and tags dropped, underscores kept), punctuation dropped, spaces -> -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"</?[^>]*>|[`*]", "", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def without_code(text: str) -> str:
    """The text without fenced code blocks and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M))


def anchors(page: Path) -> set[str]:
    """Every heading's anchor, GitHub's way (a repeated heading gets -1, -2, ...), and explicit ids."""
    text = re.sub(r"^(```|~~~).*?^\1", "", page.read_text(), flags=re.S | re.M)
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        base = slug(heading)
        name, n = base, 0
        while name in found:
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found | set(re.findall(r"""\b(?:id|name)=["']([^"']+)["']""", text))


def generated_anchors(page: Path) -> bool:
    """An API page (``::: module``) whose anchors mkdocstrings writes."""
    return re.search(r"^:::\s", page.read_text(), flags=re.M) is not None


def markdown_files(root: Path = ROOT) -> list[Path]:
    """The markdown a user reads: the top-level pages and those in docs/, benchmarks/, examples/ and experiments/."""
    found = sorted(root.glob("*.md"))
    for folder in ("docs", "benchmarks", "examples", "experiments"):
        found += sorted((root / folder).rglob("*.md"))
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """``file: link`` for every relative markdown link in ``path`` whose file or heading does not exist."""
    broken = []
    text = without_code(path.read_text())
    for link in re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link):  # https:, mailto:, ...
            continue
        target, _, anchor = link.partition("#")
        page = (path.parent / target).resolve() if target else path
        if not page.exists():
            broken.append(f"{path.relative_to(root)}: {link}")
        elif anchor and page.suffix == ".md" and not generated_anchors(page) and anchor not in anchors(page):
            broken.append(f"{path.relative_to(root)}: {link}")
    return broken


def test_every_link_in_the_markdown_resolves():
    """Relative links in README, CHANGELOG, docs/ and the other folders' READMEs point at files and headings that
    exist (GitHub's anchors: what a reader on GitHub follows; the site build checks the docs/ pages once more)."""
    files = markdown_files()
    assert ROOT / "README.md" in files and DOCS / "index.md" in files
    broken = [problem for path in files for problem in broken_links(path)]
    assert not broken, "\n".join(broken)


# this file and the voice test write made-up docs paths as examples
EXAMPLES_OF_BROKEN_REFERENCES = {Path(__file__).resolve(), (ROOT / "tests" / "test_repository_voice.py").resolve()}


def code_files(root: Path = ROOT) -> list[Path]:
    """The code, configs and tests, which cite the docs as docs/<page>.md#<anchor>."""
    return sorted(
        p
        for d in ("onlinerec", "examples", "benchmarks", "experiments", "tests")
        for p in (root / d).rglob("*")
        if p.suffix in (".py", ".yaml") and p.resolve() not in EXAMPLES_OF_BROKEN_REFERENCES
    )


def broken_references(path: Path, root: Path = ROOT) -> list[str]:
    """``file: docs/<page>.md#<anchor>`` for every docs reference in ``path`` whose page or heading does not exist."""
    missing = []
    docs = root / "docs"
    for page, anchor in re.findall(r"(?<![\w/.])docs/([\w/]+\.md)(?:#([\w-]+))?", path.read_text()):
        target = docs / page
        if not target.parent.is_dir():  # another project's docs folder (e.g. DeepMind Lab's docs/users/)
            continue
        if not target.exists() or (anchor and anchor not in anchors(target)):
            missing.append(f"{path.relative_to(root)}: docs/{page}#{anchor}")
    return missing


def test_every_docs_reference_in_the_code_resolves():
    """The code cites the docs as docs/<page>.md#<anchor>; each page and heading must exist."""
    citing = code_files()
    missing = [problem for path in citing for problem in broken_references(path)]
    assert citing and not missing, "\n".join(missing)


def build_site(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``: every page in the nav, every link and anchor between pages, every API page."""
    for module in ("mkdocs", "material", "mkdocstrings"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the docs extra is not installed ({module}): pip install -e '.[docs]'")
    result = build_site(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr[-5000:]
    assert (tmp_path / "site" / "custom_cell" / "index.html").exists()


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("The M = 1 online step", "the-m--1-online-step"),
        ("Acting on a background thread (`async_actor`)", "acting-on-a-background-thread-async_actor"),
        (
            "Cells: which recurrences learn a 100-step delay online",
            "cells-which-recurrences-learn-a-100-step-delay-online",
        ),
        ("4. Units of several numbers, and stacks", "4-units-of-several-numbers-and-stacks"),
    ],
)
def test_slug_is_githubs_anchor(heading, anchor):
    assert slug(heading) == anchor


# Markdown line budgets: the docs stay a manual one can read, not a log that only grows.
DOCS_LINE_BUDGET = 2500
FILE_LINE_BUDGETS = {"docs/results.md": 500, "docs/performance.md": 350, "README.md": 150, "CHANGELOG.md": 400}


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_docs_stay_within_their_line_budgets():
    over = [
        f"{name}: {line_count(ROOT / name)} lines, budget {budget}"
        for name, budget in FILE_LINE_BUDGETS.items()
        if line_count(ROOT / name) > budget
    ]
    total = sum(line_count(page) for page in DOCS.rglob("*.md"))
    if total > DOCS_LINE_BUDGET:
        over.append(f"docs/**/*.md: {total} lines in all, budget {DOCS_LINE_BUDGET}")
    assert not over, "\n".join(over)
