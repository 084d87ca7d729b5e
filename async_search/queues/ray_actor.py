"""Queues between Ray tasks and actors: hosted in an actor, or a direct socket to it.

A ``QueueHost`` actor holds named queues; an ``ActorQueue`` is a QueueLike handle on
one of them that travels to any task or actor. Puts made in one loop iteration leave as
one actor call (``put_many``); ``get_async`` is one long-polling call (``get_many``)
that brings back everything queued at once, so a round trip costs one call each way
whatever the number of messages. A model server actor is itself a ``QueueHost``: its
request queue lives where it is served, one call away from every client.

An actor call costs about a millisecond, whatever it carries (1.0-1.9 ms here, against
25-60 us for a socket round trip between the same two processes), so a request that
needs one per round trip is bounded by it. ``DirectListener`` lets an actor take direct
socket connections instead: a task that holds the actor's handle learns its
``DirectAddress`` (host, port and a secret token) by an actor call, and
``connect_direct`` opens a socket to it; each side then holds two ``SocketQueue``s
(one frame per loop iteration, the process backend's transport). The token is checked
before anything is unpickled, so only those who got the address through Ray can send.

When the host actor dies, a reader gets ``ClosedConnection``: from Ray
(``RayActorError``) on an actor queue, from the socket's end on a direct connection.

    >>> q = ray_queue()                      # doctest: +SKIP
    >>> q.put(1); q.get(timeout=5)           # doctest: +SKIP
    1
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hmac
import itertools
import queue
import secrets
import socket
import struct
import uuid
from typing import Any, Callable, Deque, Dict, List, Set, Tuple

from async_search.queues.local import LocalQueue
from async_search.queues.protocol import ClosedConnection, is_end
from async_search.queues.sockets import SocketQueue

__all__ = ["HostedQueue", "QueueHost", "ActorQueue", "ray_queue", "DirectAddress",
           "DirectListener", "connect_direct", "HANDSHAKE_TIMEOUT_S"]


class HostedQueue(LocalQueue):
    """A queue inside a host actor. Besides a LocalQueue's methods, ``get_batch`` takes
    everything queued at once; its waiters are served strictly in the order they came,
    each with items put after those of the waiter before it, so a reader that awaits
    its batches in the order it asked for them gets every item in order."""

    def __init__(self, maxsize: int = 0):
        super().__init__(maxsize)
        self._batch_waiters: Deque[asyncio.Future] = collections.deque()

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        while self._batch_waiters and self._items:
            waiter = self._batch_waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._take_batch())

    def _take_batch(self) -> List[Any]:
        """Everything queued; the end-of-stream marker stays, for every other reader."""
        items = []
        while self._items:
            item = self._items.popleft()
            items.append(item)
            if is_end(item):
                self._items.appendleft(item)
                break
        return items

    def batch_waiter(self) -> asyncio.Future:
        """A future for the next batch, registered now: waiters registered earlier get
        earlier items."""
        waiter = asyncio.get_running_loop().create_future()
        if self._items and not self._batch_waiters:
            waiter.set_result(self._take_batch())
        else:
            self._batch_waiters.append(waiter)
        return waiter

    async def get_batch(self, timeout: float | None = None) -> List[Any]:
        """Everything queued, waiting up to ``timeout`` s for the first item (an empty
        list if none came)."""
        return await self._wait_batch(self.batch_waiter(), timeout)

    async def _wait_batch(self, waiter: asyncio.Future, timeout: float | None) -> List[Any]:
        if not waiter.done():
            await asyncio.wait({waiter}, timeout=timeout)
        if waiter.done():
            return waiter.result()
        self._batch_waiters.remove(waiter)
        waiter.cancel()
        return []


class _Sequence:
    """Puts (or gets) of one handle, applied in the order the handle made them: Ray
    does not keep the order of one caller's calls to an async actor."""

    def __init__(self):
        self.next = 0
        self.parked: Dict[int, asyncio.Future] = {}

    async def turn(self, seq: int) -> None:
        """Returns when every call before ``seq`` has had its turn."""
        if seq != self.next:
            gate = asyncio.get_running_loop().create_future()
            self.parked[seq] = gate
            await gate

    def done(self) -> None:
        """The current call is applied: the next one may go."""
        self.next += 1
        gate = self.parked.pop(self.next, None)
        if gate is not None:
            gate.set_result(None)


class QueueHost:
    """Named queues inside an async actor (``ray.remote(QueueHost)``, or a subclass:
    a server actor hosts its own request and answer queues)."""

    def __init__(self):
        self._queues: Dict[str, HostedQueue] = {}
        self._sequences: Dict[Tuple[str, str, str], _Sequence] = {}

    def hosted(self, name: str) -> HostedQueue:
        """The queue named ``name`` (made on first use), for code inside the actor."""
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = HostedQueue()
        return q

    def _sequence(self, name: str, kind: str, handle: str) -> _Sequence:
        key = (name, kind, handle)
        sequence = self._sequences.get(key)
        if sequence is None:
            sequence = self._sequences[key] = _Sequence()
        return sequence

    async def put_many(self, name: str, items: List[Any], sender: str | None = None,
                       seq: int = 0) -> None:
        """Puts ``items`` on queue ``name``, in order; with ``sender``, after the
        sender's calls numbered below ``seq``. Returns once they are queued."""
        sequence = None if sender is None else self._sequence(name, "put", sender)
        if sequence is not None:
            await sequence.turn(seq)
        q = self.hosted(name)
        for item in items:
            q.put(item)
        if sequence is not None:
            sequence.done()

    async def get_many(self, name: str, timeout: float | None = None,
                       reader: str | None = None, seq: int = 0) -> List[Any]:
        """Everything queued on ``name`` (waiting up to ``timeout`` s for the first item;
        an empty list if none came). Calls are answered in the order they registered;
        with ``reader``, a reader's calls register in the order of their ``seq``."""
        q = self.hosted(name)
        if reader is None:
            return await q.get_batch(timeout)
        sequence = self._sequence(name, "get", reader)
        await sequence.turn(seq)
        waiter = q.batch_waiter()
        sequence.done()
        return await q._wait_batch(waiter, timeout)

    async def exchange(self, call: Tuple[str, List[Any], str, int, str, str, int],
                       ) -> List[Any]:
        """For ``call = (name, items, sender, seq, reply_name, reader, reply_seq)``:
        ``put_many(name, items, sender, seq)``, then ``get_many(reply_name, None, reader,
        reply_seq)``: a request and the wait for its answers in one call. (One argument:
        Ray serializes each argument of a call on its own, at a cost per argument.)"""
        name, items, sender, seq, reply_name, reader, reply_seq = call
        await self.put_many(name, items, sender, seq)
        return await self.get_many(reply_name, None, reader, reply_seq)

    def queue_size(self, name: str) -> int:
        return self.hosted(name).qsize()


class ActorQueue:
    """A QueueLike handle on the queue ``name`` of a ``QueueHost`` actor.

    Not thread-safe; one reader per handle (its buffer is local). Pickles to its host
    and name, so it can be passed to any Ray task or actor.
    """

    def __init__(self, host: Any, name: str):
        self._host = host
        self._name = name
        self._setup()

    def _setup(self) -> None:
        self._buffer: Deque[Any] = collections.deque()
        self._outgoing: List[Any] = []
        self._scheduled = False
        self._last_put: Any = None
        self._eof = False
        self._replies: ActorQueue | None = None
        self._coming: Deque[Any] = collections.deque()  # refs that will bring our items
        self._id = uuid.uuid4().hex  # this handle's puts and gets are applied in order
        self._put_seq = itertools.count()
        self._get_seq = itertools.count()

    def __getstate__(self) -> dict:
        return {"host": self._host, "name": self._name, "replies": self._replies}

    def __setstate__(self, state: dict) -> None:
        self._host, self._name = state["host"], state["name"]
        self._setup()
        self._replies = state["replies"]

    def with_replies(self, replies: "ActorQueue") -> "ActorQueue":
        """Sends each batch of puts with a wait for ``replies`` (a queue on the same
        host that this process reads) in one call, ``QueueHost.exchange``: for a
        request queue whose every message is answered on ``replies``, a round trip
        costs one call. Returns self."""
        if replies._host != self._host:
            raise ValueError("a queue's replies must be on the same host actor")
        self._replies = replies
        return self

    # -- putting ------------------------------------------------------------------------
    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            import ray

            ray.get(self._host.put_many.remote(self._name, [item], self._id,
                                              next(self._put_seq)), timeout=timeout)
            return
        self._outgoing.append(item)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)

    def put_nowait(self, item: Any) -> None:
        self.put(item, block=False)

    def send_pending(self) -> None:
        """Sends this iteration's puts now, as one call, instead of at the end of the
        iteration (for a caller that has put its last message of the iteration)."""
        if self._outgoing:
            self._flush()

    def _flush(self) -> None:
        self._scheduled = False
        items, self._outgoing = self._outgoing, []
        if not items:
            return
        seq = next(self._put_seq)
        replies = self._replies
        if replies is None or replies._eof:
            self._last_put = self._host.put_many.remote(self._name, items, self._id, seq)
        else:
            ref = self._host.exchange.remote((self._name, items, self._id, seq,
                                              replies._name, replies._id,
                                              next(replies._get_seq)))
            replies._coming.append(ref)
            self._last_put = ref

    async def drain(self) -> None:
        """Returns once every put has reached the host (or the host is gone)."""
        if self._outgoing:  # send what waits for the end of this iteration now
            self._flush()
        if self._last_put is None:
            return
        try:  # a sequenced empty put returns once every put before it is queued
            await self._host.put_many.remote(self._name, [], self._id, next(self._put_seq))
        except Exception:  # the host died: nothing to drain to
            pass

    # -- getting ------------------------------------------------------------------------
    def _take(self) -> Any:
        item = self._buffer.popleft()
        if is_end(item):
            self._eof = True
            self._buffer.clear()
            raise ClosedConnection("the stream was closed by its sender")
        return item

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        import ray

        if not self._buffer and not self._eof:
            wait = (timeout if timeout is not None else None) if block else 0.0
            try:
                self._buffer.extend(ray.get(self._host.get_many.remote(
                    self._name, wait, self._id, next(self._get_seq))))
            except ray.exceptions.RayActorError as e:
                raise ClosedConnection(f"the actor hosting queue {self._name!r} died: "
                                       f"{type(e).__name__}") from e
        if self._eof:
            raise ClosedConnection("the stream was closed by its sender")
        if not self._buffer:
            raise queue.Empty
        return self._take()

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def qsize(self) -> int:
        import ray

        return len(self._buffer) + ray.get(self._host.queue_size.remote(self._name))

    async def get_async(self) -> Any:
        while not self._buffer and not self._eof:
            import ray

            # Items come by the exchanges made for them (in order), else by a long poll.
            ref = self._coming.popleft() if self._coming else (
                self._host.get_many.remote(self._name, None, self._id,
                                           next(self._get_seq)))
            try:
                self._buffer.extend(await ref)
            except ray.exceptions.RayActorError as e:
                self._eof = True
                raise ClosedConnection(f"the actor hosting queue {self._name!r} died: "
                                       f"{type(e).__name__}") from e
        if self._eof:
            raise ClosedConnection("the stream was closed by its sender")
        return self._take()


def ray_queue(maxsize: int = 0) -> ActorQueue:
    """A queue in a new ``QueueHost`` actor (unbounded: ``maxsize`` must be 0).
    Starts Ray on this machine if it is not running."""
    if maxsize:
        raise ValueError(f"a Ray actor queue is unbounded: maxsize must be 0, got "
                         f"{maxsize!r}")
    from async_search.ray_init import ensure_ray

    ray = ensure_ray()
    host = ray.remote(QueueHost).options(num_cpus=0, max_concurrency=10_000).remote()
    return ActorQueue(host, "queue")


# -- direct connections: a socket from a task to an actor --------------------------------

_HANDSHAKE = struct.Struct("!32sI")  # the listener's token, the connecting side's key
_ACCEPTED = b"\x01"
#: Seconds a connection may take to connect and to send its handshake.
HANDSHAKE_TIMEOUT_S = 10.0
#: Seconds the listener waits before accepting again after accepting failed.
_ACCEPT_RETRY_S = 0.1


@dataclasses.dataclass(frozen=True)
class DirectAddress:
    """Where a ``DirectListener`` takes connections, and the token that opens them (not
    shown in its repr)."""

    host: str
    port: int
    token: bytes = dataclasses.field(repr=False)


def _tune(sock: socket.socket) -> None:
    """No Nagle delay (a frame leaves at once); a peer that vanishes without closing
    (its node lost) is noticed in tens of seconds, not hours."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", 30_000)):
        option = getattr(socket, name, None)
        if option is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
            except OSError:
                pass


def _socket_queues(sock: socket.socket) -> Tuple[SocketQueue, SocketQueue]:
    """``(inbound, outbound)``: socket queues reading from and writing to the connected
    ``sock``, each on its own descriptor (closing one leaves the other usable; the
    connection closes with the second)."""
    return SocketQueue.on_socket(reader=sock), SocketQueue.on_socket(writer=sock.dup())


def _node_ip() -> str:
    """This node's address in the Ray cluster (loopback outside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # no Ray here: a test, a single machine
        pass
    return "127.0.0.1"


async def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while len(data) < size:
        chunk = await loop.sock_recv(sock, size - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection during the handshake")
        data += chunk
    return data


class DirectListener:
    """Takes direct socket connections into this process (an actor's), in its loop.

    ``await start()`` listens on this node's address and returns the ``DirectAddress``
    to hand out (by an actor call: only holders of the actor's handle get the token).
    A connection that sends the token and its key within ``handshake_timeout`` seconds
    is accepted: ``on_connect(key, inbound, outbound)`` gets its two socket queues.
    Any other is closed, unread.

    Args:
        on_connect: called in the loop with each accepted connection.
        host: the address to listen on (default: this node's Ray address).
        handshake_timeout: seconds a connection may take to prove it holds the token.
    """

    def __init__(self, on_connect: Callable[[int, SocketQueue, SocketQueue], None], *,
                 host: str | None = None, handshake_timeout: float = HANDSHAKE_TIMEOUT_S):
        self._on_connect = on_connect
        self._host = host
        self._timeout = handshake_timeout
        self._sock: socket.socket | None = None
        self._token = secrets.token_bytes(32)
        self._tasks: Set[asyncio.Task] = set()
        self.address: DirectAddress | None = None
        #: Connections refused (a wrong token, a handshake cut short or too slow).
        self.refused = 0

    async def start(self) -> DirectAddress:
        host = self._host or _node_ip()
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            sock.bind((host, 0))
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._keep(asyncio.ensure_future(self._accept()))
        self.address = DirectAddress(host, sock.getsockname()[1], self._token)
        return self.address

    def _keep(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while self._sock is not None:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except (OSError, AttributeError):
                if self._sock is None:  # closed
                    return
                # Out of descriptors (a flood of connections that have not finished
                # their handshakes), or one aborted before it was taken: the listener
                # goes on taking connections once those are dropped (as asyncio's own
                # servers do, after a pause: no event says a descriptor was freed).
                await asyncio.sleep(_ACCEPT_RETRY_S)
                continue
            self._keep(asyncio.ensure_future(self._handshake(conn)))

    async def _handshake(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            conn.setblocking(False)
            token, key = _HANDSHAKE.unpack(await asyncio.wait_for(
                _recv_exactly(conn, _HANDSHAKE.size), self._timeout))
            if not hmac.compare_digest(token, self._token):
                raise ConnectionError("a wrong token")
            _tune(conn)
            await asyncio.wait_for(loop.sock_sendall(conn, _ACCEPTED), self._timeout)
        except (Exception, asyncio.CancelledError):
            self.refused += 1
            conn.close()
            return
        inbound, outbound = _socket_queues(conn)
        self._on_connect(key, inbound, outbound)

    def close(self) -> None:
        """Takes no more connections (those accepted go on)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        for task in list(self._tasks):
            task.cancel()


async def connect_direct(address: DirectAddress, key: int,
                         timeout: float = HANDSHAKE_TIMEOUT_S,
                         ) -> Tuple[SocketQueue, SocketQueue]:
    """``(inbound, outbound)``: the socket queues of a direct connection to the
    ``DirectListener`` at ``address``, introduced as ``key``.

    Raises:
        OSError, ConnectionError, asyncio.TimeoutError: no connection within
            ``timeout`` seconds (the address cannot be reached, or refused us).
    """
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET6 if ":" in address.host else socket.AF_INET)
    try:
        sock.setblocking(False)
        await asyncio.wait_for(loop.sock_connect(sock, (address.host, address.port)),
                               timeout)
        _tune(sock)
        await loop.sock_sendall(sock, _HANDSHAKE.pack(address.token, key))
        if await asyncio.wait_for(_recv_exactly(sock, 1), timeout) != _ACCEPTED:
            raise ConnectionError(f"{address.host}:{address.port} refused the connection")
    except BaseException:
        sock.close()
        raise
    return _socket_queues(sock)
