"""Direct connections into an actor (``DirectListener``, ``connect_direct``): tested in
one process, without Ray (the listener takes a host; Ray only carries the address)."""

import asyncio
import os
import pickle
import socket

import numpy as np
import pytest

from async_search.queues import ClosedConnection, close_stream
from async_search.queues.ray_direct import (DirectAddress, DirectListener, _HANDSHAKE,
                                            connect_direct)

pytestmark = pytest.mark.timeout(30)


class Accepted:
    """What a listener accepted: ``(key, inbound, outbound)`` per connection."""

    def __init__(self):
        self.connections = []
        self.arrived = asyncio.Event()

    def __call__(self, key, inbound, outbound):
        self.connections.append((key, inbound, outbound))
        self.arrived.set()


async def closed_on_us(raw: socket.socket) -> bool:
    """True once the listener has closed ``raw``'s connection (with a FIN, or with a
    reset when it left bytes unread)."""
    raw.setblocking(False)
    try:
        return await asyncio.wait_for(asyncio.get_running_loop().sock_recv(raw, 1), 5) == b""
    except ConnectionResetError:
        return True
    finally:
        raw.close()


async def listening(handshake_timeout=5.0):
    accepted = Accepted()
    listener = DirectListener(accepted, host="127.0.0.1",
                              handshake_timeout=handshake_timeout)
    address = await listener.start()
    return listener, address, accepted


async def test_a_direct_connection_carries_arrays_both_ways_in_frames():
    listener, address, accepted = await listening()
    try:
        inbound, outbound = await connect_direct(address, key=7)
        await asyncio.wait_for(accepted.arrived.wait(), 5)
        key, server_in, server_out = accepted.connections[0]
        assert key == 7
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        outbound.put(("request", x))
        outbound.put("second")
        kind, got = await asyncio.wait_for(server_in.get_async(), 5)
        assert kind == "request"
        np.testing.assert_array_equal(got, x)
        assert await asyncio.wait_for(server_in.get_async(), 5) == "second"
        server_out.put(got * 2)
        np.testing.assert_array_equal(await asyncio.wait_for(inbound.get_async(), 5), x * 2)
        close_stream(outbound)  # the end of the stream travels like an item
        with pytest.raises(ClosedConnection):
            await asyncio.wait_for(server_in.get_async(), 5)
    finally:
        listener.close()
        for _, a, b in accepted.connections:
            a.close()
            b.close()


async def test_a_reader_gets_closed_connection_when_the_other_side_is_gone():
    """A server actor that dies closes its sockets: its client's reader must end, not
    wait (the client then fails what it was waiting for with ServerDiedError)."""
    listener, address, accepted = await listening()
    try:
        inbound, outbound = await connect_direct(address, key=0)
        await asyncio.wait_for(accepted.arrived.wait(), 5)
        _, server_in, server_out = accepted.connections[0]
        server_out.put("last")
        await server_out.drain()
        server_in.close()
        server_out.close()  # both descriptors: the connection closes
        assert await asyncio.wait_for(inbound.get_async(), 5) == "last"
        with pytest.raises(ClosedConnection):
            await asyncio.wait_for(inbound.get_async(), 5)
    finally:
        listener.close()


async def test_a_wrong_token_is_refused_and_nothing_it_sends_is_read():
    listener, address, accepted = await listening()
    try:
        wrong = DirectAddress(address.host, address.port, b"\0" * 32)
        with pytest.raises(ConnectionError):
            await connect_direct(wrong, key=1)
        # A raw peer that sends a wrong token and then a pickle: closed, unread.
        raw = socket.create_connection((address.host, address.port))
        raw.sendall(_HANDSHAKE.pack(b"x" * 32, 2) + pickle.dumps(object))
        assert await closed_on_us(raw)
        assert listener.refused == 2
        assert not accepted.connections
        assert "token" not in repr(address)  # the secret is not shown
    finally:
        listener.close()


async def test_a_peer_that_never_finishes_its_handshake_is_dropped_in_time():
    listener, address, accepted = await listening(handshake_timeout=0.2)
    try:
        raw = socket.create_connection((address.host, address.port))
        raw.sendall(b"\1\2\3")  # part of a handshake, then silence
        assert await closed_on_us(raw)
        assert listener.refused == 1 and not accepted.connections
    finally:
        listener.close()


async def test_an_address_nobody_listens_on_fails_at_once_instead_of_waiting():
    listener, address, _ = await listening()
    listener.close()  # nobody listens there any more
    with pytest.raises(OSError):
        await asyncio.wait_for(connect_direct(address, key=0, timeout=5), 10)


async def test_a_closed_listener_takes_no_new_connection_and_keeps_the_old_ones():
    listener, address, accepted = await listening()
    inbound, outbound = await connect_direct(address, key=3)
    await asyncio.wait_for(accepted.arrived.wait(), 5)
    listener.close()
    with pytest.raises(OSError):
        await connect_direct(address, key=4, timeout=5)
    _, server_in, server_out = accepted.connections[0]
    outbound.put(5)
    assert await asyncio.wait_for(server_in.get_async(), 5) == 5
    for q in (inbound, outbound, server_in, server_out):
        q.close()


async def test_a_flood_that_runs_the_process_out_of_descriptors_does_not_stop_the_listener():
    """Connections that never finish their handshakes can exhaust the descriptors
    (accepting then fails with EMFILE): once they are dropped, the listener must take
    connections again, not have ended its accepting for good."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    listener, address, accepted = await listening(handshake_timeout=0.3)
    raws = []
    try:
        # The flood connects while the loop is blocked here, so its 80 connections wait
        # in the listen backlog (128); only then is the limit lowered to 20 more files,
        # so the listener, not the flood, is the one to run out (a flood from a thread
        # raced the listener for the last descriptors, and the listener could win).
        for _ in range(80):
            raws.append(socket.create_connection((address.host, address.port)))
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 20,
                                                    hard))
        await asyncio.sleep(1.0)  # the listener hit EMFILE; the handshakes time out
    finally:
        for raw in raws:
            raw.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert listener.refused > 0
        inbound, outbound = await asyncio.wait_for(connect_direct(address, key=9), 5)
        await asyncio.wait_for(accepted.arrived.wait(), 5)
        assert accepted.connections[0][0] == 9
        inbound.close()
        outbound.close()
    finally:
        listener.close()
        for _, a, b in accepted.connections:
            a.close()
            b.close()
