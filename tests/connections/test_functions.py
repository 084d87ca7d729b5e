"""connections.functions: connected functions as the prototype used them (no running
loop), awaited, closed, and failing their requests when the server is gone."""

import asyncio
import contextlib
import multiprocessing
import queue
import threading
import time

import pytest

from async_search.connections import (FifoConnectedFunction, Notice,
                                      PassThroughConnection, UnorderedConnectedFunction,
                                      get_connected_functions, pipe)
from async_search.errors import ServerDiedError
from async_search.queues import (ClosedConnection, close_stream, local_queue, socket_queue,
                                 thread_queue)
from tests.connections.common import FACTORIES, flush_until, recv
from tests.helpers import LoadsNowhere, WAIT_S, within

pytestmark = pytest.mark.timeout(60)


async def serve_async(server, count, transform=lambda x: x * 10):
    """Receives ``count`` requests (awaited), then answers them in order."""
    messages = [await within(server.recv_async(), "a request") for _ in range(count)]
    for x in messages:
        server.send(transform(x))


def _square_server(server, count):
    for _ in range(count):
        server.send(server.recv(timeout=60) ** 2)
    server.close()




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



def test_flush_fails_the_pending_call_when_a_socket_queues_stream_ends(plain_loop):
    # A socket queue takes the end of its stream in without counting it in qsize:
    # flush reads until the queue is empty, not while poll() says so.
    (fn,), server = get_connected_functions(socket_queue, 1, ordered=True)
    pending = fn(3)
    assert server.recv(timeout=WAIT_S) == 3
    server.close()
    deadline = time.monotonic() + WAIT_S
    while not pending.done() and time.monotonic() < deadline:
        fn.flush()
        time.sleep(0.01)
    assert isinstance(pending.exception(), ServerDiedError)
    assert isinstance(fn.error, ServerDiedError)


class Hello(Notice):
    pass


async def test_a_listen_callback_that_raises_does_not_stop_the_responses():
    (fn,), server = get_connected_functions(local_queue, 1, ordered=True)
    reported = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))

    def buggy(notice):
        raise RuntimeError("a bug in the callback")

    fn.listen(buggy)
    call = fn(1)
    await asyncio.sleep(0)
    server.notify(Hello())
    assert recv(server) == 1
    server.send("answer")
    assert await within(call, "the answer") == "answer"
    assert [type(c["exception"]).__name__ for c in reported] == ["RuntimeError"]
    await fn.aclose()


async def test_a_response_that_matches_no_request_fails_the_pending_ones():
    client, server = pipe(local_queue)
    fn = UnorderedConnectedFunction(client)
    first, second = fn(1), fn(2)
    await asyncio.sleep(0)
    server.recv(), server.recv()
    server.send("not (uid, response)")
    for call in (first, second):
        with pytest.raises(ServerDiedError, match="could not be matched"):
            await within(call, "the failure")
    with pytest.raises(ServerDiedError):
        fn(3)


def test_a_response_flush_cannot_read_fails_every_pending_call_not_the_next_one():
    # flush raised the raw error, and the next flush gave request 1 the answer to 2.
    from async_search.errors import ConnectionGoneError
    from async_search.queues import process_queue

    (fn,), server = get_connected_functions(process_queue, 1, ordered=True)
    first, second = fn(1), fn(2)
    server.recv(timeout=5)
    server.recv(timeout=5)
    server.send(LoadsNowhere())
    server.send("the answer to request 2")
    deadline = time.monotonic() + 10
    while not first.done() and time.monotonic() < deadline:
        fn.flush()
        time.sleep(0.01)
    for fut in (first, second):
        with pytest.raises(ConnectionGoneError, match="could not be read"):
            fut.result()
