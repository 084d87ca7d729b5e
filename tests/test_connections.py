"""Connections: the knossos prototype's pipes, forked pipes, pass-through keys and
connected functions (with ``queue.Queue`` and no running loop, as it used them), plus
awaiting, closing and the failure of requests whose server is gone."""

import asyncio
import contextlib
import multiprocessing
import pickle
import queue
import threading
import time

import pytest

from async_search.connections import (Connection, FifoConnectedFunction, ForkedConnection,
                                      KeyedConnection, PassThroughConnection,
                                      UnorderedConnectedFunction, forked_pipe,
                                      get_connected_functions, pipe)
from async_search.errors import ServerDiedError
from async_search.queues import (END_OF_STREAM, ClosedConnection, close_stream, local_queue,
                                 thread_queue)
from tests.helpers import WAIT_S, wait_until, within

pytestmark = pytest.mark.timeout(60)

#: Factories whose queues a single thread can use without blocking forever.
FACTORIES = [pytest.param(queue.Queue, id="Queue"), pytest.param(local_queue, id="local"),
             pytest.param(thread_queue, id="thread")]


@pytest.fixture
def plain_loop():
    """A current event loop that is not running: what the prototype's callers had."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()
    asyncio.set_event_loop(None)


def recv(conn):
    """The next message, without blocking forever (a LocalQueue never blocks anyway)."""
    return conn.recv(timeout=WAIT_S)


def flush_until(fns, futures, timeout=WAIT_S):
    """Flushes ``fns`` until every future is done (bounded); no loop runs."""
    deadline = time.monotonic() + timeout
    while not all(f.done() for f in futures):
        assert time.monotonic() < deadline, "responses did not arrive in time"
        for fn in fns:
            fn.flush()
        time.sleep(0.001)


# -- the prototype's API with queue.Queue (and the awaitable queues) ----------------------


@pytest.mark.parametrize("factory", FACTORIES)
def test_pipe_carries_objects_both_ways_with_poll_and_num_waiting(factory):
    a, b = pipe(factory)
    assert isinstance(a, Connection) and not a.poll() and a.num_waiting() == 0
    a.send(1)
    a.send({"two": 2})
    b.send("back")
    assert b.poll() and b.num_waiting() == 2
    assert recv(b) == 1 and recv(b) == {"two": 2}
    assert not b.poll() and b.num_waiting() == 0
    assert a.poll() and recv(a) == "back" and not a.poll()


def test_pipe_recv_without_a_message_raises_empty():
    a, _ = pipe(queue.Queue)
    with pytest.raises(queue.Empty):
        a.recv(block=False)
    with pytest.raises(queue.Empty):
        a.recv(timeout=0.01)


def test_pipe_maxsize_bounds_each_queue():
    a, b = pipe(queue.Queue, maxsize=1)
    a.send(1)
    with pytest.raises(queue.Full):
        a.send(2, block=False)
    b.send(3, block=False)  # the other direction has its own bound
    assert recv(b) == 1 and recv(a) == 3


def test_design_contract_forked_pipe_answers_its_client():
    for queue_factory in (queue.Queue, local_queue, thread_queue):
        server, clients = forked_pipe(queue_factory, 2)
        clients[0].send(3)
        assert server.recv() == 3
        server.send(9)
        assert clients[0].recv() == 9
        assert not clients[1].poll()


@pytest.mark.parametrize("factory", FACTORIES)
def test_forked_pipe_routes_answers_to_their_clients_in_fifo_order(factory):
    server, clients = forked_pipe(factory, 3)
    assert isinstance(server, ForkedConnection) and len(clients) == 3
    assert all(isinstance(c, KeyedConnection) for c in clients)
    assert [c.key for c in clients] == [0, 1, 2]
    sends = [(2, "a"), (0, "b"), (2, "c"), (1, "d"), (0, "e"), (2, "f")]
    for i, payload in sends:
        clients[i].send(payload)
    assert server.num_waiting() == len(sends)
    received = [recv(server) for _ in sends]
    assert received == [p for _, p in sends]  # bare payloads, in arrival order
    for payload in received:
        server.send(payload.upper())
    assert [recv(clients[0]) for _ in range(2)] == ["B", "E"]
    assert [recv(clients[1])] == ["D"]
    assert [recv(clients[2]) for _ in range(3)] == ["A", "C", "F"]
    assert not any(c.poll() for c in clients)


def test_forked_pipe_answers_interleaved_with_requests_still_route_in_order():
    server, (c0, c1) = forked_pipe(queue.Queue, 2)
    c0.send(1)
    c1.send(2)
    assert recv(server) == 1
    server.send(10)  # answers c0 while c1's request is still queued
    c0.send(3)
    assert recv(server) == 2 and recv(server) == 3
    server.send(20)
    server.send(30)
    assert [recv(c0), recv(c0), recv(c1)] == [10, 30, 20]


@pytest.mark.parametrize("num_branches", [0, -1, 1.5, True, "2"])
def test_forked_pipe_refuses_a_bad_number_of_branches(num_branches):
    with pytest.raises(ValueError, match="num_branches"):
        forked_pipe(queue.Queue, num_branches)


@pytest.mark.parametrize("factory", FACTORIES)
def test_pass_through_connection_keeps_the_keys_of_its_messages(factory):
    client, server_end = pipe(factory)
    server = PassThroughConnection(server_end)
    for key, value in (("k1", 1), (("tuple", "key"), 2), (None, 3)):
        client.send((key, value))
    assert [recv(server) for _ in range(3)] == [1, 2, 3]
    for response in ("one", "two", "three"):
        server.send(response)
    assert [recv(client) for _ in range(3)] == [
        ("k1", "one"), (("tuple", "key"), "two"), (None, "three")]


def test_fifo_function_flush_resolves_arrived_responses_without_a_running_loop(plain_loop):
    server, client = pipe(queue.Queue)
    fn = FifoConnectedFunction(client)
    futures = [fn(i) for i in range(3)]
    assert fn.num_pending == 3 and not any(f.done() for f in futures)
    assert fn.flush() == 0  # nothing answered yet
    assert [recv(server) for _ in range(3)] == [0, 1, 2]
    server.send(0)
    server.send(1)
    assert fn.flush() == 2
    assert [f.result() for f in futures[:2]] == [0, 1] and not futures[2].done()
    server.send(4)
    assert fn.flush() == 1 and futures[2].result() == 4 and fn.num_pending == 0


def test_unordered_function_flush_matches_out_of_order_responses(plain_loop):
    server_end, client = pipe(queue.Queue)
    fn = UnorderedConnectedFunction(client)
    futures = [fn(i) for i in range(4)]
    requests = [recv(server_end) for _ in range(4)]
    assert [x for _, x in requests] == [0, 1, 2, 3]
    assert len({uid for uid, _ in requests}) == 4
    for uid, x in reversed(requests):
        server_end.send((uid, x * 10))
    assert fn.flush() == 4
    assert [f.result() for f in futures] == [0, 10, 20, 30]


def test_responses_that_are_exceptions_fail_their_future(plain_loop):
    (fn,), server = get_connected_functions(queue.Queue, 1, ordered=True)
    bad, good = fn("x"), fn("y")
    recv(server), recv(server)
    server.send(KeyError("nope"))
    server.send("fine")
    assert fn.flush() == 2
    with pytest.raises(KeyError, match="nope"):
        bad.result()
    assert good.result() == "fine"


def test_run_while_flushes_until_the_condition_fails(plain_loop):
    (fn,), server = get_connected_functions(queue.Queue, 1, ordered=True)
    futures = [fn(i) for i in range(5)]

    def serve():
        for _ in futures:
            server.send(recv(server) ** 2)

    thread = threading.Thread(target=serve)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    fn.run_while(lambda: not all(f.done() for f in futures) and time.monotonic() < deadline)
    thread.join(WAIT_S)
    assert [f.result() for f in futures] == [0, 1, 4, 9, 16]


def test_run_until_complete_runs_a_loop_that_is_not_running(plain_loop):
    (fn,), server = get_connected_functions(queue.Queue, 1, ordered=True)

    async def search(start):
        return [await fn(start + i) for i in range(3)]  # each waits for the last answer

    async def main():
        return await asyncio.wait_for(asyncio.gather(search(0), search(10)), WAIT_S)

    def serve():
        for _ in range(6):
            server.send(recv(server) + 100)

    thread = threading.Thread(target=serve)
    thread.start()
    task = plain_loop.create_task(main())
    assert not plain_loop.is_running()
    assert fn.run_until_complete(task) == [[100, 101, 102], [110, 111, 112]]
    thread.join(WAIT_S)
    assert not plain_loop.is_running() and fn.num_pending == 0


def test_one_client_two_servers_answer_out_of_order(plain_loop):
    server_end, client = pipe(queue.Queue)
    fn = UnorderedConnectedFunction(client)
    s1, s2 = PassThroughConnection(server_end), PassThroughConnection(server_end.copy())
    futures = [fn(i) for i in range(4)]
    assert [recv(s1), recv(s2), recv(s1), recv(s2)] == [0, 1, 2, 3]
    s2.send("s2:1")  # the second server answers first
    s1.send("s1:0")
    s2.send("s2:3")
    s1.send("s1:2")
    flush_until([fn], futures)
    assert [f.result() for f in futures] == ["s1:0", "s2:1", "s1:2", "s2:3"]


def test_two_clients_two_servers(plain_loop):
    fns, server = get_connected_functions(queue.Queue, 2, ordered=False)
    assert isinstance(server, PassThroughConnection)
    servers = [server, server.copy()]
    assert servers[1] is not server
    futures = {(i, j): fns[i]((i, j)) for j in range(3) for i in range(2)}
    taken = [[], []]
    for n in range(6):  # the servers take turns
        s = n % 2
        taken[s].append(recv(servers[s]))
    for s in (1, 0):  # the second server answers all of its requests first
        for i, j in taken[s]:
            servers[s].send(("from", s, i, j))
    flush_until(fns, list(futures.values()))
    for (i, j), fut in futures.items():
        assert fut.result()[2:] == (i, j)
    assert {fut.result()[1] for fut in futures.values()} == {0, 1}


@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize("num_fns", [1, 3])
@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
def test_get_connected_functions(plain_loop, factory, num_fns, ordered):
    fns, server = get_connected_functions(factory, num_fns, ordered,
                                          preprocess_fn=lambda x: x * 2)
    assert len(fns) == num_fns
    cls = FifoConnectedFunction if ordered else UnorderedConnectedFunction
    assert all(type(fn) is cls for fn in fns)
    assert isinstance(server, PassThroughConnection) is (not ordered)
    futures = [(i, x, fns[i](x)) for x in range(4) for i in range(num_fns)]
    received = [recv(server) for _ in futures]
    assert received == [2 * x for _, x, _ in futures]  # bare payloads, preprocessed
    for x in received:
        server.send(x + 1)
    flush_until(fns, [f for _, _, f in futures])
    assert all(f.result() == 2 * x + 1 for _, x, f in futures)


def test_get_connected_functions_with_maxsize_bounds_the_queues(plain_loop):
    (fn,), server = get_connected_functions(queue.Queue, 1, True, maxsize=1)
    fn(1)
    with pytest.raises(queue.Full):
        fn.connection.send(2, block=False)
    server.send(1)
    with pytest.raises(queue.Full):
        server.send(2, block=False)


# -- awaiting: a receiver task resolves futures ------------------------------------------


async def serve_async(server, count, transform=lambda x: x * 10):
    """Receives ``count`` requests (awaited), then answers them in order."""
    messages = [await within(server.recv_async(), "a request") for _ in range(count)]
    for x in messages:
        server.send(transform(x))


@pytest.mark.parametrize("factory", [local_queue, thread_queue])
@pytest.mark.parametrize("num_fns", [1, 2])
async def test_awaitable_functions_resolve_without_flush(factory, num_fns):
    fns, server = get_connected_functions(factory, num_fns, ordered=True)
    assert all(fn.connection.awaitable for fn in fns) and server.awaitable
    futures = [fns[i % num_fns](i) for i in range(6)]
    await serve_async(server, 6)
    assert await within(asyncio.gather(*futures), "answers") == [0, 10, 20, 30, 40, 50]
    assert all(fn.num_pending == 0 for fn in fns)


@pytest.mark.parametrize("factory", [local_queue, thread_queue])
async def test_unordered_awaitable_functions_match_responses_from_two_servers(factory):
    fns, server = get_connected_functions(factory, 2, ordered=False)
    futures = [fns[i % 2](i) for i in range(8)]
    first, second = server, server.copy()
    taken = [[await within(s.recv_async(), "a request") for _ in range(4)]
             for s in (first, second)]
    assert sorted(taken[0] + taken[1]) == list(range(8))
    for s, xs in ((second, taken[1]), (first, taken[0])):  # the second answers first
        for x in xs:
            s.send(x * 10)
    assert await within(asyncio.gather(*futures), "answers") == [
        i * 10 for i in range(8)]


async def test_awaitable_functions_answered_from_another_thread():
    fns, server = get_connected_functions(thread_queue, 2, ordered=True)

    def serve():  # blocking recv in a thread, with no loop
        for _ in range(6):
            server.send(-server.recv(timeout=WAIT_S))

    futures = [fns[i % 2](i) for i in range(6)]
    thread = threading.Thread(target=serve)
    thread.start()
    assert await within(asyncio.gather(*futures), "answers") == [0, -1, -2, -3, -4, -5]
    await asyncio.to_thread(thread.join, WAIT_S)


async def test_awaitable_error_response_fails_only_its_future():
    (fn,), server = get_connected_functions(local_queue, 1, ordered=True)
    bad, good = fn("x"), fn("y")
    await serve_async(server, 2, transform=lambda x: KeyError(x) if x == "x" else x)
    with pytest.raises(KeyError):
        await within(bad, "the failed answer")
    assert await within(good, "the good answer") == "y"


async def test_preprocess_fn_is_applied_before_sending():
    (fn,), server = get_connected_functions(local_queue, 1, True,
                                            preprocess_fn=lambda x: x + 1)
    fut = fn(1)
    assert await within(server.recv_async(), "the request") == 2
    server.send("ok")
    assert await within(fut, "the answer") == "ok"


async def test_cancelled_caller_response_is_discarded():
    (fn,), server = get_connected_functions(local_queue, 1, True)
    cancelled, kept = fn(1), fn(2)
    cancelled.cancel()
    await serve_async(server, 2)
    assert await within(kept, "the kept answer") == 20
    assert fn.num_pending == 0


async def test_aclose_stops_the_receiver_task():
    (fn,), server = get_connected_functions(local_queue, 1, True)
    fut = fn(1)
    await asyncio.sleep(0)
    await within(fn.aclose(), "aclose")
    server.send(10)  # nobody resolves it now, until a flush
    for _ in range(3):
        await asyncio.sleep(0)
    assert not fut.done()
    assert fn.flush() == 1 and fut.result() == 10


def test_recv_async_refuses_a_queue_that_cannot_be_awaited():
    a, _ = pipe(queue.Queue)
    assert not a.awaitable
    with pytest.raises(TypeError, match="cannot be awaited"):
        asyncio.run(a.recv_async())


# -- closing ------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", FACTORIES)
def test_close_ends_the_stream_after_what_was_sent(factory):
    a, b = pipe(factory)
    a.send(1)
    a.send(2)
    a.close()
    assert recv(b) == 1 and recv(b) == 2
    for _ in range(2):  # and stays ended
        with pytest.raises(ClosedConnection):
            recv(b)
    b.send("the other direction is still open")
    assert recv(a) == "the other direction is still open"


@pytest.mark.parametrize("factory", FACTORIES)
def test_end_of_stream_is_sticky_for_every_reader_of_a_queue(factory):
    a, b = pipe(factory)
    readers = [b, Connection(b.inbound, b.outbound)]
    a.send("x")
    a.close()
    assert recv(readers[1]) == "x"
    for reader in readers + readers:
        with pytest.raises(ClosedConnection):
            recv(reader)


async def test_recv_async_raises_closed_connection_for_every_waiting_reader():
    a, b = pipe(local_queue)
    readers = [asyncio.ensure_future(b.recv_async()) for _ in range(2)]
    await asyncio.sleep(0)
    a.close()
    for reader in readers:
        with pytest.raises(ClosedConnection):
            await within(reader, "the end of the stream")


@pytest.mark.parametrize("factory", FACTORIES)
def test_forked_server_ends_only_after_every_client_closed(factory):
    server, clients = forked_pipe(factory, 3)
    clients[0].send("a")
    clients[0].close()
    clients[1].send("b")
    clients[2].close()
    assert recv(server) == "a" and recv(server) == "b"
    server.send("A")
    with pytest.raises(queue.Empty):  # client 1 may still send
        server.recv(block=False)
    clients[1].send("c")
    assert recv(server) == "c"
    clients[1].close()
    copy = server.copy()
    for conn in (server, copy, server):
        with pytest.raises(ClosedConnection):
            recv(conn)
    assert recv(clients[0]) == "A"


async def test_forked_server_recv_async_ends_after_every_client_closed():
    server, clients = forked_pipe(thread_queue, 2)

    async def take_all():
        taken = []
        with pytest.raises(ClosedConnection):
            while True:
                taken.append(await server.recv_async())
        return taken

    taking = asyncio.ensure_future(take_all())
    clients[0].send(1)
    clients[0].close()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not taking.done()
    thread = threading.Thread(target=lambda: (clients[1].send(2), clients[1].close()))
    thread.start()
    assert await within(taking, "the end of the forked stream") == [1, 2]
    thread.join(WAIT_S)


def test_a_client_closing_twice_does_not_end_the_others_stream():
    server, (c0, c1) = forked_pipe(queue.Queue, 2)
    c0.close()
    c0.close()
    c1.send(1)
    assert recv(server) == 1
    with pytest.raises(queue.Empty):
        server.recv(block=False)


@pytest.mark.parametrize("factory", FACTORIES)
def test_close_stream_on_the_inbound_ends_every_copy_of_a_server(factory):
    server, clients = forked_pipe(factory, 2)
    copies = [server, server.copy(), PassThroughConnection(server.copy())]
    clients[0].send(("k", "x"))
    close_stream(server.inbound)
    assert recv(copies[2]) == "x"
    for conn in copies:
        with pytest.raises(ClosedConnection):
            recv(conn)


def test_forked_server_close_ends_every_clients_stream():
    server, clients = forked_pipe(queue.Queue, 2)
    clients[1].send(5)
    assert recv(server) == 5
    server.send(25)
    server.close()
    assert recv(clients[1]) == 25
    for client in clients:
        with pytest.raises(ClosedConnection):
            recv(client)


def test_end_of_stream_survives_pickling():
    assert pickle.loads(pickle.dumps(END_OF_STREAM)) is END_OF_STREAM


# -- a server that goes away ----------------------------------------------------------------


@pytest.mark.parametrize("factory", [local_queue, thread_queue])
@pytest.mark.parametrize("num_fns", [1, 2])
@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
async def test_pending_futures_fail_with_server_died_when_the_responses_stream_closes(
        factory, num_fns, ordered):
    fns, server = get_connected_functions(factory, num_fns, ordered)
    answered = fns[0]("first")
    pending = [fn(i) for i, fn in enumerate(fns)]
    assert await within(server.recv_async(), "a request") == "first"
    server.send("answer")
    server.close()  # every client's stream of responses ends
    assert await within(answered, "the answer sent before closing") == "answer"
    for fut in pending:
        with pytest.raises(ServerDiedError, match="closed"):
            await within(fut, "the failure")
    for fn in fns:
        assert isinstance(fn.error, ServerDiedError)
        with pytest.raises(ServerDiedError):  # later calls fail at once
            fn("later")


async def test_a_dead_server_fails_only_the_functions_whose_stream_closed():
    fns, server = get_connected_functions(local_queue, 2, ordered=True)
    doomed, fine = fns[0](1), fns[1](2)
    close_stream(fns[0].connection.inbound)  # only client 0 loses its responses
    with pytest.raises(ServerDiedError):
        await within(doomed, "the failure")
    await serve_async(server, 2)  # client 0's request is answered into the void
    assert await within(fine, "the other client's answer") == 20
    assert fns[1].error is None
    later = fns[1](3)
    await serve_async(server, 1)
    assert await within(later, "a later answer") == 30


def test_flush_fails_pending_futures_with_server_died_when_the_stream_closed(plain_loop):
    (fn,), server = get_connected_functions(queue.Queue, 1, ordered=True)
    pending = fn(1)
    server.close()
    with contextlib.suppress(ClosedConnection, ServerDiedError):
        fn.flush()
    assert pending.done() and isinstance(pending.exception(), ServerDiedError)
    with pytest.raises(ServerDiedError):
        fn(2)


# -- across processes, with the prototype's manager queues -------------------------------


def _square_server(server, count):
    for _ in range(count):
        server.send(server.recv(timeout=60) ** 2)
    server.close()


def test_manager_queues_connect_functions_to_a_server_in_a_spawned_process(plain_loop):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        fns, server = get_connected_functions(manager.Queue, 2, ordered=True)
        child = ctx.Process(target=_square_server, args=(server, 6))
        child.start()
        try:
            futures = [fns[i % 2](i) for i in range(6)]
            flush_until(fns, futures, timeout=60)
            assert [f.result() for f in futures] == [0, 1, 4, 9, 16, 25]
            child.join(60)
            assert child.exitcode == 0
            for fn in fns:  # the child closed every client's stream
                with pytest.raises(ClosedConnection):
                    fn.connection.recv(timeout=WAIT_S)
        finally:
            if child.is_alive():
                child.kill()
                child.join(WAIT_S)


@pytest.mark.parametrize("bad", [True, 0, -1, 1.5, "2"])
def test_get_connected_functions_refuses_a_bad_number_of_functions(bad):
    with pytest.raises(ValueError, match="num_fns must be an integer >= 1"):
        get_connected_functions(queue.Queue, bad, True)


class RefusingQueue(queue.Queue):
    """Refuses to carry strings: a stand-in for an item that cannot travel."""

    def put(self, item, block=True, timeout=None):
        if isinstance(item, str) or (isinstance(item, tuple) and isinstance(item[-1], str)):
            raise TypeError("cannot travel")
        super().put(item, block, timeout)


@pytest.mark.parametrize("ordered", [True, False])
def test_a_request_that_cannot_be_sent_fails_at_once_and_keeps_the_matching(ordered,
                                                                          plain_loop):
    (fn,), server = get_connected_functions(RefusingQueue, 1, ordered)
    first = fn(1)
    with pytest.raises(TypeError, match="cannot travel"):
        fn("x")
    second = fn(2)
    assert fn.num_pending == 2
    for _ in range(2):
        server.send(server.recv(timeout=5) * 10)
    fn.flush()
    assert (first.result(), second.result()) == (10, 20)
