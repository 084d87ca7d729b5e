import asyncio
import dataclasses
import functools
import pickle

import numpy as np

import pytest

import async_search as asr
from async_search.experiments import ModelConfig, SearchConfig, make_workload, summarize
from async_search.experiments.workloads import budgeted_rollouts, build_model, make_starts
from async_search import problems, search
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
    assert summary["solved"] == summary.get("goal_found", 0)


def test_summarize_gives_the_solved_count_and_their_mean_path_length():
    puzzle = problems.SlidingPuzzle(3)
    ev = asr.immediate(problems.ManhattanHeuristic(puzzle))
    solve = functools.partial(search.batched_astar, puzzle, evaluate=ev, buffer_size=4)
    near = [asyncio.run(solve(puzzle.scramble(n, seed=n), budget=5000)) for n in (4, 12)]
    far = asyncio.run(solve(puzzle.scramble(40, seed=1), budget=8))
    assert [r.status for r in near + [far]] == [Status.GOAL_FOUND] * 2 + [
        Status.BUDGET_EXHAUSTED]
    summary = summarize(near + [far])
    assert summary["solved"] == 2 and summary["goal_found"] == 2
    assert summary["mean_path_length"] == (len(near[0].path) + len(near[1].path)) / 2 - 1
    assert summarize([far])["solved"] == 0 and summarize([far])["mean_path_length"] is None


def test_the_default_model_is_the_trained_net_and_tf_computes_the_numpys_bits():
    puzzle = problems.SlidingPuzzle(4)
    x = puzzle.encode([puzzle.scramble(100, seed=i) for i in range(5)])
    trained = ModelConfig(kind="numpy", warm_up=False)
    assert trained.trained and ModelConfig().kind == "tf"
    numpy_net = build_model("astar", 4, trained)
    np.testing.assert_array_equal(numpy_net(x), problems.pretrained("15-puzzle")(x))
    pytest.importorskip("tensorflow")
    tf_net = build_model("astar", 4, dataclasses.replace(trained, kind="tf"))
    assert tf_net(x).tobytes() == numpy_net(x).tobytes()


def test_the_default_workload_solves_its_first_puzzles_with_the_trained_heuristic():
    w = make_workload(SearchConfig(num_searches=2),
                      ModelConfig(kind="numpy", warm_up=False))
    assert "weight 0.3" in w.describe() and "trained numpy net" in w.describe()
    ev = asr.immediate(w.model_factory())
    results = [asyncio.run(w.search_fn(s, ev)) for s in w.starts]
    assert summarize(results)["solved"] == 2


def test_no_trained_net_is_shipped_for_other_puzzles():
    with pytest.raises(ValueError, match="the trained heuristic is for the 15-puzzle"):
        make_workload(tiny_search(puzzle_size=3), ModelConfig(kind="numpy"))
    make_workload(tiny_search(puzzle_size=3), TINY_MODEL)  # the untrained net is any size


def test_describe_names_the_workload():
    text = make_workload(tiny_search("mcts"), TINY_MODEL).describe()
    assert "3 mcts searches on Connect Four" in text
    assert "untrained numpy net 16 (seed 0)" in text
