"""Modules of async_search as they were at a past commit, read from the git history.

A benchmark that measures new code against old times both in the same run, so that their
ratio shares the noise of a shared machine. The old code comes from the repository's own
history at run time (``git show COMMIT:PATH``) rather than from a frozen copy kept in the
tree: nothing is written twice, and the yardstick is exactly what was committed.

``import_at_commit("async_search.search.alphazero", commit)`` loads that module's source
at ``commit`` under a private package name (``_async_search_at_<commit>``), and its
imports of other ``async_search`` modules are read at the same commit: the old code runs
against its own helpers, never against today's. Packages load bare (their
``__init__.py`` is not run), so only the modules asked for and what they import are
loaded, not the whole old package with its servers and backends.

Example:
    >>> alphazero = import_at_commit("async_search.search.alphazero", "3c80ed5")
    >>> alphazero.__name__
    '_async_search_at_3c80ed5f627c.search.alphazero'
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import os
import subprocess
import sys
import types
from typing import List, Optional, Sequence, Set, Union

__all__ = ["HistoryUnavailableError", "import_at_commit", "resolve_commit"]

#: The repository these benchmarks live in: the parent of ``benchmarks/``.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The package whose past modules are loaded.
PACKAGE = "async_search"


class HistoryUnavailableError(RuntimeError):
    """The git history cannot give the code asked for (no git checkout, a commit or file
    missing)."""


def resolve_commit(commit: str, repository: str = REPOSITORY) -> str:
    """The full hash of ``commit`` (a hash, a prefix of one, a tag or a branch).

    Raises:
        HistoryUnavailableError: if ``repository`` is not a git checkout, git is not
            installed, or the commit is not in its history (a shallow clone, say).
    """
    inside = _git(repository, "rev-parse", "--git-dir")
    if inside.returncode != 0:
        raise HistoryUnavailableError(
            f"{repository} is not a git checkout, so the code of commit {commit} cannot "
            f"be read from its history; run the benchmark from a clone of the repository "
            f"(git said: {_said(inside)})")
    found = _git(repository, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if found.returncode != 0:
        shallow = _git(repository, "rev-parse", "--is-shallow-repository")
        if _text(shallow.stdout).strip() == "true":
            hint = ("this clone is shallow: fetch the whole history with "
                    "`git fetch --unshallow`")
        else:
            hint = "fetch it from the repository it was made in, or check the name"
        raise HistoryUnavailableError(
            f"commit {commit} is not in the git history of {repository}; {hint}")
    return _text(found.stdout).strip()


def import_at_commit(module: str, commit: str, *,
                     repository: str = REPOSITORY) -> types.ModuleType:
    """The module ``module`` of async_search as it was at ``commit``.

    Loading the same module at the same commit again returns the same module object.

    Args:
        module: a dotted name under ``async_search``, as it was spelled at that commit
            (``"async_search.search.alphazero"``).
        commit: a commit of ``repository``: a hash, a prefix of one, a tag or a branch.
        repository: a git checkout holding that commit; by default the one these
            benchmarks live in.

    Returns:
        The module, named ``_async_search_at_<12 hex digits>.<rest of the name>``; the
        ``async_search`` modules it imports are loaded from the same commit.

    Raises:
        ValueError: if ``module`` is not under ``async_search``.
        HistoryUnavailableError: if the commit cannot be read (see ``resolve_commit``)
            or holds no source for ``module``.

    Example:
        >>> tree = import_at_commit("async_search.search.tree", "3c80ed5")
        >>> tree.Node.__module__
        '_async_search_at_3c80ed5f627c.search.tree'
    """
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        raise ValueError(f"module must be async_search or a module under it, got "
                         f"{module!r}")
    sha = resolve_commit(commit, repository)
    finder = _finder_for(sha, repository)
    if finder.source_path(module) is None:
        path = module.replace(".", "/")
        raise HistoryUnavailableError(
            f"commit {sha[:12]} has no source for {module} (neither {path}.py nor "
            f"{path}/__init__.py); was the module moved or renamed since?")
    return importlib.import_module(finder.alias + module[len(PACKAGE):])


# -- git ------------------------------------------------------------------------------------

def _git(repository: str, *args: str) -> subprocess.CompletedProcess:
    """Runs git in ``repository`` and returns its completed process (bytes out)."""
    try:
        return subprocess.run(["git", "-C", repository, *args], capture_output=True,
                              check=False)
    except FileNotFoundError as error:  # no git executable on PATH
        raise HistoryUnavailableError(
            "the git command was not found; it is needed to read the old code these "
            "benchmarks compare against from the repository's history") from error


def _text(output: Union[bytes, str]) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output


def _said(process: subprocess.CompletedProcess) -> str:
    return _text(process.stderr).strip() or f"exit status {process.returncode}"


# -- the import machinery ---------------------------------------------------------------------

def _finder_for(sha: str, repository: str) -> "_CommitFinder":
    """The finder of modules at ``sha``, installed on ``sys.meta_path`` at the first call.

    It stays installed: an old module may import another one lazily, inside a function,
    long after it was loaded. It answers only for its own private package name.
    """
    alias = f"_{PACKAGE}_at_{sha[:12]}"
    for finder in sys.meta_path:
        if isinstance(finder, _CommitFinder) and finder.alias == alias:
            return finder
    listing = _git(repository, "ls-tree", "-r", "--name-only", "-z", sha, "--", PACKAGE)
    if listing.returncode != 0:
        raise HistoryUnavailableError(
            f"cannot list {PACKAGE}/ at commit {sha[:12]} in {repository}: "
            f"{_said(listing)}")
    paths = {p for p in _text(listing.stdout).split("\0") if p}
    finder = _CommitFinder(repository, sha, alias, paths)
    sys.meta_path.insert(0, finder)
    return finder


class _CommitFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads ``<alias>.x.y`` from ``async_search/x/y.py`` at one commit."""

    def __init__(self, repository: str, sha: str, alias: str, paths: Set[str]) -> None:
        self.repository = repository
        self.sha = sha
        self.alias = alias
        self.paths = paths  # every file under async_search/ at that commit

    def source_path(self, module: str) -> Optional[str]:
        """The path of ``module``'s source at the commit (``async_search`` spelling), or
        None if it has none."""
        base = module.replace(".", "/")
        for path in (f"{base}/__init__.py", f"{base}.py"):
            if path in self.paths:
                return path
        return None

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None
                  ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != self.alias and not fullname.startswith(self.alias + "."):
            return None
        source = self.source_path(PACKAGE + fullname[len(self.alias):])
        if source is None:
            return None
        spec = importlib.util.spec_from_loader(
            fullname, self, origin=f"{self.sha[:12]}:{source}",
            is_package=source.endswith("/__init__.py"))
        spec.loader_state = source
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        spec = module.__spec__
        if spec.submodule_search_locations is not None:
            # A bare package: its __init__.py would import the whole old package
            # (servers, backends, ...), of which only some modules are wanted.
            return
        raw = self._show(spec.loader_state)
        filename = spec.origin
        source = importlib.util.decode_source(raw)
        # Tracebacks and inspect show the old lines; mtime None keeps them cached.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        tree = _ImportsAtCommit(self.alias).visit(ast.parse(raw, filename))
        ast.fix_missing_locations(tree)
        exec(compile(tree, filename, "exec", dont_inherit=True), module.__dict__)

    def _show(self, path: str) -> bytes:
        shown = _git(self.repository, "show", f"{self.sha}:{path}")
        if shown.returncode != 0:
            raise HistoryUnavailableError(
                f"cannot read {path} at commit {self.sha[:12]}: {_said(shown)}")
        return shown.stdout


class _ImportsAtCommit(ast.NodeTransformer):
    """Rewrites absolute imports of ``async_search`` into imports of the private package,
    so that an old module imports its neighbours at the same commit."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def _renamed(self, name: str) -> Optional[str]:
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            return self.alias + name[len(PACKAGE):]
        return None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.ImportFrom:
        renamed = self._renamed(node.module or "") if node.level == 0 else None
        if renamed is not None:
            node.module = renamed
        return node

    def visit_Import(self, node: ast.Import) -> Union[ast.Import, List[ast.stmt]]:
        if not any(self._renamed(a.name) for a in node.names):
            return node
        statements: List[ast.stmt] = []
        for name in node.names:
            renamed = self._renamed(name.name)
            if renamed is None:
                statements.append(ast.Import(names=[name]))
            elif name.asname is not None:
                statements.append(ast.Import(names=[ast.alias(renamed, name.asname)]))
            else:
                # ``import async_search.x`` binds the name ``async_search`` to the top
                # package: bind it to the private one.
                statements.append(ast.Import(names=[ast.alias(renamed, None)]))
                statements.append(ast.Assign(
                    targets=[ast.Name(PACKAGE, ast.Store())],
                    value=ast.Name(self.alias, ast.Load())))
        return [ast.copy_location(s, node) for s in statements]
