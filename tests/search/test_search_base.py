"""search/base.py: reading a heuristic model's outputs (values_of), and every search's
check of evaluate."""

import numpy as np
import pytest

from async_search.errors import ModelOutputError
from async_search.search.base import values_of


@pytest.mark.parametrize("y", [
    np.array([[1 + 2j], [3 + 0j]]),  # the imaginary part would be dropped silently
    np.array([["a"], ["b"]]),
    np.array([[object()], [1.0]], dtype=object),
])
def test_values_of_refuses_outputs_that_are_not_real_numbers(y):
    with pytest.raises(ModelOutputError, match="must be real numbers"):
        values_of(y, 2, "the heuristic model's output")


def test_values_of_reads_numbers_held_as_objects_as_floats():
    assert values_of(np.array([[1.5], [2]], dtype=object), 2, "h") == [1.5, 2.0]


@pytest.mark.parametrize("y", [np.array([[1.0], [np.inf]], np.float32),
                               np.array([np.nan, 1.0], np.float16)])
def test_values_of_refuses_values_that_are_not_finite(y):
    with pytest.raises(ModelOutputError, match="must be finite"):
        values_of(y, 2, "h")


def test_values_of_takes_finite_values_whose_sum_overflows():
    assert values_of(np.array([1e308, 1e308]), 2, "h") == [1e308, 1e308]


@pytest.mark.parametrize("name", ["batched_astar", "continuous_astar", "simple_rollout",
                                  "multi_rollout", "mcts", "gumbel_mcts"])
@pytest.mark.parametrize("evaluate", [5, None, np.zeros((1, 1), np.float32)])
async def test_every_search_refuses_an_evaluate_that_cannot_be_called(name, evaluate):
    # A model's output or a number passed for evaluate, named, before any work; not
    # "'int' object is not callable" from inside the search.
    from async_search import problems, search
    puzzle, game = problems.SlidingPuzzle(3), problems.ConnectFour()
    args = {"batched_astar": (puzzle, {"budget": 10, "buffer_size": 2}),
            "continuous_astar": (puzzle, {"budget": 10}),
            "simple_rollout": (puzzle, {"depth": 2, "seed": 0}),
            "multi_rollout": (puzzle, {"depth": 2, "num_rollouts": 2, "seed": 0}),
            "mcts": (game, {"num_simulations": 2, "num_parallel": 1}),
            "gumbel_mcts": (game, {"num_simulations": 2})}
    problem, options = args[name]
    start = puzzle.scramble(3, seed=0) if problem is puzzle else game.initial_state()
    with pytest.raises(ValueError, match="evaluate must be an awaitable callable"):
        await getattr(search, name)(problem, start, evaluate, **options)
