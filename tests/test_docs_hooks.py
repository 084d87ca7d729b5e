"""The docs build's griffe extension fences doctest examples and leaves the rest alone."""

import importlib.util
import os

import pytest

pytest.importorskip("griffe")   # the docs extra

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_doctest_blocks():
    path = os.path.join(ROOT, "docs", "hooks", "doctest_blocks.py")
    spec = importlib.util.spec_from_file_location("doctest_blocks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_doctest_with_its_output_becomes_one_pycon_block_at_its_indent():
    text = ("Summary.\n\nExample:\n    >>> xs = [1, 2]\n    >>> xs\n    [1, 2]\n\n"
            "After.")
    assert load_doctest_blocks().fence_doctests(text) == (
        "Summary.\n\nExample:\n    ```pycon\n    >>> xs = [1, 2]\n    >>> xs\n"
        "    [1, 2]\n    ```\n\nAfter.")


def test_text_without_prompts_and_fenced_prompts_are_left_as_they_are():
    fence_doctests = load_doctest_blocks().fence_doctests
    plain = "A list [1, 2]\n[3] in prose."
    fenced = "```python\n>>> 1 + 1\n2\n```"
    assert fence_doctests(plain) == plain
    assert fence_doctests(fenced) == fenced
