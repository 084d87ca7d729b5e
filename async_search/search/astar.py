"""Batched A*: pop a buffer of nodes, evaluate all their new children in one request."""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from async_search.base import Evaluate
from async_search.checks import check_float, check_int
from async_search.problems.base import SearchProblem, State
from async_search.search.base import (PROBLEM_METHODS, Status, check_evaluate,
                                      check_hashable, check_protocol, evaluated,
                                      values_of)
from async_search.search.frontier import (Frontier, encode_keys, expand_ids, has_open_node,
                                          new_frontier, path_to, pop_ids, record_ids)

#: The largest ``weight`` A* computes with; a larger one searches as this one does.
MAX_WEIGHT = 1e12


@dataclasses.dataclass(frozen=True)
class AStarResult:
    """What an A* search (batched or continuous) returns.

    Equal results compare equal, so a run through a batching server can be checked
    against a sequential run with ``==``.
    """

    status: Status
    """GOAL_FOUND if a goal was reached (the cheapest one found; ``proven`` says
    whether the frontier's priorities reached its cost), SPACE_EXHAUSTED if the open list
    ran empty without a goal, BUDGET_EXHAUSTED if the evaluation budget ran out first."""
    path: Optional[Tuple[State, ...]]
    """The states from the start to the goal, both included; None without a goal."""
    cost: Optional[float]
    """The path's cost (the sum of its step costs, in the problem's units); None
    without a goal."""
    nodes_expanded: int
    """Nodes popped from the open list and expanded."""
    nodes_generated: int
    """Distinct states generated (the start included)."""
    evaluations: int
    """States sent to the model (the budget counts these)."""
    requests: int
    """Calls to ``evaluate``, each one batch of states."""
    proven: bool = dataclasses.field(default=False, compare=False)
    """GOAL_FOUND: whether the search reached its own stopping bound, no open priority
    below ``weight * cost``: with ``weight`` >= 1 and an admissible model, ``cost`` is
    then the least; with ``weight`` below 1 (0 is greedy) it says nothing of that.
    False when the budget stopped the search after it found a goal and before that
    bound (a large ``buffer_size`` or ``max_in_flight`` pops nodes past the optimum, so
    a costlier goal can come first), and without a goal. (Not compared: results equal
    before it came stay equal.)"""


def astar_result(fr: Frontier) -> AStarResult:
    """The result of a search that stopped with frontier ``fr``."""
    open_node = has_open_node(fr)
    if fr.goal is not None:
        path, cost = path_to(fr, fr.state_of(fr.goal))
        status = Status.GOAL_FOUND
    else:
        path, cost = None, None
        status = Status.BUDGET_EXHAUSTED if open_node else Status.SPACE_EXHAUSTED
    return AStarResult(status=status, path=path, cost=cost, nodes_expanded=fr.expanded,
                       nodes_generated=len(fr.index) + len(fr.goals),
                       evaluations=fr.evaluations, requests=fr.requests,
                       proven=fr.goal is not None and not open_node)


def check_astar_arguments(problem: SearchProblem, start: State, *, budget: int,
                          weight: float) -> tuple:
    """Validate what both A* variants take; returns ``(budget, weight)`` normalised."""
    budget = check_int("budget", budget, minimum=1)
    # Past MAX_WEIGHT, weight * g would overflow to inf and every priority tie: a larger
    # weight searches as MAX_WEIGHT does (g orders the nodes, h breaks ties).
    weight = min(check_float("weight", weight, minimum=0.0), MAX_WEIGHT)
    check_protocol("problem", problem, PROBLEM_METHODS, "SearchProblem",
                   "problems.SlidingPuzzle(4)")
    problem.check_state(start)
    check_hashable(problem, start)
    return budget, weight


async def batched_astar(problem: SearchProblem, start: State, evaluate: Evaluate, *,
                        budget: int, buffer_size: int, weight: float = 1.0) -> AStarResult:
    """A* that expands up to ``buffer_size`` nodes per step and evaluates their children
    in one request.

    Each step pops the ``buffer_size`` open nodes of lowest priority
    ``f = weight * g + h``, generates their successors, and awaits the model once for all
    successors not seen before; the model's output is the estimated cost to go ``h``
    (shape ``[n]`` or ``[n, 1]``). With ``weight`` 1 and an admissible model the path
    found is a cheapest one, unless the budget stopped the search before it proved
    so (``result.proven`` False); ``weight`` below 1 is batch-weighted A* (DeepCubeA), which
    trades path cost for fewer expansions; 0 is greedy best-first search.

    The sequence of requests depends only on the model's outputs, so a run through a
    batching server returns the same result as one with ``asr.immediate``.

    Args:
        problem: the search problem (``SearchProblem``).
        start: the start state; checked with ``problem.check_state``.
        evaluate: ``await evaluate(problem.encode(states))`` gives their h values.
        budget: the search stops before a step once this many states have been
            evaluated (the last step may pass it by less than one step's children).
        buffer_size: nodes popped and expanded per step.
        weight: the weight of the path cost g (>= 0; one above ``MAX_WEIGHT``, 1e12,
            searches as 1e12 does: g orders the nodes, h breaks ties).

    Returns:
        An ``AStarResult``: status, path and cost, and the counts.

    Raises:
        ValueError: for a budget or buffer_size below 1, a negative weight, or an
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
        >>> r = asyncio.run(batched_astar(puzzle, puzzle.scramble(20, seed=0), evaluate,
        ...                               budget=2000, buffer_size=16))
        >>> r.status.value, r.cost, len(r.path)
        ('goal_found', 14, 15)
    """
    check_evaluate(evaluate)
    budget, weight = check_astar_arguments(problem, start, budget=budget, weight=weight)
    buffer_size = check_int("buffer_size", buffer_size, minimum=1)
    fr = new_frontier(problem, start, weight=weight)
    while fr.evaluations < budget:
        ids, gs = pop_ids(fr, buffer_size)
        if not ids:  # no open node can lead to a cheaper goal
            break
        new, keys = expand_ids(fr, ids, gs)  # the new nodes: ids and keys
        if new:
            fr.evaluations += len(new)
            fr.requests += 1
            y = await evaluated(evaluate, encode_keys(fr, keys))
            record_ids(fr, new, values_of(y, len(new), "the heuristic model's output"))
    return astar_result(fr)
