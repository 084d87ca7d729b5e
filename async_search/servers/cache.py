"""A result cache in front of an evaluate function: a transposition table for search.

``CachedEvaluate`` has the call shape of the function it wraps. For ``x[n, ...]`` it
looks up each element by its shape, dtype and bytes (the same bytes as float32 and as
int32 are two elements), sends the elements it does not have, deduplicated, as one
request, and assembles the outputs in order. An element already in flight for another
caller is not sent again: the second caller waits for the first one's request.

Put one in front of a server and share it among all searches (a central table), or give
each search its own (a per-client table); it works in front of a ``Router`` or a client
of a server in another process alike.

Versions: the cache holds results of one model, a *generation*: the wrapped function's
``version`` label together with the identity of its model (``swap_token``: the model
object of a BatchingServer, the servers' models for a Router). Any swap starts a new
generation, even when the labels compare equal (1, then 1.0; or the same label pushed
twice): generations are compared by identity, and labels only when of the same type.
When the generation changes, the table is emptied and in-flight requests of the old
one are no longer joined, so a result computed by an older model is never served after
the swap. A result is stored only when it was sent in the current generation and the
version that computed it (``with_version``) is that generation's label; a request
whose parts (hits, joined and sent elements) disagree on the version, or that waited
across a swap, is looked up again.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from typing import Any, Dict, Hashable, List, Set, Tuple

import numpy as np

from async_search.base import Outputs, evaluate_with_version, version_of
from async_search import rows
from async_search.servers.requests import plain_array

__all__ = ["CachedEvaluate", "Key", "swap_token", "same_label"]

_ATTEMPTS = 3  # lookups of one request before it goes around the table

#: An element's key: ((shape, dtype), bytes). Equal bytes of another dtype or shape are
#: another element.
Key = Tuple[tuple, bytes]


def same_label(a: Hashable, b: Hashable) -> bool:
    """Whether two version labels name the same version: the same object, or equal
    values of the same type (``1`` and ``1.0`` are two versions)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # a label whose comparison fails names no known version
        return False


def swap_token(evaluate: Any) -> Any:
    """What identifies the model behind ``evaluate`` beyond its label: its own
    ``swap_token`` when it has one (a Router: one per server), else its ``model`` (a
    BatchingServer's property: a new object after every swap), else None."""
    token = getattr(type(evaluate), "swap_token", None)
    if isinstance(token, property):
        return evaluate.swap_token
    model = getattr(type(evaluate), "model", None)
    if isinstance(model, property) or "model" in getattr(evaluate, "__dict__", ()):
        return evaluate.model
    return None


def _same_token(a: Any, b: Any) -> bool:
    if a is b:
        return True
    return (type(a) is tuple and type(b) is tuple and len(a) == len(b)
            and all(_same_token(x, y) for x, y in zip(a, b)))


class _Generation:
    """The model whose results the table holds: one per swap the cache saw. Compared by
    identity (``is``), never by label."""

    __slots__ = ("label", "token")

    def __init__(self, label: Hashable, token: Any):
        self.label = label  # the wrapped function's version label
        self.token = token  # swap_token(evaluate): the model object(s), or None

    def is_current(self, label: Hashable, token: Any) -> bool:
        return same_label(label, self.label) and _same_token(token, self.token)


class _Flight:
    """One request of missed elements sent to the wrapped function."""

    __slots__ = ("future", "spec", "keys", "rows", "generation")

    def __init__(self, future: asyncio.Future, spec: tuple, keys: List[Key],
                 generation: _Generation):
        self.future = future  # -> (outputs, version)
        self.spec = spec
        self.keys = keys
        self.generation = generation  # the generation current when it was sent
        self.rows: list | None = None  # frozen per-element outputs, once landed

    def row(self, j: int):
        if self.rows is None:
            self.rows = rows.rows_of(rows.frozen_copy(self.future.result()[0]))
        return self.rows[j]


class CachedEvaluate:
    """An LRU cache of per-element outputs, keyed by the element's shape, dtype and bytes.

    Args:
        evaluate: the function whose results are cached (``await evaluate(x)``); with
            ``with_version`` and ``version`` (a BatchingServer, a Router), results are
            tied to the model version that computed them.
        capacity: the most elements kept; 0 keeps none but still merges identical
            elements in flight.

    Example:
        >>> # async with asr.serve(model) as evaluate:
        >>> #     cached = CachedEvaluate(evaluate, capacity=100_000)
        >>> #     y = await cached(x)          # same outputs as evaluate(x)
        >>> #     cached.stats["hit_rate"]
    """

    def __init__(self, evaluate: Any, *, capacity: int = 65536):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise ValueError(
                f"capacity must be an integer >= 0 (entries), got {capacity!r}")
        if not callable(evaluate):
            raise TypeError(f"evaluate must be callable, got {type(evaluate).__name__}")
        self.evaluate = evaluate
        self.capacity = capacity
        self._entries: "collections.OrderedDict[Key, Any]" = collections.OrderedDict()
        self._pending: Dict[Key, Tuple[_Flight, int]] = {}
        self._tasks: Set[asyncio.Task] = set()  # every evaluation in flight
        self._generation = _Generation(self._current_version(), swap_token(evaluate))
        self._spec: tuple | None = None  # (shape, dtype) of elements, once one was served
        self._requests = 0
        self._lookups = 0
        self._hits = 0
        self._misses = 0
        self._deduplicated = 0
        self._evictions = 0
        self._invalidations = 0
        self._retries = 0

    # -- the evaluate function --------------------------------------------------------
    async def __call__(self, x: np.ndarray) -> Outputs:
        return (await self._lookup(x, False))[0]

    async def with_version(self, x: np.ndarray) -> Tuple[Outputs, Hashable]:
        """``(outputs, version)``: the version of the model that computed the elements
        that were sent (or of the cached ones, when every element was a hit)."""
        return await self._lookup(x, True)

    @property
    def version(self) -> Hashable:
        """The wrapped function's model version (the version the table holds)."""
        return self._current_version()

    def _current_version(self) -> Hashable:
        return version_of(self.evaluate)  # None (unknown) when it reports none

    async def _lookup(self, x, want_version: bool) -> Tuple[Outputs, Hashable]:
        if type(x) is not np.ndarray:
            x = plain_array(x)  # a subclass is keyed and answered as its plain data
        if type(x) is not np.ndarray or x.ndim == 0 or not len(x) or (
                not x.dtype.isnative) or (
                self._spec is not None and (x.shape[1:], x.dtype) != self._spec):
            return await self._bypass(x, want_version)  # the server checks and answers
        self._requests += 1
        for _ in range(_ATTEMPTS):
            result = await self._attempt(x)
            if result is not None:
                return result
            self._retries += 1
        return await self._bypass(x, want_version)  # the model keeps changing: go direct

    async def _attempt(self, x: np.ndarray) -> Tuple[Outputs, Hashable] | None:
        """The outputs from the table and from the server; None when a model swap
        while waiting made them disagree on the version (the table is then dropped)."""
        self._sync_version()
        generation = self._generation
        spec = (x.shape[1:], x.dtype)
        keys = [(spec, b) for b in rows.row_keys(x)]
        n = len(keys)
        entries, pending = self._entries, self._pending
        found: Dict[int, Any] = {}          # position -> cached row
        joined: List[Tuple[int, _Flight, int]] = []
        sent: Dict[Key, int] = {}            # key -> index in this request's misses
        mine: List[Tuple[int, int]] = []     # (position, index in misses)
        first_of: List[int] = []             # position of each distinct miss
        for i, key in enumerate(keys):
            value = entries.get(key)
            if value is not None:
                entries.move_to_end(key)
                found[i] = value
                continue
            flying = pending.get(key)
            if flying is not None:
                joined.append((i, flying[0], flying[1]))
                continue
            j = sent.get(key)
            if j is None:
                j = sent[key] = len(first_of)
                first_of.append(i)
            mine.append((i, j))
        self._lookups += n
        self._hits += len(found)
        self._misses += len(first_of)
        self._deduplicated += len(joined) + len(mine) - len(first_of)

        flight = None
        if first_of:
            xs = x if len(first_of) == n else x[first_of]
            flight = self._launch(xs, [keys[i] for i in first_of], spec)
        for f in {f for _, f, _ in joined} | ({flight} if flight else set()):
            await asyncio.shield(f.future)  # a cancelled caller leaves others their rows
        if flight is not None and len(first_of) == n:
            return flight.future.result()  # every element was sent, once: as it came
        labels = [f.future.result()[1] for f in {f for _, f, _ in joined}]
        if flight is not None:
            labels.append(flight.future.result()[1])
        if found:
            labels.append(generation.label)
        self._sync_version()
        if self._generation is not generation or not all(
                same_label(label, labels[0]) for label in labels[1:]):
            return None  # parts of two models, or a swap while waiting: look up again
        values: List[Any] = [None] * n
        for i, value in found.items():
            values[i] = value
        for i, f, j in joined:
            values[i] = f.row(j)
        for i, j in mine:
            values[i] = flight.row(j)
        return rows.stack(values), labels[0]

    async def _bypass(self, x, want_version: bool) -> Tuple[Outputs, Hashable]:
        return await evaluate_with_version(self.evaluate, x)

    def _launch(self, xs: np.ndarray, keys: List[Key], spec: tuple) -> _Flight:
        generation = self._generation
        # The version is the one that computed the rows (read when they came, for a
        # function without with_version): rows of a swap while they were computed are
        # not stored (_landed).
        task = asyncio.ensure_future(evaluate_with_version(self.evaluate, xs))
        self._tasks.add(task)  # the loop holds tasks only weakly
        task.add_done_callback(self._tasks.discard)
        flight = _Flight(task, spec, keys, generation)
        pending = self._pending
        for j, key in enumerate(keys):
            pending[key] = (flight, j)
        flight.future.add_done_callback(functools.partial(self._landed, flight, pending))
        return flight

    def _landed(self, flight: _Flight, pending: dict, future: asyncio.Future) -> None:
        for j, key in enumerate(flight.keys):
            flying = pending.get(key)
            if flying is not None and flying[0] is flight:
                del pending[key]
        if future.cancelled() or future.exception() is not None:
            return
        flight.row(0)  # copies the rows now, before the sender can change its outputs
        if self._spec is None:
            self._spec = flight.spec
        if not self.capacity:
            return
        self._sync_version()
        if flight.generation is not self._generation or not same_label(
                future.result()[1], flight.generation.label):
            # Computed by a model since replaced, or sent before a swap: a request split
            # across batches during a swap may hold rows of both models.
            return
        entries = self._entries
        for j, key in enumerate(flight.keys):
            entries[key] = flight.row(j)
            entries.move_to_end(key)
        excess = len(entries) - self.capacity
        for _ in range(max(excess, 0)):
            entries.popitem(last=False)
        self._evictions += max(excess, 0)

    def _sync_version(self) -> None:
        """Starts a new generation (an empty table) when the model was swapped."""
        label, token = self._current_version(), swap_token(self.evaluate)
        if not self._generation.is_current(label, token):
            self._generation = _Generation(label, token)
            self._entries = collections.OrderedDict()
            self._pending = {}
            self._invalidations += 1

    # -- bookkeeping ------------------------------------------------------------------
    def clear(self) -> None:
        """Forget every cached element (elements in flight still reach their callers)."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def stats(self) -> dict:
        """requests, lookups (elements looked up), hits, misses (elements sent),
        deduplicated (elements that joined one already in flight or repeated in a
        request), evictions, invalidations (tables dropped after a version change),
        retries (lookups repeated because a swap made their parts disagree), entries,
        capacity, hit_rate (hits / lookups)."""
        return {
            "requests": self._requests,
            "lookups": self._lookups,
            "hits": self._hits,
            "misses": self._misses,
            "deduplicated": self._deduplicated,
            "evictions": self._evictions,
            "invalidations": self._invalidations,
            "retries": self._retries,
            "entries": len(self._entries),
            "capacity": self.capacity,
            "hit_rate": self._hits / self._lookups if self._lookups else 0.0,
        }
