"""Direct connections between Ray tasks and an actor: a socket instead of actor calls.

An actor call costs far more than a socket round trip between the same two processes,
whatever it carries, so a request that needs one per round trip is bounded by it.
``DirectListener`` lets an actor take direct socket connections instead: a task that
holds the actor's handle learns its ``DirectAddress`` (host, port and a secret token)
by an actor call, and ``connect_direct`` opens a socket to it; each side then holds two
``SocketQueue``s (one frame per loop iteration, the process backend's transport). The
token is checked before anything is unpickled, so only those who got the address
through Ray can send. When the actor dies, a reader gets ``ClosedConnection`` from the
socket's end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import secrets
import socket
import struct
from typing import Callable, Set, Tuple

from async_search.queues.sockets import SocketQueue


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
