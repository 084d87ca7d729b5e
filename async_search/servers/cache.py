"""A result cache in front of an evaluate function: a transposition table for search.

``CachedEvaluate`` has the call shape of the function it wraps. For ``x[n, ...]`` it
looks up each element by its bytes, sends the elements it does not have, deduplicated,
as one request, and assembles the outputs in order. An element already in flight for
another caller is not sent again: the second caller waits for the first one's request.

Put one in front of a server and share it among all searches (a central table), or give
each search its own (a per-client table); it works in front of a ``Router`` or a client
of a server in another process alike.

Versions: the cache holds results of one model version, the wrapped function's
``version``. When that changes (``update_model``), the table is emptied and in-flight
requests of the old version are no longer joined, so a result computed by an older
model is never served after the swap. A result is stored only when the version it was
sent under, the version that computed it (``with_version``) and the current version
are one and the same; a request whose parts (hits, joined and sent elements) came from
different versions is looked up again.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from typing import Any, Dict, Hashable, List, Tuple

import numpy as np

from async_search.base import Outputs
from async_search.servers import rows

__all__ = ["CachedEvaluate"]

_ATTEMPTS = 3  # lookups of one request before it goes around the table


class _Flight:
    """One request of missed elements sent to the wrapped function."""

    __slots__ = ("future", "spec", "keys", "rows", "sent_version")

    def __init__(self, future: asyncio.Future, spec: tuple, keys: List[bytes],
                 sent_version: Hashable):
        self.future = future  # -> (outputs, version)
        self.spec = spec
        self.keys = keys
        self.sent_version = sent_version  # the version current when it was sent
        self.rows: list | None = None  # frozen per-element outputs, once landed

    def row(self, j: int):
        if self.rows is None:
            self.rows = rows.rows_of(rows.frozen_copy(self.future.result()[0]))
        return self.rows[j]


class CachedEvaluate:
    """An LRU cache of per-element outputs, keyed by the element's bytes.

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
        self._entries: "collections.OrderedDict[bytes, Any]" = collections.OrderedDict()
        self._pending: Dict[bytes, Tuple[_Flight, int]] = {}
        self._version: Hashable = self._current_version()
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
        return getattr(self.evaluate, "version", None)

    async def _lookup(self, x, want_version: bool) -> Tuple[Outputs, Hashable]:
        if type(x) is not np.ndarray or x.ndim == 0 or not len(x) or (
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
        version = self._version
        spec = (x.shape[1:], x.dtype)
        keys = rows.row_keys(x)
        n = len(keys)
        entries, pending = self._entries, self._pending
        found: Dict[int, Any] = {}          # position -> cached row
        joined: List[Tuple[int, _Flight, int]] = []
        sent: Dict[bytes, int] = {}          # key -> index in this request's misses
        mine: List[Tuple[int, int]] = []     # (position, index in misses)
        first_of: List[int] = []             # position of each distinct miss
        for i, key in enumerate(keys):
            value = entries.get(key)
            if value is not None:
                entries.move_to_end(key)
                found[i] = value
                continue
            flying = pending.get(key)
            if flying is not None and flying[0].spec == spec:
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
        versions = {f.future.result()[1] for _, f, _ in joined}
        if flight is not None:
            versions.add(flight.future.result()[1])
        if found:
            versions.add(version)
        if len(versions) > 1:
            self._sync_version()
            return None
        values: List[Any] = [None] * n
        for i, value in found.items():
            values[i] = value
        for i, f, j in joined:
            values[i] = f.row(j)
        for i, j in mine:
            values[i] = flight.row(j)
        return rows.stack(values), versions.pop()

    async def _bypass(self, x, want_version: bool) -> Tuple[Outputs, Hashable]:
        with_version = getattr(self.evaluate, "with_version", None)
        if with_version is not None:
            return await with_version(x)
        return await self.evaluate(x), self._current_version()

    def _launch(self, xs: np.ndarray, keys: List[bytes], spec: tuple) -> _Flight:
        with_version = getattr(self.evaluate, "with_version", None)
        if with_version is not None:
            coro = with_version(xs)
        else:
            coro = self._plain(xs, self._version)
        flight = _Flight(asyncio.ensure_future(coro), spec, keys, self._version)
        pending = self._pending
        for j, key in enumerate(keys):
            pending[key] = (flight, j)
        flight.future.add_done_callback(functools.partial(self._landed, flight, pending))
        return flight

    async def _plain(self, xs: np.ndarray, version: Hashable) -> Tuple[Outputs, Hashable]:
        return await self.evaluate(xs), version

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
        if not flight.sent_version == future.result()[1] == self._version:
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
        current = self._current_version()
        if current != self._version:
            self._version = current
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
