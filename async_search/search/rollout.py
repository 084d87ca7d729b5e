"""Rollouts: random walks that pick each step by a softmax over the model's scores.

A rollout stands on a state, evaluates all its neighbours not yet on its path in one
request, and moves to one of them drawn with probability proportional to
``exp(-score / temperature)``: the model's score is an estimated cost to go (the output
of a heuristic model, as for A*), so lower is likelier. It stops at a goal, after
``depth`` steps, or where every neighbour is already on its path.

Each rollout draws from its own seeded generator, one uniform number per step, so a
rollout's path depends only on its seed and the model's outputs. ``multi_rollout`` runs
several rollouts in lockstep (one request per step for all of them); its rollout ``i``
equals ``simple_rollout`` seeded with ``rollout_seeds(seed, num_rollouts)[i]``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from async_search.base import Evaluate
from async_search.checks import check_float, check_int
from async_search.problems.base import SearchProblem, State
from async_search.search.base import (MAX_STEP_COST, PROBLEM_METHODS, Status,
                                      check_evaluate, check_hashable, check_protocol,
                                      check_step_cost, encoded, evaluated,
                                      path_cost_overflow, values_of)
from async_search.search.sums import left_sum


Seed = Union[int, np.random.SeedSequence]


@dataclasses.dataclass(frozen=True)
class RolloutResult:
    """What one rollout did."""

    status: Status
    """GOAL_FOUND if it reached a goal, BUDGET_EXHAUSTED if it took ``depth`` steps
    without one, SPACE_EXHAUSTED if it stopped where every neighbour was on its path."""
    path: Tuple[State, ...]
    """The states visited, the start first (the whole walk, whatever the status)."""
    cost: float
    """The sum of the step costs along ``path``."""
    scores: Tuple[float, ...]
    """The model's score of each state moved to (``len(path) - 1`` of them)."""
    nodes_expanded: int
    """States whose neighbours were generated."""
    evaluations: int
    """States sent to the model."""
    requests: int
    """Requests this rollout's states were part of (one per step)."""


@dataclasses.dataclass(frozen=True)
class MultiRolloutResult:
    """What ``multi_rollout`` returns: every rollout, and the best of them."""

    status: Status
    """The best rollout's status (GOAL_FOUND if any rollout reached a goal)."""
    path: Tuple[State, ...]
    """The best rollout's path."""
    cost: float
    """The best rollout's path cost."""
    best: int
    """Index of the best rollout: the cheapest to reach a goal, else the one whose last
    state has the lowest score; ties go to the lower index."""
    rollouts: Tuple[RolloutResult, ...]
    """Each rollout's result, in seed order."""
    nodes_expanded: int
    """States expanded, over all rollouts."""
    evaluations: int
    """States sent to the model, over all rollouts."""
    requests: int
    """Calls to ``evaluate`` (one per lockstep step, shared by the rollouts)."""


@dataclasses.dataclass(eq=False)
class Walk:
    """One rollout's explicit state, advanced by ``walk_candidates`` and ``walk_step``.

    Fields mirror ``RolloutResult``; ``rng`` draws the steps, ``depth`` is the most
    steps to take, ``on_path`` the set of ``path``, and ``status`` stays None while the
    walk goes on.
    """

    rng: np.random.Generator
    depth: int
    path: List[State]
    on_path: set
    cost: float = 0
    scores: List[float] = dataclasses.field(default_factory=list)
    status: Optional[Status] = None
    expanded: int = 0
    evaluations: int = 0
    requests: int = 0


#: The most rollouts ``multi_rollout`` runs in lockstep (each a walk in Python).
MAX_ROLLOUTS = 10_000_000


def rollout_seeds(seed: Seed, num_rollouts: int) -> List[np.random.SeedSequence]:
    """The independent seeds of ``multi_rollout``'s rollouts."""
    if isinstance(seed, np.random.SeedSequence):
        # A fresh copy: spawning from the caller's sequence would change it.
        base = np.random.SeedSequence(seed.entropy, spawn_key=seed.spawn_key)
    else:
        base = np.random.SeedSequence(seed)
    return base.spawn(num_rollouts)


def new_walk(problem: SearchProblem, start: State, seed: Seed, depth: int) -> Walk:
    """A rollout standing on ``start`` (already finished if the start is a goal)."""
    walk = Walk(rng=np.random.default_rng(seed), depth=depth, path=[start],
                on_path={start})
    if problem.is_goal(start):
        walk.status = Status.GOAL_FOUND
    return walk


def walk_candidates(problem: SearchProblem, walk: Walk) -> List[Tuple[State, float]]:
    """The neighbours the walk may move to; none (and a finished walk) at a dead end."""
    walk.expanded += 1
    # each cost checked, whichever the walk draws (the seed never hides one), and kept
    # as Python's number
    try:
        candidates = [(s, check_step_cost(problem, c)) for s, c in
                      problem.neighbors(walk.path[-1]) if s not in walk.on_path]
    except TypeError:
        for s, _ in problem.neighbors(walk.path[-1]):
            check_hashable(problem, s, "from neighbors")
        raise
    if not candidates:
        walk.status = Status.SPACE_EXHAUSTED
    return candidates


def softmax_sample(rng: np.random.Generator, scores: Sequence[float],
                   temperature: float) -> int:
    """An index drawn with probability proportional to ``exp(-score / temperature)``."""
    low = min(scores)
    weights = [math.exp((low - s) / temperature) for s in scores]
    u = rng.random() * left_sum(weights)
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w
        if u < acc:
            return i
    return len(weights) - 1  # only reached through rounding at the top end


def walk_step(problem: SearchProblem, walk: Walk, candidates: List[Tuple[State, float]],
              scores: Sequence[float], temperature: float) -> None:
    """Move the walk to a candidate drawn from the softmax of ``scores``."""
    i = softmax_sample(walk.rng, scores, temperature)
    state, cost = candidates[i]
    walk.path.append(state)
    walk.on_path.add(state)
    walk.cost += cost
    if walk.cost > MAX_STEP_COST:  # inf, or an int past the floats
        raise path_cost_overflow(problem, walk.cost)
    walk.scores.append(scores[i])
    if problem.is_goal(state):
        walk.status = Status.GOAL_FOUND
    elif len(walk.path) - 1 >= walk.depth:
        walk.status = Status.BUDGET_EXHAUSTED


def _result(walk: Walk) -> RolloutResult:
    return RolloutResult(status=walk.status, path=tuple(walk.path), cost=walk.cost,
                         scores=tuple(walk.scores), nodes_expanded=walk.expanded,
                         evaluations=walk.evaluations, requests=walk.requests)


def best_rollout(results: Sequence[RolloutResult]) -> int:
    """The index of the best rollout (see ``MultiRolloutResult.best``)."""
    def key(i):
        r = results[i]
        if r.status is Status.GOAL_FOUND:
            return (0, r.cost, i)
        return (1, r.scores[-1] if r.scores else math.inf, i)
    return min(range(len(results)), key=key)


def _check_seed(seed: Seed) -> Seed:
    """An int >= 0 or a SeedSequence: None (fresh entropy each call) would make the
    rollout differ from run to run."""
    if isinstance(seed, np.random.SeedSequence):
        return seed
    return check_int("seed", seed, minimum=0)


def _check(problem, start, depth, temperature):
    depth = check_int("depth", depth, minimum=1)
    temperature = check_float("temperature", temperature, minimum=0.0, strict=True)
    check_protocol("problem", problem, PROBLEM_METHODS, "SearchProblem",
                   "problems.SlidingPuzzle(4)")
    problem.check_state(start)
    check_hashable(problem, start)
    return depth, temperature


async def simple_rollout(problem: SearchProblem, start: State, evaluate: Evaluate, *,
                         depth: int, seed: Seed, temperature: float = 1.0) -> RolloutResult:
    """One rollout of up to ``depth`` steps from ``start``; one request per step.

    Args:
        problem: the search problem.
        start: the start state; checked with ``problem.check_state``.
        evaluate: ``await evaluate(problem.encode(neighbours))`` scores them (estimated
            cost to go, lower is better; shape ``[n]`` or ``[n, 1]``).
        depth: the most steps to take (>= 1).
        seed: an int or a ``numpy.random.SeedSequence``.
        temperature: of the softmax over negated scores (> 0).

    Raises:
        ValueError: for a depth below 1, a temperature <= 0 or an invalid start, before
            any request is made.
        TypeError: at the first request, if ``evaluate(x)`` returns something that
            cannot be awaited (a model passed where ``asr.immediate(model)`` belongs).

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search import problems
        >>> puzzle = problems.SlidingPuzzle(3)
        >>> ev = asr.immediate(problems.ManhattanHeuristic(puzzle))
        >>> r = asyncio.run(simple_rollout(puzzle, puzzle.scramble(4, seed=0), ev,
        ...                                depth=8, seed=0, temperature=0.1))
        >>> r.status.value, r.cost
        ('goal_found', 4)
    """
    check_evaluate(evaluate)
    depth, temperature = _check(problem, start, depth, temperature)
    seed = _check_seed(seed)
    walk = new_walk(problem, start, seed, depth)
    while walk.status is None:
        candidates = walk_candidates(problem, walk)
        if walk.status is not None:
            break
        states = [s for s, _ in candidates]
        walk.evaluations += len(states)
        walk.requests += 1
        x = encoded(problem, problem.encode(states), len(states))
        y = await evaluated(evaluate, x)
        walk_step(problem, walk, candidates,
                  values_of(y, len(states), "the rollout model's output"), temperature)
    return _result(walk)


async def multi_rollout(problem: SearchProblem, start: State, evaluate: Evaluate, *,
                        depth: int, num_rollouts: int, seed: Seed,
                        temperature: float = 1.0) -> MultiRolloutResult:
    """``num_rollouts`` rollouts from ``start`` in lockstep: one request per step for all.

    Rollout ``i`` draws from ``rollout_seeds(seed, num_rollouts)[i]`` and follows the
    same path as ``simple_rollout`` with that seed. Arguments are as for
    ``simple_rollout``.

    Raises:
        ValueError: for num_rollouts or depth below 1, a temperature <= 0 or an invalid
            start, before any request is made.
        TypeError: at the first request, if ``evaluate(x)`` returns something that
            cannot be awaited (a model passed where ``asr.immediate(model)`` belongs).

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search import problems
        >>> puzzle = problems.SlidingPuzzle(3)
        >>> ev = asr.immediate(problems.ManhattanHeuristic(puzzle))
        >>> r = asyncio.run(multi_rollout(puzzle, puzzle.scramble(6, seed=0), ev,
        ...                               depth=8, num_rollouts=4, seed=0))
        >>> len(r.rollouts), r.path[0] == puzzle.scramble(6, seed=0)
        (4, True)
    """
    check_evaluate(evaluate)
    # (walks made before the first step: past a SeedSequence's count, an OverflowError)
    num_rollouts = check_int("num_rollouts", num_rollouts, minimum=1, maximum=MAX_ROLLOUTS)
    depth, temperature = _check(problem, start, depth, temperature)
    seed = _check_seed(seed)
    walks = [new_walk(problem, start, s, depth) for s in rollout_seeds(seed, num_rollouts)]
    requests = 0
    while True:
        stepping = []
        for walk in walks:
            if walk.status is None:
                candidates = walk_candidates(problem, walk)
                if walk.status is None:
                    stepping.append((walk, candidates))
        if not stepping:
            break
        states = [s for _, candidates in stepping for s, _ in candidates]
        requests += 1
        x = encoded(problem, problem.encode(states), len(states))
        y = await evaluated(evaluate, x)
        values = values_of(y, len(states), "the rollout model's output")
        offset = 0
        for walk, candidates in stepping:
            k = len(candidates)
            walk.evaluations += k
            walk.requests += 1
            walk_step(problem, walk, candidates, values[offset:offset + k], temperature)
            offset += k
    results = tuple(_result(w) for w in walks)
    best = best_rollout(results)
    return MultiRolloutResult(
        status=results[best].status, path=results[best].path, cost=results[best].cost,
        best=best, rollouts=results, nodes_expanded=sum(r.nodes_expanded for r in results),
        evaluations=sum(r.evaluations for r in results), requests=requests)
