"""The pure core of A*: the frontier as explicit state, and the functions that move it.

No event loop here. A search pops nodes (``pop_nodes``), generates their children
(``expand_nodes``, which returns the children whose heuristic value is not yet known),
and records the model's values for those children (``record_values``), which puts them
on the open list. The coroutines in ``astar`` and ``continuous_astar`` only decide when
to call these and when to await the model.

Priorities are ``f = weight * g + h``. Ties go to the smaller ``h`` (the node believed
closer to a goal), then to the earlier insertion, so the order is deterministic. Goals
are recognised when generated and never evaluated (their cost-to-go is 0); the best goal
found so far bounds the search, which ends once no open node has ``f`` below
``weight * goal_cost``. With weight 1 and an admissible heuristic, that makes the goal
returned a cheapest one, even when many nodes are popped at once.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Any, Dict, List, Optional, Set, Tuple

from async_search.problems.base import SearchProblem, State
from async_search.search.base import Status

__all__ = ["Frontier", "AStarResult", "new_frontier", "has_open_node", "pop_nodes",
           "expand_nodes", "record_values", "path_to", "astar_result"]

_INF = math.inf


@dataclasses.dataclass(eq=False)
class Frontier:
    """Everything an A* search knows; mutated in place by this module's functions."""

    weight: float
    """The weight of the path cost g in a node's priority ``weight * g + h``."""
    heap: List[tuple] = dataclasses.field(default_factory=list)
    """Open list entries ``(f, h, insertion counter, g, state)``; stale ones stay until
    popped and are skipped (a state's entry is stale once a cheaper g is known)."""
    best_g: Dict[State, float] = dataclasses.field(default_factory=dict)
    """The cheapest known cost from the start to each generated state."""
    parent: Dict[State, Optional[Tuple[State, float]]] = dataclasses.field(
        default_factory=dict)
    """For each generated state, its predecessor on the cheapest known path and the
    step cost; None for the start."""
    h: Dict[State, float] = dataclasses.field(default_factory=dict)
    """The model's value (estimated cost to go) of each evaluated state."""
    awaiting: Set[State] = dataclasses.field(default_factory=set)
    """States sent to the model whose values are not yet recorded."""
    closed: Dict[State, float] = dataclasses.field(default_factory=dict)
    """The g at which each expanded state was last expanded."""
    goal: Any = None
    """The cheapest goal found so far, or None."""
    goal_cost: float = _INF
    """The path cost of ``goal`` (inf while there is none)."""
    counter: int = 0
    """Entries pushed so far: the last tie-breaker."""
    expanded: int = 0
    """Nodes expanded (popped and their successors generated)."""
    evaluations: int = 0
    """States sent to the model."""
    requests: int = 0
    """Calls to the model (each a batch of states)."""


@dataclasses.dataclass(frozen=True)
class AStarResult:
    """What an A* search (batched or continuous) returns.

    Equal results compare equal, so a run through a batching server can be checked
    against a sequential run with ``==``.
    """

    status: Status
    """GOAL_FOUND if a goal was reached (the cheapest one found, proven cheapest when
    the frontier's priorities reached its cost), SPACE_EXHAUSTED if the open list ran
    empty without a goal, BUDGET_EXHAUSTED if the evaluation budget ran out first."""
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


def new_frontier(problem: SearchProblem, start: State, *, weight: float) -> Frontier:
    """A frontier holding only ``start`` (a goal already if the start is one)."""
    fr = Frontier(weight=weight)
    fr.best_g[start] = 0
    fr.parent[start] = None
    if problem.is_goal(start):
        fr.goal, fr.goal_cost = start, 0
    else:
        # The start's h is never needed: it is the only node, so it is popped first.
        fr.heap.append((0.0, 0.0, 0, 0, start))
        fr.counter = 1
    return fr


def has_open_node(fr: Frontier) -> bool:
    """Whether some open node could still lead to a cheaper goal (drops stale entries).

    True when the best open entry has priority below the bound set by the best goal
    found (``weight * goal_cost``; no bound while there is no goal).
    """
    heap, best_g, closed = fr.heap, fr.best_g, fr.closed
    while heap:
        f, _, _, g, state = heap[0]
        if g > best_g[state] or closed.get(state, _INF) <= g:
            heapq.heappop(heap)
            continue
        return fr.goal is None or f < fr.weight * fr.goal_cost
    return False


def pop_nodes(fr: Frontier, max_nodes: int) -> List[Tuple[State, float]]:
    """Pop up to ``max_nodes`` open nodes in priority order, as ``(state, g)`` pairs."""
    nodes = []
    while len(nodes) < max_nodes and has_open_node(fr):
        _, _, _, g, state = heapq.heappop(fr.heap)
        fr.closed[state] = g
        nodes.append((state, g))
    return nodes


def expand_nodes(problem: SearchProblem, fr: Frontier,
                 nodes: List[Tuple[State, float]]) -> List[State]:
    """Generate the successors of ``nodes``; return those the model must evaluate.

    A successor reached more cheaply than before gets its new cost and parent. Goals
    update the best goal and go no further. Successors with a known value are pushed
    at once; new ones are returned (each state once, in generation order) and are
    pushed by ``record_values`` when their values arrive.
    """
    best_g, parent, h, awaiting = fr.best_g, fr.parent, fr.h, fr.awaiting
    heap, weight, is_goal = fr.heap, fr.weight, problem.is_goal
    to_evaluate = []
    for state, g in nodes:
        for child, cost in problem.neighbors(state):
            g_child = g + cost
            if g_child >= best_g.get(child, _INF):
                continue
            best_g[child] = g_child
            parent[child] = (state, cost)
            if is_goal(child):
                if g_child < fr.goal_cost:
                    fr.goal, fr.goal_cost = child, g_child
                continue
            value = h.get(child)
            if value is not None:
                heapq.heappush(heap, (weight * g_child + value, value, fr.counter,
                                      g_child, child))
                fr.counter += 1
            elif child not in awaiting:
                # A state already awaiting its value is pushed at its best g on arrival.
                awaiting.add(child)
                to_evaluate.append(child)
    fr.expanded += len(nodes)
    return to_evaluate


def record_values(fr: Frontier, states: List[State], values: List[float]) -> None:
    """Record the model's values for ``states`` and push each at its current best g."""
    h, best_g, heap, weight = fr.h, fr.best_g, fr.heap, fr.weight
    counter = fr.counter
    for state, value in zip(states, values):
        h[state] = value
        fr.awaiting.discard(state)
        g = best_g[state]
        heapq.heappush(heap, (weight * g + value, value, counter, g, state))
        counter += 1
    fr.counter = counter


def path_to(fr: Frontier, state: State) -> Tuple[Tuple[State, ...], float]:
    """The cheapest known path from the start to ``state`` and its cost."""
    path, cost = [state], 0
    link = fr.parent[state]
    while link is not None:
        previous, step = link
        path.append(previous)
        cost += step
        link = fr.parent[previous]
    return tuple(reversed(path)), cost


def astar_result(fr: Frontier) -> AStarResult:
    """The result of a search that stopped with frontier ``fr``."""
    if fr.goal is not None:
        path, cost = path_to(fr, fr.goal)
        status = Status.GOAL_FOUND
    else:
        path, cost = None, None
        status = Status.BUDGET_EXHAUSTED if has_open_node(fr) else Status.SPACE_EXHAUSTED
    return AStarResult(status=status, path=path, cost=cost, nodes_expanded=fr.expanded,
                       nodes_generated=len(fr.best_g), evaluations=fr.evaluations,
                       requests=fr.requests)
