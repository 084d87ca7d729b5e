"""Connections over QueueLike queues, and connected functions that make requests on them.

A ``Connection`` is one end of a pipe: ``send`` to the other end, ``recv`` what it sent
(``poll``, ``num_waiting``, and ``recv_async`` to await it in the running loop). Every
message on a client's side is ``(key, payload)``; ``forked_pipe`` joins many clients to
one server connection, on which a message is ``(route, payload)``: the server sends
each response back with the route it came with (pass-through), and the route takes it
to the right client with the right key.

A ``ConnectedFunction`` is the awaitable face of a client connection: calling it sends
a request and returns a future. ``FifoConnectedFunction`` matches responses to requests
in order; ``UnorderedConnectedFunction`` matches them by key, for several servers that
answer out of order. When the connection can be awaited (local and thread queues),
responses wake the waiting coroutine by themselves; otherwise ``flush()`` resolves the
futures whose responses have arrived.

    >>> import asyncio
    >>> async def main():
    ...     fns, server = get_connected_functions(local_queue, num_fns=2, ordered=True)
    ...     futures = [fns[0](1), fns[1](2)]
    ...     for _ in range(2):
    ...         route, x = server.recv()
    ...         server.send((route, x * 10))
    ...     return await asyncio.gather(*futures)
    >>> asyncio.run(main())
    [10, 20]
"""

from __future__ import annotations

import abc
import asyncio
import collections
import itertools
from typing import Any, Callable, Deque, Dict, List, Tuple

from async_search.queues import QueueFactory, QueueLike, local_queue

__all__ = [
    "Connection", "ClientConnection", "ServerConnection", "pipe", "forked_pipe",
    "ConnectedFunction", "FifoConnectedFunction", "UnorderedConnectedFunction",
    "get_connected_functions",
]


class Connection:
    """One end of a pipe over two queues: ``send`` to the other end, ``recv`` from it."""

    def __init__(self, inbox: QueueLike, outbox: QueueLike):
        self.inbox = inbox
        self.outbox = outbox

    def send(self, obj: Any) -> None:
        """Send ``obj`` to the other end."""
        self.outbox.put(obj)

    def recv(self, timeout: float | None = None) -> Any:
        """The next object sent by the other end; blocks up to ``timeout`` seconds.

        Raises:
            queue.Empty: when nothing arrived in time (at once on a local queue).
        """
        return self.inbox.get(True, timeout)

    def poll(self) -> bool:
        """True when an object is waiting to be received."""
        return self.inbox.qsize() > 0

    def num_waiting(self) -> int:
        """How many objects are waiting to be received."""
        return self.inbox.qsize()

    @property
    def awaitable(self) -> bool:
        """True when ``recv_async`` can wait without polling."""
        return hasattr(self.inbox, "get_async")

    async def recv_async(self) -> Any:
        """The next object sent by the other end, awaited in the running loop."""
        if not self.awaitable:
            raise TypeError(f"{type(self.inbox).__name__} cannot be awaited; use poll and "
                            f"recv (or a connected function's flush)")
        return await self.inbox.get_async()


class ClientConnection(Connection):
    """A client's end of a forked pipe: sends ``(key, payload)`` tagged with its id."""

    def __init__(self, inbox: QueueLike, outbox: QueueLike, client_id: int):
        super().__init__(inbox, outbox)
        self.client_id = client_id

    def send(self, obj: Tuple[Any, Any]) -> None:
        key, payload = obj
        self.outbox.put(((self.client_id, key), payload))


class ServerConnection(Connection):
    """The server's end of a forked pipe: receives ``(route, payload)`` from every
    client; ``send((route, response))`` delivers ``(key, response)`` to the route's
    client. Routes are opaque to the server, which sends them back as they came."""

    def __init__(self, inbox: QueueLike, responses: List[QueueLike]):
        super().__init__(inbox, None)
        self.responses = responses

    def send(self, obj: Tuple[Any, Any]) -> None:
        (client_id, key), response = obj
        self.responses[client_id].put((key, response))


def pipe(queue_factory: QueueFactory = local_queue, maxsize: int = 0,
         ) -> Tuple[Connection, Connection]:
    """Two connected ends: what one sends, the other receives.

    Example:
        >>> a, b = pipe()
        >>> a.send("hi"); b.recv()
        'hi'
    """
    forward, backward = queue_factory(maxsize), queue_factory(maxsize)
    return Connection(backward, forward), Connection(forward, backward)


def forked_pipe(queue_factory: QueueFactory = local_queue, num_clients: int = 1,
                maxsize: int = 0) -> Tuple[List[ClientConnection], ServerConnection]:
    """Many client connections feeding one server connection through one request queue.

    Each client gets its own response queue. Give every server a copy of the server
    connection (they share the request queue) to serve it with several servers.
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    requests = queue_factory(maxsize)
    responses = [queue_factory(maxsize) for _ in range(num_clients)]
    clients = [ClientConnection(responses[i], requests, i) for i in range(num_clients)]
    return clients, ServerConnection(requests, responses)


class ConnectedFunction(abc.ABC):
    """An async function whose calls are requests over a client connection.

    ``fn(x)`` sends ``preprocess_fn(x)`` and returns a future for the response; a
    response that is an exception fails the future with it. If the connection can be
    awaited, a receiver task resolves futures as responses arrive (it ends when none is
    pending); else call ``flush()``.
    """

    def __init__(self, connection: Connection,
                 preprocess_fn: Callable[[Any], Any] | None = None):
        self.connection = connection
        self.preprocess_fn = preprocess_fn
        self._receiver: asyncio.Task | None = None

    def __call__(self, x: Any) -> asyncio.Future:
        if self.preprocess_fn is not None:
            x = self.preprocess_fn(x)
        fut = asyncio.get_running_loop().create_future()
        self.connection.send((self._register(fut), x))
        if self.connection.awaitable and (self._receiver is None or self._receiver.done()):
            self._receiver = asyncio.ensure_future(self._receive())
        return fut

    def flush(self) -> int:
        """Resolves the futures whose responses have arrived; returns how many."""
        count = 0
        while self.connection.poll():
            self._resolve(*self.connection.recv())
            count += 1
        return count

    @property
    def num_pending(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

    async def aclose(self) -> None:
        """Stops the receiver task, if one runs."""
        if self._receiver is not None and not self._receiver.done():
            self._receiver.cancel()
            try:
                await self._receiver
            except asyncio.CancelledError:
                pass

    async def _receive(self) -> None:
        while self._pending:
            key, response = await self.connection.recv_async()
            self._resolve(key, response)

    def _resolve(self, key: Any, response: Any) -> None:
        fut = self._take(key)
        if fut.done():  # the caller was cancelled
            return
        if isinstance(response, BaseException):
            fut.set_exception(response)
        else:
            fut.set_result(response)

    _pending: Any

    @abc.abstractmethod
    def _register(self, fut: asyncio.Future) -> Any:
        """Remembers ``fut``; returns the key that its response will come back with."""

    @abc.abstractmethod
    def _take(self, key: Any) -> asyncio.Future:
        """The future that the response with ``key`` resolves."""


class FifoConnectedFunction(ConnectedFunction):
    """Assumes responses come back in the order the requests were made."""

    def __init__(self, connection: Connection,
                 preprocess_fn: Callable[[Any], Any] | None = None):
        super().__init__(connection, preprocess_fn)
        self._pending: Deque[asyncio.Future] = collections.deque()

    def _register(self, fut: asyncio.Future) -> None:
        self._pending.append(fut)
        return None

    def _take(self, key: Any) -> asyncio.Future:
        return self._pending.popleft()


class UnorderedConnectedFunction(ConnectedFunction):
    """Matches responses to requests by key, in whatever order they come back."""

    def __init__(self, connection: Connection,
                 preprocess_fn: Callable[[Any], Any] | None = None):
        super().__init__(connection, preprocess_fn)
        self._pending: Dict[int, asyncio.Future] = {}
        self._keys = itertools.count()

    def _register(self, fut: asyncio.Future) -> int:
        key = next(self._keys)
        self._pending[key] = fut
        return key

    def _take(self, key: int) -> asyncio.Future:
        return self._pending.pop(key)


def get_connected_functions(queue_factory: QueueFactory, num_fns: int, ordered: bool = True,
                            maxsize: int = 0,
                            preprocess_fn: Callable[[Any], Any] | None = None,
                            ) -> Tuple[List[ConnectedFunction], ServerConnection]:
    """``num_fns`` connected functions and the server connection that serves them all.

    Args:
        queue_factory: makes the queues (``queues.local_queue``, ``thread_queue``, ...).
        num_fns: how many independent client functions.
        ordered: FIFO matching (one server); False matches by key (several servers).
        maxsize: bound of each queue (0: unbounded).
        preprocess_fn: applied to each request before it is sent.
    """
    clients, server = forked_pipe(queue_factory, num_fns, maxsize)
    cls = FifoConnectedFunction if ordered else UnorderedConnectedFunction
    return [cls(c, preprocess_fn) for c in clients], server
