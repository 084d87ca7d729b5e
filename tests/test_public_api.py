import ast
import importlib
import inspect
import pkgutil

import pytest

import async_search

MODULES = ["async_search", "async_search.servers", "async_search.backends",
           "async_search.batchers", "async_search.queues", "async_search.connections",
           "async_search.models", "async_search.search",
           "async_search.problems", "async_search.training"]


@pytest.mark.parametrize("name", MODULES)
def test_every_name_in_all_is_importable(name):
    module = importlib.import_module(name)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it lacks: {missing}"


def test_the_design_contract_names_exist():
    for name in ("serve", "immediate", "run_searches"):
        assert callable(getattr(async_search, name))
    from async_search.batchers import BatchManager, BatchSizeBatcher, NumpyUnbatcher
    from async_search.connections import forked_pipe, get_connected_functions, pipe
    from async_search.problems import ConnectFour, SlidingPuzzle
    from async_search.search import batched_astar, continuous_astar, mcts, multi_rollout
    names = (BatchManager, BatchSizeBatcher, NumpyUnbatcher, forked_pipe,
             get_connected_functions, pipe, ConnectFour, SlidingPuzzle, batched_astar,
             continuous_astar, mcts, multi_rollout)
    assert all(callable(n) for n in names)


def test_the_design_contract_learning_names_exist():
    from async_search import problems
    from async_search.training import (Commander, ReplayBuffer, Trainer, load_checkpoint,
                                       save_checkpoint)
    assert all(callable(n) for n in (Commander, ReplayBuffer, Trainer, load_checkpoint,
                                     save_checkpoint))
    net = problems.pretrained("connect_four")
    game = problems.ConnectFour()
    logits, value = net(game.encode([game.initial_state()]))
    assert logits.shape == (1, 7) and value.shape == (1, 1)
    h = problems.pretrained("15-puzzle")
    puzzle = problems.SlidingPuzzle(4)
    assert h(puzzle.encode([puzzle.goal])).shape == (1, 1)


# -- every module's __all__, both ways --------------------------------------------------
def package_modules():
    """Every module of the package, the package itself first (walk_packages imports the
    packages to find their submodules; a package that fails to import is recorded)."""
    broken = {}
    names = [async_search.__name__]
    names += [info.name for info in pkgutil.walk_packages(
        async_search.__path__, async_search.__name__ + ".",
        onerror=lambda name: broken.setdefault(name, "walk_packages could not import it"))]
    return names, broken


def defined_public_names(module) -> set:
    """The public names ``module``'s own source binds at its top level: functions,
    classes and assigned constants (also under a top-level ``if``/``try``), never an
    import, never an underscore name. Submodules and imported names are not its own."""
    tree = ast.parse(inspect.getsource(module))
    names = set()

    def bind(target):
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                bind(element)
        elif isinstance(target, ast.Starred):
            bind(target.value)

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    bind(target)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and (
                    node.value is not None or isinstance(node, ast.AugAssign)):
                bind(node.target)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for part in (node.body, node.orelse, node.finalbody,
                             *(handler.body for handler in node.handlers)):
                    visit(part)

    visit(tree.body)
    return {n for n in names if not n.startswith("_")}


def test_every_module_has_an_all_that_matches_what_it_defines():
    """Walks every module of the package (none skipped: the optional extras are part of
    the test environment, so a module that cannot import fails here, by name) and
    checks ``__all__`` both ways: every name in it exists in the module, and every
    public name the module defines itself is in it."""
    names, problems = package_modules()
    problems = {name: [why] for name, why in problems.items()}
    for name in names:
        if name.rsplit(".", 1)[-1] == "__main__":  # a script: importing it runs it
            continue
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - reported by name below
            problems.setdefault(name, []).append(f"cannot import: {type(e).__name__}: {e}")
            continue
        exported = getattr(module, "__all__", None)
        if exported is None:
            problems.setdefault(name, []).append("has no __all__")
            exported = ()
        missing = sorted(n for n in exported if not hasattr(module, n))
        unlisted = sorted(defined_public_names(module) - set(exported))
        duplicated = sorted({n for n in exported if list(exported).count(n) > 1})
        if missing:
            problems.setdefault(name, []).append(f"__all__ names what it lacks: {missing}")
        if unlisted:
            problems.setdefault(name, []).append(
                f"defines public names missing from __all__: {unlisted}")
        if duplicated:
            problems.setdefault(name, []).append(f"__all__ lists twice: {duplicated}")
    assert len(names) > 50, f"walk_packages found only {names}"
    report = "\n".join(f"  {name}: " + "; ".join(why) for name, why in sorted(problems.items()))
    assert not problems, f"{len(problems)} module(s) with __all__ problems:\n{report}"
