"""Every docstring example of the package runs, and shows its true output.

One test per docstring that holds an example (``>>>``). The docstrings are found by
reading the sources (``ast``), so collecting costs no import of TensorFlow, PyTorch, JAX
or Ray; each test imports its module, asks :class:`doctest.DocTestFinder` for the same
docstring and runs it. An example that needs an optional framework that is not installed
is skipped, with the framework's name as the reason. Examples that cannot run in a test
(a Ray cluster, a GPU, a network server, a long training run) are prose in the
docstrings, not commented-out ``>>>`` lines: :func:`test_no_example_is_commented_out`
keeps it so.
"""

from __future__ import annotations

import ast
import doctest
import importlib
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

import async_search

PACKAGE_DIR = Path(async_search.__file__).parent

#: How an example's output is compared: ``...`` matches anything (addresses, timings),
#: and runs of whitespace are equal (long reprs may wrap).
OPTION_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

#: The optional dependencies (the extras of setup.cfg), by top-level import name. An
#: example that fails to import one of these is skipped when it is missing.
OPTIONAL_DEPENDENCIES = {"tensorflow", "torch", "jax", "jaxlib", "ray", "aiohttp",
                         "prometheus_client", "grpc", "tritonclient", "matplotlib",
                         "seaborn", "tqdm", "absl", "uvloop"}


class Docstring(NamedTuple):
    """A docstring that holds examples, as the sources say."""

    module: str  #: The module's dotted name, e.g. ``async_search.rows``.
    name: str  #: The name DocTestFinder gives it: ``module[.Class][.function]``.
    first_line: int  #: The docstring's first line in the module's file (1-based).
    last_line: int  #: Its last line.
    text: str  #: The docstring, as Python reads it.


def module_name(path: Path) -> str:
    """``async_search/servers/serving.py`` -> ``async_search.servers.serving``."""
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_sources() -> list[Path]:
    """Every module file of the package; scripts (``__main__``) are left out, since
    importing one runs it."""
    return sorted(p for p in PACKAGE_DIR.rglob("*.py") if p.name != "__main__.py")


def docstrings_of(path: Path) -> Iterator[Docstring]:
    """The docstrings in ``path`` that hold a ``>>>`` line: the module's, and those of
    the classes, functions and methods bound at its top level (also under a top-level
    ``if`` or ``try``) or in a class body: the objects DocTestFinder visits."""
    module = module_name(path)
    tree = ast.parse(path.read_text(), filename=str(path))

    def visit(node: ast.AST, prefix: str) -> Iterator[Docstring]:
        body = getattr(node, "body", [])
        if body and isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                      ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text is not None and ">>>" in text:
                first = body[0]
                yield Docstring(module, prefix, first.lineno, first.end_lineno, text)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return  # DocTestFinder does not look inside functions.
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(child, f"{prefix}.{child.name}")
            elif isinstance(child, (ast.If, ast.Try, ast.ExceptHandler)):
                yield from visit(child, prefix)

    yield from visit(tree, module)


DOCSTRINGS = [d for path in package_sources() for d in docstrings_of(path)]


class SkippingRunner(doctest.DocTestRunner):
    """A DocTestRunner that notes an example's failure to import a missing optional
    dependency, so that the test is skipped rather than failed."""

    missing: str | None = None

    def report_unexpected_exception(self, out, test, example, exc_info):
        error = exc_info[1]
        if isinstance(error, ModuleNotFoundError) and (
                (error.name or "").partition(".")[0] in OPTIONAL_DEPENDENCIES):
            self.missing = self.missing or error.name
        super().report_unexpected_exception(out, test, example, exc_info)


def import_or_skip(module: str):
    """Imports ``module``; skips the test when an optional dependency is missing."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        top = (error.name or "").partition(".")[0]
        if top in OPTIONAL_DEPENDENCIES:
            pytest.skip(f"{module} needs {error.name}, which is not installed")
        raise


# rows.plain and requests.plain_array show that a np.matrix comes out a plain array.
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("docstring", DOCSTRINGS, ids=[d.name for d in DOCSTRINGS])
def test_docstring_examples_run(docstring: Docstring):
    module = import_or_skip(docstring.module)
    found = {test.name: test for test in doctest.DocTestFinder().find(module)}
    assert docstring.name in found, (
        f"DocTestFinder does not see the examples of {docstring.name}: they would never "
        f"run. Found: {sorted(found)}")
    test = found[docstring.name]
    runner = SkippingRunner(optionflags=OPTION_FLAGS)
    report: list[str] = []
    result = runner.run(test, out=report.append, clear_globs=True)
    if result.failed and runner.missing:
        pytest.skip(f"{docstring.name} needs {runner.missing}, which is not installed")
    assert result.attempted, f"{docstring.name}: no example ran"
    if result.failed:
        pytest.fail("".join(report), pytrace=False)


def test_the_examples_are_found():
    # A walk that found nothing would pass every test above by having none.
    assert len(DOCSTRINGS) > 100
    assert {d.module for d in DOCSTRINGS} >= {"async_search.batchers",
                                               "async_search.servers.serving"}


def test_every_example_line_is_in_a_collected_docstring():
    """A ``>>>`` line outside the docstrings above (a nested function's docstring, a
    string in code) would never run."""
    stray = []
    for path in package_sources():
        spans = [(d.first_line, d.last_line) for d in docstrings_of(path)]
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.lstrip().startswith(">>>") and not any(
                    first <= number <= last for first, last in spans):
                stray.append(f"{path.relative_to(PACKAGE_DIR.parent)}:{number}")
    assert not stray, f"examples that no test runs: {stray}"


def test_no_example_is_commented_out_or_skipped():
    """An example that is only a comment (``>>> # y = await f(x)``, which doctest drops)
    or that carries ``+SKIP`` runs and checks nothing: it is either made to run or
    written as prose."""
    idle = []
    for d in DOCSTRINGS:
        for line in d.text.splitlines():
            code = line.strip()
            if code.startswith(">>>") and (
                    code[3:].strip().startswith("#") or not code[3:].strip()
                    or "+SKIP" in code):
                idle.append(f"{d.name}: {code}")
    assert not idle, "examples that do not run:\n" + "\n".join(idle)
