"""What keeps an HTTP front responsive under hostile or careless clients.

- ``HttpLimits``: the bounds, with their defaults, in one frozen table.
- ``ConnectionLimiter`` and ``LimitedSite``: a cap on open connections, enforced where
  connections are accepted. At the cap, a new connection closes the connection that has
  been idle longest (no request in progress: keep-alive, headers still trickling in, or
  an answer the client is not taking); when every connection is busy it is answered
  503 and closed. A connection whose request has arrived is busy before it
  reaches the front's handlers: bytes not read yet, or a request read whole that waits
  for the handlers (a burst of connections, each with its request, closed some of
  them unanswered as "idle"). An idle connection that has sent nothing yet is closed
  with a 503 rather than silently (in a burst, each newcomer closed the one accepted
  just before it, whose request was on its way: that client read an end with no
  answer). File descriptors stay bounded whatever clients do (``connection_cap`` keeps
  the front's own and its codec workers' out of the connections' share), and a flood
  of idle connections cannot lock out a client with a real request.
- Answers a client does not take: every byte of an answer that the socket has not
  taken counts as unsent (a transport's write buffer has no low-water slack here), a
  connection whose client takes no byte for ``write_timeout`` is dropped, and an answer
  that would bring the unsent bytes of all connections over ``max_unsent_bytes`` is
  refused with 503 before it is written. A client that never reads cannot pin the
  server's memory: what it holds is bounded, and returned within ``write_timeout``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import struct
from typing import Any, Callable

from aiohttp import web

from async_search.http.error_responses import adopt
from async_search.http.kserve import error_body
from async_search.machine import open_file_limit, usable_cpus

try:  # how many bytes a socket has received that are not read yet
    from fcntl import ioctl
    from termios import FIONREAD
except ImportError:  # pragma: no cover - not on this platform: such bytes go unseen
    ioctl = FIONREAD = None


@dataclasses.dataclass(frozen=True)
class HttpLimits:
    """Bounds on what clients may hold or send; every one has a ``python -m
    async_search.http`` flag of the same name.

    Attributes:
        max_json_bytes: the largest JSON part of an inference body (the whole body, or
            the header of a binary-tensor body), and the largest load or unload body,
            1 MiB; larger ones get 413. JSON costs about 20 bytes and a microsecond of
            parsing per value: send large tensors with the binary tensor extension,
            which is bounded by ``max_body_bytes``.
            (Measured on 2 cores: with 3 clients sending JSON bodies near the bound
            back to back, small requests' p99 stayed at 65 ms with 1 MiB; at 4 MiB
            it was 170-270 ms, the parsing starving everything else of CPU.)
        max_connections: open connections at once, 512, and never more than half of
            what the process's open-file limit (``ulimit -n``) leaves after the
            descriptors the front needs for itself and its codec workers
            (``connection_cap``): the other half answers refused connections. At the
            cap the longest-idle connection is closed for a new one (with a 503 if it
            has sent nothing yet); if none is idle the new one gets 503.
        keepalive_timeout: seconds a connection may stay open with no request in
            progress (between requests, or before its request line and headers have
            all arrived), 5.0; then it is closed.
        read_timeout: seconds a request's body may take to arrive, in all, 30.0; then
            the request gets 408 and its connection is closed.
        shutdown_timeout: seconds that requests in progress get to finish when the
            front closes (SIGTERM), 5.0: each gets its answer within it or a 503 that
            says the server is stopping. Bodies still arriving, and requests that
            arrive meanwhile, get that 503 at once.
        write_timeout: seconds a client may take no byte of an answer, 30.0; then its
            connection is dropped (and the answer's memory returned). A slow client
            that keeps taking bytes is not dropped.
        max_unsent_bytes: the most bytes of answers that clients have not taken yet,
            over all connections, 256 MiB; an answer that would go over is refused
            with 503 (retry shortly) before it is written. An answer held for a client
            counts with the copy of its unsent part in the socket's write buffer (and
            twice its size when it is admitted), so the bound is on memory.
        offload_bytes: JSON parts of at least this many bytes (256 KiB) are decoded in
            a worker process; JSON responses of at least ``offload_bytes // 16`` values
            are encoded there.
        offload_workers: worker processes for that, half the CPUs (at least 1),
            leaving the rest to the loop and the model; started on first use.
        max_workers: the most ``num_workers`` a load request may ask for; None: 4 per
            CPU (applies to the repository the front makes itself).
    """

    max_json_bytes: int = 2 ** 20
    max_connections: int = 512
    keepalive_timeout: float = 5.0
    read_timeout: float = 30.0
    shutdown_timeout: float = 5.0
    write_timeout: float = 30.0
    max_unsent_bytes: int = 256 * 2 ** 20
    offload_bytes: int = 256 * 2 ** 10
    offload_workers: int = dataclasses.field(
        default_factory=lambda: max(1, usable_cpus() // 2))
    max_workers: int | None = None

    def __post_init__(self):
        for name in ("max_json_bytes", "max_connections", "max_unsent_bytes",
                     "offload_bytes", "offload_workers"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("keepalive_timeout", "read_timeout", "shutdown_timeout",
                     "write_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 < value < float("inf")):
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.max_workers is not None and (type(self.max_workers) is not int or
                                             self.max_workers < 1):
            raise ValueError(f"max_workers must be an integer >= 1 or None, got "
                             f"{self.max_workers!r}")


#: How long a refused connection is kept open, reading and dropping what its client
#: sends, so that its 503 is read: one closed with bytes unread is reset, and the
#: client may lose the answer.
_REFUSAL_LINGER_S = 2.0
#: Descriptors the front keeps whatever clients do: stdio, the loop's, the listening
#: socket, the model's (about 16 in all), one being accepted and a codec worker being
#: started (its pipes, 6 for a moment).
FRONT_DESCRIPTORS = 24
#: Descriptors each codec worker holds: its stdin and stdout pipes.
WORKER_DESCRIPTORS = 2

_REFUSAL_BODY = error_body("the server has too many open connections and none is idle; "
                           "retry shortly")
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
            % len(_REFUSAL_BODY)) + _REFUSAL_BODY


class _Guarded(asyncio.Protocol):
    """One connection: admitted by the limiter, then passed to aiohttp's handler."""

    def __init__(self, handler: asyncio.Protocol, limiter: "ConnectionLimiter"):
        if limiter.handler_class is not None:
            adopt(handler, limiter.handler_class)
        self.handler: asyncio.Protocol | None = handler
        self.limiter = limiter
        self.transport: asyncio.Transport | None = None
        self.served = False  # has a request reached the front's handlers
        self.heard = False   # has the client sent any byte
        self.answer_bytes = 0  # the size of the answer last written (see answering)
        self._first_request: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        if not self.limiter.admit(self):
            self.handler = None
            self.limiter.refuse(self)
            return
        # Every byte the socket does not take counts as unsent (pause at once, resume
        # when all is out): the limiter then sees each connection that holds unsent
        # answer bytes, and aiohttp's writer waits for the client before writing more.
        try:
            transport.set_write_buffer_limits(high=0)
        except (AttributeError, NotImplementedError):  # pragma: no cover - odd loops
            pass
        # aiohttp's keep-alive timer covers the time between requests; this one covers
        # a connection that never completes a first request, whatever aiohttp's version.
        if self.limiter.first_request_timeout is not None:
            self._first_request = asyncio.get_running_loop().call_later(
                self.limiter.first_request_timeout, self._no_first_request)
        self.handler.connection_made(transport)

    def detach(self) -> None:
        """Lets aiohttp's handler go, the socket kept (to be refused): what the client
        sends from now on is dropped."""
        handler, self.handler = self.handler, None
        # Its clean-up would close the socket (a 503 then unread, reset): it lets go
        # of it first, after its start task has run (accepted in this loop turn, it
        # may not have yet).
        handler.transport = None
        asyncio.get_running_loop().call_soon(handler.connection_lost, None)
        if self._first_request is not None:
            self._first_request.cancel()
            self._first_request = None

    def _no_first_request(self) -> None:
        if not self.served and self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if self._first_request is not None:
            self._first_request.cancel()
        handler, self.handler = self.handler, None
        if handler is not None:
            self.limiter.release(self)
            handler.connection_lost(exc)
        else:
            self.limiter.refused_closed(self)

    def data_received(self, data: bytes) -> None:
        self.heard = True
        if self.handler is not None:  # else refused: what it sends is dropped
            self.handler.data_received(data)
            if self.request_waiting():
                self.limiter.waiting(self)

    def request_waiting(self) -> bool:
        """Whether aiohttp has read a whole request (line and headers) of this
        connection that has not gone to the front's handlers yet."""
        return bool(getattr(self.handler, "_messages", None))

    def eof_received(self):
        return self.handler.eof_received() if self.handler is not None else None

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.limiter.stalled(self)
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.limiter.flowing(self)
            self.handler.resume_writing()


def _spare_descriptors(workers: int) -> int | None:
    """What the open-file limit leaves for connections, after the front's own
    descriptors and those of ``workers`` codec workers (None: no limit)."""
    limit = open_file_limit()
    if limit is None:
        return None
    return limit - FRONT_DESCRIPTORS - WORKER_DESCRIPTORS * workers


def connection_cap(max_connections: int, workers: int = 0) -> int:
    """``max_connections``, lowered where the open-file limit is lower: connections get
    half of the descriptors left after the front's own and its ``workers`` codec
    workers' (at least 1), refused connections being answered the other half
    (``refusal_cap``). Half of ``ulimit -n`` alone left a front at ``ulimit -n 32``
    no descriptor to start a codec worker with."""
    spare = _spare_descriptors(workers)
    return max_connections if spare is None else max(1, min(max_connections,
                                                            spare // 2))


def refusal_cap(max_connections: int, workers: int = 0) -> int:
    """How many refused connections may stay open at once to have their 503 read: the
    descriptors left beside ``connection_cap``'s (``max_connections`` where there is
    no open-file limit)."""
    spare = _spare_descriptors(workers)
    cap = connection_cap(max_connections, workers)
    return cap if spare is None else max(0, spare - cap)


class _Stall:
    """A connection with unsent bytes: when its client last took some, how many were
    left then, and the size of the answer it holds meanwhile (aiohttp keeps the whole
    answer until the socket has taken its last byte)."""

    __slots__ = ("since", "unsent", "answer")

    def __init__(self, since: float, unsent: int, answer: int):
        self.since = since
        self.unsent = unsent
        self.answer = answer


class ConnectionLimiter:
    """Counts open connections, knows which are idle, and enforces ``max_connections``,
    ``write_timeout`` and ``max_unsent_bytes``.

    The front marks a connection busy while a request is in its handlers (``busy`` and
    ``idle``, keyed by the request's transport). A connection is busy too from the
    moment its request has arrived: while bytes it received are not read yet, and once
    aiohttp has read a whole request of it (``waiting``) until that request reaches the
    handlers. Every other open connection is idle.
    A connection whose socket has not taken all of an answer is stalled until it has:
    a stalled connection whose client takes no byte for ``write_timeout`` is dropped
    (aborted: its unsent bytes are freed at once), and ``admit_answer`` refuses an
    answer that would bring the unsent bytes of all connections over
    ``max_unsent_bytes``.

    Args:
        max_connections: the cap.
        first_request_timeout: seconds a new connection has to get its first request
            to the front's handlers before it is closed (None: no limit).
        write_timeout: seconds a client may take no byte of an answer before its
            connection is dropped (None: no limit).
        max_unsent_bytes: the bound of ``admit_answer`` (None: no bound).
        handler_class: what aiohttp's handlers are retyped to
            (``error_responses.error_handler_class``; None: left as they are).
        max_lingering: refused connections kept open at once while their clients read
            the 503 (at most ``_REFUSAL_LINGER_S`` each); beyond, one is closed at once
            (None: ``max_connections``).
        on_event: called with ``"refused"``, ``"evicted"`` or ``"write_timeout"`` each
            time a connection is refused at the cap or closed for that reason.

    Attributes:
        refused: connections answered 503 because every open one was busy.
        evicted: idle connections closed to make room for a new one.
        write_timeouts: connections dropped for taking no byte for ``write_timeout``.
    """

    def __init__(self, max_connections: int, first_request_timeout: float | None = None,
                 *, write_timeout: float | None = None,
                 max_unsent_bytes: int | None = None, handler_class: type | None = None,
                 max_lingering: int | None = None,
                 on_event: Callable[[str], None] | None = None):
        self.max_connections = max_connections
        self.max_lingering = max_connections if max_lingering is None else max_lingering
        self.first_request_timeout = first_request_timeout
        self.write_timeout = write_timeout
        self.max_unsent_bytes = max_unsent_bytes
        self.handler_class = handler_class
        self.refused = 0
        self.evicted = 0
        self.write_timeouts = 0
        self._on_event = on_event
        self._idle: collections.OrderedDict = collections.OrderedDict()  # oldest first
        self._busy: dict = {}          # guard -> requests in progress on it
        self._waiting: set = set()     # guards with a request read, not yet in _busy
        self._by_transport: dict = {}
        self._stalled: dict = {}       # guard -> _Stall, while it holds unsent bytes
        self._lingering: dict = {}     # refused guard -> the timer that closes it
        self._watch: asyncio.TimerHandle | None = None

    @property
    def open(self) -> int:
        """Connections open now."""
        return len(self._idle) + len(self._busy) + len(self._waiting)

    @property
    def busy_connections(self) -> int:
        """Open connections with a request in progress (or read, waiting for the
        handlers)."""
        return len(self._busy) + len(self._waiting)

    @property
    def stalled_connections(self) -> int:
        """Open connections holding bytes of an answer that their socket has not taken."""
        return len(self._stalled)

    @property
    def unsent_bytes(self) -> int:
        """Bytes held for answers that clients have not taken yet: each such answer,
        and the copy of its unsent part in the socket's write buffer."""
        return sum(stall.answer + _unsent(guard)
                   for guard, stall in self._stalled.items())

    def protocol_factory(self, make_handler: Callable[[], asyncio.Protocol]):
        """A protocol factory for ``loop.create_server`` that guards ``make_handler``'s
        protocols."""
        return lambda: _Guarded(make_handler(), self)

    def busy(self, transport: Any) -> Any:
        """Mark the connection of ``transport`` busy; returns a token for ``idle``."""
        guard = self._by_transport.get(transport)
        if guard is not None:
            guard.served = True
            self._idle.pop(guard, None)
            self._waiting.discard(guard)
            self._busy[guard] = self._busy.get(guard, 0) + 1
        return guard

    def idle(self, guard: Any) -> None:
        """The request that ``busy`` returned ``guard`` for is done."""
        count = self._busy.get(guard)
        if count is None:
            return
        if count > 1:
            self._busy[guard] = count - 1
        else:
            del self._busy[guard]
            if guard.request_waiting():  # pipelined: the next one is read already
                self._waiting.add(guard)
            else:
                self._idle[guard] = None

    def waiting(self, guard: _Guarded) -> None:
        """A whole request of ``guard``'s connection was read: busy until it reaches
        the handlers (``busy``), never evicted meanwhile."""
        if guard in self._idle:
            del self._idle[guard]
            self._waiting.add(guard)

    def admit(self, guard: _Guarded) -> bool:
        """Count a new connection in, closing the oldest idle ones to make room; False
        (and counted as refused) when every open connection is busy. An idle one with
        received bytes not read yet is busy: its request may be whole (a burst of
        connections is accepted before any is read). One that has sent nothing yet is
        answered 503 as it is closed: its request may be on its way."""
        for oldest in list(self._idle) if self.open >= self.max_connections else ():
            if self.open < self.max_connections:
                break
            if _unread(oldest):
                continue
            del self._idle[oldest]
            self._by_transport.pop(oldest.transport, None)
            self._stalled.pop(oldest, None)
            self.evicted += 1
            self._event("evicted")
            if not (oldest.served or oldest.heard):
                # Nothing sent yet: a client whose request may be on its way (a burst
                # is accepted before any is read). Answered 503, it knows to retry;
                # closed, it would read an end with no answer.
                oldest.detach()
                self.refuse(oldest)
                continue
            # Aborted, not closed: a close waits for unsent bytes that an idle client
            # may never take, and would keep the descriptor and the bytes meanwhile.
            oldest.transport.abort()  # its connection_lost comes later: uncounted now
        if self.open >= self.max_connections:
            self.refused += 1
            self._event("refused")
            return False
        self._idle[guard] = None
        self._by_transport[guard.transport] = guard
        return True

    def refuse(self, guard: _Guarded) -> None:
        """Answer a connection that was not admitted 503 and close it. It lingers a
        while first (within ``max_lingering``): its write side is shut after the 503
        and what its client sends is dropped until the client closes. Closed at once,
        a socket with its request's bytes unread (or arriving after) is reset, and the
        client may read the reset rather than the 503."""
        transport = guard.transport
        transport.write(_REFUSAL)
        if len(self._lingering) >= self.max_lingering or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._lingering[guard] = asyncio.get_running_loop().call_later(
            _REFUSAL_LINGER_S, transport.abort)

    def refused_closed(self, guard: _Guarded) -> None:
        """A refused connection is closed."""
        timer = self._lingering.pop(guard, None)
        if timer is not None:
            timer.cancel()

    def release(self, guard: _Guarded) -> None:
        """Count a closed connection out."""
        self._idle.pop(guard, None)
        self._busy.pop(guard, None)
        self._waiting.discard(guard)
        self._stalled.pop(guard, None)
        if self._by_transport.get(guard.transport) is guard:
            del self._by_transport[guard.transport]

    # -- answers the clients have not taken ----------------------------------------
    def admit_answer(self, size: int) -> bool:
        """Whether an answer of ``size`` bytes may be written: the unsent bytes of every
        connection, with twice ``size`` (the answer and a copy of it in a write buffer),
        stay within ``max_unsent_bytes``."""
        bound = self.max_unsent_bytes
        if bound is None:
            return True
        return 2 * size <= bound and (not self._stalled or
                                      self.unsent_bytes + 2 * size <= bound)

    @staticmethod
    def answering(guard: Any, size: int) -> None:
        """The connection that ``busy`` returned ``guard`` for is about to be written an
        answer of ``size`` bytes (held while its socket has not taken it all)."""
        if guard is not None:
            guard.answer_bytes = size

    def stalled(self, guard: _Guarded) -> None:
        """The socket of ``guard`` did not take all of an answer (writing paused)."""
        if guard.transport is None:
            return
        loop = asyncio.get_running_loop()
        self._stalled[guard] = _Stall(loop.time(), _unsent(guard), guard.answer_bytes)
        if self._watch is None and self.write_timeout is not None:
            self._watch = loop.call_later(self._tick, self._check_writes)

    def flowing(self, guard: _Guarded) -> None:
        """The socket of ``guard`` took every byte (writing resumed)."""
        self._stalled.pop(guard, None)
        guard.answer_bytes = 0

    @property
    def _tick(self) -> float:
        return max(0.02, min(1.0, self.write_timeout / 10))

    def _check_writes(self) -> None:
        """Drop each stalled connection whose client took no byte for write_timeout."""
        self._watch = None
        now = asyncio.get_running_loop().time()
        for guard, stall in list(self._stalled.items()):
            unsent = _unsent(guard)
            if unsent < stall.unsent:  # the client took bytes since the last look
                stall.since = now
            stall.unsent = unsent
            if now - stall.since >= self.write_timeout:
                del self._stalled[guard]
                self.write_timeouts += 1
                self._event("write_timeout")
                guard.transport.abort()  # frees the unsent bytes now; no close wait
        if self._stalled:
            self._watch = asyncio.get_running_loop().call_later(self._tick,
                                                                self._check_writes)

    def close(self) -> None:
        """Stop watching writes and close the refused connections still lingering (the
        front is closed)."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        for guard, timer in list(self._lingering.items()):
            timer.cancel()
            guard.transport.abort()
        self._lingering.clear()

    def _event(self, kind: str) -> None:
        if self._on_event is not None:
            self._on_event(kind)


def _unsent(guard: _Guarded) -> int:
    return guard.transport.get_write_buffer_size() if guard.transport is not None else 0


def _unread(guard: _Guarded) -> int:
    """Bytes that ``guard``'s socket has received and the loop has not read yet (0
    where the platform cannot tell)."""
    sock = guard.transport.get_extra_info("socket") if guard.transport else None
    if sock is None or ioctl is None:
        return 0
    try:
        return struct.unpack("i", ioctl(sock.fileno(), FIONREAD, b"\0" * 4))[0]
    except (OSError, ValueError):  # closed meanwhile
        return 0


_ACCEPT_ERROR = "socket.accept() out of system resource"
#: The most often asyncio's accept error is logged.
_ACCEPT_LOG_S = 10.0


class _AcceptErrors:
    """The loop's exception handler while a site serves: asyncio's selector loop logs
    ``socket.accept() out of system resource`` (out of descriptors) once per connection
    it tries to accept in one turn, and retries that many times a second later (33,717
    tracebacks in 12 s at ``ulimit -n 32``): one such line per ``_ACCEPT_LOG_S`` goes on
    to the handler it replaces, naming the open-file limit. uvloop logs none."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.previous = loop.get_exception_handler()
        self.logged: float | None = None  # when the last one was
        self.dropped = 0
        loop.set_exception_handler(self)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if context.get("message") == _ACCEPT_ERROR:
            now = loop.time()
            if self.logged is not None and now - self.logged < _ACCEPT_LOG_S:
                self.dropped += 1
                return
            self.logged = now
            since = f", {self.dropped} more since the last" if self.dropped else ""
            context = {**context, "message": (
                f"{_ACCEPT_ERROR}: the process is at its open-file limit (ulimit -n "
                f"{open_file_limit()}); logged once per {_ACCEPT_LOG_S:g} s{since}")}
            self.dropped = 0
        if self.previous is None:
            loop.default_exception_handler(context)
        else:
            self.previous(loop, context)

    def restore(self) -> None:
        """Takes this handler out of the loop's chain, wherever it is in it (fronts of
        one loop stop in any order)."""
        handler = self.loop.get_exception_handler()
        if handler is self:
            self.loop.set_exception_handler(self.previous)
            return
        while isinstance(handler, _AcceptErrors):  # installed after this one: unlinked
            if handler.previous is self:
                handler.previous = self.previous
                return
            handler = handler.previous


class LimitedSite(web.BaseSite):
    """A TCP site whose connections pass through a ``ConnectionLimiter``."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 limiter: ConnectionLimiter, backlog: int = 128):
        super().__init__(runner, backlog=backlog)
        self._host, self._port = host, port
        self._limiter = limiter
        self._accept_errors: _AcceptErrors | None = None

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._limiter.protocol_factory(self._runner.server), self._host, self._port,
            backlog=self._backlog)
        self._accept_errors = _AcceptErrors(loop)

    async def stop(self) -> None:
        if self._accept_errors is not None:
            self._accept_errors.restore()
            self._accept_errors = None
        await super().stop()
