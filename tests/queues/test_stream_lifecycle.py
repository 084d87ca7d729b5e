"""One lifecycle for every queue a connection runs on: after close nothing is sent,
nothing waits forever, the server's end closes when its client's does, and misuse says
what it is. Every test runs on each queue kind: the prototype's ``queue.Queue``, local,
thread, process, socket and Ray (Ray's are slow: starting it costs seconds)."""

import asyncio
import queue

import numpy as np
import pytest

import async_search as asr
from async_search.connections import (PassThroughConnection, forked_pipe,
                                      get_connected_functions, pipe)
from async_search.errors import ConnectionGoneError, ServerDiedError
from async_search.queues import (ClosedConnection, close_stream, local_queue, process_queue,
                                 ray_queue, socket_queue, thread_queue)
from tests.helpers import WAIT_S, within

pytestmark = pytest.mark.timeout(120)

FACTORIES = {"Queue": queue.Queue, "local": local_queue, "thread": thread_queue,
             "process": process_queue, "socket": socket_queue, "ray": ray_queue}
#: The kinds a coroutine can await (``queue.Queue`` cannot: it has flush only).
AWAITABLE = [k for k in FACTORIES if k != "Queue"]


def kinds(names):
    return [pytest.param(n, marks=pytest.mark.slow) if n == "ray" else n for n in names]


@pytest.fixture
def factory(request):
    if request.param == "ray":
        request.getfixturevalue("ray_session")  # skips when Ray is not installed
    return FACTORIES[request.param]


def recv(conn):
    """The next message, bounded (a local queue never blocks anyway)."""
    return conn.recv(timeout=WAIT_S)


def double(x):
    return x * 2


# -- close: nothing is sent after it, and the reader's stream stays ended ----------------
@pytest.mark.parametrize("factory", kinds(FACTORIES), indirect=True)
def test_send_after_close_raises_and_nothing_arrives_after_the_end(factory):
    # Before, local, thread and queue.Queue took the send: the reader saw
    # before, ClosedConnection, after, ClosedConnection.
    a, b = pipe(factory)
    a.send("before")
    a.close()
    with pytest.raises(ClosedConnection, match=r"cannot send: this end .* was closed"):
        a.send("after")
    a.close()  # a second close does nothing
    assert recv(b) == "before"
    for _ in range(3):
        with pytest.raises(ClosedConnection, match="closed"):
            recv(b)
    b.send("the other way is open")  # close is a half-close
    assert recv(a) == "the other way is open"


@pytest.mark.parametrize("factory", kinds(FACTORIES), indirect=True)
def test_a_forked_client_that_closed_cannot_send_and_its_answers_end_after_the_last(
        factory):
    server, clients = forked_pipe(factory, 2)
    clients[0].send("question")
    clients[0].close()
    with pytest.raises(ClosedConnection, match="cannot send"):
        clients[0].send("another")
    with pytest.raises(ClosedConnection, match="cannot send"):
        clients[0].copy().send("from a copy")  # copies share the end's state
    clients[1].send("other")
    assert recv(server) == "question" and recv(server) == "other"
    server.send("answer")  # client 0's last answer: then its stream ends
    assert recv(clients[0]) == "answer"
    with pytest.raises(ClosedConnection):
        recv(clients[0])
    server.send("for the open client")
    assert recv(clients[1]) == "for the open client"
    clients[1].close()
    with pytest.raises(ClosedConnection):
        recv(server)
    with pytest.raises(ClosedConnection):
        recv(clients[1])  # nothing owed to it: its stream ended when it closed


# -- a call whose connection is gone fails at once ----------------------------------------
@pytest.mark.parametrize("factory", kinds(FACTORIES), indirect=True)
@pytest.mark.parametrize("ordered", [True, False], ids=["fifo", "unordered"])
def test_a_call_after_the_client_end_closed_fails_at_once(factory, ordered):
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        (fn,), server = get_connected_functions(factory, 1, ordered)
        fn.connection.close()
        with pytest.raises(ClosedConnection, match="cannot send"):
            fn(3)
        assert fn.num_pending == 0  # nothing is left waiting for an answer
    finally:
        loop.close()
        asyncio.set_event_loop(None)


@pytest.mark.parametrize("factory", kinds(AWAITABLE), indirect=True)
async def test_the_server_end_closes_when_its_client_does(factory):
    # Before, serving stopped when its client closed but never closed its own end: a
    # call made then got neither an answer nor an error (local and socket queues).
    (fn,), server_end = get_connected_functions(factory, 1, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(double, server_end))
    x = np.arange(3.0)[:, None]
    np.testing.assert_array_equal(await within(fn(x), "an answer"), x * 2)
    pending = fn(x)
    fn.connection.close()  # after a request: it is still answered
    np.testing.assert_array_equal(await within(pending, "the last answer"), x * 2)
    await within(serving, "serving to end")
    with pytest.raises(ClosedConnection, match="cannot send"):
        fn(x)  # its own end is closed: at once
    with pytest.raises(ClosedConnection, match="closed"):
        await within(fn.connection.recv_async(), "the end of the answers")


@pytest.mark.parametrize("factory", kinds(AWAITABLE), indirect=True)
async def test_two_servers_sharing_one_stream_both_end_when_their_clients_close(factory):
    # Before, on a process queue, the second server's wait on the shared stream took
    # the first's place in the loop: one server never woke, and serving never ended.
    fns, server_end = get_connected_functions(factory, 2, ordered=False)
    serving = asyncio.ensure_future(asr.serve_connection(double,
                                                         [server_end, server_end.copy()]))
    try:
        x = np.ones((1, 2))
        answers = await within(asyncio.gather(*(fn(x) for fn in fns)), "the answers")
        for answer in answers:
            np.testing.assert_array_equal(answer, x * 2)
        for fn in fns:
            fn.connection.close()
        await within(serving, "both servers to end")
    finally:
        serving.cancel()
        for fn in fns:
            await fn.aclose()


@pytest.mark.parametrize("factory", kinds(AWAITABLE), indirect=True)
async def test_a_call_whose_server_end_is_gone_fails_and_later_ones_at_once(factory):
    (fn,), server_end = get_connected_functions(factory, 1, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(double, server_end))
    close_stream(server_end.inbound)  # the server stops (its requests' stream ends)
    await within(serving, "serving to end")  # ... and closes its end
    waiting = fn(np.ones((1, 1)))
    with pytest.raises(ConnectionGoneError, match="the request was not answered"):
        await within(waiting, "the failure")
    for error in (ConnectionGoneError, ServerDiedError, ClosedConnection):
        with pytest.raises(error):  # one error, catchable as each
            fn(np.ones((1, 1)))


# -- misuse names itself ----------------------------------------------------------------
@pytest.mark.parametrize("factory", kinds(FACTORIES), indirect=True)
def test_answering_more_than_was_received_names_the_misuse(factory):
    # Before: IndexError('pop from an empty deque').
    server, clients = forked_pipe(factory, 1)
    with pytest.raises(RuntimeError, match="no received message is waiting for an answer"):
        server.send(9)
    clients[0].send(3)
    assert recv(server) == 3
    server.send(9)
    with pytest.raises(RuntimeError, match="no received message is waiting"):
        server.send(10)
    assert recv(clients[0]) == 9
    a, b = pipe(factory)
    through = PassThroughConnection(b)
    with pytest.raises(RuntimeError, match="no received message is waiting"):
        through.send(9)
    a.send(("key", 3))
    assert recv(through) == 3
    through.send(9)
    assert recv(a) == ("key", 9)


@pytest.mark.parametrize("factory", kinds(FACTORIES), indirect=True)
def test_a_message_that_is_not_key_and_value_names_what_was_expected(factory):
    a, b = pipe(factory)
    a.send("not a pair")
    with pytest.raises(TypeError, match=r"receives \(key, value\) messages"):
        recv(PassThroughConnection(b))
    server, _ = forked_pipe(factory, 1)
    server.inbound.put(42)  # a bare payload, not from a client end
    with pytest.raises(TypeError, match=r"receives \(key, payload\) messages"):
        recv(server)


def test_the_design_contract_still_holds_on_every_kind_of_queue():
    for factory in (queue.Queue, local_queue, thread_queue, socket_queue):
        server, clients = forked_pipe(factory, 2)
        clients[0].send(3)
        assert recv(server) == 3
        server.send(9)
        assert recv(clients[0]) == 9
