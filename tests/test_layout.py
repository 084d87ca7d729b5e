"""The shape of the package: which side of a request may import which.

A request flows from a client down to a server and back; the client side of a
connection must not import the server side (what both need lives below both), and no
lower layer imports a higher one. Checked on the source's own import statements, so
that the package face (``async_search/__init__.py``, which hands on names from every
layer) does not blur the picture.
"""

import ast
import pathlib

import pytest

import async_search

ROOT = pathlib.Path(async_search.__file__).parent


def module_file(name: str) -> pathlib.Path | None:
    """The source file of module ``name`` of the package (a package's ``__init__``)."""
    path = ROOT.parent.joinpath(*name.split("."))
    if path.is_dir():
        return path / "__init__.py"
    path = path.with_suffix(".py")
    return path if path.exists() else None


def imported_modules(name: str) -> set[str]:
    """The package's modules that module ``name`` imports, at any depth of its source
    (lazy imports inside functions included)."""
    source = module_file(name)
    if source is None:
        return set()
    found = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            # ``from async_search.x import y`` may name a submodule y
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if module_file(f"{node.module}.{alias.name}") is not None)
    return {m for m in found if m.startswith("async_search.") and module_file(m)}


def reachable(start: str) -> set[str]:
    """Every module of the package that ``start`` imports, directly or through others.
    The faces of the packages around a module are not followed (they hand on names of
    their whole folder, on purpose); a face imported by name is."""
    assert module_file(start) is not None, f"no module {start}"
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imported_modules(name))
    return seen


def under(names: set[str], *folders: str) -> list[str]:
    return sorted(n for n in names
                  if any(n == f"async_search.{f}" or n.startswith(f"async_search.{f}.")
                         for f in folders))


@pytest.mark.parametrize("client", ["async_search.backends.client",
                                    "async_search.connections"])
def test_the_client_side_imports_nothing_of_the_server_side(client):
    assert not under(reachable(client), "servers", "routing", "http")


def test_the_http_client_imports_no_server():
    assert not under(reachable("async_search.http.client"), "servers", "routing")
    assert not under(reachable("async_search.http.client"), "http.front", "http.limits",
                     "http.repository", "http.metrics", "http.__main__")


def test_problems_import_nothing_of_training():
    found = set()
    for path in (ROOT / "problems").glob("*.py"):
        found |= reachable(f"async_search.problems.{path.stem}")
    assert not under(found, "training", "experiments", "backends")


def test_the_walk_follows_imports():
    # The check above must be able to fail: the process backend serves, so it reaches
    # the servers.
    assert under(reachable("async_search.backends.process"), "servers")
