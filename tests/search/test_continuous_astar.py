import asyncio
import random

import numpy as np
import pytest

import async_search as asr
from async_search import problems, search
from async_search.search import Status
from tests.helpers import WAIT_S, wait_until

PUZZLE = problems.SlidingPuzzle(3)


class OutOfOrder:
    """An evaluate that answers pending requests in a random order, after random delays."""

    def __init__(self, model, seed):
        self.model = model
        self.rng = random.Random(seed)
        self.pending = []
        self.outstanding = 0
        self.max_outstanding = 0

    async def __call__(self, x):
        future = asyncio.get_running_loop().create_future()
        self.pending.append((x, future))
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        try:
            return await future
        finally:
            self.outstanding -= 1

    async def serve_forever(self):
        while True:
            for _ in range(self.rng.randint(1, 4)):
                await asyncio.sleep(0)
            if self.pending:
                x, future = self.pending.pop(self.rng.randrange(len(self.pending)))
                if not future.done():
                    future.set_result(self.model(x))


@pytest.mark.parametrize("max_in_flight", [1, 3, 8])
async def test_continuous_astar_with_manhattan_finds_optimal_length(
        max_in_flight, eight_puzzle_distances):
    evaluate = asr.immediate(problems.ManhattanHeuristic(PUZZLE))
    for seed in range(10):
        start = PUZZLE.scramble(40, seed=seed)
        result = await search.continuous_astar(PUZZLE, start, evaluate, budget=20000,
                                               max_in_flight=max_in_flight)
        assert result.status is Status.GOAL_FOUND
        assert result.cost == eight_puzzle_distances[start]
        assert result.path[0] == start and PUZZLE.is_goal(result.path[-1])


@pytest.mark.parametrize("model", ["manhattan", "mlp"])
async def test_one_in_flight_equals_batched_astar_with_buffer_one(model):
    net = (problems.ManhattanHeuristic(PUZZLE) if model == "manhattan" else
           problems.heuristic_mlp(PUZZLE, hidden_sizes=(16,), seed=1))
    for seed in range(6):
        start = PUZZLE.scramble(40, seed=seed)
        continuous = await search.continuous_astar(PUZZLE, start, asr.immediate(net),
                                                   budget=600, max_in_flight=1)
        batched = await search.batched_astar(PUZZLE, start, asr.immediate(net),
                                             budget=600, buffer_size=1)
        assert continuous == batched


async def test_result_does_not_depend_on_the_order_results_arrive_in():
    model = problems.heuristic_mlp(PUZZLE, hidden_sizes=(16,), seed=2)
    starts = [PUZZLE.scramble(40, seed=100 + i) for i in range(8)]
    expected = [await search.continuous_astar(PUZZLE, s, asr.immediate(model), budget=400,
                                              max_in_flight=6) for s in starts]
    for seed in range(3):
        evaluate = OutOfOrder(model, seed)
        server = asyncio.create_task(evaluate.serve_forever())
        try:
            got = await asyncio.gather(*[search.continuous_astar(
                PUZZLE, s, evaluate, budget=400, max_in_flight=6) for s in starts])
        finally:
            server.cancel()
        assert list(got) == expected
        assert evaluate.max_outstanding > 6  # several searches, several requests each


async def test_keeps_up_to_max_in_flight_requests_outstanding():
    model = problems.heuristic_mlp(PUZZLE, hidden_sizes=(16,), seed=2)
    for max_in_flight in (1, 5):
        evaluate = OutOfOrder(model, seed=0)
        server = asyncio.create_task(evaluate.serve_forever())
        try:
            await search.continuous_astar(PUZZLE, PUZZLE.scramble(40, seed=1), evaluate,
                                          budget=300, max_in_flight=max_in_flight)
        finally:
            server.cancel()
        assert evaluate.max_outstanding == max_in_flight


async def test_sends_the_next_request_before_the_previous_result_arrives():
    model = problems.ManhattanHeuristic(PUZZLE)
    third_request = asyncio.Event()
    calls = 0

    async def evaluate(x):
        # The second request (the first one with a choice of nodes to pop) is answered
        # only once a third one was sent.
        nonlocal calls
        calls += 1
        if calls == 2:
            await third_request.wait()
        elif calls == 3:
            third_request.set()
        return model(x)

    result = await asyncio.wait_for(search.continuous_astar(
        PUZZLE, PUZZLE.scramble(20, seed=0), evaluate, budget=2000, max_in_flight=4), 5)
    assert result.status is Status.GOAL_FOUND


async def test_a_failed_request_fails_the_search_and_cancels_the_others():
    started = []

    async def evaluate(x):
        started.append(asyncio.current_task())
        if len(started) == 1:
            return np.zeros((len(x), 1), np.float32)
        if len(started) == 2:
            await asyncio.sleep(0)
            raise RuntimeError("model failed")
        await asyncio.sleep(60)  # only a cancel ends it within the wait below

    with pytest.raises(RuntimeError, match="model failed"):
        await search.continuous_astar(PUZZLE, PUZZLE.scramble(20, seed=0), evaluate,
                                      budget=2000, max_in_flight=4)
    assert len(started) > 2
    await asyncio.wait(started, timeout=WAIT_S)
    assert all(t.done() for t in started)
    assert all(t.cancelled() for t in started[2:])


async def test_cancelling_the_search_cancels_its_requests():
    started = []

    async def evaluate(x):
        started.append(asyncio.current_task())
        await asyncio.sleep(60)  # only a cancel ends it within the wait below

    task = asyncio.create_task(search.continuous_astar(
        PUZZLE, PUZZLE.scramble(20, seed=0), evaluate, budget=2000, max_in_flight=3))
    await wait_until(lambda: started, "the search sends its first request")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait(started, timeout=WAIT_S)
    assert len(started) == 1 and started[0].cancelled()


async def test_budget_stops_sending_and_waits_for_requests_in_flight():
    model = problems.heuristic_mlp(PUZZLE, hidden_sizes=(16,), seed=0)
    result = await search.continuous_astar(PUZZLE, PUZZLE.scramble(60, seed=0),
                                           asr.immediate(model), budget=100,
                                           max_in_flight=4)
    assert result.status is Status.BUDGET_EXHAUSTED
    assert 100 <= result.evaluations < 100 + 3


@pytest.mark.parametrize("kwargs, message", [
    (dict(budget=-5), "budget must be an integer >= 1, got -5"),
    (dict(max_in_flight=0), "max_in_flight must be an integer >= 1, got 0"),
    (dict(weight=float("nan")), "weight must be a finite number"),
    (dict(start=bytes(9)), r"SlidingPuzzle\(3\).*exactly once"),
])
async def test_bad_arguments_raise_before_any_request(kwargs, message, recorder):
    evaluate = recorder(problems.ManhattanHeuristic(PUZZLE))
    args = dict(start=PUZZLE.scramble(10, seed=0), budget=100)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        await search.continuous_astar(PUZZLE, args.pop("start"), evaluate, **args)
    assert evaluate.requests == []


async def test_a_goal_found_before_the_budget_ran_out_says_whether_it_was_proven():
    # 16 requests in flight pop nodes past the optimum (18, breadth-first search): a
    # budget of 582 returned a goal of cost 20 as GOAL_FOUND, like a proven one.
    puzzle = problems.SlidingPuzzle(3)
    start = bytes((2, 1, 6, 5, 0, 8, 4, 3, 7))
    evaluate = asr.immediate(problems.ManhattanHeuristic(puzzle))
    runs = [await search.continuous_astar(puzzle, start, evaluate, budget=budget,
                                          max_in_flight=16) for budget in (10**6, 582)]
    assert [(r.status, r.cost, r.proven) for r in runs] == [
        (Status.GOAL_FOUND, 18, True), (Status.GOAL_FOUND, 20, False)]
