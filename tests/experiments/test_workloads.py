import asyncio
import pickle

import pytest

import async_search as asr
from async_search.experiments import make_workload, summarize
from async_search.experiments.workloads import budgeted_rollouts, build_model, make_starts
from async_search import problems
from async_search.search import Status

from tests.experiments.conftest import TINY_MODEL, tiny_search


def test_starts_are_seeded_and_distinct():
    params = tiny_search(num_searches=4)
    assert make_starts(params) == make_starts(params)
    assert len(set(make_starts(params))) == 4
    assert make_starts(params) != make_starts(tiny_search(num_searches=4, seed=1))


def test_connect_four_starts_are_openings_with_moves_left():
    game = problems.ConnectFour()
    starts = make_starts(tiny_search("mcts", num_searches=5, opening_moves=6))
    for s in starts:
        game.check_state(s)
        assert game.terminal_value(s) is None
    assert len(set(starts)) > 1


@pytest.mark.parametrize("search", ["astar", "rollout", "mcts", "continuous"])
def test_search_function_and_model_factory_pickle(search):
    w = make_workload(tiny_search(search), TINY_MODEL)
    search_fn, factory = pickle.loads(pickle.dumps((w.search_fn, w.model_factory)))
    model = factory()
    out = asyncio.run(search_fn(w.starts[0], asr.immediate(model)))
    assert out == asyncio.run(w.search_fn(w.starts[0], asr.immediate(w.model_factory())))


def test_models_are_built_once_per_process():
    w = make_workload(tiny_search(), TINY_MODEL)
    assert w.model_factory() is w.model_factory()
    assert build_model("astar", 4, TINY_MODEL) is w.model_factory()
    assert build_model("mcts", 4, TINY_MODEL) is not w.model_factory()


def test_budgeted_rollouts_stop_at_a_goal_or_the_budget():
    puzzle = problems.SlidingPuzzle(3)
    ev = asr.immediate(problems.ManhattanHeuristic(puzzle))
    near = puzzle.scramble(2, seed=0)
    r = asyncio.run(budgeted_rollouts(puzzle, near, ev, budget=1000, depth=4,
                                      num_rollouts=2, seed=0))
    assert r.status is Status.GOAL_FOUND and r.path[-1] == puzzle.goal
    far = puzzle.scramble(40, seed=1)
    r = asyncio.run(budgeted_rollouts(puzzle, far, asr.immediate(
        problems.heuristic_mlp(puzzle, hidden_sizes=(8,))), budget=50, depth=3,
        num_rollouts=2, seed=0))
    assert r.status is not Status.GOAL_FOUND
    assert 50 <= r.evaluations < 50 + 2 * 3 * 4 and r.rounds >= 2


def test_summarize_counts_statuses_and_evaluations():
    w = make_workload(tiny_search(), TINY_MODEL)
    ev = asr.immediate(w.model_factory())
    results = [asyncio.run(w.search_fn(s, ev)) for s in w.starts]
    summary = summarize(results)
    assert summary["searches"] == 3
    assert sum(v for k, v in summary.items() if k in {s.value for s in Status}) == 3
    assert summary["evaluations"] == ev.stats["elements"]


def test_describe_names_the_workload():
    text = make_workload(tiny_search("mcts"), TINY_MODEL).describe()
    assert "3 mcts searches on Connect Four" in text and "numpy net 16" in text
