"""benchmarks/git_history.py: modules of async_search loaded from a past commit."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import os
import subprocess
import sys
import textwrap

import pytest

from benchmarks.git_history import HistoryUnavailableError, import_at_commit

#: A repository made here: two commits of a tiny async_search whose ``values.NUMBER`` is
#: 1 and then 2, and whose package ``__init__`` fails if it is ever run.
FIRST_FILES = {
    "async_search/__init__.py": "raise ImportError('a bare package must not run this')\n",
    "async_search/values.py": "NUMBER = 1\n",
    "async_search/sub/__init__.py": "raise ImportError('nor this')\n",
    "async_search/sub/reader.py": """\
        import os, async_search.values
        import async_search.values as values_alias
        from async_search.values import NUMBER


        def numbers():
            return NUMBER, async_search.values.NUMBER, values_alias.NUMBER


        def imported_late():
            from async_search import values
            return values.NUMBER


        def fails():
            raise ValueError("raised by the old code")
        """,
}

GIT_IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
                "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}


def git(cwd, *args: str) -> str:
    env = {**os.environ, **GIT_IDENTITY}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """(repository, first commit, second commit)."""
    repo = tmp_path_factory.mktemp("history")
    git(repo, "init", "-q")
    for path, text in FIRST_FILES.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(textwrap.dedent(text))
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    first = git(repo, "rev-parse", "HEAD")
    (repo / "async_search/values.py").write_text("NUMBER = 2\n")
    git(repo, "commit", "-q", "-am", "second")
    return str(repo), first, git(repo, "rev-parse", "HEAD")


@pytest.fixture(autouse=True)
def no_leftover_imports():
    """Each test starts without the finders and modules that an earlier one loaded."""
    finders, modules = list(sys.meta_path), set(sys.modules)
    yield
    sys.meta_path[:] = finders
    for name in set(sys.modules) - modules:
        if name.startswith("_async_search_at_"):
            del sys.modules[name]


def test_a_module_imports_its_neighbours_at_the_same_commit(history):
    repo, first, second = history
    old = import_at_commit("async_search.sub.reader", first, repository=repo)
    new = import_at_commit("async_search.sub.reader", second, repository=repo)
    assert old.numbers() == (1, 1, 1) and old.imported_late() == 1
    assert new.numbers() == (2, 2, 2) and new.imported_late() == 2


def test_the_module_lives_under_a_private_name_not_async_search(history):
    repo, first, _ = history
    reader = import_at_commit("async_search.sub.reader", first[:7], repository=repo)
    assert reader.__name__ == f"_async_search_at_{first[:12]}.sub.reader"
    assert sys.modules.get("async_search") is not reader  # today's package untouched


def test_loading_twice_gives_the_same_module(history):
    repo, first, _ = history
    assert (import_at_commit("async_search.values", first, repository=repo)
            is import_at_commit("async_search.values", first, repository=repo))


def test_the_old_source_is_shown_by_inspect_and_tracebacks(history):
    repo, first, _ = history
    reader = import_at_commit("async_search.sub.reader", first, repository=repo)
    assert "async_search.values.NUMBER" in inspect.getsource(reader.numbers)
    with pytest.raises(ValueError) as raised:
        reader.fails()
    assert 'raise ValueError("raised by the old code")' in str(raised.getrepr())


def test_outside_a_git_checkout_the_error_says_so(tmp_path):
    with pytest.raises(HistoryUnavailableError, match="not a git checkout"):
        import_at_commit("async_search.values", "HEAD", repository=str(tmp_path))


def test_a_missing_commit_is_named(history):
    repo, _, _ = history
    with pytest.raises(HistoryUnavailableError, match="commit 0{40} is not in the git"):
        import_at_commit("async_search.values", "0" * 40, repository=repo)


def test_a_shallow_clone_is_told_to_fetch_the_history(history, tmp_path):
    repo, first, _ = history
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", "shallow")
    with pytest.raises(HistoryUnavailableError, match="git fetch --unshallow"):
        import_at_commit("async_search.values", first,
                         repository=str(tmp_path / "shallow"))


def test_a_module_absent_at_the_commit_is_named(history):
    repo, first, _ = history
    with pytest.raises(HistoryUnavailableError,
                       match=r"no source for async_search\.nowhere"):
        import_at_commit("async_search.nowhere", first, repository=repo)


def test_a_module_outside_async_search_is_refused(history):
    repo, first, _ = history
    with pytest.raises(ValueError, match="'numpy'"):
        import_at_commit("numpy", first, repository=repo)


def test_the_mcts_baseline_returns_what_search_mcts_returns():
    """The yardstick of benchmarks/search_cost.py, read from this repository's history."""
    import async_search as asr
    from async_search import problems, search
    from benchmarks.search_cost import MCTS_BASELINE_COMMIT, free_policy_value

    try:
        alphazero = import_at_commit("async_search.search.alphazero", MCTS_BASELINE_COMMIT)
    except HistoryUnavailableError as error:  # a shallow clone or an unpacked archive
        pytest.skip(str(error))
    connect_four = import_at_commit("async_search.problems.connect_four",
                                    MCTS_BASELINE_COMMIT)
    old_game, game = connect_four.ConnectFour(), problems.ConnectFour()
    evaluate = asr.immediate(free_policy_value(game.num_actions))

    async def both(seed):
        old = await alphazero.mcts(old_game, old_game.initial_state(), evaluate,
                                   num_simulations=48, num_parallel=8, seed=seed)
        new = await search.mcts(game, game.initial_state(), evaluate,
                                num_simulations=48, num_parallel=8, seed=seed)
        compared = [f.name for f in dataclasses.fields(old)]  # later results add fields
        return ([getattr(old, f) for f in compared], [getattr(new, f) for f in compared])

    for seed in range(3):
        old, new = asyncio.run(both(seed))
        assert old == new
