"""The pure core of A*: the frontier as explicit state, and the functions that move it.

No event loop here. A search pops nodes (``pop_nodes``), generates their children
(``expand_nodes``, which returns the children whose heuristic value is not yet known),
and records the model's values for those children (``record_values``), which puts them
on the open list. The coroutines in ``astar`` and ``continuous_astar`` only decide when
to call these and when to await the model; they call the same steps on node ids
(``pop_ids``, ``expand_ids``, ``encode_keys``, ``record_ids``), which skip the
conversions between the problem's states and the frontier's keys.

Priorities are ``f = weight * g + h``. Ties go to the smaller ``h`` (the node believed
closer to a goal), then to the earlier insertion, so the order is deterministic. Goals
are recognised when generated and never evaluated (their cost-to-go is 0); the best goal
found so far bounds the search, which ends once no open node has ``f`` below
``weight * goal_cost``. With weight 1 and an admissible heuristic, that makes the goal
returned a cheapest one, even when many nodes are popped at once.

How it is kept fast (the order above is kept exactly):

- Nodes are numbered as they are generated; a node's g and parent live in lists
  indexed by its id, its key in one dict, so most of the work of a step is done by a
  few list and dict operations over all its children at once, not a loop in Python.
- The open list is a bucket queue: a heap of the distinct values of ``f``, and for each
  a first-in-first-out queue of entries per ``h`` (insertion order is the last
  tie-breaker, so a queue in push order is sorted already). Comparing floats in a small
  heap costs much less than comparing ``(f, h, counter)`` tuples in a big one, and a
  whole run of equal priorities goes in and out at once.
- An entry is a token: the node's id for its first push. A node pushed again at a lower
  g gets a new token (``Frontier.latest``), which makes its earlier ones stale; while no
  node has been pushed twice, nothing popped can be stale.
- Problems that offer ``compact_keys()`` (``problems.base.CompactKeys``: the sliding
  puzzle) are searched on compact int keys, a whole step expanded and encoded in one
  call each; others call ``neighbors`` state by state.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import operator
from typing import Any, Dict, List, Optional, Sequence, Tuple

from async_search.problems.base import CompactKeys, SearchProblem, State, compact_keys_of
from async_search.search.base import (MAX_STEP_COST, bad_step_cost, check_hashable,
                                      check_step_cost, encoded, path_cost_overflow)
from async_search.search.sums import left_sum


_INF = math.inf
_ID_BITS = 32
_ID_MASK = (1 << _ID_BITS) - 1

_chain = itertools.chain.from_iterable
_repeat = itertools.repeat
_compress = itertools.compress


@dataclasses.dataclass(eq=False)
class Frontier:
    """Everything an A* search knows; mutated in place by this module's functions.

    Generated states other than goals are nodes, numbered in generation order (goals
    are never expanded nor evaluated; they are kept in ``goals``). A node's key is its
    state, or the problem's compact key when it offers ``compact_keys()``. With compact
    keys, some ids are left unused (a child found known takes an id slot for nothing).
    """

    weight: float
    """The weight of the path cost g in a node's priority ``weight * g + h``."""
    problem: Any = None
    """The search problem."""
    compact: Optional[CompactKeys] = None
    """The problem's compact keys, or None (then a key is the state itself)."""
    index: Dict[Any, int] = dataclasses.field(default_factory=dict)
    """The id of each node's key."""
    keys: List[Any] = dataclasses.field(default_factory=list)
    """The key of each node id."""
    g: List[float] = dataclasses.field(default_factory=list)
    """The cheapest known cost from the start to each node."""
    max_g: float = MAX_STEP_COST
    """The largest path cost the search takes: ``weight * g`` must stay a float (past
    it every priority and the goal's bound are inf, and tie)."""
    parent: List[Any] = dataclasses.field(default_factory=list)
    """The key of each node's predecessor on its cheapest known path (the start: its
    own key)."""
    step: Optional[List[float]] = dataclasses.field(default_factory=list)
    """The cost of the step from each node's parent (the start: 0); None with compact
    keys, whose steps all cost ``unit_cost``."""
    unit_cost: Optional[float] = None
    """With compact keys, ``compact.step_cost`` as Python's number (checked once)."""
    h: Dict[int, float] = dataclasses.field(default_factory=dict)
    """The model's value (estimated cost to go) of each evaluated node, once
    ``_value_of`` has filed the ``recorded`` ones; a node sent to the model whose value
    is in neither awaits it (the start is never sent)."""
    recorded: List[Tuple[Sequence[int], List[float]]] = dataclasses.field(
        default_factory=list)
    """Values recorded and not yet filed in ``h``, as ``(ids, values)``: they are only
    read when a node is reached again more cheaply, which a search may never do."""
    latest: Dict[int, int] = dataclasses.field(default_factory=dict)
    """The latest token of each node pushed more than once (see the module doc)."""
    f_heap: List[float] = dataclasses.field(default_factory=list)
    """The distinct priorities on the open list, a heap."""
    buckets: Dict[float, list] = dataclasses.field(default_factory=dict)
    """The open entries of each priority f: ``[h, head, token, ...]`` while they all
    share one h (a queue read from index ``head``), else ``[None, h heap, {h: [head,
    token, ...]}]``."""
    repushes: int = 0
    """Pushes of a node already pushed (numbers its new tokens)."""
    goals: Dict[Any, list] = dataclasses.field(default_factory=dict)
    """For each goal key generated: ``[g, parent key, step cost]`` (the start as a goal:
    ``[0, None, 0]``)."""
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


def max_path_cost(weight: float) -> float:
    """The largest path cost whose priority ``weight * g`` is a float (a little less,
    for the product's rounding)."""
    if weight <= 1:
        return MAX_STEP_COST
    return MAX_STEP_COST / weight * (1 - 2 ** -40)


def new_frontier(problem: SearchProblem, start: State, *, weight: float) -> Frontier:
    """A frontier holding only ``start`` (a goal already if the start is one).

    Raises:
        ValueError: the problem's compact keys declare a step cost that is not a
            finite number > 0 (``neighbors``' costs are checked as they come).
    """
    compact = compact_keys_of(problem)
    unit = check_step_cost(problem, compact.step_cost) if compact is not None else None
    fr = Frontier(weight=float(weight), problem=problem, compact=compact,
                  step=None if compact is not None else [], unit_cost=unit,
                  max_g=max_path_cost(weight))
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
        fr.f_heap.append(0.0)
        fr.buckets[0.0] = [0.0, 2, 0]
    return fr


# -- the open list ------------------------------------------------------------------------

def _is_live(fr: Frontier, token: int) -> bool:
    """Whether ``token`` is its node's latest (an earlier one is stale)."""
    i = token & _ID_MASK
    return fr.latest.get(i, i) == token


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
    while fr.f_heap:
        f, token = _first_token(fr)
        if not _is_live(fr, token):
            _drop_first(fr)
            continue
        return fr.goal is None or f < fr.weight * fr.goal_cost
    return False


def pop_ids(fr: Frontier, max_nodes: int) -> Tuple[List[int], List[float]]:
    """Pop up to ``max_nodes`` open nodes in priority order: their ids and their g
    (none when no open node could lead to a cheaper goal)."""
    ids: List[int] = []
    f_heap, buckets, latest = fr.f_heap, fr.buckets, fr.latest
    bound = _INF if fr.goal is None else fr.weight * fr.goal_cost
    while len(ids) < max_nodes and f_heap:
        f = f_heap[0]
        # No goal, no bound: a priority that overflowed to inf is popped too, as
        # ``has_open_node`` says it is open.
        if f >= bound and fr.goal is not None:
            break
        bucket = buckets[f]
        if bucket[0] is None:
            _, token = _first_token(fr)
            _drop_first(fr)
            if _is_live(fr, token):
                ids.append(token & _ID_MASK)
            continue
        head = bucket[1]
        if head == 2 and len(bucket) == 3:  # a single entry (a real model's values)
            heapq.heappop(f_heap)
            del buckets[f]
            token = bucket[2]
            if not latest or _is_live(fr, token):
                ids.append(token & _ID_MASK)
            continue
        # One h at this f: take a run of entries off its queue at once.
        end = min(len(bucket), head + max_nodes - len(ids))
        tokens = bucket[head:end]
        if end == len(bucket):
            heapq.heappop(f_heap)
            del buckets[f]
        else:
            bucket[1] = end
        if not latest:  # no node pushed twice: every token is a live node's id
            ids += tokens
        else:
            ids.extend(token & _ID_MASK for token in tokens if _is_live(fr, token))
    # Nothing changes g between the pops, so every g is read once, after them.
    return ids, list(map(fr.g.__getitem__, ids))


# -- expansion ----------------------------------------------------------------------------

def expand_ids(fr: Frontier, ids: List[int],
            gs: List[float]) -> Tuple[Sequence[int], List[Any]]:
    """Generate the successors of the popped nodes ``ids`` (popped at costs ``gs``).

    A successor reached more cheaply than before gets its new cost and parent. Goals
    update the best goal and go no further. Successors with a known value are pushed
    at once. Returns the new nodes' ids (a list or a range) and keys, in generation
    order: to be evaluated, and pushed by ``record_ids`` when their values arrive.
    """
    if fr.compact is None:
        new = _expand_states(fr, ids, gs)
    else:
        if gs and max(gs) + fr.unit_cost > fr.max_g:  # (one cost for every step)
            raise path_cost_overflow(fr.problem, max(gs) + fr.unit_cost, fr.weight)
        new = _expand_keys(fr, ids, gs)
    fr.expanded += len(ids)
    return new


def _reached(fr: Frontier, j: int, parent: Any, g1: float, cost: float) -> None:
    """Node ``j`` was reached again, from the node whose key is ``parent``, at ``g1``."""
    if g1 >= fr.g[j]:
        return
    fr.g[j] = g1
    fr.parent[j] = parent
    if fr.step is not None:
        fr.step[j] = cost
    value = _value_of(fr, j)
    if value is not None:
        fr.repushes += 1
        token = j | (fr.repushes << _ID_BITS)
        fr.latest[j] = token
        _push(fr, fr.weight * g1 + value, value, token)
    # else it awaits its value, and is pushed at its best g when the value arrives.


def _value_of(fr: Frontier, i: int) -> Optional[float]:
    """The model's value of node ``i``, or None if it has none (yet)."""
    if fr.recorded:
        for ids, values in fr.recorded:
            fr.h.update(zip(ids, values))
        fr.recorded.clear()
    return fr.h.get(i)


def _reached_goal(fr: Frontier, key: Any, parent: Any, g1: float, cost: float) -> None:
    """The goal ``key`` was reached from the node whose key is ``parent``, at ``g1``."""
    known = fr.goals.get(key)
    if known is not None and g1 >= known[0]:
        return
    fr.goals[key] = [g1, parent, cost]
    if g1 < fr.goal_cost:
        fr.goal, fr.goal_cost = key, g1


def _expand_states(fr: Frontier, ids: List[int],
                   gs: List[float]) -> Tuple[List[int], List[Any]]:
    """``expand_ids`` through ``problem.neighbors``, one state at a time."""
    problem, keys, index, goals = fr.problem, fr.keys, fr.index, fr.goals
    neighbors, is_goal = problem.neighbors, problem.is_goal
    g_of, parent, step, max_g = fr.g, fr.parent, fr.step, fr.max_g
    first = len(keys)
    for i, g in zip(ids, gs):
        state = keys[i]
        for child, cost in neighbors(state):
            # A float or an int is checked here (two type tests and a range);
            # anything else, once, in full. A negative cycle would loop forever.
            if type(cost) is not float and type(cost) is not int:
                cost = check_step_cost(problem, cost)  # as Python's number
            elif not 0 < cost <= MAX_STEP_COST:
                raise bad_step_cost(problem, cost)
            g1 = g + cost
            if g1 > max_g:  # inf, an int past the floats, or weight * g1 past them
                raise path_cost_overflow(problem, g1, fr.weight)
            try:
                j = index.get(child)
            except TypeError:  # (free in Python 3.11 until raised)
                check_hashable(problem, child, "from neighbors")
                raise
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
    return list(range(first, len(keys))), keys[first:]


def _expand_keys(fr: Frontier, ids: List[int],
                 gs: List[float]) -> Tuple[Sequence[int], List[Any]]:
    """``expand_ids`` through the problem's compact keys: every popped node at once.

    Child k of the step may take the id ``first + k``: one ``setdefault`` pass over the
    children finds the known ones and numbers the new ones. Every child then gets its g
    and parent in the lists (an unused slot's are never read), and the children found
    known, or repeated in the step, are taken one by one in order, as the loop over
    ``neighbors`` does, unless none of them can be reached more cheaply. A goal among
    the children undoes the pass and runs the step one child at a time.
    """
    compact, keys, index, g, parent = fr.compact, fr.keys, fr.index, fr.g, fr.parent
    popped = list(map(keys.__getitem__, ids))
    children, counts = compact.expand(popped, list(map(parent.__getitem__, ids)))
    m = len(children)
    if m < 8:  # a node or two (continuous A*): a loop costs less than the passes
        return _expand_keys_one_by_one(fr, popped, gs, children, counts)
    first = len(keys)
    slots = range(first, first + m)
    got = list(map(index.setdefault, children, slots))
    is_new = list(map(operator.eq, got, slots))
    new = is_new.count(True)
    goal_keys = compact.goal_keys
    if new and (any(map(index.__contains__, goal_keys)) if len(goal_keys) < m
                else not goal_keys.isdisjoint(children)):
        for child in _compress(children, is_new):
            del index[child]
        return _expand_keys_one_by_one(fr, popped, gs, children, counts)
    cost = fr.unit_cost
    g1s = [g0 + cost for g0 in gs]
    keys += children
    one_g = g1s.count(g1s[0]) == len(g1s)
    if one_g:
        g.extend(_repeat(g1s[0], m))
    else:
        g.extend(_chain(map(_repeat, g1s, counts)))
    parent.extend(_chain(map(_repeat, popped, counts)))
    if new == m:
        return slots, children
    # Known (or repeated) children: usually none reached more cheaply than before (with
    # one g for all, a new child's g is that g: then all of got can be checked).
    if (max(map(g.__getitem__, got)) > g1s[0] if one_g else
            min(g1s) < max(map(g.__getitem__, _compress(got, map(operator.not_, is_new))))):
        owners = _chain(map(_repeat, range(len(ids)), counts))
        for j, o, fresh in zip(got, owners, is_new):
            if not fresh and g1s[o] < g[j]:
                _reached(fr, j, popped[o], g1s[o], cost)
    return list(_compress(slots, is_new)), list(_compress(children, is_new))


def _expand_keys_one_by_one(fr: Frontier, popped: List[Any], gs: List[float],
                            children: List[Any],
                            counts: List[int]) -> Tuple[List[int], List[Any]]:
    cost = fr.unit_cost
    index, goal_keys, keys, g_of, parent = (fr.index, fr.compact.goal_keys, fr.keys,
                                            fr.g, fr.parent)
    first = len(keys)
    for child, o in zip(children, _chain(map(_repeat, range(len(popped)), counts))):
        g1 = gs[o] + cost
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
    return list(range(first, len(keys))), keys[first:]


# -- values -------------------------------------------------------------------------------

def record_ids(fr: Frontier, ids: Sequence[int], values: List[float]) -> None:
    """Record the model's values for the nodes ``ids`` (sent to it, in that order) and
    push each at its current best g, in order."""
    m = len(ids)
    fr.recorded.append((ids, values))
    # f = weight * g + h, with the roundings of a loop over the nodes; then the runs of
    # equal (f, h), each pushed at once (with a free model, a run or two a request).
    weight, h = fr.weight, values[0]
    gs = (fr.g[ids.start:ids.stop] if isinstance(ids, range) else
          list(map(fr.g.__getitem__, ids)))
    if values.count(h) == m:
        if gs.count(gs[0]) == m:
            runs = (((weight * gs[0] + h, h), ()),)
            lengths = (m,)
        else:
            runs = itertools.groupby([(weight * g + h, h) for g in gs])
            lengths = None
    else:
        # Values of a real model mostly differ: one entry at a time, as ``_push`` does
        # (what the runs below would do, without grouping runs of one).
        buckets, f_heap = fr.buckets, fr.f_heap
        for token, g, v in zip(ids, gs, values):
            f = weight * g + v
            bucket = buckets.get(f)
            if bucket is None:
                buckets[f] = [v, 2, token]
                heapq.heappush(f_heap, f)
            elif bucket[0] == v:
                bucket.append(token)
            else:
                _queue_of(fr, bucket, v).append(token)
        return
    buckets, position = fr.buckets, 0
    for k, ((f, h), run) in enumerate(runs):
        end = position + (lengths[k] if lengths else len(list(run)))
        # A node's first token is its id.
        tokens = ids[position:end] if position or end < m else ids
        bucket = buckets.get(f)
        if bucket is None:
            buckets[f] = [h, 2, *tokens]
            heapq.heappush(fr.f_heap, f)
        elif bucket[0] == h:
            bucket += tokens
        else:
            _queue_of(fr, bucket, h).extend(tokens)
        position = end


# -- the public steps, on the problem's states ------------------------------------------

def pop_nodes(fr: Frontier, max_nodes: int) -> List[Tuple[State, float]]:
    """Pop up to ``max_nodes`` open nodes in priority order, as ``(state, g)`` pairs."""
    ids, gs = pop_ids(fr, max_nodes)
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
    _, keys = expand_ids(fr, ids, [g for _, g in nodes])
    return [fr.state_of(key) for key in keys]


def record_values(fr: Frontier, states: List[State], values: List[float]) -> None:
    """Record the model's values for ``states`` and push each at its current best g."""
    if states:
        record_ids(fr, [fr.index[fr.key_of(state)] for state in states], list(values))


def path_to(fr: Frontier, state: State) -> Tuple[Tuple[State, ...], float]:
    """The cheapest known path from the start to ``state`` and its cost."""
    return _path_to_key(fr, fr.key_of(state))


def _path_to_key(fr: Frontier, key: Any) -> Tuple[Tuple[State, ...], float]:
    # The steps are met from the goal back; their costs are summed from the start on,
    # as the search summed its g-values (float sums depend on their order).
    path, costs = [key], []
    goal = fr.goals.get(key)
    if goal is not None:
        key, step = goal[1], goal[2]
        if key is None:  # the start
            return (fr.state_of(path[0]),), 0
        costs.append(step)
        path.append(key)
    index, parent, steps = fr.index, fr.parent, fr.step
    unit = fr.unit_cost if steps is None else None
    i = index[key]
    while i:
        costs.append(unit if steps is None else steps[i])
        key = parent[i]
        path.append(key)
        i = index[key]
    return tuple(fr.state_of(k) for k in reversed(path)), left_sum(reversed(costs))


def encode_keys(fr: Frontier, keys: List[Any]) -> Any:
    """The model input for the nodes of ``keys``."""
    if fr.compact is None:
        return encoded(fr.problem, fr.problem.encode(keys), len(keys))
    return encoded(fr.compact, fr.compact.encode(keys), len(keys),
                   "the CompactKeys protocol")
