"""Griffe extension for the API reference: show onlinerec's reStructuredText bits of docstrings as Markdown.

The docstrings are Google style but use Sphinx roles (``:class:`~onlinerec.X```) and a few RST simple tables
and ``::`` literal blocks. mkdocstrings renders Markdown, so this rewrites, in the text given to it only
(the source is untouched): roles -> code spans (``~a.b.C`` -> ``C``), RST simple tables -> fenced text
blocks, and a paragraph ending in ``::`` -> ``:``. Configured in mkdocs.yml; nothing here is imported by onlinerec.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|obj|exc|const|meth|ref):`(~?)([^`]+)`")
_RULE = re.compile(r"^\s*=+(?:\s+=+)+\s*$")


def _role(match: re.Match) -> str:
    tilde, target = match.groups()
    target = target.strip()
    if tilde:
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _tables(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if _RULE.match(lines[i]):
            rules = [j for j in range(i, len(lines)) if _RULE.match(lines[j])][:3]
            end = rules[-1] if len(rules) == 3 else None
            if end is not None:
                indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
                out += [f"{indent}```text", *lines[i : end + 1], f"{indent}```"]
                i = end + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def rewrite(text: str) -> str:
    text = _ROLE.sub(_role, text)
    text = _tables(text)
    return re.sub(r"(\S)::\n", r"\1:\n", text)


class RstDocstrings(griffe.Extension):
    """Rewrite each docstring once, when its object is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
