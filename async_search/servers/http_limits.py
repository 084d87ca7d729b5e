"""What keeps an HTTP front responsive under hostile or careless clients.

- ``HttpLimits``: the bounds, with their defaults, in one frozen table.
- ``ConnectionLimiter`` and ``LimitedSite``: a cap on open connections, enforced where
  connections are accepted. At the cap, a new connection closes the connection that has
  been idle longest (no request in progress: keep-alive, or headers still trickling in);
  when every connection is busy it is answered 503 and closed at once. File descriptors
  stay bounded whatever clients do, and a flood of idle connections cannot lock out a
  client with a real request.
- ``CodecPool``: worker processes that decode large JSON bodies and encode large JSON
  responses. A thread would not help: ``json`` and NumPy's list conversion hold the GIL
  for the whole call (a 16 MiB body takes about half a second), so only another process
  keeps the event loop free for small requests meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import pickle
import signal
import struct
import sys
from typing import Any, Callable

from aiohttp import web

from async_search.errors import ProtocolError
from async_search.servers.kserve import error_body

__all__ = ["HttpLimits", "ConnectionLimiter", "LimitedSite", "CodecPool",
           "connection_cap"]


@dataclasses.dataclass(frozen=True)
class HttpLimits:
    """Bounds on what clients may hold or send; every one has a ``python -m
    async_search.http`` flag of the same name.

    Attributes:
        max_json_bytes: the largest JSON part of an inference body (the whole body, or
            the header of a binary-tensor body), 1 MiB; larger ones get 413. JSON costs
            about 20 bytes and a microsecond of parsing per value: send large tensors
            with the binary tensor extension, which is bounded by ``max_body_bytes``.
            (Measured on 2 cores: with 3 clients sending JSON bodies near the bound
            back to back, small requests' p99 stayed at 65 ms with 1 MiB; at 4 MiB
            it was 170-270 ms, the parsing starving everything else of CPU.)
        max_connections: open connections at once, 512, and never more than half the
            process's open-file limit (``ulimit -n``), so that connections cannot use
            up the descriptors the server needs for itself. At the cap the longest-idle
            connection is closed for a new one; if none is idle the new one gets 503.
        keepalive_timeout: seconds a connection may stay open with no request in
            progress (between requests, or before its request line and headers have
            all arrived), 5.0; then it is closed.
        read_timeout: seconds a request's body may take to arrive, in all, 30.0; then
            the request gets 408 and its connection is closed.
        shutdown_timeout: seconds that requests in progress get to finish when the
            front closes, 5.0; then they are cancelled. Bodies still arriving are cut
            short at once (503).
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
    offload_bytes: int = 256 * 2 ** 10
    offload_workers: int = dataclasses.field(
        default_factory=lambda: max(1, (os.cpu_count() or 2) // 2))
    max_workers: int | None = None

    def __post_init__(self):
        for name in ("max_json_bytes", "max_connections", "offload_bytes",
                     "offload_workers"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("keepalive_timeout", "read_timeout", "shutdown_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 < value < float("inf")):
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.max_workers is not None and (type(self.max_workers) is not int or
                                             self.max_workers < 1):
            raise ValueError(f"max_workers must be an integer >= 1 or None, got "
                             f"{self.max_workers!r}")


_REFUSAL_BODY = error_body("the server has too many open connections and none is idle; "
                           "retry shortly")
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
            % len(_REFUSAL_BODY)) + _REFUSAL_BODY


class _Guarded(asyncio.Protocol):
    """One connection: admitted by the limiter, then passed to aiohttp's handler."""

    def __init__(self, handler: asyncio.Protocol, limiter: "ConnectionLimiter"):
        self.handler: asyncio.Protocol | None = handler
        self.limiter = limiter
        self.transport: asyncio.Transport | None = None
        self.served = False  # has a request reached the front's handlers
        self._first_request: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        if not self.limiter.admit(self):
            self.handler = None
            transport.write(_REFUSAL)
            transport.close()
            return
        # aiohttp's keep-alive timer covers the time between requests; this one covers
        # a connection that never completes a first request, whatever aiohttp's version.
        if self.limiter.first_request_timeout is not None:
            self._first_request = asyncio.get_running_loop().call_later(
                self.limiter.first_request_timeout, self._no_first_request)
        self.handler.connection_made(transport)

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

    def data_received(self, data: bytes) -> None:
        if self.handler is not None:
            self.handler.data_received(data)

    def eof_received(self):
        return self.handler.eof_received() if self.handler is not None else None

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()


def connection_cap(max_connections: int) -> int:
    """``max_connections``, lowered to half the open-file limit where that is lower."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return max_connections
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return max_connections
    return max(1, min(max_connections, soft // 2))


class ConnectionLimiter:
    """Counts open connections, knows which are idle, and enforces ``max_connections``.

    The front marks a connection busy while a request is in its handlers (``busy`` and
    ``idle``, keyed by the request's transport); every other open connection is idle.

    Args:
        max_connections: the cap.
        first_request_timeout: seconds a new connection has to get its first request
            to the front's handlers before it is closed (None: no limit).

    Attributes:
        refused: connections answered 503 because every open one was busy.
        evicted: idle connections closed to make room for a new one.
    """

    def __init__(self, max_connections: int, first_request_timeout: float | None = None):
        self.max_connections = max_connections
        self.first_request_timeout = first_request_timeout
        self.refused = 0
        self.evicted = 0
        self._idle: collections.OrderedDict = collections.OrderedDict()  # oldest first
        self._busy: dict = {}          # guard -> requests in progress on it
        self._by_transport: dict = {}

    @property
    def open(self) -> int:
        """Connections open now."""
        return len(self._idle) + len(self._busy)

    @property
    def busy_connections(self) -> int:
        """Open connections with a request in progress."""
        return len(self._busy)

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
            self._idle[guard] = None

    def admit(self, guard: _Guarded) -> bool:
        """Count a new connection in, closing the oldest idle ones to make room; False
        (and counted as refused) when every open connection is busy."""
        while self.open >= self.max_connections and self._idle:
            oldest, _ = self._idle.popitem(last=False)
            self._by_transport.pop(oldest.transport, None)
            self.evicted += 1
            oldest.transport.close()  # its connection_lost comes later: already uncounted
        if self.open >= self.max_connections:
            self.refused += 1
            return False
        self._idle[guard] = None
        self._by_transport[guard.transport] = guard
        return True

    def release(self, guard: _Guarded) -> None:
        """Count a closed connection out."""
        self._idle.pop(guard, None)
        self._busy.pop(guard, None)
        if self._by_transport.get(guard.transport) is guard:
            del self._by_transport[guard.transport]


class LimitedSite(web.BaseSite):
    """A TCP site whose connections pass through a ``ConnectionLimiter``."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 limiter: ConnectionLimiter, backlog: int = 128):
        super().__init__(runner, backlog=backlog)
        self._host, self._port = host, port
        self._limiter = limiter

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._limiter.protocol_factory(self._runner.server), self._host, self._port,
            backlog=self._backlog)


class _Worker:
    """One codec process, started on its first call: calls go in on its stdin, answers
    come back on a private pipe, each as an 8-byte length and a pickle."""

    def __init__(self):
        self.process: asyncio.subprocess.Process | None = None

    async def call(self, fn: Callable, args: tuple) -> tuple[bool, Any]:
        if self.process is None:
            import async_search

            # The worker imports this package from where the parent found it.
            root = os.path.dirname(os.path.dirname(os.path.abspath(
                async_search.__file__)))
            path = os.environ.get("PYTHONPATH")
            env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", __name__, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, start_new_session=True, env=env)
        message = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        self.process.stdin.write(_LENGTH.pack(len(message)))
        self.process.stdin.write(message)
        await self.process.stdin.drain()
        (size,) = _LENGTH.unpack(await self.process.stdout.readexactly(_LENGTH.size))
        return pickle.loads(await self.process.stdout.readexactly(size))

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()


_LENGTH = struct.Struct("<Q")
#: Added to the codec workers' niceness: parsing megabytes must not starve the loop.
_WORKER_NICENESS = 10


def _worker_main() -> None:  # pragma: no cover - runs in the worker process
    """Serve calls from stdin until it closes; stray prints go to stderr."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    try:  # on a busy machine, the event loop's small requests go first
        os.nice(_WORKER_NICENESS)
    except (AttributeError, OSError):
        pass
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    while True:
        head = inp.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            return
        fn, args = pickle.loads(inp.read(_LENGTH.unpack(head)[0]))
        try:
            result = (True, fn(*args))
        except Exception as e:  # noqa: BLE001 - every failure goes back to the caller
            result = (False, e)
        try:
            message = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001
            message = pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))
        out.write(_LENGTH.pack(len(message)) + message)
        out.flush()


class CodecPool:
    """Worker processes for CPU-heavy codec calls (``python -m`` this module), started
    on first use. Plain subprocesses rather than ``multiprocessing``: nothing re-imports
    the caller's ``__main__`` script, and nothing forks a process that runs threads.

    Args:
        workers: the most processes at once.
    """

    def __init__(self, workers: int):
        self.workers = workers
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._free: asyncio.Condition | None = None
        self._closed = False

    async def run(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` in a worker process (``fn`` and ``args`` must pickle).

        Raises:
            ProtocolError: (503) when the pool is closed or a worker died.
            Whatever ``fn`` raises.
        """
        if self._free is None:
            self._free = asyncio.Condition()
        async with self._free:
            while not self._idle and len(self._all) >= self.workers and not self._closed:
                await self._free.wait()
            if self._closed:
                raise ProtocolError("the server is shutting down", status=503)
            worker = self._idle.pop() if self._idle else _Worker()
            self._all.add(worker)
        # The call runs to its end even if the caller is cancelled: a worker with an
        # unread answer must not take the next call.
        ok, result = await asyncio.shield(asyncio.ensure_future(
            self._call(worker, fn, args)))
        if not ok:
            raise result
        return result

    async def _call(self, worker: _Worker, fn: Callable, args: tuple) -> tuple[bool, Any]:
        try:
            answer = await worker.call(fn, args)
        except Exception as e:  # noqa: BLE001 - a dead or garbled worker is replaced
            worker.kill()
            self._all.discard(worker)
            answer = (False, ProtocolError(
                f"a codec worker process failed ({type(e).__name__}); retry the request",
                status=503))
        else:
            self._idle.append(worker)
        async with self._free:
            self._free.notify()
        return answer

    async def aclose(self, timeout: float) -> None:
        """Stop the workers: idle ones at once, busy ones after at most ``timeout``."""
        self._closed = True
        if self._free is not None:
            async with self._free:
                self._free.notify_all()
        workers = [w for w in self._all if w.process is not None]
        for worker in workers:
            if worker.process.stdin is not None:
                worker.process.stdin.close()
        if workers:
            exits = [asyncio.ensure_future(w.process.wait()) for w in workers]
            _, pending = await asyncio.wait(exits, timeout=timeout)
            for worker in workers:
                worker.kill()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        self._all.clear()
        self._idle.clear()


if __name__ == "__main__":  # pragma: no cover
    _worker_main()
