"""Connections over QueueLike queues, and connected functions that make requests on them.

These are the knossos prototype's connections, with its semantics exactly (code written
for it runs here after changing its imports), plus awaiting and closing:

- ``Connection``: one end of a pipe over two queues: ``send``, ``recv``, ``poll``,
  ``num_waiting``, ``copy`` (another end on the same queues); ``await recv_async()``
  when the queue can be awaited; ``close()`` ends the stream it sends on.
- ``forked_pipe(queue_factory, n)``: ``(server, clients)``. The server receives bare
  payloads from every client, and each of its ``send``s goes, in FIFO order, to the
  client whose request it answers.
- ``PassThroughConnection``: wraps a connection whose messages are ``(key, value)``:
  receives values, and sends each response back with its key, in order. Several servers
  can share one stream: give each ``PassThroughConnection(server.copy())``.
- ``FifoConnectedFunction`` / ``UnorderedConnectedFunction``: calling one sends a
  request and returns a future. With a queue that can be awaited, responses resolve
  futures by themselves; otherwise (or with no running loop at all) ``flush()``
  resolves those whose responses have arrived.

    >>> from queue import Queue
    >>> server, clients = forked_pipe(Queue, 2)
    >>> clients[0].send(3); clients[1].send(5)
    >>> [server.recv(), server.recv()]
    [3, 5]
    >>> server.send(9); server.send(25)
    >>> clients[0].recv(), clients[1].recv()
    (9, 25)
"""

from __future__ import annotations

import abc
import asyncio
import collections
import warnings
from typing import (Any, Callable, Deque, Dict, Mapping, Optional, Protocol, Sequence,
                    Set, Tuple)

from async_search.checks import check_int
from async_search.errors import ServerDiedError
from async_search.queues import (END_OF_STREAM, ClosedConnection, QueueFactory, QueueLike,
                                 close_stream, is_end, local_queue)

__all__ = [
    "Connection", "DelegatingConnection", "ForkedConnection", "KeyedConnection",
    "PassThroughConnection", "ClosedConnection", "pipe", "forked_pipe",
    "ConnectedFunction", "FifoConnectedFunction", "UnorderedConnectedFunction",
    "Receiver", "get_connected_functions", "identity",
]


def identity(x: Any) -> Any:
    """``x``: the default preprocessing of a connected function."""
    return x


def _ended(queue: QueueLike) -> ClosedConnection:
    """Leaves the end marker in ``queue`` for every other reader; the error to raise."""
    queue.put(END_OF_STREAM)
    return ClosedConnection("the other end closed the stream")


class Connection:
    """One end of a pipe over two queues: ``send`` to the other end, ``recv`` from it.

    Example:
        >>> a, b = pipe()
        >>> a.send("hi"); b.recv()
        'hi'
    """

    def __init__(self, inbound: QueueLike, outbound: QueueLike):
        self._inbound = inbound
        self._outbound = outbound

    @property
    def inbound(self) -> QueueLike:
        """The queue this end receives from."""
        return self._inbound

    @property
    def outbound(self) -> QueueLike:
        """The queue this end sends to."""
        return self._outbound

    def num_waiting(self) -> int:
        """How many messages are waiting to be received."""
        return self._inbound.qsize()

    def poll(self) -> bool:
        """True when a message is waiting to be received."""
        return self.num_waiting() > 0

    def send(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        """Sends ``item`` to the other end."""
        self._outbound.put(item, block=block, timeout=timeout)

    def recv(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        """The next message from the other end.

        Raises:
            queue.Empty: nothing arrived in time (or ``block`` is False).
            ClosedConnection: the other end closed the stream.
        """
        item = self._inbound.get(block=block, timeout=timeout)
        if is_end(item):
            raise _ended(self._inbound)
        return item

    @property
    def awaitable(self) -> bool:
        """True when ``recv_async`` can wait without polling."""
        return hasattr(self._inbound, "get_async")

    async def recv_async(self) -> Any:
        """The next message from the other end, awaited in the running loop.

        Raises:
            ClosedConnection: the other end closed the stream.
        """
        if not self.awaitable:
            raise TypeError(f"{type(self._inbound).__name__} cannot be awaited; use poll "
                            f"and recv (or a connected function's flush)")
        item = await self._inbound.get_async()
        if is_end(item):
            raise _ended(self._inbound)
        return item

    def close(self) -> None:
        """Ends the stream this end sends on: the other end's ``recv`` raises
        ClosedConnection once it has received everything sent before."""
        close_stream(self._outbound)

    def send_pending(self) -> None:
        """Hands what was sent to the transport now, when the outbound queue holds puts
        back to coalesce them (a socket queue sends a loop iteration's puts as one frame
        at the end of the iteration); a no-op for other queues."""
        send_pending = getattr(self._outbound, "send_pending", None)
        if send_pending is not None:
            send_pending()

    async def drain(self) -> None:
        """Returns once what was sent has left this process (for a queue that buffers
        its puts, as a socket queue does until the end of the loop iteration)."""
        drain = getattr(self._outbound, "drain", None)
        if drain is not None:
            await drain()

    def close_unused_ends(self) -> "Connection":
        """In a process that uses only this end, releases the socket ends it does not use
        (a no-op for other queues), so that it learns when the other process is gone."""
        for q, method in ((self._inbound, "reader_only"), (self._outbound, "writer_only")):
            release = getattr(q, method, None)
            if release is not None:
                release()
        return self

    def copy(self) -> "Connection":
        """Another end on the same queues (a plain connection keeps no state: itself)."""
        return self


class DelegatingConnection(Connection):
    """A connection that delegates everything to ``conn``; a base for wrappers."""

    def __init__(self, conn: Connection):
        self._conn = conn

    @property
    def inbound(self) -> QueueLike:
        return self._conn.inbound

    @property
    def outbound(self) -> QueueLike:
        return self._conn.outbound

    def num_waiting(self) -> int:
        return self._conn.num_waiting()

    def poll(self) -> bool:
        return self._conn.poll()

    def send(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        self._conn.send(item, block=block, timeout=timeout)

    def recv(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        return self._conn.recv(block=block, timeout=timeout)

    @property
    def awaitable(self) -> bool:
        return self._conn.awaitable

    async def recv_async(self) -> Any:
        return await self._conn.recv_async()

    def close(self) -> None:
        self._conn.close()

    def send_pending(self) -> None:
        self._conn.send_pending()

    async def drain(self) -> None:
        await self._conn.drain()

    def close_unused_ends(self) -> "Connection":
        self._conn.close_unused_ends()
        return self

    def copy(self) -> "Connection":
        return type(self)(self._conn.copy())


class KeyedConnection(DelegatingConnection):
    """A client's end of a forked pipe: ``send(item)`` sends ``(key, item)``."""

    def __init__(self, key: Any, conn: Connection):
        super().__init__(conn)
        self._key = key

    @property
    def key(self) -> Any:
        """The key that routes this end's responses back to it."""
        return self._key

    def send(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        self._conn.send((self._key, item), block=block, timeout=timeout)

    def close(self) -> None:
        """Tells the server that this client sends nothing more (the server's stream
        ends once every client has closed)."""
        self._conn.send((self._key, END_OF_STREAM))

    def copy(self) -> "KeyedConnection":
        return KeyedConnection(self._key, self._conn.copy())


class ForkedConnection(Connection):
    """The server's end of a forked pipe: one inbound queue, one outbound per client.

    Inbound messages are ``(key, payload)``; ``recv`` returns the payload and remembers
    the key, and each ``send`` goes to the key of the oldest unanswered ``recv``: answer
    in the order received. ``copy()`` is another server end on the same queues with its
    own order of keys. The stream ends (ClosedConnection) once every client has closed,
    or once someone calls ``close_stream`` on the inbound queue.
    """

    def __init__(self, inbound: QueueLike, outbounds: Mapping[Any, QueueLike],
                 closed: Set[Any] | None = None):
        self._inbound = inbound
        self._outbounds = outbounds
        self._outbound = None
        self._keys: Deque[Any] = collections.deque()
        self._closed: Set[Any] = set() if closed is None else closed  # shared by copies

    def copy(self) -> "ForkedConnection":
        return ForkedConnection(self._inbound, self._outbounds, self._closed)

    def send(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        self._outbounds[self._keys.popleft()].put(item, block=block, timeout=timeout)

    def recv(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        while True:
            value = self._accept(Connection.recv(self, block=block, timeout=timeout))
            if value is not _SKIP:
                return value

    async def recv_async(self) -> Any:
        while True:
            value = self._accept(await Connection.recv_async(self))
            if value is not _SKIP:
                return value

    def _accept(self, message: Tuple[Any, Any]) -> Any:
        key, value = message
        if is_end(value):  # that client closed
            self._closed.add(key)
            if len(self._closed) >= len(self._outbounds):
                close_stream(self._inbound)  # every copy, here or elsewhere, ends too
            return _SKIP
        self._keys.append(key)
        return value

    def send_pending(self) -> None:
        for q in self._outbounds.values():
            send_pending = getattr(q, "send_pending", None)
            if send_pending is not None:
                send_pending()

    def close(self) -> None:
        """Ends every client's stream of responses."""
        for q in self._outbounds.values():
            close_stream(q)

    def close_unused_ends(self) -> "ForkedConnection":
        release = getattr(self._inbound, "reader_only", None)
        if release is not None:
            release()
        for q in self._outbounds.values():
            release = getattr(q, "writer_only", None)
            if release is not None:
                release()
        return self


_SKIP = object()


class PassThroughConnection(DelegatingConnection):
    """Passes each message's key through a server: receives the values of ``(key,
    value)`` messages, and sends each response as ``(key, response)``, keys taken in
    the order received. Answer in the order received.

    Example:
        >>> a, b = pipe()
        >>> server = PassThroughConnection(b)
        >>> a.send(("k", 3)); server.recv()
        3
        >>> server.send(9); a.recv()
        ('k', 9)
    """

    def __init__(self, conn: Connection):
        super().__init__(conn)
        self._metas: Deque[Any] = collections.deque()

    def send(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        self._conn.send((self._metas.popleft(), item), block=block, timeout=timeout)

    def recv(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        meta, value = self._conn.recv(block=block, timeout=timeout)
        self._metas.append(meta)
        return value

    async def recv_async(self) -> Any:
        meta, value = await self._conn.recv_async()
        self._metas.append(meta)
        return value

    def copy(self) -> "PassThroughConnection":
        return PassThroughConnection(self._conn.copy())


def pipe(queue_factory: QueueFactory = local_queue, maxsize: int = 0,
         ) -> Tuple[Connection, Connection]:
    """Two connected ends: what one sends, the other receives.

    Example:
        >>> a, b = pipe()
        >>> b.send(1); a.recv()
        1
    """
    q0, q1 = queue_factory(maxsize), queue_factory(maxsize)
    return Connection(q0, q1), Connection(q1, q0)


def forked_pipe(queue_factory: QueueFactory = local_queue, num_branches: int = 1,
                maxsize: int = 0) -> Tuple[ForkedConnection, Tuple[KeyedConnection, ...]]:
    """``(server, clients)``: ``num_branches`` client ends feeding one server end
    through one request queue; each client has its own response queue.

    Example:
        >>> server, (c0, c1) = forked_pipe(num_branches=2)
        >>> c1.send(5); server.recv()
        5
        >>> server.send(25); c1.recv()
        25
    """
    check_int("num_branches", num_branches, minimum=1)
    root = queue_factory(maxsize)
    branches = [queue_factory(maxsize) for _ in range(num_branches)]
    forked = ForkedConnection(root, dict(enumerate(branches)))
    keyed = tuple(KeyedConnection(i, Connection(q, root)) for i, q in enumerate(branches))
    return forked, keyed


class Receiver(Protocol):
    """Where a response goes: a future, or anything with its three methods."""

    def done(self) -> bool: ...

    def set_result(self, result: Any) -> None: ...

    def set_exception(self, exception: BaseException) -> None: ...


class ConnectedFunction(abc.ABC):
    """A function whose calls are requests over a connection: ``fn(x)`` sends
    ``preprocess_fn(x)`` and returns a future for the response.

    A response that is an exception fails its future with it. When the connection can
    be awaited and a loop runs, a receiver task resolves futures as responses arrive
    (it runs while any is pending; if the stream closes, every pending future fails
    with ServerDiedError). Otherwise ``flush()`` resolves the futures whose responses
    have arrived; it also works with no running loop at all, as the prototype's do.
    """

    def __init__(self, conn: Connection, preprocess_fn: Callable[[Any], Any] = identity):
        self._conn = conn
        self._preprocess_fn = identity if preprocess_fn is None else preprocess_fn
        self._awaitable = conn.awaitable
        self._receiver: asyncio.Task | None = None
        self._wake: asyncio.Future | None = None  # set while the receiver idles
        #: What every call raises once the connection is unusable (None until then).
        self.error: BaseException | None = None
        self._init()

    def _init(self) -> None:
        """Set-up of a subclass, after ``__init__``."""

    @property
    def connection(self) -> Connection:
        """The connection requests go over."""
        return self._conn

    def __call__(self, inputs: Any) -> asyncio.Future:
        future, running = _new_future()
        self.submit(inputs, future, running)
        return future

    def submit(self, inputs: Any, receiver: Receiver, running: bool = True) -> None:
        """Sends a request whose response goes to ``receiver`` instead of a new future:
        any object with a future's ``done``, ``set_result`` and ``set_exception`` (a
        client that fans one response out to many callers saves a future per message).
        ``running``: whether an event loop runs (to start the receiver task)."""
        if self.error is not None:
            raise self.error
        message = self._send(self._preprocess_fn(inputs), receiver)
        try:
            self._conn.send(message)
        except BaseException:  # not sent (it cannot travel, or the way is gone)
            self._forget_last()
            raise
        if running and self._awaitable:
            wake = self._wake
            if wake is not None:
                if not wake.done():
                    wake.set_result(True)
            elif self._receiver is None or self._receiver.done():
                self._receiver = asyncio.ensure_future(self._receive())

    def flush(self) -> int:
        """Resolves the futures whose responses have arrived; returns how many. If the
        stream of responses has ended, every pending future fails with ServerDiedError
        (and so does every later call)."""
        count = 0
        try:
            while self._conn.poll():
                self._on_recv(self._conn.recv())
                count += 1
        except ClosedConnection as e:
            self.fail_pending(ServerDiedError(f"the server's end of the connection closed "
                                              f"({e}); the request was not answered"))
        return count

    def run_while(self, cond: Callable[[], bool]) -> None:
        """Flushes while ``cond()`` is true."""
        while cond():
            self.flush()

    def run_until_complete(self, task: "asyncio.Future") -> Any:
        """Runs ``task``'s loop (not running yet) one pass at a time, flushing between
        passes, until ``task`` is done; returns its result."""
        loop = task.get_loop()
        while not task.done():
            loop.stop()
            loop.run_forever()
            self.flush()
        return task.result()

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

    def fail_pending(self, error: BaseException) -> None:
        """Fails every pending request, and every later call, with ``error``."""
        self.error = error
        for future in self._take_all():
            if not future.done():
                future.set_exception(error)

    async def _receive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                # Searches usually ask again within a loop iteration or two: wait a
                # little for that instead of ending (a task per round trip costs).
                wake = self._wake = loop.create_future()
                timer = loop.call_later(_RECEIVER_IDLE_S, _resolve, wake, False)
                try:
                    await wake
                finally:
                    timer.cancel()
                    self._wake = None
                if not self._pending:
                    return
                continue
            try:
                received = await self._conn.recv_async()
            except ClosedConnection as e:
                self.fail_pending(ServerDiedError(f"the server's end of the connection "
                                                  f"closed ({e}); the request was not "
                                                  f"answered"))
                return
            except Exception as e:  # a response that cannot be read: which is unknown
                self.fail_pending(ServerDiedError(f"a response could not be read "
                                                  f"({e!r}); the connection is unusable"))
                return
            self._on_recv(received)

    _pending: Any

    @abc.abstractmethod
    def _send(self, processed_inputs: Any, future: asyncio.Future) -> Any:
        """Remembers ``future``; returns the message to send."""

    @abc.abstractmethod
    def _on_recv(self, received: Any) -> None:
        """Resolves the future that ``received`` answers."""

    @abc.abstractmethod
    def _take_all(self) -> Sequence[asyncio.Future]:
        """Forgets and returns every pending future."""

    @abc.abstractmethod
    def _forget_last(self) -> None:
        """Forgets the request registered last (its message was not sent)."""


#: How long a receiver task with nothing pending waits for a new request before ending.
_RECEIVER_IDLE_S = 0.5


def _resolve(future: asyncio.Future, response: Any) -> None:
    if future.done():  # the caller was cancelled
        return
    if isinstance(response, BaseException):
        future.set_exception(response)
    else:
        future.set_result(response)


def _new_future() -> Tuple[asyncio.Future, bool]:
    """A future on the running loop, else on the thread's current loop (as the
    prototype did); and whether a loop runs."""
    try:
        return asyncio.get_running_loop().create_future(), True
    except RuntimeError:
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop()
        except RuntimeError:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
    return loop.create_future(), False


class FifoConnectedFunction(ConnectedFunction):
    """Matches responses to requests in order: for a connection served in order."""

    def _init(self) -> None:
        self._pending: Deque[asyncio.Future] = collections.deque()

    def _send(self, processed_inputs: Any, future: asyncio.Future) -> Any:
        self._pending.append(future)
        return processed_inputs

    def _on_recv(self, received: Any) -> None:
        _resolve(self._pending.popleft(), received)

    def _take_all(self) -> Sequence[asyncio.Future]:
        pending, self._pending = list(self._pending), collections.deque()
        return pending

    def _forget_last(self) -> None:
        self._pending.pop()


class UnorderedConnectedFunction(ConnectedFunction):
    """Sends ``(uid, request)`` and matches ``(uid, response)`` by uid, in whatever
    order they come back: for several servers (each a ``PassThroughConnection``)."""

    def _init(self) -> None:
        self._send_count = 0
        self._pending: Dict[int, asyncio.Future] = {}

    def _send(self, processed_inputs: Any, future: asyncio.Future) -> Any:
        uid = self._send_count
        self._send_count += 1
        self._pending[uid] = future
        return uid, processed_inputs

    def _on_recv(self, received: Tuple[int, Any]) -> None:
        uid, response = received
        future = self._pending.pop(uid, None)
        if future is not None:
            _resolve(future, response)

    def _take_all(self) -> Sequence[asyncio.Future]:
        pending, self._pending = list(self._pending.values()), {}
        return pending

    def _forget_last(self) -> None:
        self._pending.pop(self._send_count - 1, None)


def get_connected_functions(queue_factory: QueueFactory, num_fns: int, ordered: bool,
                            maxsize: int = 0, preprocess_fn: Callable[[Any], Any] = identity,
                            ) -> Tuple[Tuple[ConnectedFunction, ...], Connection]:
    """``num_fns`` connected functions, and the connection that serves them all.

    Args:
        queue_factory: makes the queues: ``queue.Queue`` (threads),
            ``multiprocessing.Manager().Queue`` (processes), ``queues.ray_queue``, or
            any of ``async_search.queues``' (which can be awaited).
        num_fns: how many client functions.
        ordered: FIFO matching (one server); False: matching by uid, and the server
            connection is a ``PassThroughConnection`` (``copy()`` it for more servers).
        maxsize: the bound of each queue (0: unbounded).
        preprocess_fn: applied to each request before it is sent.

    Example:
        >>> from queue import Queue
        >>> (fn,), server = get_connected_functions(Queue, 1, True)
        >>> f = fn(3); server.send(server.recv() ** 2); n = fn.flush(); f.result()
        9
    """
    if check_int("num_fns", num_fns, minimum=1) == 1:
        server, client = pipe(queue_factory, maxsize)
        clients: Sequence[Connection] = (client,)
    else:
        server, clients = forked_pipe(queue_factory, num_fns, maxsize)
    cls = FifoConnectedFunction if ordered else UnorderedConnectedFunction
    if not ordered:
        server = PassThroughConnection(server)
    return tuple(cls(c, preprocess_fn=preprocess_fn) for c in clients), server
