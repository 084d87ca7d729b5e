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

How it is kept fast (issue 12; the order above is kept exactly). Every generated state
but a goal gets a node id, in generation order, and the node's g, parent and step cost
live in lists indexed by id, so the states of one request are always the ids
``first..`` of the last expansion: the request is encoded from a slice and the values
are recorded with slices. The open list is a bucket queue: a heap of the distinct ``f``
values, and for each a first-in-first-out list of entries per ``h`` (insertion order
is the last tie-breaker, so a list in push order is already sorted); comparing floats
in a small heap is much cheaper than comparing ``(f, h, counter)`` tuples in a big one.
An entry is a token, the node id for its first push; a node re-pushed at a lower g gets
a new token and its older entries go stale. Problems that offer ``compact_keys()``
(``problems.base.CompactKeys``: the sliding puzzle) are searched on compact int keys and
expanded a whole step at a time, their new children added with bulk list and dict
operations; others call ``neighbors`` state by state.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
import operator
from typing import Any, Dict, List, Optional, Sequence, Tuple

from async_search.problems.base import CompactKeys, SearchProblem, State, compact_keys_of
from async_search.search.base import Status

__all__ = ["Frontier", "AStarResult", "new_frontier", "has_open_node", "pop_nodes",
           "expand_nodes", "record_values", "path_to", "astar_result"]

_INF = math.inf
_ID_BITS = 32
_ID_MASK = (1 << _ID_BITS) - 1


@dataclasses.dataclass(eq=False)
class Frontier:
    """Everything an A* search knows; mutated in place by this module's functions.

    Nodes are numbered in the order they are generated (goals apart: they are never
    expanded nor evaluated, and are kept in ``goals``). A node's key is its state, or
    the problem's compact key when it offers ``compact_keys()``.
    """

    weight: float
    """The weight of the path cost g in a node's priority ``weight * g + h``."""
    problem: Any = None
    """The search problem."""
    compact: Optional[CompactKeys] = None
    """The problem's compact keys, or None (then a key is the state itself)."""
    index: Dict[Any, int] = dataclasses.field(default_factory=dict)
    """Node id of each generated key (goals apart)."""
    keys: List[Any] = dataclasses.field(default_factory=list)
    """Key of each node id."""
    g: List[float] = dataclasses.field(default_factory=list)
    """The cheapest known cost from the start to each node."""
    parent: List[Any] = dataclasses.field(default_factory=list)
    """The key of each node's predecessor on its cheapest known path (the start: its
    own key)."""
    step: Optional[List[float]] = dataclasses.field(default_factory=list)
    """The cost of the step from the parent (the start: 0); None with compact keys,
    whose steps all cost ``compact.step_cost``."""
    h: List[Optional[float]] = dataclasses.field(default_factory=list)
    """The model's value (estimated cost to go) of the nodes evaluated so far, which
    are the nodes ``0..len(h) - 1`` (values arrive in node order; the start's is None:
    never needed). A node sent to the model and not in here awaits its value."""
    live: List[int] = dataclasses.field(default_factory=list)
    """The latest open-list token of each evaluated node (as ``h``): older tokens of
    the node are stale and skipped when popped."""
    f_heap: List[float] = dataclasses.field(default_factory=list)
    """The distinct priorities on the open list, a heap."""
    buckets: Dict[float, list] = dataclasses.field(default_factory=dict)
    """The open entries of each priority f: ``[h, head, token, ...]`` while they all
    share one h (a queue read from index ``head``), else ``[None, h heap, {h: [head,
    token, ...]}]``."""
    repushes: int = 0
    """Nodes pushed again at a lower g (each token must differ from the earlier ones)."""
    goals: Dict[Any, list] = dataclasses.field(default_factory=dict)
    """For each goal key generated: ``[g, parent id, step cost]``."""
    goal: Any = None
    """The key of the cheapest goal found so far, or None."""
    goal_cost: float = _INF
    """The path cost of ``goal`` (inf while there is none)."""
    expanded: int = 0
    """Nodes expanded (popped and their successors generated)."""
    evaluations: int = 0
    """States sent to the model."""
    requests: int = 0
    """Calls to the model (each a batch of states)."""

    def state_of(self, key: Any) -> State:
        """The problem's state for a key."""
        return key if self.compact is None else self.compact.state(key)

    def key_of(self, state: State) -> Any:
        """The key of a problem's state."""
        return state if self.compact is None else self.compact.key(state)


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
    compact = compact_keys_of(problem)
    fr = Frontier(weight=float(weight), problem=problem, compact=compact,
                  step=None if compact else [])
    key = fr.key_of(start)
    if problem.is_goal(start):
        fr.goals[key] = [0, None, 0]
        fr.goal, fr.goal_cost = key, 0
    else:
        # The start's h is never needed: it is the only node, so it is popped first.
        fr.index[key] = 0
        fr.keys.append(key)
        fr.g.append(0)
        fr.parent.append(key)
        if fr.step is not None:
            fr.step.append(0)
        fr.h.append(None)
        fr.live.append(0)
        fr.f_heap.append(0.0)
        fr.buckets[0.0] = [0.0, 2, 0]
    return fr


# -- the open list ------------------------------------------------------------------------

def _push(fr: Frontier, f: float, h: float, token: int) -> None:
    """Put ``token`` on the open list at priority ``(f, h)``, after its equals."""
    bucket = fr.buckets.get(f)
    if bucket is None:
        fr.buckets[f] = [h, 2, token]
        heapq.heappush(fr.f_heap, f)
    elif bucket[0] == h:
        bucket.append(token)
    else:
        _queue_of(fr, bucket, h).append(token)


def _queue_of(fr: Frontier, bucket: list, h: float) -> list:
    """The queue of value ``h`` in a bucket that holds (or is to hold) several values
    of h, made so if the bucket held one (its entries keep their order)."""
    if bucket[0] is not None:
        first = bucket[0]
        bucket[:] = [None, [first], {first: [1, *bucket[bucket[1]:]]}]
    queues = bucket[2]
    queue = queues.get(h)
    if queue is None:
        queue = queues[h] = [1]
        heapq.heappush(bucket[1], h)
    return queue


def _first_token(fr: Frontier) -> Tuple[float, int]:
    """``(f, token)`` of the first entry on the (non-empty) open list, left in place."""
    f = fr.f_heap[0]
    bucket = fr.buckets[f]
    if bucket[0] is not None:
        return f, bucket[bucket[1]]
    queue = bucket[2][bucket[1][0]]
    return f, queue[queue[0]]


def _drop_first(fr: Frontier) -> None:
    """Remove the first entry of the (non-empty) open list."""
    f = fr.f_heap[0]
    bucket = fr.buckets[f]
    if bucket[0] is not None:
        head = bucket[1] + 1
        if head == len(bucket):
            heapq.heappop(fr.f_heap)
            del fr.buckets[f]
        else:
            bucket[1] = head
        return
    h_heap, queues = bucket[1], bucket[2]
    h = h_heap[0]
    queue = queues[h]
    head = queue[0] + 1
    if head < len(queue):
        queue[0] = head
        return
    heapq.heappop(h_heap)
    del queues[h]
    if not h_heap:
        heapq.heappop(fr.f_heap)
        del fr.buckets[f]


def has_open_node(fr: Frontier) -> bool:
    """Whether some open node could still lead to a cheaper goal (drops stale entries).

    True when the best open entry has priority below the bound set by the best goal
    found (``weight * goal_cost``; no bound while there is no goal).
    """
    live = fr.live
    while fr.f_heap:
        f, token = _first_token(fr)
        if live[token & _ID_MASK] != token:
            _drop_first(fr)
            continue
        return fr.goal is None or f < fr.weight * fr.goal_cost
    return False


def _pop(fr: Frontier, max_nodes: int) -> Tuple[List[int], List[float]]:
    """Pop up to ``max_nodes`` open nodes in priority order: their ids and their g."""
    ids: List[int] = []
    f_heap, buckets, live = fr.f_heap, fr.buckets, fr.live
    bound = _INF if fr.goal is None else fr.weight * fr.goal_cost
    while len(ids) < max_nodes and f_heap:
        f = f_heap[0]
        if not f < bound:
            break
        bucket = buckets[f]
        if bucket[0] is None:
            f, token = _first_token(fr)
            _drop_first(fr)
            if live[token & _ID_MASK] == token:
                ids.append(token & _ID_MASK)
            continue
        # One h at this f: take a run of entries off the queue at once.
        head = bucket[1]
        end = min(len(bucket), head + max_nodes - len(ids))
        tokens = bucket[head:end]
        if end == len(bucket):
            heapq.heappop(f_heap)
            del buckets[f]
        else:
            bucket[1] = end
        for token in tokens:
            if live[token & _ID_MASK] == token:
                ids.append(token & _ID_MASK)
    # Nothing changes g between the pops, so every g is read once, after them.
    return ids, list(map(fr.g.__getitem__, ids))


# -- expansion ----------------------------------------------------------------------------

def _expand(fr: Frontier, ids: List[int], gs: List[float]) -> int:
    """Generate the successors of the popped nodes ``ids`` (popped at costs ``gs``).

    A successor reached more cheaply than before gets its new cost and parent. Goals
    update the best goal and go no further. Successors with a known value are pushed
    at once; new ones become the nodes ``first..`` (returned), in generation order,
    to be evaluated and pushed by ``_record`` when their values arrive.
    """
    first = len(fr.keys)
    if fr.compact is None:
        _expand_states(fr, ids, gs)
    else:
        _expand_keys(fr, ids, gs)
    fr.expanded += len(ids)
    return first


def _reached(fr: Frontier, j: int, parent: Any, g1: float, cost: float) -> None:
    """Node ``j`` was reached again, from the node whose key is ``parent``, at ``g1``."""
    if g1 >= fr.g[j]:
        return
    fr.g[j] = g1
    fr.parent[j] = parent
    if fr.step is not None:
        fr.step[j] = cost
    value = fr.h[j] if j < len(fr.h) else None
    if value is not None:
        fr.repushes += 1
        token = j | (fr.repushes << _ID_BITS)
        fr.live[j] = token
        _push(fr, fr.weight * g1 + value, value, token)
    # else it awaits its value, and is pushed at its best g when the value arrives.


def _reached_goal(fr: Frontier, key: Any, parent: Any, g1: float, cost: float) -> None:
    """The goal ``key`` was reached from the node whose key is ``parent``, at ``g1``."""
    known = fr.goals.get(key)
    if known is not None and g1 >= known[0]:
        return
    fr.goals[key] = [g1, parent, cost]
    if g1 < fr.goal_cost:
        fr.goal, fr.goal_cost = key, g1


def _expand_states(fr: Frontier, ids: List[int], gs: List[float]) -> None:
    """``_expand`` through ``problem.neighbors``, one state at a time."""
    problem, keys, index, goals = fr.problem, fr.keys, fr.index, fr.goals
    neighbors, is_goal = problem.neighbors, problem.is_goal
    g_of, parent, step = fr.g, fr.parent, fr.step
    for i, g in zip(ids, gs):
        state = keys[i]
        for child, cost in neighbors(state):
            g1 = g + cost
            j = index.get(child)
            if j is not None:
                if g1 < g_of[j]:
                    _reached(fr, j, state, g1, cost)
            elif child in goals or is_goal(child):
                _reached_goal(fr, child, state, g1, cost)
            else:
                index[child] = len(keys)
                keys.append(child)
                g_of.append(g1)
                parent.append(state)
                step.append(cost)


def _expand_keys(fr: Frontier, ids: List[int], gs: List[float]) -> None:
    """``_expand`` through the problem's compact keys: every popped node at once.

    New children are added with bulk operations when none is a goal and none appears
    twice; the others (known nodes reached again) are taken one by one, in order,
    which is what the one-by-one loop does, as a new node and a known one never touch
    each other's entries. Otherwise the step runs one child at a time.
    """
    compact, keys, index = fr.compact, fr.keys, fr.index
    cost = compact.step_cost
    popped = list(map(keys.__getitem__, ids))
    children, counts = compact.expand(popped, list(map(fr.parent.__getitem__, ids)))
    found = list(map(index.get, children))
    g1s = [g + cost for g in gs]
    new = found.count(None)
    if new == len(children):
        if not new:
            return
        first = len(keys)
        if not _add_keys(fr, children, first):
            return _expand_keys_one_by_one(fr, popped, g1s, children, counts)
        if g1s.count(g1s[0]) == len(g1s):
            fr.g.extend(_repeat(g1s[0], new))
        else:
            fr.g.extend(_chain(map(_repeat, g1s, counts)))
        fr.parent.extend(_chain(map(_repeat, popped, counts)))
        return
    fresh_mask = list(map(_is, found, _repeat(None)))
    first = len(keys)
    if new:
        fresh = list(_compress(children, fresh_mask))
        if not _add_keys(fr, fresh, first):
            return _expand_keys_one_by_one(fr, popped, g1s, children, counts)
    g = fr.g
    # Known nodes reached again: usually none more cheaply (then there is nothing to do).
    if min(g1s) < max(map(g.__getitem__, filter(_not_none, found))):
        owners = _chain(map(_repeat, range(len(ids)), counts))
        for j, o in _compress(zip(found, owners), map(_is_not, found, _repeat(None))):
            if g1s[o] < g[j]:
                _reached(fr, j, popped[o], g1s[o], cost)
    if new:
        if g1s.count(g1s[0]) == len(g1s):
            g.extend(_repeat(g1s[0], new))
        else:
            g.extend(_compress(_chain(map(_repeat, g1s, counts)), fresh_mask))
        fr.parent.extend(_compress(_chain(map(_repeat, popped, counts)), fresh_mask))


def _add_keys(fr: Frontier, children: List[Any], first: int) -> bool:
    """Index ``children`` (none known yet) as the nodes ``first..`` and list their keys,
    if none is a goal and none appears twice; else change nothing and return False."""
    index, goal_keys = fr.index, fr.compact.goal_keys
    before = len(index)
    index.update(zip(children, range(first, first + len(children))))
    # A goal would now be in the index (goals never are), a repeated key would have
    # added fewer entries than there are children.
    if len(index) - before != len(children) or (
            any(map(index.__contains__, goal_keys)) if len(goal_keys) < len(children)
            else not goal_keys.isdisjoint(children)):
        for child in children:
            index.pop(child, None)
        return False
    fr.keys.extend(children)
    return True


_chain = itertools.chain.from_iterable
_repeat = itertools.repeat
_compress = itertools.compress
_is, _is_not = operator.is_, operator.is_not
_not_none = functools.partial(operator.is_not, None)


def _expand_keys_one_by_one(fr: Frontier, popped: List[Any], g1s: List[float],
                            children: List[Any], counts: List[int]) -> None:
    cost = fr.compact.step_cost
    index, goal_keys, keys, g_of, parent = (fr.index, fr.compact.goal_keys, fr.keys,
                                            fr.g, fr.parent)
    for child, o in zip(children, _chain(map(_repeat, range(len(popped)), counts))):
        g1 = g1s[o]
        j = index.get(child)
        if j is not None:
            if g1 < g_of[j]:
                _reached(fr, j, popped[o], g1, cost)
        elif child in goal_keys:
            _reached_goal(fr, child, popped[o], g1, cost)
        else:
            index[child] = len(keys)
            keys.append(child)
            g_of.append(g1)
            parent.append(popped[o])


# -- values -------------------------------------------------------------------------------

def _record(fr: Frontier, first: int, values: Sequence[float]) -> None:
    """Record the model's values for the nodes ``first..first + len(values)`` (the next
    ones to be evaluated) and push each at its current best g, in order."""
    m = len(values)
    if len(fr.h) != first:
        raise ValueError(f"values must arrive in node order: expected those of node "
                         f"{len(fr.h)}, got node {first}")
    fr.h.extend(values)
    # A node's first token is its id.
    fr.live.extend(range(first, first + m))
    # f = weight * g + h, with the roundings of a loop over the nodes; then the runs of
    # equal (f, h), each pushed at once (the zero model: a run or two a request).
    weight, gs, h = fr.weight, fr.g[first:first + m], values[0]
    if values.count(h) == m:
        if gs.count(gs[0]) == m:
            runs = (((weight * gs[0] + h, h), ()),)
            lengths = (m,)
        else:
            runs = itertools.groupby([(weight * g + h, h) for g in gs])
            lengths = None
    else:
        runs = itertools.groupby([(weight * g + v, v) for g, v in zip(gs, values)])
        lengths = None
    buckets, position = fr.buckets, first
    for k, ((f, h), run) in enumerate(runs):
        end = position + (lengths[k] if lengths else len(list(run)))
        bucket = buckets.get(f)
        if bucket is None:
            buckets[f] = [h, 2, *range(position, end)]
            heapq.heappush(fr.f_heap, f)
        elif bucket[0] == h:
            bucket.extend(range(position, end))
        else:
            _queue_of(fr, bucket, h).extend(range(position, end))
        position = end


def _encode(fr: Frontier, first: int) -> Any:
    """The model input for the nodes ``first..`` (the last expansion's new ones)."""
    keys = fr.keys[first:]
    if fr.compact is None:
        return fr.problem.encode(keys)
    return fr.compact.encode(keys)


# -- the public steps, on the problem's states ----------------------------------------------

def pop_nodes(fr: Frontier, max_nodes: int) -> List[Tuple[State, float]]:
    """Pop up to ``max_nodes`` open nodes in priority order, as ``(state, g)`` pairs."""
    ids, gs = _pop(fr, max_nodes)
    return [(fr.state_of(fr.keys[i]), g) for i, g in zip(ids, gs)]


def expand_nodes(problem: SearchProblem, fr: Frontier,
                 nodes: List[Tuple[State, float]]) -> List[State]:
    """Generate the successors of ``nodes`` (from ``pop_nodes``); return those the
    model must evaluate.

    A successor reached more cheaply than before gets its new cost and parent. Goals
    update the best goal and go no further. Successors with a known value are pushed
    at once; new ones are returned (each state once, in generation order) and are
    pushed by ``record_values`` when their values arrive. ``problem`` is the one the
    frontier was made for.
    """
    ids = [fr.index[fr.key_of(state)] for state, _ in nodes]
    first = _expand(fr, ids, [g for _, g in nodes])
    return [fr.state_of(key) for key in fr.keys[first:]]


def record_values(fr: Frontier, states: List[State], values: List[float]) -> None:
    """Record the model's values for ``states`` and push each at its current best g.

    ``states`` are those returned by one ``expand_nodes`` call, all of them and in
    order; calls follow the order of the ``expand_nodes`` calls.
    """
    ids = [fr.index[fr.key_of(state)] for state in states]
    if not ids:
        return
    if ids != list(range(ids[0], ids[0] + len(ids))):
        raise ValueError("record_values takes the states of one expand_nodes call, all "
                         "of them and in order")
    _record(fr, ids[0], list(values))


def path_to(fr: Frontier, state: State) -> Tuple[Tuple[State, ...], float]:
    """The cheapest known path from the start to ``state`` and its cost."""
    return _path_to_key(fr, fr.key_of(state))


def _path_to_key(fr: Frontier, key: Any) -> Tuple[Tuple[State, ...], float]:
    # Costs are summed from the goal back, as the steps are met.
    path, cost = [key], 0
    goal = fr.goals.get(key)
    if goal is not None:
        key, step = goal[1], goal[2]
        if key is None:  # the start
            return (fr.state_of(path[0]),), 0
        cost += step
        path.append(key)
    index, parent, steps = fr.index, fr.parent, fr.step
    unit = fr.compact.step_cost if steps is None else None
    i = index[key]
    while i:
        cost += unit if steps is None else steps[i]
        key = parent[i]
        path.append(key)
        i = index[key]
    return tuple(fr.state_of(k) for k in reversed(path)), cost


def astar_result(fr: Frontier) -> AStarResult:
    """The result of a search that stopped with frontier ``fr``."""
    if fr.goal is not None:
        path, cost = _path_to_key(fr, fr.goal)
        status = Status.GOAL_FOUND
    else:
        path, cost = None, None
        status = Status.BUDGET_EXHAUSTED if has_open_node(fr) else Status.SPACE_EXHAUSTED
    return AStarResult(status=status, path=path, cost=cost, nodes_expanded=fr.expanded,
                       nodes_generated=len(fr.keys) + len(fr.goals),
                       evaluations=fr.evaluations, requests=fr.requests)
