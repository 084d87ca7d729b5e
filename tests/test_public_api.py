import importlib

import pytest

import async_search

MODULES = ["async_search", "async_search.servers", "async_search.backends",
           "async_search.batchers", "async_search.queues", "async_search.connections",
           "async_search.models", "async_search.transport", "async_search.search",
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
