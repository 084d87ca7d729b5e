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
object of a BatchingServer, the servers' models for a Router, a token that a client of
a server in another process renews at each swap the server tells it of). Any swap
starts a new generation, even when the labels compare equal (1, then 1.0; or the same
label pushed twice): generations are compared by identity, and labels only when of the
same type. When the generation changes, the table is emptied and in-flight requests of
the old one are no longer joined, so a result computed by an older model is never
served after the swap. A result is stored only when it was sent in the current
generation and the version that computed it (``with_version``) is that generation's
label, and never when that label is None (unknown); a request whose parts (hits,
joined and sent elements) disagree on the version, or that waited across a swap, is
looked up again. While the wrapped function's ``swap_token`` is None (it does not know
its version yet: a client before its server's first word), every request goes straight
through.

So the cache needs the wrapped function to say which model answers: every evaluate
async_search hands a search (``serve``'s server, ``immediate``, a backend's client, a
``Router``, a ``CachedEvaluate``) reports ``version`` and ``swap_token`` (or a ``model``
that is a new object at every swap). A function that reports neither is refused at
construction, unless ``fixed_model=True`` says that its model never changes.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
from typing import Any, Dict, Hashable, List, Set, Tuple

import numpy as np

from async_search import rows
from async_search.base import Outputs, evaluate_with_version, evaluated, version_of
from async_search.checks import check_int
from async_search.deadlines import check_timeout, within_deadline
from async_search.errors import InputSpecError, ModelOutputError, RequestTimeoutError
from async_search.requests import plain_array


_ATTEMPTS = 3  # lookups of one request before it goes around the table
#: The least timeout a request sent on is given (its caller's deadline may have passed
#: a moment ago: the caller's own wait reports it).
_LEAST_TIMEOUT = 1e-3
_UNKNOWN = object()  # an attempt's answer: the generation is unknown, go around

#: An element's key: ((shape, dtype), bytes). Equal bytes of another dtype or shape are
#: another element.
Key = Tuple[tuple, bytes]


def _deadline(timeout: float) -> float:
    return asyncio.get_running_loop().time() + timeout


def _takes_timeout(fn: Any) -> bool:
    """Whether ``fn`` takes a ``timeout`` keyword (or any keyword)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read: send no timeout
        return False
    return any(p.kind is p.VAR_KEYWORD or (p.name == "timeout" and p.kind in (
        p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) for p in parameters)


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


def _has(obj: Any, name: str) -> bool:
    """Whether ``obj`` has attribute ``name`` (on its class or itself), without reading
    it (a property may raise)."""
    return hasattr(type(obj), name) or name in getattr(obj, "__dict__", ())


def reports_swaps(evaluate: Any) -> bool:
    """Whether ``evaluate`` says which model answers it: a ``version`` label and a
    ``swap_token`` (or a ``model`` that is a new object at every swap).

    Example:
        >>> async def f(x): return x
        >>> reports_swaps(f)
        False
    """
    return _has(evaluate, "version") and (_has(evaluate, "swap_token")
                                          or _has(evaluate, "model"))


def labels_answers(evaluate: Any) -> bool:
    """Whether ``evaluate`` labels its answers with a version (``with_version`` or a
    ``version``): one that does but does not ``reports_swaps`` cannot be cached, since
    nothing tells when its labels stop meaning the same model."""
    return _has(evaluate, "with_version") or _has(evaluate, "version")


def swap_token(evaluate: Any) -> Any:
    """What identifies the model behind ``evaluate`` beyond its label: its own
    ``swap_token`` when it has one (a Router: one per server; a client of a server in
    another process: renewed at each swap it hears of; None while unknown), else its
    ``model`` (a BatchingServer's property: a new object after every swap), else None."""
    if _has(evaluate, "swap_token"):
        return evaluate.swap_token
    if _has(evaluate, "model"):
        return evaluate.model
    return None


def _same_token(a: Any, b: Any) -> bool:
    if a is b:
        return True
    return (type(a) is tuple and type(b) is tuple and len(a) == len(b)
            and all(_same_token(x, y) for x, y in zip(a, b)))


#: The token of a cache whose model never changes (``fixed_model=True``).
_FIXED = ("fixed model",)


class _Generation:
    """The model whose results the table holds: one per swap the cache saw. Compared by
    identity (``is``), never by label. A token of None: unknown (nothing is cached)."""

    __slots__ = ("label", "token")

    def __init__(self, label: Hashable, token: Any):
        self.label = label  # the wrapped function's version label
        self.token = token  # swap_token(evaluate): the model object(s), or None

    def is_current(self, label: Hashable, token: Any) -> bool:
        return same_label(label, self.label) and _same_token(token, self.token)


class _Flight:
    """One request of missed elements sent to the wrapped function."""

    __slots__ = ("future", "spec", "keys", "rows", "generation", "waiters")

    def __init__(self, spec: tuple, keys: List[Key], generation: _Generation):
        self.future: asyncio.Future | None = None  # -> (outputs, version)
        self.spec = spec
        self.keys = keys
        self.generation = generation  # the generation current when it was sent
        self.rows: list | None = None  # frozen per-element outputs, once landed
        self.waiters = 0  # callers waiting on it now

    def row(self, j: int):
        return self.rows[j]


def _own_bytes(row: Any) -> Any:
    """A row of a stored element as an array of its own: a view of its request's
    outputs, kept in the table, kept all of them alive (a cache of ``capacity`` rows
    held ``capacity`` requests' outputs)."""
    if type(row) is np.ndarray and row.base is not None:
        row = row.copy()
        row.flags.writeable = False
    return row


class CachedEvaluate:
    """An LRU cache of per-element outputs, keyed by the element's shape, dtype and bytes.

    Args:
        evaluate: the function whose results are cached (``await evaluate(x)``). It
            must say which model answers it (``reports_swaps``): a ``version`` and a
            ``swap_token``, or a ``model`` that is a new object at each swap (every
            evaluate of async_search has one or the other); results are tied
            to the model version that computed them (``with_version``).
        capacity: the most elements kept; 0 keeps none but still merges identical
            elements in flight.
        fixed_model: ``evaluate``'s model never changes (a plain function, a connected
            function of a server that is never swapped): it need not report versions,
            and nothing is ever invalidated.

    An answer to the elements the cache sent must hold one row per element (an array,
    or a tuple, list or dict of them): any other fails every caller waiting on it with
    ModelOutputError, and nothing of it is stored.

    Raises:
        TypeError: ``evaluate`` does not report a ``version`` and a ``swap_token``
            (and ``fixed_model`` is False), or is not callable.
        ValueError: a bad ``capacity``.

    Example:
        >>> import async_search as asr
        >>> from async_search.models import MLP
        >>> async def main():
        ...     async with asr.serve(MLP((4,))) as evaluate:
        ...         cached = CachedEvaluate(evaluate, capacity=1000)
        ...         x = np.arange(8, dtype=np.float32).reshape(2, 4)
        ...         y = await cached(x)
        ...         y_again = await cached(x)    # from the cache: no model call
        ...         return (np.array_equal(y, y_again), evaluate.stats["elements"],
        ...                 cached.stats["hit_rate"])
        >>> asyncio.run(main())
        (True, 2, 0.5)
    """

    def __init__(self, evaluate: Any, *, capacity: int = 65536, fixed_model: bool = False):
        capacity = check_int("capacity", capacity, minimum=0)  # (a NumPy int too)
        if not callable(evaluate):
            raise TypeError(f"evaluate must be callable, got {type(evaluate).__name__}")
        if not isinstance(fixed_model, bool):
            raise TypeError(f"fixed_model must be True or False, got {fixed_model!r}")
        if not fixed_model and not reports_swaps(evaluate):
            missing = [n for n in ("version", "swap_token") if not _has(evaluate, n)]
            raise TypeError(
                f"CachedEvaluate must know which model answers {type(evaluate).__name__} "
                f"{evaluate!r:.80}, or it could serve an older model's results after a "
                f"swap: it reports no {' and no '.join(missing)}. Every evaluate of "
                f"async_search (serve, immediate, a backend's client, a Router) reports "
                f"both; give yours a `version` (the label of the model that answers its "
                f"next request) and a `swap_token` (an object that changes at every "
                f"swap), or pass fixed_model=True if its model never changes")
        self.evaluate = evaluate
        self.capacity = capacity
        self.fixed_model = fixed_model
        # Whether a caller's deadline can go with the request (every evaluate of
        # async_search takes one; a plain function may not).
        self._takes_timeout = _takes_timeout(
            evaluate if fixed_model or not hasattr(evaluate, "with_version")
            else evaluate.with_version)
        self._entries: "collections.OrderedDict[Key, Any]" = collections.OrderedDict()
        self._pending: Dict[Key, Tuple[_Flight, int]] = {}
        self._tasks: Set[asyncio.Task] = set()  # every evaluation in flight
        # A Router whose servers cannot vouch for their labels raises here, naming one.
        self._generation = _Generation(self._label(), self._token())
        self._spec: tuple | None = None  # (shape, dtype) of elements, once one was served
        self._requests = 0
        self._bypassed = 0  # elements sent past the table (another spec, object arrays)
        self._lookups = 0
        self._hits = 0
        self._misses = 0
        self._deduplicated = 0
        self._evictions = 0
        self._invalidations = 0
        self._retries = 0

    # -- the evaluate function --------------------------------------------------------
    async def __call__(self, x: np.ndarray, timeout: float | None = None) -> Outputs:
        """The outputs for ``x``: hits from the table, the rest from the wrapped
        function. ``timeout``: the request's deadline, sent on with the elements it
        sends (where the wrapped function takes one, as every evaluate of
        async_search does): past it RequestTimeoutError; a caller who joined the
        elements another caller sent looks them up again if they ran out of its time."""
        if timeout is None:
            return (await self._lookup(x, False, None))[0]
        timeout = check_timeout(timeout)
        return (await within_deadline(self._lookup(x, False, _deadline(timeout)),
                                      timeout))[0]

    async def with_version(self, x: np.ndarray, timeout: float | None = None,
                           ) -> Tuple[Outputs, Hashable]:
        """``(outputs, version)``: the version of the model that computed the elements
        that were sent (or of the cached ones, when every element was a hit);
        ``timeout`` as for a call."""
        if timeout is None:
            outputs, version = await self._lookup(x, True, None)
        else:
            timeout = check_timeout(timeout)
            outputs, version = await within_deadline(
                self._lookup(x, True, _deadline(timeout)), timeout)
        if self.fixed_model:
            return outputs, version_of(self.evaluate)
        return outputs, version

    @property
    def version(self) -> Hashable:
        """The wrapped function's model version (the version the table holds)."""
        return version_of(self.evaluate)

    @property
    def swap_token(self) -> Any:
        """The table's generation (a new object at every swap the cache sees), or None
        while the wrapped function's is unknown: a cache or router in front sees every
        swap."""
        self._sync_version()
        generation = self._generation
        return None if generation.token is None else generation

    def _label(self) -> Hashable:
        """The label results are stored under: the wrapped function's version (None,
        unknown, when it reports none), or one constant for a fixed model."""
        if self.fixed_model:
            return _FIXED
        return version_of(self.evaluate)

    def _token(self) -> Any:
        return _FIXED if self.fixed_model else swap_token(self.evaluate)

    async def _lookup(self, x, want_version: bool, deadline: float | None,
                      ) -> Tuple[Outputs, Hashable]:
        if type(x) is not np.ndarray:
            x = plain_array(x)  # a subclass is keyed and answered as its plain data
        self._requests += 1
        if type(x) is not np.ndarray or x.ndim == 0 or not len(x) or (
                not x.dtype.isnative) or x.dtype.hasobject or (
                self._spec is not None and (x.shape[1:], x.dtype) != self._spec):
            # The server checks and answers. (An object array's bytes are its objects'
            # addresses, not their values: a new object at a freed address would get
            # the old one's row.)
            return await self._bypass(x, deadline)
        for _ in range(_ATTEMPTS):
            result = await self._attempt(x, deadline)
            if result is _UNKNOWN:  # the wrapped function does not know its version
                return await self._bypass(x, deadline)
            if result is not None:
                return result
            self._retries += 1
        return await self._bypass(x, deadline)  # the model keeps changing: go direct

    async def _attempt(self, x: np.ndarray, deadline: float | None,
                       ) -> Tuple[Outputs, Hashable] | None:
        """The outputs from the table and from the server; None when a model swap
        while waiting made them disagree on the version (the table is then dropped), or
        when a flight joined failed for a row another caller sent (InputSpecError) or
        at another caller's deadline (RequestTimeoutError)."""
        self._sync_version()
        generation = self._generation
        if generation.token is None:
            return _UNKNOWN
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
            # A copy even when every element is sent: the request may outlive its
            # caller, who may then reuse the array (its rows are stored by their keys)
            xs = x.copy() if len(first_of) == n else x[first_of]
            flight = self._launch(xs, [keys[i] for i in first_of], spec, deadline)
        flights = {f for _, f, _ in joined} | ({flight} if flight else set())
        for f in flights:
            f.waiters += 1
        refused_elsewhere = False
        try:
            for f in flights:
                try:
                    await asyncio.shield(f.future)  # a caller who leaves leaves others rows
                except (InputSpecError, RequestTimeoutError):
                    if f is flight:
                        raise
                    # Another caller's request, refused for a row of its own, or sent
                    # with its deadline, now past: the rows joined here may be fine, and
                    # this caller's time may not be up; look them up again.
                    refused_elsewhere = True
        finally:
            for f in flights:
                f.waiters -= 1
                if not f.waiters and not f.future.done():
                    self._unpend(f)
        if refused_elsewhere:
            return None
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

    async def _bypass(self, x, deadline: float | None) -> Tuple[Outputs, Hashable]:
        self._bypassed += len(x) if getattr(x, "ndim", 0) else 0
        return await self._evaluate(x, deadline)

    async def _evaluate(self, x, deadline: float | None) -> Tuple[Outputs, Hashable]:
        """``(outputs, label)`` from the wrapped function (a fixed model's: _FIXED), sent
        with what is left of ``deadline`` where it takes a timeout: a server that keeps
        a request past it is then its failure there (a router's breaker counts it)."""
        if deadline is not None and self._takes_timeout:
            timeout = max(deadline - asyncio.get_running_loop().time(), _LEAST_TIMEOUT)
            with_version = None if self.fixed_model else getattr(
                self.evaluate, "with_version", None)
            if with_version is not None:
                return await with_version(x, timeout=timeout)
            evaluate = functools.partial(self.evaluate, timeout=timeout)
            outputs = await evaluated(evaluate, x)
            return outputs, (_FIXED if self.fixed_model else version_of(self.evaluate))
        if self.fixed_model:
            return await evaluated(self.evaluate, x), _FIXED
        return await evaluate_with_version(self.evaluate, x)

    def _launch(self, xs: np.ndarray, keys: List[Key], spec: tuple,
                deadline: float | None) -> _Flight:
        generation = self._generation
        # The version is the one that computed the rows (read when they came, for a
        # function without with_version): rows of a swap while they were computed are
        # not stored (_landed).
        flight = _Flight(spec, keys, generation)
        task = asyncio.ensure_future(self._fly(flight, xs, deadline))
        self._tasks.add(task)  # the loop holds tasks only weakly
        task.add_done_callback(self._tasks.discard)
        flight.future = task
        pending = self._pending
        for j, key in enumerate(keys):
            pending[key] = (flight, j)
        flight.future.add_done_callback(functools.partial(self._landed, flight, pending))
        return flight

    async def _fly(self, flight: _Flight, xs: np.ndarray, deadline: float | None,
                   ) -> Tuple[Outputs, Hashable]:
        """``flight``'s ``(outputs, label)``, its rows copied. Outputs that are not one
        row per element sent fail the flight with ModelOutputError for every caller
        waiting on it: checked here, not where they land (a done callback), so that no
        caller gets another element's row and nothing escapes from a callback."""
        outputs, label = await self._evaluate(xs, deadline)
        if type(outputs) is not np.ndarray or not outputs.dtype.isnative:
            outputs = rows.plain(outputs)  # a list of outputs is a tuple, not rows; native
        try:
            rows.check_count(outputs, len(xs))
        except ModelOutputError as e:
            raise ModelOutputError(
                f"the function the cache wraps ({self.evaluate!r:.60}) answered a "
                f"request of {len(xs)} elements wrongly: {e}") from None
        # Copied now, before the sender can change its outputs.
        flight.rows = rows.rows_of(rows.frozen_copy(outputs))
        return outputs, label

    def _unpend(self, flight: _Flight) -> None:
        """Nobody waits for ``flight`` any more (they timed out or left): later requests
        for its elements are sent afresh rather than wait on it (its server may never
        answer); its rows are still stored if they come."""
        pending = self._pending
        for key in flight.keys:
            flying = pending.get(key)
            if flying is not None and flying[0] is flight:
                del pending[key]

    def _landed(self, flight: _Flight, pending: dict, future: asyncio.Future) -> None:
        for j, key in enumerate(flight.keys):
            flying = pending.get(key)
            if flying is not None and flying[0] is flight:
                del pending[key]
        if future.cancelled() or future.exception() is not None:
            return
        if self._spec is None:
            self._spec = flight.spec
        if not self.capacity:
            return
        self._sync_version()
        label = future.result()[1]
        if flight.generation is not self._generation or label is None or not same_label(
                label, flight.generation.label):
            # Computed by a model since replaced, or sent before a swap (a request split
            # across batches during a swap may hold rows of both models), or by a
            # version nobody knows (None): nothing says when it stops being current.
            return
        entries = self._entries
        for j, key in enumerate(flight.keys):
            entries[key] = rows.map_leaves(_own_bytes, flight.row(j))
            entries.move_to_end(key)
        excess = len(entries) - self.capacity
        for _ in range(max(excess, 0)):
            entries.popitem(last=False)
        self._evictions += max(excess, 0)

    def _sync_version(self) -> None:
        """Starts a new generation (an empty table) when the model was swapped."""
        label, token = self._label(), self._token()
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
        request), bypassed (elements sent past the table: of another shape or dtype
        than the first request's, the other byte order, object arrays, or while the
        version is unknown), evictions, invalidations (tables dropped after a version
        change), retries (lookups repeated because a swap made their parts disagree),
        entries, capacity, hit_rate (hits / lookups)."""
        return {
            "requests": self._requests,
            "bypassed": self._bypassed,
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
