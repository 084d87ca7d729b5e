import decimal
import fractions
import functools

import numpy as np
import pytest

import async_search as asr
from async_search import problems, search
from async_search.search import RolloutResult, Status
from async_search.search.rollout import best_rollout, rollout_seeds, softmax_sample
from tests.search.costed import Line

PUZZLE = problems.SlidingPuzzle(3)
MANHATTAN = problems.ManhattanHeuristic(PUZZLE)
MLP = problems.heuristic_mlp(PUZZLE, hidden_sizes=(16,), seed=0)


def test_softmax_sample_frequencies_follow_exp_of_negative_scores():
    rng = np.random.default_rng(0)
    scores, temperature = [1.0, 2.0, 0.5], 0.7
    counts = np.bincount([softmax_sample(rng, scores, temperature) for _ in range(20000)],
                         minlength=3)
    weights = np.exp(-np.array(scores) / temperature)
    expected = 20000 * weights / weights.sum()
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))


def test_softmax_sample_is_a_function_of_the_generator_state():
    a = [softmax_sample(np.random.default_rng(3), [0.0, 0.1, 0.2], 1.0) for _ in range(5)]
    assert len(set(a)) == 1
    rng = np.random.default_rng(3)
    assert [softmax_sample(rng, [0.0, 0.0], 1.0) for _ in range(40)].count(0) not in (0, 40)


def test_best_rollout_prefers_the_cheapest_goal_then_the_lowest_last_score():
    def r(status, cost, scores):
        return RolloutResult(status, (), cost, tuple(scores), 0, 0, 0)

    assert best_rollout([r(Status.BUDGET_EXHAUSTED, 1, [0.0]),
                         r(Status.GOAL_FOUND, 9, [5.0]),
                         r(Status.GOAL_FOUND, 7, [5.0]),
                         r(Status.GOAL_FOUND, 7, [1.0])]) == 2
    assert best_rollout([r(Status.BUDGET_EXHAUSTED, 3, [4.0, 2.0]),
                         r(Status.SPACE_EXHAUSTED, 3, [0.0, 1.0]),
                         r(Status.BUDGET_EXHAUSTED, 3, [3.0, 1.0])]) == 1


async def test_rollout_with_a_sharp_manhattan_softmax_walks_to_the_goal():
    evaluate = asr.immediate(MANHATTAN)
    for seed in range(5):
        start = PUZZLE.scramble(6, seed=seed)
        result = await search.simple_rollout(PUZZLE, start, evaluate, depth=20, seed=seed,
                                             temperature=0.05)
        assert result.status is Status.GOAL_FOUND
        assert result.path[0] == start and result.path[-1] == PUZZLE.goal
        assert result.cost == len(result.path) - 1 == len(result.scores)
        assert result.scores[-1] == 0.0


async def test_rollout_stops_after_depth_steps_and_never_revisits_a_state(recorder):
    evaluate = recorder(MLP)
    result = await search.simple_rollout(PUZZLE, PUZZLE.scramble(50, seed=0), evaluate,
                                         depth=12, seed=1)
    assert result.status is Status.BUDGET_EXHAUSTED
    assert len(result.path) == 13 and len(set(result.path)) == 13
    for a, b in zip(result.path, result.path[1:]):
        assert b in [s for s, _ in PUZZLE.neighbors(a)]
    assert result.requests == len(evaluate.requests) == 12 == result.nodes_expanded
    assert result.evaluations == sum(len(x) for x in evaluate.requests)
    # Each step's score is the model's value of the state moved to.
    for state, score in zip(result.path[1:], result.scores):
        assert MLP(PUZZLE.encode([state]))[0, 0] == np.float32(score)


async def test_rollout_into_a_dead_end_is_space_exhausted():
    graph = problems.SyntheticGraph(branching=2, depth=3, seed=0, goal_fraction=0.0)
    evaluate = asr.immediate(problems.DepthHeuristic(graph))
    result = await search.simple_rollout(graph, graph.start(), evaluate, depth=10, seed=0)
    assert result.status is Status.SPACE_EXHAUSTED
    assert len(result.path) == 4 and result.nodes_expanded == 4 and result.requests == 3


async def test_rollout_from_a_goal_makes_no_request(recorder):
    evaluate = recorder(MANHATTAN)
    result = await search.simple_rollout(PUZZLE, PUZZLE.goal, evaluate, depth=5, seed=0)
    assert result == RolloutResult(Status.GOAL_FOUND, (PUZZLE.goal,), 0, (), 0, 0, 0)
    assert evaluate.requests == []


async def test_rollouts_are_seeded():
    start = PUZZLE.scramble(50, seed=3)
    runs = [await search.simple_rollout(PUZZLE, start, asr.immediate(MLP), depth=15,
                                        seed=s) for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0].path != runs[2].path


async def test_multi_rollout_rollouts_equal_simple_rollouts_with_spawned_seeds():
    start = PUZZLE.scramble(50, seed=4)
    multi = await search.multi_rollout(PUZZLE, start, asr.immediate(MLP), depth=10,
                                       num_rollouts=5, seed=11)
    singles = [await search.simple_rollout(PUZZLE, start, asr.immediate(MLP), depth=10,
                                           seed=s) for s in rollout_seeds(11, 5)]
    assert multi.rollouts == tuple(singles)
    assert len({r.path for r in singles}) > 1
    assert multi.path == singles[multi.best].path and multi.best == best_rollout(singles)


async def test_multi_rollout_sends_one_request_per_step_for_all_rollouts(recorder):
    evaluate = recorder(MLP)
    result = await search.multi_rollout(PUZZLE, PUZZLE.scramble(50, seed=5), evaluate,
                                        depth=9, num_rollouts=6, seed=0)
    assert result.requests == len(evaluate.requests) == 9
    assert result.evaluations == sum(len(x) for x in evaluate.requests)
    first_step = len(PUZZLE.neighbors(PUZZLE.scramble(50, seed=5)))
    assert len(evaluate.requests[0]) == 6 * first_step


async def test_multi_rollout_reports_a_goal_if_any_rollout_reaches_one():
    start = PUZZLE.scramble(3, seed=0)
    result = await search.multi_rollout(PUZZLE, start, asr.immediate(MANHATTAN), depth=3,
                                        num_rollouts=8, seed=0, temperature=2.0)
    statuses = [r.status for r in result.rollouts]
    assert Status.GOAL_FOUND in statuses and Status.BUDGET_EXHAUSTED in statuses
    assert result.status is Status.GOAL_FOUND and result.cost == 3


@pytest.mark.parametrize("kwargs, message", [
    (dict(depth=0), "depth must be an integer >= 1, got 0"),
    (dict(num_rollouts=0), "num_rollouts must be an integer in \\[1, 10000000\\], got 0"),
    # a SeedSequence's count overflowed inside the search
    (dict(num_rollouts=10 ** 20), "num_rollouts must be an integer in"),
    (dict(temperature=0.0), "temperature must be a finite number > 0.0, got 0.0"),
    (dict(start=b"bad"), r"SlidingPuzzle\(3\)"),
])
async def test_bad_arguments_raise_before_any_request(kwargs, message, recorder):
    evaluate = recorder(MANHATTAN)
    args = dict(start=PUZZLE.scramble(10, seed=0), depth=5, num_rollouts=2, seed=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        await search.multi_rollout(PUZZLE, args.pop("start"), evaluate, **args)
    if "num_rollouts" not in kwargs:
        args.pop("num_rollouts")
        with pytest.raises(ValueError, match=message):
            await search.simple_rollout(PUZZLE, kwargs.get("start", PUZZLE.goal), evaluate,
                                        **args)
    assert evaluate.requests == []



@pytest.mark.parametrize("seed", [None, -1, 2.5])
async def test_a_rollout_needs_a_seed_so_that_it_is_the_same_every_time(seed):
    evaluate = asr.immediate(MLP)
    for rollout in (search.simple_rollout, functools.partial(search.multi_rollout,
                                                            num_rollouts=2)):
        with pytest.raises(ValueError, match="seed must be an integer >= 0"):
            await rollout(PUZZLE, PUZZLE.scramble(4, seed=0), evaluate, depth=8, seed=seed)


async def test_a_rollout_takes_a_seed_sequence():
    evaluate = asr.immediate(MLP)
    start = PUZZLE.scramble(4, seed=0)
    one = await search.multi_rollout(PUZZLE, start, evaluate, depth=8, num_rollouts=2,
                                     seed=np.random.SeedSequence(7))
    two = await search.multi_rollout(PUZZLE, start, evaluate, depth=8, num_rollouts=2,
                                     seed=np.random.SeedSequence(7))
    assert one == two


@pytest.mark.parametrize("cost", [0.0, -1.0, float("nan"), float("inf"), "1", None, 1j, True,
                                  decimal.Decimal("1.5"), 10 ** 400, np.array([1.0])])
@pytest.mark.parametrize("which", ["simple", "multi"])
async def test_a_step_cost_that_is_not_a_finite_number_above_zero_is_refused(cost, which):
    evaluate = asr.immediate(lambda x: np.zeros((len(x), 1), np.float32))
    run = (search.simple_rollout(Line(cost), 0, evaluate, depth=5, seed=0)
           if which == "simple" else
           search.multi_rollout(Line(cost), 0, evaluate, depth=5, num_rollouts=2, seed=0))
    with pytest.raises(ValueError, match="Line: a step costs .*finite numbers > 0"):
        await run


@pytest.mark.parametrize("cost", [1e308, 10 ** 308])
async def test_a_walk_whose_cost_passes_the_floats_is_refused(cost):
    # It returned goal_found at a cost of inf.
    evaluate = asr.immediate(lambda x: np.zeros((len(x), 1), np.float32))
    with pytest.raises(ValueError, match="Line: a path costs .* past the largest float"):
        await search.simple_rollout(Line(cost), 0, evaluate, depth=5, seed=0)


@pytest.mark.parametrize("cost", [np.float32(1.5), np.int64(2), fractions.Fraction(3, 2), 7])
async def test_real_numbers_of_any_type_are_step_costs(cost):
    evaluate = asr.immediate(lambda x: np.zeros((len(x), 1), np.float32))
    result = await search.simple_rollout(Line(cost), 0, evaluate, depth=5, seed=0)
    assert result.status == Status.GOAL_FOUND and result.cost == 3 * cost


@pytest.mark.parametrize("cost, total", [(np.uint8(100), 300), (np.int32(10 ** 9), 3 * 10 ** 9),
                                         (np.float16(40000), 120000.0)])
@pytest.mark.parametrize("which", ["simple", "multi"])
async def test_numpy_step_costs_are_summed_as_python_numbers(cost, total, which):
    # Summed in their own type: uint8 wrapped around (44), float16 overflowed to inf.
    evaluate = asr.immediate(lambda x: np.zeros((len(x), 1), np.float32))
    run = (search.simple_rollout(Line(cost), 0, evaluate, depth=5, seed=0)
           if which == "simple" else
           search.multi_rollout(Line(cost), 0, evaluate, depth=5, num_rollouts=2, seed=0))
    result = await run
    assert result.status == Status.GOAL_FOUND and result.cost == total
