"""Batching: a stream of requests in, batches out.

A request is an array of ``n`` elements ``[n, ...]``. A ``Batcher`` turns the stream of
requests into batches bounded by a budget (element count or total cost), splitting a
request across batches where it does not fit. Turning batch outputs back into one output
per request is ``unbatchers``; ``BatchManager`` pairs a Batcher with an Unbatcher.

With a batch size of 8, requests of sizes (5, 4, 6, 3) give batches of 8, 8 and 2
elements and four outputs of 5, 4, 6 and 3 elements:

    >>> m = BatchManager(BatchSizeBatcher(8))
    >>> for n in (5, 4, 6, 3):
    ...     m.add_inputs(np.arange(n))
    >>> outputs = []
    >>> while not m.empty():
    ...     outputs.extend(m.process_output(m.pop_batch() * 10))
    >>> [len(y) for y in outputs]
    [5, 4, 6, 3]

Every operation costs O(1) Python operations per request, never per element: requests
are stored as arrays, batches are built with one ``np.concatenate`` and outputs are split
with slices (views).
"""

from __future__ import annotations

import abc
import bisect
import collections
import dataclasses
import itertools
import math
from typing import (TYPE_CHECKING, Any, Callable, Deque, Dict, Iterable, List, Optional,
                    Sequence, Tuple)

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

from async_search import rows
from async_search.base import Outputs
from async_search.checks import check_float, check_instance, check_int
from async_search.errors import InputSpecError, ModelOutputError
# NumpyUnbatcher is re-exported: the public contract imports it from here.
from async_search.unbatchers import NumpyUnbatcher, Unbatcher, unbatcher_for

__all__ = [
    "Batcher", "BatchSizeBatcher", "FairBatcher", "CostBatcher", "Popped", "BatchManager",
    "NumpyUnbatcher", "JOIN_BELOW_BYTES",
]


@dataclasses.dataclass
class Popped:
    """One batch and the requests it holds, as ``Batcher.pop_parts`` returns it.

    ``pieces[i]`` is the part of request ``tags[i]`` in this batch (a view).
    ``parts`` maps the index of each piece that is not a whole request to ``(offset,
    size)``: the piece starts at element ``offset`` of a request of ``size`` elements
    (None when every piece is a whole request). A first-in-first-out batcher splits at
    most the first request (``head_continues``: it started in an earlier batch, at
    element ``head_offset``) and the last (``tail_size``: its whole size, as it goes on
    in a later batch); a ``FairBatcher`` may hold a continued request anywhere, so
    ``parts`` is the complete account. ``buffer`` is the pooled array that ``batch`` was
    copied into, if any.
    """

    batch: np.ndarray
    tags: List[Any]
    pieces: List[np.ndarray]
    head_continues: bool
    tail_size: Optional[int]
    head_offset: int = 0
    buffer: Optional[np.ndarray] = None
    parts: Optional[Dict[int, Tuple[int, int]]] = None

    @property
    def starting(self) -> int:
        """How many of the batch's requests start in it (the others continue one)."""
        parts = self.parts
        if not parts:
            return len(self.tags)
        return len(self.tags) - sum(1 for offset, _ in parts.values() if offset)


#: Batches of uniform requests up to this many bytes are built by joining the requests'
#: bytes; bigger ones are copied into a pooled buffer, where a fresh allocation would
#: cost page faults.
JOIN_BELOW_BYTES = 256 * 1024


def _stack(pieces: List[np.ndarray],
           out: Callable[[int, np.ndarray], np.ndarray | None] | None,
           uniform: bool) -> Tuple[np.ndarray, np.ndarray | None]:
    """``(batch, pooled buffer or None)``: the pieces' rows as one array."""
    first = pieces[0]
    if len(pieces) == 1:
        return first, None
    rows = sum(map(len, pieces))
    if uniform and rows * first.itemsize * math.prod(first.shape[1:]) <= JOIN_BELOW_BYTES:
        try:  # one C loop over the pieces' buffers (C-contiguous, not of objects)
            return np.frombuffer(bytearray().join(pieces), first.dtype).reshape(
                rows, *first.shape[1:]), None
        except (BufferError, ValueError, TypeError):
            pass  # a piece without a plain buffer: concatenate below
    buffer = out(rows, first) if out is not None else None
    if buffer is None:
        return np.concatenate(pieces), None
    return np.concatenate(pieces, out=buffer[:rows]), buffer


def _popped(batch: np.ndarray, tags: List[Any], pieces: List[np.ndarray],
            parts: Dict[int, Tuple[int, int]], take: int,
            buffer: np.ndarray | None) -> Popped:
    """The Popped of a batch with split requests; FIFO's head and tail fields are read
    from ``parts`` (``take``: the last piece was cut from a request that goes on)."""
    first = parts.get(0)
    last = parts.get(len(tags) - 1) if take else None
    return Popped(batch, tags, pieces, bool(first and first[0]), last[1] if last else None,
                  first[0] if first else 0, buffer, parts)


class Batcher(abc.ABC):
    """Splits a stream of requests into batches bounded by a budget.

    Requests wait in arrays (``_xs``) beside their tags and the running total of their
    costs (``_ends``), so finding how many requests fit in a batch is one bisection and
    popping them is one slice: O(1) Python operations per request.

    A request that does not fit whole in a batch is split. Here (first in, first out)
    its rest stays at the front (``_head`` elements of it already left) and fills the
    next batch first; a ``FairBatcher`` (``_rotate``) sends the rest to the back of the
    queue instead, as a view recorded in ``_rests``, so that the requests behind it take
    their turn.

    Subclasses say what a request costs (``_cost``) and, for the one request that
    straddles the budget, how many of its elements fit (``_split``).
    """

    budget: float
    #: Whether a request costs more than its length to work out (``price``), which may
    #: fail: a server then prices each request when it is made, so that a cost that
    #: cannot be computed fails that request alone. True for a subclass that defines
    #: ``_cost`` (and for ``CostBatcher``).
    priced = False
    #: A request's rest goes to the back of the queue (round robin) instead of the front.
    _rotate = False
    #: Queues of other priorities (FairBatcher's own; empty, never filled, here).
    _lanes: Dict[int, "Batcher"] = {}
    #: The open server batching with it (a ``BatchingServer``): one at a time.
    _server: Any = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_cost" in cls.__dict__:
            cls.priced = True

    def __init__(self) -> None:
        self._xs: List[np.ndarray] = []
        self._tags: List[Any] = []
        self._ends: List[float] = []  # running total of cost at the end of each request
        self._total = 0               # cost of everything ever appended
        self._start = 0               # cost of everything ever batched
        self._head = 0                # elements of the front request already batched
        # id(view) -> (offset, size): the rests of split requests queued as views
        # (``_rotate``); each view stays alive in ``_xs`` while its id is a key here.
        self._rests: Dict[int, Tuple[int, int]] = {}
        #: Elements (or cost) queued and not yet batched. Read it, never set it.
        self.queued: float = 0

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_server", None)  # a copy (sent to another process) is nobody's yet
        return state

    def append(self, x: np.ndarray, tag: Any = None) -> None:
        """Queue one request ``x[n, ...]``; ``tag`` comes back with its parts."""
        self._enqueue(x, tag, self._cost(x))

    def _enqueue(self, x: np.ndarray, tag: Any, cost: float) -> None:
        self._total += cost
        self.queued += cost
        self._xs.append(x)
        self._tags.append(tag)
        self._ends.append(self._total)

    def price(self, x: np.ndarray) -> Any:
        """What request ``x`` costs, worked out now, for ``extend(..., prices=...)``.

        A server calls it when a request is made (where ``priced``), so that a cost
        that cannot be computed fails that request alone, before anything is queued.

        Raises:
            whatever working out the cost raises (a ``cost_fn`` that fails).
        """
        return self._cost(x)

    def extend(self, xs: Sequence[np.ndarray], tags: Sequence[Any] | None = None,
               prices: Sequence[Any] | None = None) -> None:
        """Queue several requests (with their tags), in bulk: no Python loop per request
        where the cost of a request is its length. ``prices``: each request's
        ``price``, worked out before (None: worked out here)."""
        if tags is None:
            tags = [None] * len(xs)
        elif len(tags) != len(xs):
            raise ValueError(f"{len(xs)} requests but {len(tags)} tags")
        if prices is not None and len(prices) != len(xs):
            raise ValueError(f"{len(xs)} requests but {len(prices)} prices")
        ends = list(itertools.accumulate(self._costs(xs) if prices is None else prices,
                                         initial=self._total))
        self._xs += xs
        self._tags += tags
        self._ends += ends[1:]
        self.queued += ends[-1] - self._total
        self._total = ends[-1]

    def _costs(self, xs: Sequence[np.ndarray]) -> Iterable[float]:
        """The cost of each request of ``xs``."""
        return map(self._cost, xs)

    def empty(self) -> bool:
        """True when no request (not even one of zero elements) is queued."""
        return not self._xs

    def has_full_batch(self) -> bool:
        """True when the queued requests fill at least one batch."""
        return self.queued >= self.budget

    def __len__(self) -> int:
        return len(self._xs)

    def clear(self) -> List[Any]:
        """Removes every queued request; returns their tags, in order."""
        tags = self._tags
        self._xs, self._tags, self._ends = [], [], []
        self._start = self._total
        self._head = 0
        self._rests = {}
        self.queued = 0
        return tags

    def pop(self) -> np.ndarray:
        """The next batch: the queued requests in order, up to the budget."""
        return self.pop_parts().batch

    def pop_parts(self, drop: Callable[[Any], bool] | None = None,
                  out: Callable[[int, np.ndarray], np.ndarray | None] | None = None,
                  uniform: bool = False) -> Popped:
        """The next batch with the requests (tags and pieces) it holds.

        ``drop(tag)`` is asked of each request about to start; those it returns True for
        are removed without being batched (cancelled callers). ``out(rows, like)`` may
        give a buffer of at least ``rows`` rows to build the batch in (a pool), or None.
        ``uniform`` says every request has the same dtype and element shape (a server
        checked them): a small batch is then built by joining the requests' bytes,
        several times faster than ``np.concatenate`` for many small requests.

        Raises:
            IndexError: when nothing is queued (or everything queued was dropped).
        """
        if self._lanes:  # a FairBatcher holding requests at other priorities
            return self._pop_levels(drop, out, uniform)
        ends = self._ends
        if ends and not self._head and not self._rests and (
                ends[-1] - self._start <= self.budget):
            # The common case of serving, written out: everything queued fits in one
            # batch and nothing is split, so the queue's own lists are the batch.
            xs, tags = self._xs, self._tags
            if drop is None or not any(map(drop, tags)):
                batch, buffer = _stack(xs, out, uniform)  # may raise: all still queued
                cost = ends[-1] - self._start
                self._xs, self._tags, self._ends = [], [], []
                self._on_pop(len(xs))
                self._start += cost
                self.queued -= cost
                return Popped(batch, tags, xs, False, None, 0, buffer)
        count, take, cost, pieces, tags, parts, whole = self._select(drop, self.budget,
                                                                    True)
        # The batch is built before the queue changes: if building it fails, every
        # request is still queued (and a crash handler can fail it), none is lost.
        batch, buffer = _stack(pieces, out, uniform)
        self._commit(count, take, cost, whole)
        if parts is None:
            return Popped(batch, tags, pieces, False, None, 0, buffer)
        return _popped(batch, tags, pieces, parts, take, buffer)

    def _select(self, drop: Callable[[Any], bool] | None, room: float, alone: bool,
                ) -> Tuple[int, int, float, List[np.ndarray], List[Any],
                           Optional[Dict[int, Tuple[int, int]]], bool]:
        """The next batch of at most ``room`` cost (at least one element when
        ``alone``: an element over budget goes alone), left in the queue: ``(count,
        take, cost, pieces, tags, parts, whole)``: the requests that fit whole, the
        elements of the next that fit, the batch's cost, its pieces and their tags,
        where split requests' pieces go (``Popped.parts``), and whether it is the whole
        queue (the queue's own lists then).

        Raises:
            IndexError: when nothing is queued (or everything queued was dropped).
        """
        while True:
            if not self._xs:
                raise IndexError("pop from an empty batcher")
            count, take, cost = self._plan(room, alone)
            if drop is None or not any(map(drop, self._tags[:count + (take > 0)])):
                break
            self._remove(drop)
        xs, tags, head, rests = self._xs, self._tags, self._head, self._rests
        whole = count == len(xs) and not head and not rests
        parts = None
        if whole:  # the lists themselves, no copies
            pieces, batch_tags = xs, tags
        else:
            pieces = xs[:count]
            batch_tags = tags[:count]
            if rests:  # rests of split requests, continued here
                parts = {i: rests[key] for i, key in enumerate(map(id, pieces))
                         if key in rests} or None
        if head and count:
            pieces[0] = pieces[0][head:]
            parts = {0: (head, len(xs[0]))}
        if take:
            offset = 0 if count else head
            x = xs[count]
            pieces.append(x[offset:offset + take])
            batch_tags.append(tags[count])
            done, size = rests.get(id(x), (0, len(x)))
            if parts is None:
                parts = {}
            parts[count] = (done + offset, size)
        return count, take, cost, pieces, batch_tags, parts, whole

    def _commit(self, count: int, take: int, cost: float, whole: bool) -> None:
        """Takes the batch ``_select`` chose out of the queue."""
        xs, tags, rests = self._xs, self._tags, self._rests
        self.queued -= cost
        if whole:
            self._xs, self._tags, self._ends = [], [], []
        elif rests:
            for x in xs[:count]:
                rests.pop(id(x), None)
        if take and self._rotate:
            # The rest of the split request goes to the back of the queue, behind every
            # request queued now (a cost is a length here: see FairBatcher).
            x, tag = xs[count], tags[count]
            done, size = rests.pop(id(x), (0, len(x)))
            rest = x[take:]
            count += 1
            self._on_pop(count)
            self._start = self._ends[count - 1]
            del xs[:count], tags[:count], self._ends[:count]
            self._total += len(rest)
            rests[id(rest)] = (done + take, size)
            xs.append(rest)
            tags.append(tag)
            self._ends.append(self._total)
            return
        if not whole:
            del xs[:count], tags[:count], self._ends[:count]
        self._head = (0 if count else self._head) + take if take else 0
        self._on_pop(count)
        self._start += cost

    def _plan(self, room: float, alone: bool = True) -> Tuple[int, int, float]:
        """(whole requests that fit in ``room``, elements of the next that fit, total
        cost). The elements taken of the next request are never all of what is left of
        it: a request whose rest is taken counts as whole."""
        start, ends = self._start, self._ends
        limit = start + room
        count = bisect.bisect_right(ends, limit)
        done = ends[count - 1] if count else start
        if count == len(ends):
            return count, 0, done - start
        offset = 0 if count else self._head
        take, cost = self._split(count, offset, limit - done)
        if take == 0 and count == 0 and alone:  # one element alone over budget: it goes
            take, cost = self._split(count, offset, float("inf"), 1)  # alone
        if take and offset + take == len(self._xs[count]):
            # Its last element went alone (or its costs' rounding let its rest fit): it
            # leaves the queue now, else it would stay queued with nothing left and
            # the next batch would be empty.
            return count + 1, 0, ends[count] - start
        return count, take, done - start + cost

    def _remove(self, drop: Callable[[Any], bool]) -> None:
        """Removes the requests ``drop`` selects, with what is left of those already
        part-batched (their other pieces are out: a caller's ``drop`` says it wants
        none of it, a cancelled or failed request)."""
        keep = [i for i, tag in enumerate(self._tags) if not drop(tag)]
        costs = [e - s for s, e in zip([self._start] + self._ends[:-1], self._ends)]
        if self._head and (not keep or keep[0] != 0):
            self._head = 0  # the front request went (its cost above: what was left)
        if self._rests:
            kept = set(keep)
            for i, x in enumerate(self._xs):
                if i not in kept:
                    self._rests.pop(id(x), None)
        self._xs = [self._xs[i] for i in keep]
        self._tags = [self._tags[i] for i in keep]
        kept_costs = [costs[i] for i in keep]
        self._ends = list(itertools.accumulate(kept_costs, initial=self._start))[1:]
        self._total = self._ends[-1] if self._ends else self._start
        self.queued = self._total - self._start
        self._on_remove(keep)

    # -- what subclasses say -------------------------------------------------------------
    def _cost(self, x: np.ndarray) -> float:
        """The whole cost of request ``x``: by default its number of elements."""
        return len(x)

    @abc.abstractmethod
    def _split(self, i: int, offset: int, room: float, limit: int | None = None,
               ) -> Tuple[int, float]:
        """How many elements of request ``i`` from ``offset`` fit in ``room`` (at most
        ``limit``), and their cost."""

    def _on_pop(self, count: int) -> None:
        """The first ``count`` requests left the queue whole."""

    def _on_remove(self, keep: List[int]) -> None:
        """Requests were removed; ``keep`` are the indices of those left."""


class BatchSizeBatcher(Batcher):
    """Batches of at most ``batch_size`` elements.

    Example:
        >>> b = BatchSizeBatcher(4)
        >>> b.extend([np.zeros(3), np.ones(3)])
        >>> b.pop().tolist()
        [0.0, 0.0, 0.0, 1.0]
    """

    def __init__(self, batch_size: int):
        batch_size = check_int("batch_size", batch_size, minimum=1)
        super().__init__()
        self.budget = batch_size

    def append(self, x: np.ndarray, tag: Any = None) -> None:
        # The hot path of serving, written out: a request costs its length.
        n = len(x)
        self._total += n
        self.queued += n
        self._xs.append(x)
        self._tags.append(tag)
        self._ends.append(self._total)

    def price(self, x: np.ndarray) -> int:
        return len(x)

    def _costs(self, xs):
        return map(len, xs)

    def _split(self, i, offset, room, limit=None):
        take = min(len(self._xs[i]) - offset, int(room))
        if limit is not None:
            take = min(take, limit)
        return take, take



class FairBatcher(BatchSizeBatcher):
    """Batches of at most ``batch_size`` elements, fair between requests, with priorities.

    Requests take turns (round robin): a batch takes the queued requests in order, and
    the one that does not fit whole fills the batch and sends its rest to the back of
    the queue, behind every request queued at that moment. A request of 100,000 elements
    therefore holds back a request made after it by at most one batch of its own, not
    by all of them, while every batch stays full (a request split over batches is
    reassembled in order; ``Popped.parts`` says where each piece goes). With requests of
    sizes (5, 4, 6, 3) and a batch size of 8 the batches still hold 8, 8 and 2 elements.

    ``priority`` (an integer, default 0; higher goes first): a batch is filled from the
    highest priority queued down, round robin within each level, so a level waits while
    higher ones fill the batches (strict priority, as in Triton's priority levels).

    Example:
        >>> b = FairBatcher(4)
        >>> b.extend([np.arange(10), np.array([100]), np.array([200])])
        >>> [b.pop().tolist() for _ in range(3)]
        [[0, 1, 2, 3], [100, 200, 4, 5], [6, 7, 8, 9]]
        >>> b.extend([np.array([1, 1])]); b.append(np.array([7, 7, 7]), priority=1)
        >>> b.pop().tolist()
        [7, 7, 7, 1]
    """

    _rotate = True

    def __init__(self, batch_size: int):
        super().__init__(batch_size)
        self._lanes: Dict[int, FairBatcher] = {}  # priority (never 0) -> its queue
        # The levels' order and what they hold, kept as they change: a pop reads only
        # the levels it takes from (each pop sorted and counted every level queued).
        self._order: List[int] = []  # -priority of each lane, ascending: highest first
        self._lanes_queued = 0       # elements queued in the lanes
        self._lanes_requests = 0     # requests queued in the lanes

    def append(self, x: np.ndarray, tag: Any = None, priority: int = 0) -> None:
        """Queue one request ``x[n, ...]`` at ``priority`` (``extend`` queues at 0)."""
        if priority == 0 and type(priority) is int:
            super().append(x, tag)
            return
        lane = self._lane(priority)
        if lane is self:
            super().append(x, tag)
            return
        lane.append(x, tag)
        self.queued += len(x)
        self._lanes_queued += len(x)
        self._lanes_requests += 1

    def _lane(self, priority: int) -> "FairBatcher":
        priority = check_int("priority", priority)
        if priority == 0:
            return self
        lane = self._lanes.get(priority)
        if lane is None:
            lane = self._lanes[priority] = FairBatcher(self.budget)
            bisect.insort(self._order, -priority)
        return lane

    def empty(self) -> bool:
        return not self._xs and not self._lanes

    def __len__(self) -> int:
        return len(self._xs) + self._lanes_requests

    def clear(self) -> List[Any]:
        """Removes every queued request; returns their tags (highest priority first)."""
        tags = []
        for priority in sorted(self._lanes, reverse=True):
            if priority > 0:
                tags += self._lanes[priority].clear()
        tags += super().clear()
        for priority in sorted(self._lanes, reverse=True):
            if priority < 0:
                tags += self._lanes[priority].clear()
        self._lanes, self._order = {}, []
        self._lanes_queued = self._lanes_requests = 0
        return tags

    def _levels(self) -> Iterable[int]:
        """The priorities queued, highest first, 0 among them."""
        order = self._order
        split = bisect.bisect_left(order, 0)
        for k in range(split):
            yield -order[k]
        yield 0
        for k in range(split, len(order)):
            yield -order[k]

    def _pop_levels(self, drop: Callable[[Any], bool] | None,
                    out: Callable[[int, np.ndarray], np.ndarray | None] | None,
                    uniform: bool) -> Popped:
        """``pop_parts`` over the priority levels, highest first."""
        room, chosen, visited = self.budget, [], []
        try:  # settled however it ends: a drop, a buffer or a stack may raise
            for priority in self._levels():
                lane = self._lanes[priority] if priority else self
                if lane.empty():
                    continue
                if lane is not self:  # what it held, before this pop
                    visited.append((priority, lane, lane.queued, len(lane)))
                try:
                    plan = lane._select(drop, room, not chosen)
                except IndexError:  # every request in it was dropped
                    continue
                if plan[3]:  # pieces
                    chosen.append((lane, plan))
                    room -= plan[2]
                    if room <= 0:
                        break
            if not chosen:
                raise IndexError("pop from an empty batcher")
            pieces, tags, parts = [], [], {}
            for _, (_, _, _, lane_pieces, lane_tags, lane_parts, _) in chosen:
                if lane_parts:
                    parts.update((len(tags) + i, part) for i, part in lane_parts.items())
                pieces += lane_pieces
                tags += lane_tags
            batch, buffer = _stack(pieces, out, uniform)  # before the queues change
            for lane, (count, take, cost, _, _, _, whole) in chosen:
                lane._commit(count, take, cost, whole)
        finally:
            self._settle(visited)
        take = chosen[-1][1][1]
        if not parts:
            return Popped(batch, tags, pieces, False, None, 0, buffer)
        return _popped(batch, tags, pieces, parts, take, buffer)

    def _settle(self, visited: List[Tuple[int, "FairBatcher", float, int]]) -> None:
        """Counts what the levels a pop took from hold now, and forgets those left
        empty."""
        for priority, lane, queued, requests in visited:
            self._lanes_queued += lane.queued - queued
            self._lanes_requests += len(lane) - requests
            if lane.empty():
                del self._lanes[priority]
                del self._order[bisect.bisect_left(self._order, -priority)]
        self.queued = self._total - self._start + self._lanes_queued

    def _remove(self, drop: Callable[[Any], bool]) -> None:
        super()._remove(drop)
        self.queued += self._lanes_queued


class CostBatcher(Batcher):
    """Batches whose elements' total cost is at most ``max_cost``.

    ``cost_fn(x)`` maps a request ``x[n, ...]`` to the cost of each element, an array of
    ``n`` numbers (the node count of each graph, say); it is called once per request (a
    server calls it when the request is made: a ``cost_fn`` that raises fails that
    request alone). An element that alone costs more than ``max_cost`` goes in a batch
    of its own.

    Example:
        >>> b = CostBatcher(10, cost_fn=lambda x: x)   # each element costs its value
        >>> b.extend([np.array([4, 4]), np.array([3, 9])])
        >>> b.pop().tolist(), b.pop().tolist()
        ([4, 4], [3])
    """

    priced = True

    def __init__(self, max_cost: float, cost_fn: Callable[[np.ndarray], np.ndarray]):
        check_float("max_cost", max_cost, minimum=0, strict=True)
        super().__init__()
        self.budget = max_cost
        self.cost_fn = cost_fn
        self._cumulative: List[np.ndarray] = []  # per request: running cost by element

    def append(self, x: np.ndarray, tag: Any = None) -> None:
        cumulative = self.price(x)
        self._cumulative.append(cumulative)
        self._enqueue(x, tag, float(cumulative[-1]) if len(cumulative) else 0.0)

    def price(self, x: np.ndarray) -> np.ndarray:
        """The running total of the cost of ``x``'s elements (``cost_fn`` checked).

        Raises:
            ValueError: when ``cost_fn`` gives a number of costs other than one per
                element, or a cost that is negative, NaN or infinite; what ``cost_fn``
                raises, as it is.
        """
        return self._cumulative_cost(x)

    def extend(self, xs, tags=None, prices=None) -> None:
        """Queue several requests; all or none: when ``cost_fn`` raises for one of
        them, nothing is queued. ``prices``: each request's ``price``, worked out
        before (None: here)."""
        if tags is None:
            tags = [None] * len(xs)
        elif len(tags) != len(xs):
            raise ValueError(f"{len(xs)} requests but {len(tags)} tags")
        if prices is None:
            prices = [self._cumulative_cost(x) for x in xs]  # may raise: nothing queued
        elif len(prices) != len(xs):
            raise ValueError(f"{len(xs)} requests but {len(prices)} prices")
        for x, tag, cumulative in zip(xs, tags, prices):
            self._cumulative.append(cumulative)
            self._enqueue(x, tag, float(cumulative[-1]) if len(cumulative) else 0.0)

    def _cumulative_cost(self, x: np.ndarray) -> np.ndarray:
        costs = np.asarray(self.cost_fn(x), dtype=np.float64).reshape(-1)
        if len(costs) != len(x):
            raise ValueError(
                f"cost_fn must return one cost per element: {len(x)} elements, "
                f"{len(costs)} costs")
        cumulative = np.cumsum(costs)
        # NaN fails both tests; an infinite or overflowing total would poison the
        # running totals of every request queued after this one.
        if len(costs) and not (costs.min() >= 0 and math.isfinite(cumulative[-1])):
            bad = costs[~(np.isfinite(costs) & (costs >= 0))]
            raise ValueError(f"cost_fn must return finite costs >= 0, got "
                             f"{bad[0] if len(bad) else 'costs whose sum overflows'}")
        return cumulative

    def _split(self, i, offset, room, limit=None):
        cumulative = self._cumulative[i]
        before = float(cumulative[offset - 1]) if offset else 0.0
        take = int(np.searchsorted(cumulative[offset:], before + room, side="right"))
        if limit is not None:
            take = min(take, limit)
        return take, (float(cumulative[offset + take - 1]) - before) if take else 0.0

    def _on_pop(self, count: int) -> None:
        del self._cumulative[:count]

    def clear(self) -> List[Any]:
        self._cumulative = []
        return super().clear()

    def _on_remove(self, keep: List[int]) -> None:
        self._cumulative = [self._cumulative[i] for i in keep]


#: What requests a batch may mix: numbers with numbers, text with text, bytes with
#: bytes, dates with dates, durations with durations (numbers joined with strings would
#: reach the model as text; bytes with text, or dates with durations, do not join).
_KINDS = {"number": "numbers", "text": "text", "bytes": "bytes", "date": "dates",
          "duration": "durations", "object": "objects"}


_KIND_OF = {"b": "number", "i": "number", "u": "number", "f": "number", "c": "number",
            "U": "text", "S": "bytes", "M": "date", "m": "duration"}


def _kind(dtype: np.dtype) -> str:
    kind = dtype.kind
    if kind == "V" and dtype.fields is None:  # ml_dtypes' bfloat16, float8: numbers
        try:
            if np.result_type(dtype, np.float32).kind == "f":
                return "number"
        except TypeError:
            pass
    return _KIND_OF.get(kind, "object")


def _joins(first: np.dtype, later: np.dtype) -> bool:
    """Whether a request of ``later`` may join requests of ``first`` in one batch."""
    if first == later:
        return True
    if _kind(first) != _kind(later):
        return False
    try:
        np.result_type(first, later)
    except TypeError:  # (DTypePromotionError is one) no dtype holds both
        return False
    return True


#: NumPy's dtype kinds of numbers, named for messages ("the first float batch's").
_KIND_NAMES = {"b": "boolean", "i": "integer", "u": "unsigned integer", "f": "float",
               "c": "complex"}


def _same_shape(got: rows.OutputStructure, first: rows.OutputStructure) -> None:
    """ModelOutputError unless ``got`` has the kind, keys and trailing shapes of
    ``first`` (their dtypes may differ)."""
    def shape(structure: rows.OutputStructure) -> tuple:
        return structure.kind, sorted((repr(key), tuple(trailing))
                                      for key, trailing, _ in structure.leaves)

    if shape(got) != shape(first):
        raise ModelOutputError(f"the model's outputs do not match the first batch's: "
                               f"expected {first.describe()} (any dtypes), got "
                               f"{got.describe()}")


def _dtype_kind(batch: Any) -> str:
    """The NumPy kind of a batch's dtype (``"i"``, ``"f"``...); ``""`` for a batch that
    is no array."""
    dtype = getattr(batch, "dtype", None)
    return dtype.kind if isinstance(dtype, np.dtype) else ""


def _rows_of(shape: Tuple[int, ...] | None) -> str:
    """``[n, 3, 4]``: how a message names requests of elements of ``shape``."""
    return "[n, ...]" if shape is None else "[" + ", ".join(["n", *map(str, shape)]) + "]"


class BatchManager:
    """Coordinates a Batcher and an Unbatcher: requests in, batches out, outputs back.

    Batches are processed in the order they are popped: ``process_output`` takes the
    outputs of the oldest batch popped and not yet processed, which must have one row
    per element of that batch.

    The element shape of requests is learnt from the first request and kept for the
    manager's lifetime: a request of another is refused when it is added, and never
    joins a batch. Dtypes may differ within a kind (numbers, strings, times): a batch is
    what ``np.concatenate`` makes of its requests (int32 and int64 rows make an int64
    batch), as the prototype batched them; a request of another kind is refused.

    Args:
        batcher: how to cut the stream of requests into batches.
        unbatcher: how to split outputs; default: chosen from the first outputs (an
            array, or a tuple or dict of arrays).

    Example:
        >>> m = BatchManager(BatchSizeBatcher(8))
        >>> m.add_inputs(np.arange(5)); m.add_inputs(np.arange(4))
        >>> [y.tolist() for y in m.process_output(m.pop_batch())]
        [[0, 1, 2, 3, 4]]
    """

    def __init__(self, batcher: Batcher, unbatcher: Unbatcher | None = None):
        check_instance("batcher", batcher, Batcher, "BatchSizeBatcher(8)")
        if unbatcher is not None:
            check_instance("unbatcher", unbatcher, Unbatcher, "NumpyUnbatcher()")
        if isinstance(batcher, FairBatcher):
            # Its batches interleave the pieces of split requests, which an unbatcher
            # reading rows in order would hand to the wrong requests.
            raise ValueError(
                "BatchManager hands outputs back in the order requests were added, so it "
                "needs a batcher that keeps that order (BatchSizeBatcher, CostBatcher); "
                "a FairBatcher interleaves split requests (serve() reassembles them)")
        self.batcher = batcher
        self.unbatcher = unbatcher
        self._sizes: Deque[int] = collections.deque()  # registered before an unbatcher
        # With the unbatcher chosen here, every batch must keep the first's structure.
        self._check = unbatcher is None
        # The structure of the first outputs of batches of each dtype kind (ints,
        # floats...): numbers of several kinds join in one manager, and a model that
        # keeps its batch's kind (an identity) answers an int batch with ints.
        self._structures: Dict[str, rows.OutputStructure] = {}
        # The rows and dtype kind of each batch popped and not yet processed, oldest
        # first: outputs are measured against their batch before anything is taken.
        self._popped: Deque[Tuple[int, str]] = collections.deque()
        # The first request's element shape: one that would not concatenate with the
        # others fails alone, where it would wedge every later pop.
        self._element_shape: Tuple[int, ...] | None = None
        self._dtype: np.dtype | None = None  # the first request's

    def add_inputs(self, x: "ArrayLike") -> None:
        """Queue one request ``x[n, ...]``; its output comes back in order.

        Raises:
            InputSpecError: (a ValueError) when ``x`` has no batch dimension, another
                element shape than the first request's, or a dtype that cannot join
                its dtype (another kind: a string or a time among numbers); the message
                names the expected and the given. Nothing is queued then.
        """
        try:
            x = np.asarray(x)
        except ValueError as e:  # a ragged list: numpy's own words, as the request's
            raise InputSpecError(f"a request must be rows of one shape "
                                 f"(expected {_rows_of(self._element_shape)}): {e}") from None
        if x.ndim == 0:
            raise InputSpecError(f"a request must have a batch dimension: expected "
                                 f"{_rows_of(self._element_shape)}, given a 0-d array")
        if not x.dtype.isnative:  # the model sees its own byte order, as serve's does
            x = x.astype(x.dtype.newbyteorder("="))
        if self._element_shape is None:
            self._element_shape, self._dtype = x.shape[1:], x.dtype
        elif x.shape[1:] != self._element_shape:
            raise InputSpecError(f"a request's elements must keep the first request's "
                                 f"shape: expected {_rows_of(self._element_shape)}, given "
                                 f"{list(x.shape)}")
        elif not _joins(self._dtype, x.dtype):
            raise InputSpecError(f"a request of {x.dtype} cannot join requests of "
                                 f"{self._dtype}: expected {_rows_of(self._element_shape)} "
                                 f"of {_KINDS[_kind(self._dtype)]}, given {list(x.shape)} "
                                 f"{x.dtype}")
        self.batcher.append(x)
        if self.unbatcher is None:
            self._sizes.append(len(x))
        else:
            self.unbatcher.register(len(x))

    def pop_batch(self) -> np.ndarray:
        """The next batch to run the model on; ``process_output`` takes its outputs
        (batches in the order they were popped)."""
        batch = self.batcher.pop()
        self._popped.append((len(batch), _dtype_kind(batch)))
        return batch

    def has_full_batch(self) -> bool:
        """True when the queued requests fill a batch."""
        return self.batcher.has_full_batch()

    def empty(self) -> bool:
        """True when no request waits to be batched."""
        return self.batcher.empty()

    def process_output(self, outputs: Outputs) -> List[Outputs]:
        """The outputs of every request completed by the outputs of the oldest batch
        popped and not yet processed, in order.

        Raises:
            ModelOutputError: when no popped batch awaits outputs, or ``outputs`` do not
                keep the structure of the first outputs of a batch of the same dtype
                kind (kind, trailing shapes, dtypes of one kind; a float64 output where
                the first was float32 is cast; an int batch's outputs are measured
                against an int batch's, a float batch's against a float one's), or
                have another number of rows than their batch has elements (the message
                names both); the outputs are then not taken and nothing changes, so the
                batch's right outputs may still be passed.
        """
        if not self._popped:
            raise ModelOutputError(
                "no popped batch awaits outputs: process_output takes the outputs of a "
                "batch from pop_batch, once")
        expected, kind = self._popped[0]
        structure = self._structures.get(kind)
        if self._check:  # a list reaches callers as a tuple, as serve delivers it
            mixed = any(other != kind for other in self._structures)
            first = (f"the first {_KIND_NAMES.get(kind, 'other')} batch's" if mixed
                     else "the first batch's")
            outputs, structure = rows.check(rows.plain(outputs), structure,
                                            expected_from=first)
            if mixed and kind not in self._structures:
                # This kind's first outputs: their dtypes are theirs, their shape the
                # first batch's of any kind.
                _same_shape(structure, next(iter(self._structures.values())))
        if self.unbatcher is None:
            rows.check_count(outputs, expected)
        else:
            try:
                given = self.unbatcher.num_rows(outputs)
            except TypeError as e:  # None, a scalar: nothing with rows
                raise ModelOutputError(f"the model's outputs have no batch dimension "
                                       f"({type(outputs).__name__}): {e}") from None
            if given != expected:
                raise ModelOutputError(
                    f"the model returned {given} rows for a batch of {expected} "
                    f"elements: it must return one output row per input element")
        # Checked: from here on the outputs are taken.
        if structure is not None:
            self._structures[kind] = structure
        if self.unbatcher is None:
            self.unbatcher = unbatcher_for(outputs)
            for n in self._sizes:
                self.unbatcher.register(n)
            self._sizes.clear()
        completed = self.unbatcher.unbatch(outputs)
        self._popped.popleft()
        return completed
