"""Batched and continuous A* against the reference: the one-state-at-a-time A* they were
before issue 12 (a heap of ``(f, h, counter, g, state)`` tuples, dicts keyed by state,
``neighbors`` per state), kept here verbatim in essence.

The cases are built to reach the rare paths: random weighted graphs with few distinct
values of h (ties at every level, -0.0 among them), inconsistent values (nodes reached
again more cheaply after their value is known, so pushed twice; repeated children in one
step), goals met inside a step, and the sliding puzzle searched on its compact keys
with such a model. Each run must return the same result and send the same requests
(the same rows in the same order) as the reference.
"""

import asyncio
import collections
import heapq
import math

import numpy as np
import pytest

from async_search import problems, search
from async_search.search import Status
from async_search.search.base import values_of
from tests.search.conftest import ToyGraph

_INF = math.inf


# -- the reference ----------------------------------------------------------------------

def reference_astar(problem, start, model, *, budget, buffer_size=1, max_in_flight=None,
                    weight=1.0):
    """The pre-issue-12 A*: batched with ``buffer_size``, or continuous (requests applied
    in send order, up to ``max_in_flight`` outstanding) when ``max_in_flight`` is set.
    Returns ``(AStarResult, [request arrays])``."""
    best_g, parent, h, awaiting, closed = {start: 0}, {start: None}, {}, set(), {}
    heap, counter = [], 0
    goal, goal_cost = None, _INF
    expanded = evaluations = 0
    requests = []
    if problem.is_goal(start):
        goal, goal_cost = start, 0
    else:
        heap.append((0.0, 0.0, 0, 0, start))
        counter = 1

    def has_open():
        while heap:
            f, _, _, g, state = heap[0]
            if g > best_g[state] or closed.get(state, _INF) <= g:
                heapq.heappop(heap)
                continue
            return goal is None or f < weight * goal_cost
        return False

    def pop(k):
        nodes = []
        while len(nodes) < k and has_open():
            _, _, _, g, state = heapq.heappop(heap)
            closed[state] = g
            nodes.append((state, g))
        return nodes

    def expand(nodes):
        nonlocal goal, goal_cost, counter, expanded
        out = []
        for state, g in nodes:
            for child, cost in problem.neighbors(state):
                g1 = g + cost
                if g1 >= best_g.get(child, _INF):
                    continue
                best_g[child] = g1
                parent[child] = (state, cost)
                if problem.is_goal(child):
                    if g1 < goal_cost:
                        goal, goal_cost = child, g1
                    continue
                value = h.get(child)
                if value is not None:
                    heapq.heappush(heap, (weight * g1 + value, value, counter, g1, child))
                    counter += 1
                elif child not in awaiting:
                    awaiting.add(child)
                    out.append(child)
        expanded += len(nodes)
        return out

    def record(states, values):
        nonlocal counter
        for state, value in zip(states, values):
            h[state] = value
            awaiting.discard(state)
            g = best_g[state]
            heapq.heappush(heap, (weight * g + value, value, counter, g, state))
            counter += 1

    def evaluate(states):
        nonlocal evaluations
        evaluations += len(states)
        x = problem.encode(states)
        requests.append(x)
        return values_of(model(x), len(states), "h")

    if max_in_flight is None:
        while evaluations < budget and has_open():
            states = expand(pop(buffer_size))
            if states:
                record(states, evaluate(states))
    else:
        in_flight = collections.deque()
        while True:
            if len(in_flight) < max_in_flight and evaluations < budget and has_open():
                states = expand(pop(1))
                if states:
                    in_flight.append((states, evaluate(states)))
            elif in_flight:
                record(*in_flight.popleft())
            else:
                break
    if goal is not None:
        path, cost, state = [goal], 0, goal
        while parent[state] is not None:
            state, step = parent[state]
            path.append(state)
            cost += step
        path, status = tuple(reversed(path)), Status.GOAL_FOUND
    else:
        path = cost = None
        status = Status.BUDGET_EXHAUSTED if has_open() else Status.SPACE_EXHAUSTED
    return search.AStarResult(status=status, path=path, cost=cost,
                              nodes_expanded=expanded, nodes_generated=len(best_g),
                              evaluations=evaluations, requests=len(requests)), requests


def run_astar(problem, start, model, *, budget, buffer_size=1, max_in_flight=None,
              weight=1.0):
    """The library's A* with an evaluate that records its requests."""
    requests = []

    async def evaluate(x):
        requests.append(np.array(x))
        return model(x)

    if max_in_flight is None:
        coroutine = search.batched_astar(problem, start, evaluate, budget=budget,
                                         buffer_size=buffer_size, weight=weight)
    else:
        coroutine = search.continuous_astar(problem, start, evaluate, budget=budget,
                                            max_in_flight=max_in_flight, weight=weight)
    return asyncio.run(coroutine), requests


def assert_same_run(problem, start, model, **kwargs):
    expected, expected_requests = reference_astar(problem, start, model, **kwargs)
    result, requests = run_astar(problem, start, model, **kwargs)
    assert result == expected
    assert len(requests) == len(expected_requests)
    for x, y in zip(requests, expected_requests):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    return result


# -- random graphs (the one-state-at-a-time path) ------------------------------------------

def random_graph(seed, *, nodes=40, degree=3):
    rng = np.random.default_rng(seed)
    names = [f"n{i}" for i in range(nodes)]
    edges = {}
    for name in names:
        targets = rng.choice(nodes, size=rng.integers(0, degree + 1), replace=True)
        edges[name] = [(names[t], float(rng.choice([0.5, 1.0, 1.0, 2.0, 3.0])))
                       for t in targets]
    goals = [names[i] for i in rng.choice(np.arange(1, nodes), size=rng.integers(0, 3),
                                          replace=False)]
    values = [0.0, -0.0, 1.0, 1.0, 2.0, 0.5, 4.0]
    h = {name: float(rng.choice(values)) for name in names}
    return ToyGraph(edges, goals, h)


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_match_the_reference(seed):
    graph = random_graph(seed)
    model = graph.model()
    statuses = set()
    for weight in (0.0, 0.5, 1.0):
        for budget in (5, 1000):
            for buffer_size in (1, 3, 8):
                statuses.add(assert_same_run(graph, "n0", model, budget=budget,
                                             buffer_size=buffer_size, weight=weight).status)
            for max_in_flight in (1, 4):
                assert_same_run(graph, "n0", model, budget=budget,
                                max_in_flight=max_in_flight, weight=weight)
    assert statuses


def test_random_graphs_end_in_every_way():
    statuses = collections.Counter()
    for seed in range(40):
        graph = random_graph(seed)
        for budget in (5, 1000):
            statuses[reference_astar(graph, "n0", graph.model(), budget=budget,
                                     buffer_size=3)[0].status] += 1
    assert set(statuses) == set(Status)


# -- the puzzle on compact keys -----------------------------------------------------------

def tie_model(puzzle, seed, levels):
    """Row-independent, inconsistent values with many ties: a random integer weight per
    (tile, position), summed, taken modulo ``levels``, minus a constant."""
    table = np.random.default_rng(seed).integers(0, 7, puzzle.num_cells ** 2)

    def model(x):
        rows = np.asarray(x).reshape(len(x), -1) @ table
        return ((rows % levels) - 1.0).astype(np.float32)

    return model


class NoCompactKeys:
    """A problem's neighbors, is_goal and encode, without ``compact_keys``."""

    def __init__(self, problem):
        self.input_spec = problem.input_spec
        self.check_state = problem.check_state
        self.neighbors = problem.neighbors
        self.is_goal = problem.is_goal
        self.encode = problem.encode


@pytest.mark.parametrize("size, moves", [(3, 30), (4, 40)])
@pytest.mark.parametrize("seed", range(6))
def test_the_puzzle_on_compact_keys_matches_the_reference(size, moves, seed):
    puzzle = problems.SlidingPuzzle(size)
    assert puzzle.compact_keys() is not None
    start = puzzle.scramble(moves, seed=seed)
    model = tie_model(puzzle, seed, levels=(3, 8)[seed % 2])
    found = set()
    for weight in (0.0, 0.5, 1.0):
        for buffer_size in (1, 5, 16):
            found.add(assert_same_run(puzzle, start, model, budget=600,
                                      buffer_size=buffer_size, weight=weight).status)
        assert_same_run(puzzle, start, model, budget=300, max_in_flight=3, weight=weight)
    # Without compact keys, the same problem takes the one-state-at-a-time path.
    plain = NoCompactKeys(puzzle)
    assert_same_run(plain, start, model, budget=600, buffer_size=16, weight=0.5)
    assert found


def test_a_goal_met_inside_a_step_of_compact_keys_matches_the_reference():
    puzzle = problems.SlidingPuzzle(3)
    model = problems.ManhattanHeuristic(puzzle)
    for seed in range(10):
        start = puzzle.scramble(12, seed=seed)
        for buffer_size in (8, 32):
            result = assert_same_run(puzzle, start, model, budget=5000,
                                     buffer_size=buffer_size)
            assert result.status is Status.GOAL_FOUND


def test_a_larger_puzzle_without_compact_keys_matches_the_reference():
    puzzle = problems.SlidingPuzzle(5)
    assert puzzle.compact_keys() is None
    start = puzzle.scramble(20, seed=0)
    assert_same_run(puzzle, start, tie_model(puzzle, 0, 4), budget=400, buffer_size=8)
    assert_same_run(puzzle, start, problems.ManhattanHeuristic(puzzle), budget=5000,
                    buffer_size=8)
