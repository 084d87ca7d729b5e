"""Continuous A*: one request per expansion, sent at once, never waiting for a batch.

Determinism. Results of concurrent requests can arrive in any order and at any time, so
a search that pops from whatever the frontier holds at the moment would expand different
nodes in different runs. This one pipelines instead: it keeps up to ``max_in_flight``
expansions whose children are being evaluated, each in its own task, and applies their
results to the frontier in the order the requests were sent (a result that comes early
waits for its predecessors). The k-th expansion therefore always sees exactly the
results of the expansions that preceded it by at least ``max_in_flight``, whatever the
timing, and the search is a deterministic function of the model's outputs: a run through
a batching server equals a run with ``asr.immediate``. With ``max_in_flight=1`` it is
``batched_astar`` with ``buffer_size=1``.
"""

from __future__ import annotations

import asyncio
import collections

from async_search.base import Evaluate
from async_search.checks import check_int
from async_search.problems.base import SearchProblem, State
from async_search.search.astar import AStarResult, astar_result, check_astar_arguments
from async_search.search.base import check_awaitable, check_evaluate, values_of
from async_search.search.frontier import (encode_keys, expand_ids, has_open_node,
                                          new_frontier, pop_ids, record_ids)


async def continuous_astar(problem: SearchProblem, start: State, evaluate: Evaluate, *,
                           budget: int, weight: float = 1.0,
                           max_in_flight: int = 8) -> AStarResult:
    """A* that sends each expansion's children to the model as soon as it is popped.

    The search pops one node, generates its children and sends the new ones in a
    request of their own, in a task, then pops the next node without waiting, until
    ``max_in_flight`` requests are outstanding; it then awaits the oldest and applies its
    values to the frontier (in send order, see the module docstring). Batching happens
    across the requests in flight and across searches. It stops when no open node can
    lead to a cheaper goal and nothing is in flight, or when the budget is spent and the
    requests in flight are back.

    Priorities, goal handling and the meaning of the result are those of
    ``batched_astar``: with ``weight`` 1 and an admissible model the path is a cheapest
    one, because the search only ends when no open or in-flight node could improve it,
    or when the budget ran out (``result.proven`` False: a costlier goal may have come
    first, with nodes in flight past the optimum).

    Args:
        problem: the search problem (``SearchProblem``).
        start: the start state; checked with ``problem.check_state``.
        evaluate: ``await evaluate(problem.encode(states))`` gives their h values.
        budget: no request is sent once this many states have been evaluated.
        weight: the weight of the path cost g in ``f = weight * g + h`` (>= 0; one
            above 1e12 searches as 1e12 does).
        max_in_flight: requests outstanding at once (>= 1).

    Returns:
        An ``AStarResult``.

    Raises:
        ValueError: for a budget or max_in_flight below 1, a negative weight, or an
            invalid start, before any request is made; for
            a step cost that is not a finite number > 0, or a path whose cost passes
            the largest float (over ``weight`` where above 1), when the step is
            generated.
        TypeError: at the first request, if ``evaluate(x)`` returns something that
            cannot be awaited (a model passed where ``asr.immediate(model)`` belongs).

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search import problems
        >>> puzzle = problems.SlidingPuzzle(3)
        >>> evaluate = asr.immediate(problems.ManhattanHeuristic(puzzle))
        >>> r = asyncio.run(continuous_astar(puzzle, puzzle.scramble(20, seed=0), evaluate,
        ...                                  budget=2000))
        >>> r.status.value, r.cost
        ('goal_found', 14)
    """
    check_evaluate(evaluate)
    budget, weight = check_astar_arguments(problem, start, budget=budget, weight=weight)
    max_in_flight = check_int("max_in_flight", max_in_flight, minimum=1)
    fr = new_frontier(problem, start, weight=weight)
    in_flight = collections.deque()  # (task, the nodes sent), oldest first
    try:
        while True:
            if (len(in_flight) < max_in_flight and fr.evaluations < budget
                    and has_open_node(fr)):
                new, keys = expand_ids(fr, *pop_ids(fr, 1))  # the new nodes: ids and keys
                if new:
                    fr.evaluations += len(new)
                    fr.requests += 1
                    request = evaluate(encode_keys(fr, keys))
                    try:
                        task = asyncio.ensure_future(request)
                    except TypeError:  # free unless raised: is evaluate a model?
                        check_awaitable(evaluate, request)
                        raise
                    in_flight.append((task, new))
            elif in_flight:
                task, new = in_flight[0]
                y = await task
                in_flight.popleft()
                record_ids(fr, new, values_of(y, len(new), "the heuristic model's output"))
            else:
                return astar_result(fr)
    finally:
        # On an error or cancellation, drop the requests nobody will read (and mark
        # the errors of finished ones as seen, so that asyncio does not log them).
        for task, _ in in_flight:
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()
