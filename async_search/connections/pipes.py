"""Pipes over QueueLike queues: the ends of a connection, and how a stream ends.

These are the knossos prototype's connections, with its semantics exactly, plus
awaiting, closing and notices (see the ``connections`` package for the lifecycle):

- ``Connection``: one end of a pipe over two queues: ``send``, ``recv``, ``poll``,
  ``num_waiting``, ``copy`` (another end on the same queues); ``await recv_async()``
  when the queue can be awaited; ``close()`` ends the stream it sends on.
- ``forked_pipe(queue_factory, n)``: ``(server, clients)``. The server receives bare
  payloads from every client, and each of its ``send``s goes, in FIFO order, to the
  client whose request it answers.
- ``PassThroughConnection``: wraps a connection whose messages are ``(key, value)``:
  receives values, and sends each response back with its key, in order. Several servers
  can share one stream: give each ``PassThroughConnection(server.copy())``.
- ``Notice``: a message a server sends outside the order of its answers (``notify``).

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

import collections
import queue
from typing import Any, Callable, Deque, Dict, Mapping, Optional, Set, Tuple

from async_search.checks import check_int
from async_search.errors import MalformedMessageError
from async_search.notices import Notice
from async_search.queues import (END_OF_STREAM, ClosedConnection, QueueFactory, QueueLike,
                                 close_stream, is_end, local_queue)


def identity(x: Any) -> Any:
    """``x``: the default preprocessing of a connected function."""
    return x


def _ended(inbound: QueueLike) -> ClosedConnection:
    """Leaves the end marker in ``inbound`` for every other reader; the error to raise."""
    try:
        inbound.put(END_OF_STREAM)
    except Exception:  # a queue this process only reads (a socket's): no other reader
        pass
    return ClosedConnection("the other end closed the stream")


def _closed_here(what: str) -> ClosedConnection:
    return ClosedConnection(f"cannot {what}: this end of the connection was closed "
                            f"(close() was called), and nothing is sent after the end of "
                            f"a stream")


class _SendSide:
    """Whether an end (and every copy of it) has closed the stream it sends on, and how
    many servers answer on it now (``acquire``)."""

    __slots__ = ("closed", "servers")

    def __init__(self):
        self.closed = False
        self.servers = 0


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
        self._send_side = _SendSide()
        self._recv_ended = False  # this end has received the end of its stream

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

    @property
    def closed(self) -> bool:
        """True once this end (or a copy of it) closed the stream it sends on."""
        return self._send_side.closed

    @property
    def sender(self) -> Any:
        """Who sent the message ``recv`` returned last: a client's key on a forked
        server end, None on other ends (they have one sender)."""
        return None

    def send(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        """Sends ``item`` to the other end.

        Raises:
            ClosedConnection: this end was closed (or the transport's other end is
                gone).
        """
        if self._send_side.closed:
            raise _closed_here("send")
        self._outbound.put(item, block=block, timeout=timeout)

    def notify(self, notice: "Notice", client: Any = None) -> None:
        """Sends ``notice`` outside the order of answers (a client's connected function
        hands it to its ``listen`` callback). ``client``: a forked server end's client
        key (None: every client that has not closed); ignored on other ends.

        Raises:
            ClosedConnection: this end was closed.
        """
        self.send(notice)

    def recv(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        """The next message from the other end.

        Raises:
            queue.Empty: nothing arrived in time (or ``block`` is False).
            ClosedConnection: the other end closed the stream (every later call too).
        """
        if self._recv_ended:
            raise ClosedConnection("the other end closed the stream")
        item = self._inbound.get(block=block, timeout=timeout)
        if is_end(item):
            self._recv_ended = True
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
        if self._recv_ended:
            raise ClosedConnection("the other end closed the stream")
        item = await self._inbound.get_async()
        if is_end(item):
            self._recv_ended = True
            raise _ended(self._inbound)
        return item

    def close(self) -> None:
        """Ends the stream this end sends on: the other end's ``recv`` raises
        ClosedConnection once it has received everything sent before. Later sends
        raise ClosedConnection; a second close does nothing, and so does a close once
        the other end is gone. On a full bounded queue the end waits for room as a send
        does (a queue that cannot wait raises ``queue.Full``, and the end stays open:
        close it again later)."""
        if self._send_side.closed:
            return
        try:
            close_stream(self._outbound)
        except (ClosedConnection, OSError):  # its reader is gone: nothing left to end
            pass
        self._send_side.closed = True

    def acquire(self) -> None:
        """A server answers on this end (or a copy of it) from now on: ``release``
        closes the end once every server that acquired it has released it."""
        self._send_side.servers += 1

    def release(self) -> None:
        """The server that acquired this end is done (its stream ended, its answers are
        sent): the last one to release closes the end, so that its clients learn that
        no answer can come."""
        side = self._send_side
        side.servers -= 1
        if side.servers <= 0:
            self.close()

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
    def closed(self) -> bool:
        return self._conn.closed

    @property
    def sender(self) -> Any:
        return self._conn.sender

    def notify(self, notice: "Notice", client: Any = None) -> None:
        self._conn.notify(notice, client)

    def acquire(self) -> None:
        self._conn.acquire()

    def release(self) -> None:
        self._conn.release()

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

    def __init__(self, key: Any, conn: Connection, *, _send_side: _SendSide | None = None):
        super().__init__(conn)
        self._key = key
        self._send_side = _SendSide() if _send_side is None else _send_side

    @property
    def key(self) -> Any:
        """The key that routes this end's responses back to it."""
        return self._key

    @property
    def closed(self) -> bool:
        return self._send_side.closed

    def send(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        if self._send_side.closed:
            raise _closed_here("send")
        self._conn.send((self._key, item), block=block, timeout=timeout)

    def notify(self, notice: "Notice", client: Any = None) -> None:
        self.send(notice)

    def close(self) -> None:
        """Tells the server that this client sends nothing more (the server's stream
        ends once every client has closed; this client's stream of answers, once each
        of its requests is answered). A second close does nothing."""
        if self._send_side.closed:
            return
        try:
            self._conn.send((self._key, END_OF_STREAM))  # may raise queue.Full: still open
        except (ClosedConnection, OSError):  # the server is gone: nothing left to end
            pass
        self._send_side.closed = True

    def copy(self) -> "KeyedConnection":
        return KeyedConnection(self._key, self._conn.copy(), _send_side=self._send_side)


#: The longest a forked end's ``poll`` waits for a message that its queue counts but
#: has not delivered yet (``ForkedConnection.num_waiting``).
IN_FLIGHT_S = 1.0


def _put_and_not_got(q: QueueLike) -> bool:
    """Whether ``q`` counts an item that a get did not find: one on its way."""
    try:
        return q.qsize() > 0
    except (AttributeError, NotImplementedError, OSError):  # (macOS: no qsize)
        return False


class ForkedConnection(Connection):
    """The server's end of a forked pipe: one inbound queue, one outbound per client.

    Inbound messages are ``(key, payload)``; ``recv`` returns the payload and remembers
    the key, and each ``send`` goes to the key of the oldest unanswered ``recv``: answer
    in the order received. ``copy()`` is another server end on the same queues with its
    own order of keys. The stream ends (ClosedConnection) once every client has closed,
    or once someone calls ``close_stream`` on the inbound queue. A client's stream of
    answers ends once it has closed and each of its requests is answered (by this end or
    a copy of it in this process). Copies sent to other processes each know only what
    they received: once one is pickled, clients' streams are left open for the owner
    to ``close()`` when every process is done.
    """

    def __init__(self, inbound: QueueLike, outbounds: Mapping[Any, QueueLike],
                 closed: Set[Any] | None = None, *, _shared: "_Fork | None" = None):
        self._inbound = inbound
        self._outbounds = outbounds
        self._outbound = None
        self._keys: Deque[Any] = collections.deque()
        #: Messages taken from ``inbound`` by ``num_waiting`` (``poll``), not returned
        #: yet: ``(key, payload)`` as they came, clients' end markers left out.
        self._ahead: Deque[Tuple[Any, Any]] = collections.deque()
        self._recv_ended = False
        self._sender: Any = None
        self._fork = _Fork(closed) if _shared is None else _shared  # shared by copies
        self._closed: Set[Any] = self._fork.closed
        self._send_side = self._fork.send_side

    def copy(self) -> "ForkedConnection":
        return ForkedConnection(self._inbound, self._outbounds, _shared=self._fork)

    def __getstate__(self) -> dict:
        self._fork.crossed = True  # copies elsewhere answer what this one cannot see
        # Messages taken in by num_waiting are this end's to recv, not a copy's too.
        return {**self.__dict__, "_ahead": collections.deque()}

    def release(self) -> None:
        """The server that acquired this end is done. Each client's stream of answers
        ended after its last answer; once the last server here is done, so do the
        streams of clients that never closed (the stream was ended for them,
        ``close_stream`` on the inbound queue): no answer can come, and their calls
        fail instead of waiting. Not when copies answer in other processes."""
        side = self._send_side
        side.servers -= 1
        if side.servers <= 0 and not self._fork.crossed:
            for key in list(self._outbounds):
                self._end_client(key)

    @property
    def sender(self) -> Any:
        return self._sender

    @property
    def clients(self) -> Tuple[Any, ...]:
        """The keys of the clients that have not closed."""
        return tuple(k for k in self._outbounds if k not in self._closed)

    def on_client_closed(self, callback: Callable[[Any], None]) -> None:
        """Calls ``callback(key)`` when client ``key`` closes its stream (in whichever
        copy receives its end), for as long as this end and its copies live."""
        self._fork.on_close.append(callback)

    def send(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        """Sends the answer to the oldest message received and not answered yet.

        Raises:
            RuntimeError: no received message waits for an answer (more answers sent
                than messages received).
            ClosedConnection: this end was closed.
        """
        if self._send_side.closed:
            raise _closed_here("send")
        if not self._keys:
            raise RuntimeError(
                f"{type(self).__name__}.send: no received message is waiting for an "
                f"answer (every message received has been answered); each send answers "
                f"one message received, in order")
        key = self._keys[0]
        fork = self._fork
        # A client cut off (close_client) reads nothing: its answer is dropped
        if key not in fork.ended:
            try:  # queue.Full (a timeout) leaves the message to answer again
                self._outbounds[key].put(item, block=block, timeout=timeout)
            except (ClosedConnection, OSError):
                # That client is gone (its process died): nobody reads its answers,
                # and the other clients' answers go on.
                fork.ended.add(key)
        self._keys.popleft()
        owed = fork.owed.get(key, 1) - 1
        if owed:
            fork.owed[key] = owed
        else:
            fork.owed.pop(key, None)
        if not owed and key in self._closed and not fork.crossed:  # its last answer
            self._end_client(key)

    def notify(self, notice: "Notice", client: Any = None) -> None:
        if self._send_side.closed:
            raise _closed_here("notify")
        for key in (self.clients if client is None else (client,)):
            if key not in self._fork.ended:
                try:
                    self._outbounds[key].put(notice)
                except (ClosedConnection, OSError):  # gone: it hears of nothing more
                    self._fork.ended.add(key)

    def close_client(self, key: Any) -> None:
        """Ends client ``key``'s stream of answers now (what it is owed is dropped)."""
        self._fork.owed.pop(key, None)
        self._end_client(key)

    def _end_client(self, key: Any) -> None:
        if key not in self._fork.ended:
            self._fork.ended.add(key)
            try:
                close_stream(self._outbounds[key])
            except (ClosedConnection, OSError):  # gone already
                pass

    def num_waiting(self) -> int:
        """How many messages are waiting to be received: a client's close, which
        ``recv`` never returns, is not one (it is taken in here), so that ``while
        server.poll(): server.recv()`` never blocks on it. The messages it counts are
        taken in too, and are this end's to ``recv`` (a copy of it, here or pickled
        to another process, does not see them). A message a client has put that is
        still on its way (a ``multiprocessing`` queue's feeder thread writes it a moment
        later) is waited for, up to ``IN_FLIGHT_S``, as the prototype's ``qsize() > 0``
        counted it."""
        ahead = self._ahead
        while True:
            try:
                message = Connection.recv(self, block=False)
            except queue.Empty:
                if ahead or not _put_and_not_got(self._inbound):
                    return len(ahead)
                try:
                    message = Connection.recv(self, block=True, timeout=IN_FLIGHT_S)
                except (queue.Empty, ClosedConnection):  # another reader took it
                    return len(ahead)
            except ClosedConnection:  # the stream ended
                return len(ahead)
            if _is_close(message):
                self._accept(message)  # what recv would do with it
            else:
                ahead.append(message)

    def recv(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        if self._ahead:
            return self._accept(self._ahead.popleft())
        while True:
            value = self._accept(Connection.recv(self, block=block, timeout=timeout))
            if value is not _SKIP:
                return value

    async def recv_async(self) -> Any:
        if self._ahead:
            return self._accept(self._ahead.popleft())
        while True:
            value = self._accept(await Connection.recv_async(self))
            if value is not _SKIP:
                return value

    def _accept(self, message: Tuple[Any, Any]) -> Any:
        try:
            key, value = message
        except (TypeError, ValueError):
            raise MalformedMessageError(
                f"a forked server end receives (key, payload) messages from its "
                f"clients' KeyedConnection ends, got {type(message).__name__}") from None
        try:
            known = key in self._outbounds
        except TypeError:  # an unhashable key
            known = False
        if not known:
            raise MalformedMessageError(
                f"a message from an unknown client {key!r}; this server end answers "
                f"clients {list(self._outbounds)}")
        fork = self._fork
        if is_end(value):  # that client closed
            if key not in self._closed:
                self._closed.add(key)
                if key not in fork.owed and not fork.crossed:  # nothing left to answer
                    self._end_client(key)
                for callback in list(fork.on_close):
                    callback(key)
                if len(self._closed) >= len(self._outbounds):
                    try:  # every copy, here or elsewhere, ends too
                        close_stream(self._inbound)
                    except (ClosedConnection, OSError):  # a queue only read here (a
                        self._recv_ended = True  # socket's): this end, at least, ends
            return _SKIP
        self._keys.append(key)
        fork.owed[key] = fork.owed.get(key, 0) + 1
        self._sender = key
        return value

    def send_pending(self) -> None:
        ended = self._fork.ended
        for key, q in self._outbounds.items():
            send_pending = getattr(q, "send_pending", None)
            if send_pending is not None and key not in ended:
                try:
                    send_pending()
                except (ClosedConnection, OSError):  # that client is gone; not the rest
                    ended.add(key)

    def close(self) -> None:
        """Ends every client's stream of responses (and this end's copies'); later sends
        raise ClosedConnection. A second close does nothing."""
        if self._send_side.closed:
            return
        self._send_side.closed = True
        for key in self._outbounds:
            self._end_client(key)

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


def _is_close(message: Any) -> bool:
    """Whether a forked server end's inbound ``message`` is a client's close."""
    return (isinstance(message, tuple) and len(message) == 2
            and is_end(message[1]))


class _Fork:
    """What the copies of a forked server end share: the clients that closed, the
    answers each client is owed, the clients whose stream of answers has ended."""

    __slots__ = ("closed", "owed", "ended", "send_side", "on_close", "crossed")

    def __init__(self, closed: Set[Any] | None):
        self.closed: Set[Any] = set() if closed is None else closed
        self.owed: Dict[Any, int] = {}
        self.ended: Set[Any] = set()
        self.send_side = _SendSide()
        self.on_close: list = []
        self.crossed = False  # a copy went to another process

    def __getstate__(self):
        return {"closed": self.closed, "owed": {}, "ended": self.ended,
                "send_side": self.send_side, "on_close": [], "crossed": True}

    def __setstate__(self, state):
        for name, value in state.items():
            setattr(self, name, value)


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
        """Sends ``(key, item)``, the key of the oldest message not answered yet.

        Raises:
            RuntimeError: no received message waits for an answer.
            ClosedConnection: this end was closed.
        """
        if not self._metas:
            if self._conn.closed:
                raise _closed_here("send")
            raise RuntimeError(
                f"{type(self).__name__}.send: no received message is waiting for an "
                f"answer (every message received has been answered); each send answers "
                f"one message received, in order")
        try:
            self._conn.send((self._metas[0], item), block=block, timeout=timeout)
        except queue.Full:  # not sent: the message still waits for its answer
            raise
        except BaseException:  # it never can be (its client is gone): answered all the
            self._metas.popleft()  # same, so that the next answer gets the next key
            raise
        self._metas.popleft()

    def recv(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        return self._accept(self._conn.recv(block=block, timeout=timeout))

    async def recv_async(self) -> Any:
        return self._accept(await self._conn.recv_async())

    def _accept(self, message: Any) -> Any:
        try:
            meta, value = message
        except (TypeError, ValueError):
            raise MalformedMessageError(
                f"a pass-through end receives (key, value) messages (an "
                f"UnorderedConnectedFunction's), got {type(message).__name__}") from None
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

    The clients share the request queue, so it must take writers in several processes
    when the clients are: ``process_queue``, ``queue.Queue`` across threads,
    ``multiprocessing.Manager().Queue``. A ``socket_queue`` has one writing process:
    its clients must stay in one process (for clients in several, give each its own
    ``pipe(socket_queue)``, as the process backend does).

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
