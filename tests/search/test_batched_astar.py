import asyncio
import dataclasses
import decimal
import math

import numpy as np
import pytest

import async_search as asr
from async_search import problems, search
from tests.search.costed import CostsOf, Diamond, Line, Shortcut
from async_search.errors import ModelOutputError
from async_search.search import Status

PUZZLE = problems.SlidingPuzzle(3)


def assert_valid_path(puzzle, result, start):
    assert result.path[0] == start and puzzle.is_goal(result.path[-1])
    for a, b in zip(result.path, result.path[1:]):
        assert b in [s for s, _ in puzzle.neighbors(a)]
    assert result.cost == len(result.path) - 1


@pytest.mark.parametrize("buffer_size", [1, 4, 16])
async def test_astar_with_manhattan_finds_optimal_length(buffer_size,
                                                         eight_puzzle_distances):
    evaluate = asr.immediate(problems.ManhattanHeuristic(PUZZLE))
    for seed in range(12):
        start = PUZZLE.scramble(40, seed=seed)
        result = await search.batched_astar(PUZZLE, start, evaluate, budget=20000,
                                            buffer_size=buffer_size)
        assert result.status is Status.GOAL_FOUND
        assert result.cost == eight_puzzle_distances[start]
        assert_valid_path(PUZZLE, result, start)


async def test_weighted_astar_finds_a_valid_path_no_shorter_than_optimal(
        eight_puzzle_distances):
    evaluate = asr.immediate(problems.ManhattanHeuristic(PUZZLE))
    for weight in (0.0, 0.5):
        for seed in range(5):
            start = PUZZLE.scramble(60, seed=seed)
            result = await search.batched_astar(PUZZLE, start, evaluate, budget=20000,
                                                buffer_size=4, weight=weight)
            assert_valid_path(PUZZLE, result, start)
            assert result.cost >= eight_puzzle_distances[start]


async def test_lower_weight_expands_fewer_nodes_on_the_15_puzzle():
    puzzle = problems.SlidingPuzzle(4)
    evaluate = asr.immediate(problems.ManhattanHeuristic(puzzle))
    start = puzzle.scramble(40, seed=1)
    full = await search.batched_astar(puzzle, start, evaluate, budget=20000,
                                      buffer_size=8)
    weighted = await search.batched_astar(puzzle, start, evaluate, budget=20000,
                                          buffer_size=8, weight=0.5)
    assert full.status is weighted.status is Status.GOAL_FOUND
    assert weighted.nodes_expanded < full.nodes_expanded
    assert weighted.cost >= full.cost == 30


async def test_start_at_goal_returns_without_a_request(recorder):
    evaluate = recorder(problems.ManhattanHeuristic(PUZZLE))
    result = await search.batched_astar(PUZZLE, PUZZLE.goal, evaluate, budget=10,
                                        buffer_size=4)
    assert result == search.AStarResult(status=Status.GOAL_FOUND, path=(PUZZLE.goal,),
                                        cost=0, nodes_expanded=0, nodes_generated=1,
                                        evaluations=0, requests=0)
    assert evaluate.requests == []


async def test_budget_counts_evaluated_states_and_stops_the_search(recorder):
    evaluate = recorder(problems.heuristic_mlp(PUZZLE, hidden_sizes=(16,), seed=0))
    result = await search.batched_astar(PUZZLE, PUZZLE.scramble(60, seed=0), evaluate,
                                        budget=50, buffer_size=4)
    assert result.status is Status.BUDGET_EXHAUSTED and result.path is None
    sizes = [len(x) for x in evaluate.requests]
    assert result.evaluations == sum(sizes) and result.requests == len(sizes)
    assert 50 <= result.evaluations < 50 + 4 * 3
    assert sum(sizes[:-1]) < 50


async def test_each_request_holds_the_new_children_of_one_buffer(recorder):
    evaluate = recorder(problems.heuristic_mlp(PUZZLE, hidden_sizes=(16,), seed=0))
    result = await search.batched_astar(PUZZLE, PUZZLE.scramble(60, seed=2), evaluate,
                                        budget=400, buffer_size=16)
    sizes = [len(x) for x in evaluate.requests]
    assert max(sizes) <= 16 * 3 and max(sizes) > 16
    assert result.nodes_expanded <= 16 * result.requests
    # Every state is evaluated at most once.
    rows = np.concatenate(evaluate.requests).reshape(result.evaluations, -1)
    assert len(np.unique(rows, axis=0)) == result.evaluations


async def test_space_exhausted_when_the_graph_has_no_goal():
    graph = problems.SyntheticGraph(branching=2, depth=4, seed=0, goal_fraction=0.0)
    evaluate = asr.immediate(problems.DepthHeuristic(graph))
    result = await search.batched_astar(graph, graph.start(), evaluate, budget=1000,
                                        buffer_size=3)
    assert result.status is Status.SPACE_EXHAUSTED and result.path is None
    assert result.nodes_expanded == result.nodes_generated == 31
    assert result.evaluations == 30


@pytest.mark.parametrize("kwargs, message", [
    (dict(budget=0), "budget must be an integer >= 1, got 0"),
    (dict(buffer_size=0), "buffer_size must be an integer >= 1, got 0"),
    (dict(buffer_size=2.5), "buffer_size must be an integer >= 1, got 2.5"),
    (dict(buffer_size=True), "buffer_size must be an integer >= 1, got True"),
    (dict(weight=-1.0), "weight must be a finite number >= 0.0, got -1.0"),
    (dict(start=bytes([2, 1, 3, 4, 5, 6, 7, 8, 0])), r"SlidingPuzzle\(3\).*unsolvable"),
    (dict(start=(1, 2, 3)), r"SlidingPuzzle\(3\): a state must be bytes"),
])
async def test_bad_arguments_raise_before_any_request(kwargs, message, recorder):
    evaluate = recorder(problems.ManhattanHeuristic(PUZZLE))
    args = dict(start=PUZZLE.scramble(10, seed=0), budget=100, buffer_size=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        await search.batched_astar(PUZZLE, args.pop("start"), evaluate, **args)
    assert evaluate.requests == []


async def test_model_with_wrong_number_of_outputs_raises_model_output_error():
    async def evaluate(x):
        return np.zeros((len(x) + 1, 1), np.float32)

    with pytest.raises(ModelOutputError, match="one value per element"):
        await search.batched_astar(PUZZLE, PUZZLE.scramble(10, seed=0), evaluate,
                                   budget=100, buffer_size=4)


@pytest.mark.parametrize("model, expected", [
    ("manhattan", (Status.GOAL_FOUND, 24, 348, 684, 682, 88)),
    ("mlp", (Status.BUDGET_EXHAUSTED, None, 1468, 3005, 3004, 368)),
])
async def test_golden_counts_on_the_15_puzzle(model, expected):
    # Pins the search's behaviour (order, tie-breaking, goal bound, counting): a change
    # in any of them changes these numbers.
    puzzle = problems.SlidingPuzzle(4)
    net = (problems.ManhattanHeuristic(puzzle) if model == "manhattan" else
           problems.heuristic_mlp(puzzle, hidden_sizes=(32,), seed=0))
    result = await search.batched_astar(puzzle, puzzle.scramble(30, seed=0),
                                        asr.immediate(net), budget=3000, buffer_size=4)
    assert (result.status, result.cost, result.nodes_expanded, result.nodes_generated,
            result.evaluations, result.requests) == expected


async def test_policy_value_outputs_given_to_astar_raise_model_output_error():
    async def evaluate(x):
        return np.zeros((len(x), 7), np.float32), np.zeros((len(x), 1), np.float32)

    with pytest.raises(ModelOutputError, match="is it a policy-value model"):
        await search.batched_astar(PUZZLE, PUZZLE.scramble(10, seed=0), evaluate,
                                   budget=100, buffer_size=4)


@pytest.mark.parametrize("cost", [-1.0, 0.0, math.nan, math.inf, "1", None, 1j, True,
                                  decimal.Decimal("1.5"), 10 ** 400, np.array([1.0]),
                                  np.array([1.0, 2.0])])
@pytest.mark.parametrize("variant", ["batched", "continuous"])
async def test_a_step_cost_that_is_not_finite_and_positive_is_refused(cost, variant):
    async def evaluate(x):
        return np.zeros((len(x), 1), np.float32)

    # A negative cycle would loop forever without awaiting: nothing could stop it.
    run = (search.batched_astar(CostsOf(cost), 0, evaluate, budget=100, buffer_size=1)
           if variant == "batched" else
           search.continuous_astar(CostsOf(cost), 0, evaluate, budget=100))
    with pytest.raises(ValueError, match="a step costs .*finite numbers > 0"):
        await asyncio.wait_for(run, 10)


@pytest.mark.parametrize("cost, scale", [(np.uint8, 1), (np.int32, 8 * 10 ** 6),
                                         (np.int64, 4 * 10 ** 16), (np.float16, 100)])
@pytest.mark.parametrize("variant", ["batched", "continuous"])
async def test_numpy_step_costs_are_summed_as_python_numbers(cost, scale, variant):
    # Summed in their own type, uint8 costs wrapped around (250 read as 44, the dearer
    # path chosen), int32 ones went negative, float16 ones became inf and the goal was
    # lost (space_exhausted).
    async def evaluate(x):
        return np.zeros((len(x), 1), np.float32)

    run = (search.batched_astar(Diamond(cost, scale), 0, evaluate, budget=100,
                                buffer_size=1)
           if variant == "batched" else
           search.continuous_astar(Diamond(cost, scale), 0, evaluate, budget=100))
    result = await asyncio.wait_for(run, 10)
    assert result.status is Status.GOAL_FOUND and result.path == (0, 2, 3)
    assert result.cost == 250 * scale and type(result.cost) in (int, float)


class _ScaledKeys:
    """A puzzle's compact keys whose every step costs ``step_cost``."""

    def __init__(self, keys, step_cost):
        self._keys, self.step_cost = keys, step_cost

    def __getattr__(self, name):
        return getattr(self._keys, name)


class _CostlyPuzzle(problems.SlidingPuzzle):
    """A sliding puzzle whose every step costs ``cost`` (compact keys too)."""

    def __init__(self, size, cost):
        super().__init__(size)
        self.cost = cost

    def neighbors(self, state):
        return [(s, self.cost) for s, _ in super().neighbors(state)]

    def compact_keys(self):
        return _ScaledKeys(problems.SlidingPuzzle(self.size).compact_keys(), self.cost)


async def test_a_numpy_compact_step_cost_is_summed_as_a_python_number():
    puzzle = _CostlyPuzzle(3, np.uint8(200))
    start = puzzle.scramble(6, seed=1)
    evaluate = asr.immediate(problems.ManhattanHeuristic(PUZZLE))
    keyed = await search.batched_astar(puzzle, start, evaluate, budget=1000,
                                       buffer_size=1)
    plain = await search.batched_astar(PUZZLE, start, evaluate, budget=1000,
                                       buffer_size=1)
    assert keyed.path == plain.path and keyed.cost == 200 * plain.cost > 255


@pytest.mark.parametrize("cost", [1e308, 10 ** 308])
@pytest.mark.parametrize("variant", ["batched", "continuous"])
async def test_a_path_whose_cost_passes_the_floats_is_refused(cost, variant):
    # Each step's cost is a float, but their sum is not: as inf, the goal reached did
    # not beat "none found" (space_exhausted); as an int, a raw OverflowError.
    async def evaluate(x):
        return np.zeros((len(x), 1), np.float32)

    run = (search.batched_astar(Line(cost), 0, evaluate, budget=100, buffer_size=1)
           if variant == "batched" else
           search.continuous_astar(Line(cost), 0, evaluate, budget=100))
    with pytest.raises(ValueError, match="Line: a path costs .* past the largest float"):
        await asyncio.wait_for(run, 10)


@pytest.mark.parametrize("scale, weight", [(1e307, 2.0), (1e296, 1e12), (1e296, 1e300)])
@pytest.mark.parametrize("variant", ["batched", "continuous"])
async def test_a_path_whose_weighted_cost_passes_the_floats_is_refused(scale, weight,
                                                                       variant):
    """weight * g overflowed to inf: every priority and the goal's bound tied, and the
    search returned the first goal it reached (15 scale, not 10 scale)."""
    async def evaluate(x):
        return np.zeros((len(x), 1), np.float32)

    def run(w):
        return (search.batched_astar(Shortcut(scale), 0, evaluate, budget=100,
                                     buffer_size=1, weight=w)
                if variant == "batched" else
                search.continuous_astar(Shortcut(scale), 0, evaluate, budget=100,
                                        weight=w))

    cheapest = await asyncio.wait_for(run(1.0), 10)
    assert cheapest.path == (0, 1, 2) and cheapest.cost == 9 * scale + scale
    with pytest.raises(ValueError, match=r"Shortcut: a path costs .* past the largest "
                                         r"float .* over the weight .* lower the weight"):
        await asyncio.wait_for(run(weight), 10)


async def test_a_compact_keyed_path_whose_weighted_cost_passes_the_floats_is_refused():
    puzzle = _CostlyPuzzle(3, 1e300)
    start = puzzle.scramble(6, seed=1)
    evaluate = asr.immediate(problems.ManhattanHeuristic(PUZZLE))
    found = await search.batched_astar(puzzle, start, evaluate, budget=1000,
                                       buffer_size=1)
    assert found.status is Status.GOAL_FOUND and found.cost >= 1e300
    with pytest.raises(ValueError, match="over the weight"):
        await search.batched_astar(puzzle, start, evaluate, budget=1000, buffer_size=1,
                                   weight=1e12)


async def test_a_goal_found_before_the_budget_ran_out_says_whether_it_was_proven():
    # A budget that stops the search after a costlier goal came first (64 nodes popped
    # at a time) returned it as GOAL_FOUND with nothing to tell it from a proven one:
    # this start's distance is 20 (breadth-first search), and the cut run found 22.
    start = bytes((3, 2, 6, 1, 8, 4, 0, 7, 5))
    evaluate = asr.immediate(problems.ManhattanHeuristic(PUZZLE))
    full = await search.batched_astar(PUZZLE, start, evaluate, budget=10**6,
                                      buffer_size=64)
    cut = await search.batched_astar(PUZZLE, start, evaluate, budget=1594, buffer_size=64)
    assert (full.status, full.cost, full.proven) == (Status.GOAL_FOUND, 20, True)
    assert (cut.status, cut.cost, cut.proven) == (Status.GOAL_FOUND, 22, False)
    at_goal = await search.batched_astar(PUZZLE, PUZZLE.goal, evaluate, budget=1,
                                         buffer_size=1)
    assert at_goal.proven
    none = await search.batched_astar(PUZZLE, start, evaluate, budget=5, buffer_size=1)
    assert none.status is Status.BUDGET_EXHAUSTED and not none.proven
    # Not compared: results equal before the field came stay equal.
    assert dataclasses.replace(cut, proven=True) == cut
