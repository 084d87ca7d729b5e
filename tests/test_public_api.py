"""The public face: the names the design's contract promises, and the small set of
modules that declare names (``__all__``) for callers."""

import ast
import importlib
import inspect
import pkgutil

import pytest

import async_search
from async_search import errors
from async_search.extras import is_missing_extra

#: Modules other than package faces that are contracts in their own right: callers and
#: the other modules import names from them directly.
CONTRACT_MODULES = {"async_search.base", "async_search.errors", "async_search.batchers",
                    "async_search.rows", "async_search.wire"}


def package_modules():
    """Every module of the package, the package itself first, as ``(name, is_face)``;
    scripts (``__main__``) are left out: importing one runs it."""
    broken = []
    found = [(async_search.__name__, True)]
    found += [(info.name, info.ispkg) for info in pkgutil.walk_packages(
        async_search.__path__, async_search.__name__ + ".", onerror=broken.append)]
    assert not broken, f"walk_packages could not import {broken}"
    assert len(found) > 50, f"walk_packages found only {found}"
    return [(name, face) for name, face in found if not name.endswith(".__main__")]


MODULES = package_modules()


def imported(name: str):
    """The module ``name``; the test is skipped where it needs an extra not installed
    (the tests also run, in part, on a core install)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if is_missing_extra(e):
            pytest.skip(f"{name} needs {e.name}, which is not installed")
        raise


def exported(module, name: str):
    """``getattr(module, name)``, skipped as ``imported`` is (a face imports each name
    on first use)."""
    try:
        return getattr(module, name)
    except ModuleNotFoundError as e:
        if is_missing_extra(e):
            pytest.skip(f"{module.__name__}.{name} needs {e.name}, which is not installed")
        raise
FACES = [name for name, face in MODULES if face]


def defined_public_names(module) -> set:
    """The public names ``module``'s own source binds at its top level: functions,
    classes and assigned constants (also under a top-level ``if``/``try``), never an
    import, never an underscore name."""
    tree = ast.parse(inspect.getsource(module))
    names = set()

    def bind(target):
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                bind(element)

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    bind(target)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
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


# -- the design's contract ----------------------------------------------------------------
def test_the_design_contract_names_exist():
    for name in ("serve", "immediate", "run_searches", "serve_connection", "Router",
                 "CachedEvaluate", "TensorSpec"):
        assert getattr(async_search, name)
    from async_search.batchers import BatchManager, BatchSizeBatcher, NumpyUnbatcher
    from async_search.connections import forked_pipe, get_connected_functions, pipe
    from async_search.models import JaxModel, TensorFlowModel, TorchModel
    from async_search.problems import ConnectFour, SlidingPuzzle, SyntheticGraph
    from async_search.search import (batched_astar, continuous_astar, mcts, multi_rollout,
                                     simple_rollout)
    names = (BatchManager, BatchSizeBatcher, NumpyUnbatcher, forked_pipe,
             get_connected_functions, pipe, ConnectFour, SlidingPuzzle, SyntheticGraph,
             batched_astar, continuous_astar, mcts, multi_rollout, simple_rollout,
             TorchModel, JaxModel, TensorFlowModel)
    assert all(callable(n) for n in names)
    from async_search import search
    assert async_search.search is search


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


# -- every exception a caller can get ------------------------------------------------------
def test_every_exception_lives_in_errors_and_is_exported_at_the_top():
    defined = {name for name, obj in vars(errors).items()
               if inspect.isclass(obj) and issubclass(obj, BaseException)
               and obj.__module__ == errors.__name__}
    assert defined - set(async_search.__all__) == set()
    assert set(errors.__all__) >= defined


@pytest.mark.parametrize("face", FACES)
def test_a_face_exports_exceptions_only_from_errors(face):
    module = imported(face)
    elsewhere = [name for name in module.__all__
                 if inspect.isclass(obj := exported(module, name))
                 and issubclass(obj, BaseException) and obj.__module__ != errors.__name__]
    assert not elsewhere, f"{face} exports exceptions defined outside errors.py"


# -- __all__ on the faces and the contract modules only ------------------------------------
def test_only_faces_and_contract_modules_declare_all():
    importable = {name for name, _ in MODULES if _importable(name)}
    declaring = {name for name in importable
                 if hasattr(importlib.import_module(name), "__all__")}
    expected = (set(FACES) | CONTRACT_MODULES) & importable
    assert declaring - expected == set(), "__all__ outside the faces and contracts"
    assert expected - declaring == set(), "a face or contract module without __all__"


def _importable(name: str) -> bool:
    """Whether ``name`` imports here: not where it needs an extra not installed."""
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if is_missing_extra(e):
            return False
        raise
    return True


@pytest.mark.parametrize("name", sorted(set(FACES) | CONTRACT_MODULES))
def test_all_names_what_the_module_has_once(name):
    module = imported(name)
    names = list(module.__all__)
    for n in names:
        exported(module, n)  # AttributeError where the module lacks it
    assert sorted({n for n in names if names.count(n) > 1}) == []


@pytest.mark.parametrize("name", sorted(set(FACES) | CONTRACT_MODULES))
def test_every_public_name_a_module_defines_is_in_its_all(name):
    module = imported(name)
    assert defined_public_names(module) - set(module.__all__) == set()


@pytest.mark.parametrize("face", FACES)
def test_no_module_is_shadowed_by_a_name_of_its_package(face):
    package = imported(face)
    shadowed = [info.name for info in pkgutil.iter_modules(package.__path__)
                if info.name in package.__all__]
    assert shadowed == []
