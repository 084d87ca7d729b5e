"""Griffe extension: show the docstrings' doctest examples as Python console blocks.

The package's docstrings put their examples under ``Example:``, which the Google style
renders as an admonition of Markdown. Markdown knows no ``>>>`` lines: it would join an
example into one paragraph and read ``[a, b]`` followed by ``[c]`` as a reference link,
which the strict build reports as a missing cross-reference. This extension fences every
run of doctest lines (the prompts and the expected output after them, up to a blank
line) as a ``pycon`` block, so the docstrings stay plain doctests that pytest can run.
"""

from __future__ import annotations

from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    """Returns ``text`` with each run of doctest lines inside a ``pycon`` fence."""
    lines = text.split("\n")
    out: list[str] = []
    in_fence = False
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if in_fence or not stripped.startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(stripped)]
        out.append(f"{indent}```pycon")
        # A doctest example runs until a blank line (its output ends there too).
        while i < len(lines) and lines[i].strip():
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Fences the doctest examples of every docstring that griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
