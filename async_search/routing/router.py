"""Routing across several servers: round robin, least outstanding, consistent hashing.

A ``Router`` is an evaluate function over several evaluate functions (BatchingServers,
connected clients of servers in other processes, plain ``async def`` functions that
raise ``ServerDiedError`` once their server is gone: anything with the call shape). Each
server has a circuit breaker; requests go around servers whose breaker is open and fail
over to another server when one fails; when every breaker is open, callers get
``CircuitOpenError`` at once instead of waiting. Only server failures count toward a
breaker and fail over: a caller's bad input (InputSpecError, or a ValueError or
TypeError the model raised for it; ``breaker.counts_against_server``) goes back to that
caller alone, is not sent to another server, and leaves every breaker as it was.

Consistent hashing routes each *element* by its bytes (on a ``hash_ring.HashRing``), so
that an element always goes to the same server (and that server's cache); adding or
removing one of N servers moves only about 1/N of the elements. A request whose
elements go to several servers is sent as one part per server, each a task the router
holds until it ends; when one part fails for good, the others are cancelled.

Every answer must have one row per element sent: a server that answers another number
of rows (or no batch dimension at all) fails that request with ``ModelOutputError``,
which counts against its breaker and fails over like any server failure, so that no
caller gets another element's row. The parts of a split request must have one
structure; a part whose dtype differs is cast to the first part's (in the order of the
servers' names) when the cast keeps its values (``rows.check``), as the serving core
does for a batch whose dtype changed.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from typing import (Any, Awaitable, Callable, Dict, Hashable, List, Mapping, NoReturn,
                    Protocol, Sequence, Set, Tuple)

import numpy as np

from async_search import rows
from async_search.base import (Outputs, Versioned, evaluate_with_version, evaluated,
                               same_version, version_of)
from async_search.checks import check_callable, check_instance, is_async
from async_search.deadlines import (cancellations, check_timeout, deadline_passed,
                                    within_deadline)
from async_search.errors import (InputSpecError, ModelOutputError, RequestTimeoutError,
                                 ServerClosedError, add_note, deliverable)
from async_search.requests import plain_array
from async_search.routing.breaker import (BreakerPolicy, BreakerState, CircuitBreaker,
                                          CircuitOpenError, counts_against_server)
from async_search.routing.cache import labels_answers, reports_swaps, swap_token
from async_search.routing.hash_ring import HashRing


class RoutingPolicy(Protocol):
    """Chooses servers for a request.

    ``assign`` gets the request ``x[n, ...]``, the servers that may take it now (in the
    router's order, breakers allowing), every server of the router, and the requests
    outstanding per server. It returns one server name for the whole request, or a list
    of ``n`` names, one per element.
    """

    def assign(self, x: np.ndarray, candidates: Sequence[str], servers: Sequence[str],
               outstanding: Mapping[str, int]) -> str | Sequence[str]: ...


class RoundRobin:
    """Each request goes to the next server in turn. A request sent again after its
    server failed (the router asks with the same array) takes no turn: it goes to the
    next server after that one, so the requests after it still take turns."""

    def __init__(self) -> None:
        self._turn = itertools.count()
        self._last: Tuple[Any, str] | None = None  # (weakref to the request, its server)

    def assign(self, x, candidates, servers, outstanding) -> str:
        last = self._last
        if last is not None and last[0]() is x:  # the same request, after a failure
            after = servers.index(last[1]) if last[1] in servers else -1
            ring = list(servers[after + 1:]) + list(servers[:after + 1])
            name = next((n for n in ring if n in candidates), candidates[0])
        else:
            name = candidates[next(self._turn) % len(candidates)]
        try:
            self._last = (weakref.ref(x), name)
        except TypeError:  # an object without weak references: no memory of it
            self._last = None
        return name


class LeastOutstanding:
    """Each request goes to the server with the fewest requests in flight (ties in turn)."""

    def __init__(self) -> None:
        self._turn = itertools.count()

    def assign(self, x, candidates, servers, outstanding) -> str:
        start = next(self._turn) % len(candidates)
        best, fewest = None, None
        for name in itertools.chain(candidates[start:], candidates[:start]):
            load = outstanding[name]
            if fewest is None or load < fewest:
                best, fewest = name, load
        return best


class ConsistentHash:
    """Each element goes to the server that owns its bytes on a hash ring.

    Args:
        virtual_nodes: points per server on the ring.
    """

    def __init__(self, *, virtual_nodes: int = 128):
        self.ring = HashRing(virtual_nodes=virtual_nodes)
        self._servers: Tuple[str, ...] = ()

    def assign(self, x, candidates, servers, outstanding) -> str | List[str]:
        if tuple(servers) != self._servers:
            self._sync(servers)
        among = candidates if len(candidates) < len(servers) else None
        if len(x) == 1:
            return self.ring.node_for(x.tobytes(), among)
        return self.ring.nodes_for(rows.row_keys(x), among)

    def _sync(self, servers: Sequence[str]) -> None:
        self.ring.update(servers)
        self._servers = tuple(servers)


_POLICIES = {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding,
             "consistent_hash": ConsistentHash}

#: A string as the plain ``str`` it holds: a policy's ``np.str_`` or ``str`` Enum
#: member equals the server's name, and ``str()`` of the Enum member would not.
_plain = str.__str__

#: The swap token a server that reports no version stands for.
_UNVERSIONED = ("unversioned server",)


#: A passed deadline counts against the server that kept the request only when the
#: server had it this many times its usual answer time (a moving average of its
#: answers; before its first, the other servers' quickest), or ``FIRST_FAIR_S`` seconds
#: before any server answered: callers choose their deadlines, and ten requests with a
#: deadline of a microsecond opened every healthy server's breaker. (Its usual time,
#: not more: a hung server must count against deadlines a little past it.)
FAIR_FACTOR = 1.0
FIRST_FAIR_S = 0.1
_USUAL_WEIGHT = 0.1  # of the latest answer in the moving average


class _Entry:
    """A server as added to the router: its evaluate function, breaker and counters.
    Adding a server under a name that was removed makes a new entry, so that the old
    server's requests still in flight end against the old entry and never move the
    new server's numbers."""

    __slots__ = ("evaluate", "breaker", "requests", "failures", "outstanding", "usual_s")

    def __init__(self, evaluate: Any, breaker: CircuitBreaker):
        self.evaluate = evaluate
        self.breaker = breaker
        self.requests = 0
        self.failures = 0
        self.outstanding = 0
        self.usual_s: float | None = None  # its answers' time, a moving average

    def answered(self, seconds: float) -> None:
        usual = self.usual_s
        self.usual_s = seconds if usual is None else usual + _USUAL_WEIGHT * (
            seconds - usual)

    def had_a_fair_chance(self, seconds: float, others_usual_s: float | None) -> bool:
        """Whether a deadline that passed after the server had a request for
        ``seconds`` is the server's failure: it had ``FAIR_FACTOR`` times its usual
        answer time (before its first answer, the other servers' quickest usual time;
        ``FIRST_FAIR_S`` before any answer). A caller's deadline shorter than that is
        the caller's doing, and moves no breaker."""
        usual = self.usual_s if self.usual_s is not None else others_usual_s
        return seconds >= (FIRST_FAIR_S if usual is None else FAIR_FACTOR * usual)


class _ServerFailed(Exception):
    def __init__(self, name: str, error: BaseException):
        self.name, self.error = name, error


class Router:
    """An evaluate function that spreads requests over several servers.

    ``await router(x)`` sends ``x`` (or, with consistent hashing, each element of it) to
    a server chosen by ``policy`` among those whose breaker admits requests, and returns
    the outputs in order. A server failure counts against its breaker and, with
    ``failover``, the request goes to another server; after every server failed it, the
    caller gets the last error. When every breaker is open the caller gets
    ``CircuitOpenError`` at once.

    The rule (``is_failure``, by default ``breaker.counts_against_server``): a caller's
    bad input is the caller's failure, never the server's. InputSpecError, and any
    ValueError or TypeError (the model rejected its input; also when raised in another
    process and carried as a RemoteError), reach the caller at once: no breaker counts
    them and they are not sent to another server (a poison request would fail there
    too). Timeouts, crashes, dead or closed servers, ModelOutputError and every other
    exception count, once per failed call to the server: the requests of one batch
    (or of one message to another process) that failed with one exception count as one
    failure (see ``breaker``).

    A server may be any evaluate function: a BatchingServer, a connected client, or a
    plain ``async def`` that raises ``ServerDiedError`` when its server is gone (that
    counts against its breaker and the request fails over like any server failure).

    An answer whose number of rows is not the number of elements sent (or that has no
    batch dimension) is the server's failure: ModelOutputError, counted against it and
    failed over. The parts of a split request must agree in structure: a dtype of the
    same kind is cast to the first part's when the cast keeps the values; any other
    difference (kind, trailing shape, int for float, a value the cast would change)
    fails the request with ModelOutputError naming both parts; no breaker counts it,
    since nothing tells which server is wrong.

    Args:
        servers: name -> evaluate function (a BatchingServer, a connected client, ...).
        policy: "round_robin", "least_outstanding", "consistent_hash", or a
            ``RoutingPolicy``.
        breaker: the policy of every server's circuit breaker.
        clock: the breakers' clock (seconds); inject a fake one in tests.
        failover: send a failed request (or the failed part of it) to another server.
        is_failure: which errors count against a server and fail over (default:
            ``counts_against_server``: all but a caller's error and cancellation).

    Example:
        >>> import async_search as asr
        >>> from async_search.models import MLP
        >>> async def main():
        ...     model = MLP((4,))
        ...     async with asr.serve(model) as a, asr.serve(model) as b:
        ...         evaluate = Router({"a": a, "b": b}, policy="consistent_hash")
        ...         y = await evaluate(np.zeros((3, 4), np.float32))
        ...         return y.shape, a.stats["elements"] + b.stats["elements"]
        >>> asyncio.run(main())
        ((3, 1), 3)
    """

    def __init__(self, servers: Mapping[str, Any], *,
                 policy: str | RoutingPolicy = "round_robin",
                 breaker: BreakerPolicy = BreakerPolicy(),
                 clock: Callable[[], float] = time.monotonic, failover: bool = True,
                 is_failure: Callable[[BaseException], bool] = counts_against_server):
        # Checked here, not at the first request or failure (where a class for an
        # instance, or a dict for a BreakerPolicy, failed inside the routing).
        if not isinstance(servers, Mapping):
            raise TypeError(f"servers must be a mapping of names to evaluate functions "
                            f"({{'a': a, 'b': b}}), got {type(servers).__name__}")
        if isinstance(policy, str):
            if policy not in _POLICIES:
                raise ValueError(f"unknown routing policy {policy!r}: use one of "
                                 f"{sorted(_POLICIES)} or a RoutingPolicy object")
            policy = _POLICIES[policy]()
        elif isinstance(policy, type) or not callable(getattr(policy, "assign", None)):
            raise TypeError(f"policy must be one of {sorted(_POLICIES)} or a RoutingPolicy "
                            f"instance (an object with assign(...), RoundRobin() say), got "
                            + (f"the class {policy.__name__}" if isinstance(policy, type)
                               else type(policy).__name__))
        check_instance("breaker", breaker, BreakerPolicy, "BreakerPolicy(failure_threshold=3)")
        check_callable("clock", clock)
        check_callable("is_failure", is_failure)
        if not isinstance(failover, (bool, np.bool_)):
            raise TypeError(f"failover must be True or False, got {failover!r}")
        self.policy = policy
        self.breaker_policy = breaker
        self.failover = bool(failover)
        self._clock = clock
        self._is_failure = is_failure
        self._entries: Dict[str, _Entry] = {}
        self._names: Tuple[str, ...] = ()
        self.breakers: Dict[str, CircuitBreaker] = {}
        #: Requests in flight per server routed to now (what least_outstanding reads).
        self.outstanding: Dict[str, int] = {}
        self._rejected = 0
        self._tasks: Set[asyncio.Task] = set()  # the parts of split requests, in flight
        for name, evaluate in servers.items():
            self.add_server(name, evaluate)

    # -- membership -------------------------------------------------------------------
    @property
    def servers(self) -> Mapping[str, Any]:
        """name -> evaluate function, in the router's order."""
        return {name: entry.evaluate for name, entry in self._entries.items()}

    def add_server(self, name: str, evaluate: Any) -> None:
        """Route to ``evaluate`` as well, with a fresh (closed) breaker and counters of
        its own (none carried over from a server removed under that name)."""
        if not isinstance(name, str):  # a policy's answer is told from a list by it
            raise TypeError(f"a server's name must be a str, got {type(name).__name__} "
                            f"{name!r}")
        if name in self._entries:
            raise ValueError(f"a server named {name!r} is already routed to: remove it "
                             f"first or pick another name")
        if not callable(evaluate):
            raise TypeError(f"server {name!r} must be an evaluate function, got "
                            f"{type(evaluate).__name__}")
        breaker = CircuitBreaker(self.breaker_policy, clock=self._clock)
        self._entries[name] = _Entry(evaluate, breaker)
        self._names = tuple(self._entries)
        self.breakers[name] = breaker
        self.outstanding[name] = 0

    def remove_server(self, name: str) -> Any:
        """Stop routing new requests to ``name`` (its requests in flight finish, and
        count toward no server added later under that name)."""
        if name not in self._entries:
            raise KeyError(f"no server named {name!r}; servers: {list(self._names)}")
        entry = self._entries.pop(name)
        self._names = tuple(self._entries)
        del self.breakers[name], self.outstanding[name]
        return entry.evaluate

    # -- the evaluate function --------------------------------------------------------
    async def __call__(self, x: np.ndarray, timeout: float | None = None) -> Outputs:
        """The outputs for ``x``, from the servers the policy picks. ``timeout``: the
        request's deadline, failover included: past it RequestTimeoutError, and what
        it sent that is not batched yet is dropped (cancelled)."""
        if timeout is None:
            outputs, _ = await self._route(x, frozenset(), False, None)
        else:
            timeout = check_timeout(timeout)
            outputs, _ = await within_deadline(self._route(x, frozenset(), False, None),
                                               timeout)
        return outputs

    async def with_version(self, x: np.ndarray, timeout: float | None = None,
                           ) -> Tuple[Outputs, Hashable]:
        """``(outputs, version)``; the version is None when parts of the request were
        computed by different versions (a swap happened while it was served);
        ``timeout`` as for a call."""
        if timeout is None:
            return await self._route(x, frozenset(), True, None)
        timeout = check_timeout(timeout)
        return await within_deadline(self._route(x, frozenset(), True, None), timeout)

    async def _route(self, x, tried: frozenset, want_version: bool,
                     last: _ServerFailed | None) -> Tuple[Outputs, Hashable]:
        if type(x) is not np.ndarray:
            x = plain_array(x)  # a subclass's arithmetic never reaches a policy or server
        if not isinstance(x, np.ndarray) or x.ndim == 0:
            raise InputSpecError(f"a request must be a NumPy array [n, ...] with a batch "
                                 f"dimension, got {type(x).__name__} {np.shape(x)}")
        candidates = [n for n in self._names
                      if n not in tried and self.breakers[n].available()]
        if not candidates:
            if last is not None:
                raise last.error
            self._rejected += 1
            raise CircuitOpenError(self._no_server_message())
        choice = self.policy.assign(x, candidates, self._names, self.outstanding)
        if isinstance(choice, str):  # as the plain string it is (np.str_, a str Enum)
            choice = _plain(choice)
            self._check_choice((choice,), candidates)
            return await self._send_or_fail_over(choice, x, tried, want_version)
        # Grouped as Python strings: a NumPy string array would drop a name's trailing
        # NULs (and sorting one costs more than this loop). At most one name past the
        # elements is read: a policy's endless iterator is an error, not a hang.
        try:
            names_chosen = iter(choice)
        except TypeError:
            raise RuntimeError(
                f"the router's {type(self.policy).__name__} policy returned "
                f"{type(choice).__name__} {choice!r:.80}: it must return a server's name, "
                f"or one name for each element of the request") from None
        groups: Dict[str, List[int]] = {}
        count = 0
        for i, name in zip(range(len(x) + 1), names_chosen):
            if not isinstance(name, str):  # (a list is no key; an array no truth value)
                self._refuse_choice(name, candidates)
            groups.setdefault(_plain(name), []).append(i)
            count += 1
        if count != len(x):
            raise RuntimeError(f"the router's {type(self.policy).__name__} policy chose "
                               f"servers for {'more than ' if count > len(x) else ''}"
                               f"{min(count, len(x))} elements of a request of {len(x)}")
        self._check_choice(groups, candidates)
        # The parts in the order of the servers' names: the first one's structure is
        # the one the others must fit (whichever server took the request's first row).
        names = sorted(groups)  # (plain strings, checked)
        if len(names) <= 1:  # one server, or no element at all (any server answers it)
            name = names[0] if names else candidates[0]
            return await self._send_or_fail_over(name, x, tried, want_version)
        indices = [np.array(groups[name], np.intp) for name in names]
        parts = [self._start(self._send_or_fail_over(name, x[index], tried, want_version))
                 for name, index in zip(names, indices)]
        try:
            results = await asyncio.gather(*parts)
        except BaseException:
            for part in parts:  # the request failed (or its caller left): drop the rest
                part.cancel()
            raise
        parts = _one_structure(list(names), [r[0] for r in results])
        return (rows.assemble(parts, indices, len(x)),
                same_version([r[1] for r in results]))

    def _check_choice(self, names: Sequence[Any], candidates: Sequence[str]) -> None:
        """RuntimeError unless the policy chose among ``candidates``: a name it made up
        would fail over to the same choice again, without end."""
        for name in names:
            if name not in candidates:
                self._refuse_choice(name, candidates)

    def _refuse_choice(self, name: Any, candidates: Sequence[str]) -> NoReturn:
        raise RuntimeError(
            f"the router's {type(self.policy).__name__} policy chose {name!r:.80}, "
            f"which is not among the servers it may choose now: {candidates}")

    def _start(self, coro: Awaitable) -> asyncio.Task:
        """A task the router keeps a reference to until it ends (the loop holds tasks
        only weakly: an unreferenced one may be collected mid-flight)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _send_or_fail_over(self, name: str, x, tried: frozenset, want_version: bool):
        try:
            return await self._send(name, x, want_version)
        except _ServerFailed as failed:
            if not self.failover:
                raise failed.error from None
            return await self._route(x, tried | {name}, want_version, failed)

    async def _send(self, name: str, x, want_version: bool):
        entry = self._entries.get(name)
        if entry is None:  # a part of a split request started after remove_server
            raise _ServerFailed(name, ServerClosedError(
                f"server {name!r} was removed from the router"))
        breaker = entry.breaker
        permit = breaker.try_acquire()
        if permit is None:  # a part of a split request started after another request
            # took the half-open breaker's last probe: route that part elsewhere
            raise _ServerFailed(name, CircuitOpenError(
                f"server {name!r}: its circuit breaker admits no more requests now"))
        entry.outstanding += 1
        entry.requests += 1
        self.outstanding[name] = entry.outstanding
        before = cancellations()
        sent = time.perf_counter()
        try:
            if want_version:
                outputs, version = await evaluate_with_version(entry.evaluate, x)
            else:  # evaluated: a model given for a server is named as such
                outputs, version = await evaluated(entry.evaluate, x), None
            # Checked here, where a wrong answer still counts against its server.
            outputs = _one_row_each(name, outputs, len(x))
        except BaseException as e:
            if isinstance(e, Exception) and self._is_failure(e):
                breaker.record(permit, ok=False, error=e)  # a batch's requests: once
                entry.failures += 1
                raise _ServerFailed(name, e) from e
            if deadline_passed(e):
                if entry.had_a_fair_chance(time.perf_counter() - sent, min(
                        (e.usual_s for e in self._entries.values()
                         if e.usual_s is not None), default=None)):
                    breaker.record(permit, ok=False, error=RequestTimeoutError(
                        f"server {name!r} did not answer within the request's deadline"))
                    entry.failures += 1
                else:  # a deadline too short for any server: the caller's doing
                    breaker.release(permit)
                raise
            if _raised_by_server(e, before):  # not the caller's cancellation: its fault
                error = deliverable(e)
                breaker.record(permit, ok=False, error=error)
                entry.failures += 1
                raise _ServerFailed(name, error) from e
            breaker.release(permit)
            raise
        else:
            breaker.record(permit, ok=True)
            entry.answered(time.perf_counter() - sent)
            return outputs, version
        finally:
            entry.outstanding -= 1
            if self._entries.get(name) is entry:  # not a server added since under name
                self.outstanding[name] = entry.outstanding

    def _no_server_message(self) -> str:
        if not self._names:
            return "the router has no servers: add one with add_server(name, evaluate)"
        states = ", ".join(
            f"{n}: " + ("half_open, its probes in flight"
                        if self.breakers[n].state is BreakerState.HALF_OPEN
                        else self.breakers[n].state.value) for n in self._names)
        return (f"no server's circuit breaker admits a request now ({states}); a breaker "
                f"admits a probe {self.breaker_policy.reset_timeout} s after it opened")

    # -- versions ---------------------------------------------------------------------
    @property
    def swap_token(self) -> tuple | None:
        """What identifies the models behind the router beyond their labels: each
        server's ``cache.swap_token`` (its model object, or a client's token), so that a
        cache in front sees every swap, even one that keeps the label. None while a
        server does not know its version yet (a client before its server's first
        word). A server that reports no version at all stands for one constant: its
        answers are labelled None (unknown), and a cache never stores those.

        Raises:
            TypeError: a server labels its answers (``with_version`` or ``version``)
                but has no ``swap_token`` (nothing says when its labels stop meaning
                one model), or no server reports a version (nothing could be cached).
        """
        tokens = []
        for name, evaluate in self.servers.items():
            if reports_swaps(evaluate):
                token = swap_token(evaluate)
                if token is None:
                    return None
                tokens.append(token)
            elif labels_answers(evaluate):
                raise TypeError(
                    f"server {name!r} ({type(evaluate).__name__}) labels its answers with "
                    f"a version but reports no swap_token: a cache in front of the router "
                    f"cannot tell when its model changes; give it a swap_token (an object "
                    f"that changes at every swap)")
            else:
                tokens.append(_UNVERSIONED)
        if tokens and all(t is _UNVERSIONED for t in tokens):
            raise TypeError(
                f"no server of the router reports a model version "
                f"({', '.join(self._names)}): a cache in front could not tell when a "
                f"model changes; serve them with asr.serve, or pass fixed_model=True "
                f"to the cache if their models never change")
        return tuple(tokens)

    @property
    def version(self) -> Hashable:
        """The model version of the servers that declare one, when they agree; else
        None."""
        versions = [version_of(e) for e in self.servers.values()
                    if isinstance(e, Versioned)]
        return same_version(versions) if versions else None

    def update_model(self, model_or_weights: Any, version: Hashable) -> None:
        """``update_model`` on every server (each swaps between its own batches).

        Every server checks the update and makes its new model first (its
        ``prepare_update``, as ``asr.serve``'s servers and routers have), and only then
        do all swap: a server that refuses it (closed, another input spec, weights that
        do not fit) leaves every server on the model it had.

        Raises:
            TypeError: a server has no ``update_model``, or an ``async`` one (this call
                cannot await it).
            What a server's check raises (its message names the server).
            In each case no server was updated.
        """
        self.prepare_update(model_or_weights, version)()

    def prepare_update(self, model_or_weights: Any, version: Hashable,
                       ) -> Callable[[], None]:
        """Every server's check of ``update_model`` and its new model made, without the
        swap: returns the swap (so that a router routing to routers swaps none of them
        until each has checked).

        Raises:
            what ``update_model`` raises; nothing has changed then.
        """
        swaps, unchecked = [], []
        for name, evaluate in self.servers.items():
            prepare = getattr(evaluate, "prepare_update", None)
            if prepare is None:
                update = getattr(evaluate, "update_model", None)
                if update is None or is_async(update):
                    raise TypeError(f"server {name!r} ({type(evaluate).__name__}) has no "
                                    f"update_model" + (" that can be called without an "
                                    f"await (it is async)" if update is not None else "")
                                    + ": serve it with asr.serve; no server was updated")
                unchecked.append(update)
                continue
            try:
                swaps.append(prepare(model_or_weights, version))
            except Exception as e:
                named = _naming(e, f"server {name!r} refused the update, so no server "
                                   f"was updated")
                if named is e:
                    raise
                raise named from e

        def swap() -> None:
            for each in swaps:
                each()
            for update in unchecked:  # servers that cannot check first: last
                update(model_or_weights, version)

        return swap

    @property
    def stats(self) -> dict:
        """Per server: requests, failures, outstanding and its breaker's stats, since it
        was added (a server removed and added again starts from zero); rejected
        (requests refused because every breaker was open); and parts_in_flight (parts
        of split requests being served now)."""
        return {
            "servers": {n: {"requests": e.requests, "failures": e.failures,
                            "outstanding": e.outstanding, "breaker": e.breaker.stats}
                        for n, e in self._entries.items()},
            "rejected": self._rejected,
            "parts_in_flight": len(self._tasks),
        }


def _naming(error: Exception, said: str) -> Exception:
    """``error`` again, of its type, with ``said`` before its message (itself, with
    ``said`` as a note, when its type takes no message)."""
    try:
        renamed = type(error)(f"{said}: {error}")
        renamed.__dict__.update(error.__dict__)  # its attributes (a status) kept
    except Exception:  # noqa: BLE001 - a type with other arguments, or slots
        add_note(error, said)
        return error
    return renamed


#: Whether this Python counts a task's pending cancellations (3.11+).
_COUNTS_CANCELLATIONS = hasattr(asyncio.Task, "cancelling")


def _raised_by_server(error: BaseException, before: int) -> bool:
    """Whether ``error`` is a CancelledError that a server raised while nothing
    cancelled the routing task (its pending cancellations still ``before``, as when
    the request was sent; Python 3.11+ counts them, 3.10 cannot tell and says no): it
    would read as the caller's own cancellation."""
    if not isinstance(error, asyncio.CancelledError):
        return False
    return _COUNTS_CANCELLATIONS and cancellations() == before


def _one_row_each(name: str, outputs: Outputs, size: int) -> Outputs:
    """``outputs`` (plain, as a server delivers them) when they hold one row per element
    of a request of ``size``; else ModelOutputError naming the server."""
    if type(outputs) is not np.ndarray or not outputs.dtype.isnative:
        outputs = rows.plain(outputs)  # a list of outputs is a tuple, not rows; native
    try:
        rows.check_count(outputs, size)
    except ModelOutputError as e:
        raise ModelOutputError(f"server {name!r} answered a request of {size} elements "
                               f"with {_described(outputs)}: {e}") from None
    return outputs


def _described(outputs: Any) -> str:
    """What a server answered, for an error message: its type and shapes."""
    if isinstance(outputs, np.ndarray):
        return f"an array of shape {list(outputs.shape)}"
    if isinstance(outputs, (tuple, dict)):
        shapes = {k: list(np.shape(v)) for k, v in rows.labelled_leaves(outputs)}
        return f"a {type(outputs).__name__} of shapes {shapes}"
    return f"a {type(outputs).__name__}"


def _one_structure(names: Sequence[str], parts: Sequence[Outputs]) -> List[Outputs]:
    """The parts of a split request made to fit the first one's structure, as the
    serving core makes a batch fit the first batch's (``rows.check``: a dtype of the same
    kind is cast when the cast keeps the values); ModelOutputError naming both servers'
    parts when one cannot (assembling them would cast or broadcast silently)."""
    first = names[0]
    structure = None
    fitted = []
    for name, part in zip(names, parts):
        try:
            part, structure = rows.check(part, structure,
                                         expected_from=f"server {first!r}'s part")
        except ModelOutputError as e:
            raise ModelOutputError(
                f"the servers answered the parts of one request differently: server "
                f"{name!r}'s part: {e}") from None
        fitted.append(part)
    return fitted
