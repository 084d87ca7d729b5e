import asyncio
import queue

import pytest

from async_search.connections import (FifoConnectedFunction, UnorderedConnectedFunction,
                                      forked_pipe, get_connected_functions, pipe)
from async_search.queues import local_queue, thread_queue

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("factory", [local_queue, thread_queue])
def test_pipe_carries_objects_both_ways(factory):
    a, b = pipe(factory)
    a.send(1)
    b.send("back")
    assert b.poll() and b.num_waiting() == 1 and b.recv() == 1
    assert a.recv() == "back"
    assert not a.poll()


def test_forked_pipe_routes_each_response_to_its_client():
    clients, server = forked_pipe(local_queue, num_clients=3)
    for i, client in enumerate(clients):
        client.send((f"key{i}", i))
    for _ in range(3):
        route, payload = server.recv()
        server.send((route, payload * 100))
    assert [c.recv() for c in clients] == [("key0", 0), ("key1", 100), ("key2", 200)]


async def answer(server, count, transform=lambda x: x * 10, reverse=False):
    messages = [await server.recv_async() for _ in range(count)]
    for route, x in (reversed(messages) if reverse else messages):
        server.send((route, transform(x)))


@pytest.mark.parametrize("factory", [local_queue, thread_queue])
async def test_fifo_functions_resolve_without_flush(factory):
    fns, server = get_connected_functions(factory, num_fns=2, ordered=True)
    assert all(isinstance(f, FifoConnectedFunction) for f in fns)
    futures = [fns[i % 2](i) for i in range(6)]
    await answer(server, 6)
    assert await asyncio.wait_for(asyncio.gather(*futures), 5) == [0, 10, 20, 30, 40, 50]


async def test_unordered_functions_match_out_of_order_responses_by_key():
    fns, server = get_connected_functions(local_queue, num_fns=1, ordered=False)
    assert isinstance(fns[0], UnorderedConnectedFunction)
    futures = [fns[0](i) for i in range(4)]
    await answer(server, 4, reverse=True)
    assert await asyncio.wait_for(asyncio.gather(*futures), 5) == [0, 10, 20, 30]


async def test_flush_resolves_futures_on_a_connection_that_cannot_be_awaited():
    fns, server = get_connected_functions(queue.Queue, num_fns=1)
    fut = fns[0](7)
    route, x = server.recv(timeout=1)
    server.send((route, x + 1))
    assert fns[0].flush() == 1
    assert fut.result() == 8


async def test_error_response_fails_the_future():
    fns, server = get_connected_functions(local_queue, num_fns=1)
    fut = fns[0]("x")
    route, _ = await server.recv_async()
    server.send((route, KeyError("nope")))
    with pytest.raises(KeyError):
        await asyncio.wait_for(fut, 5)


async def test_preprocess_fn_is_applied_before_sending():
    fns, server = get_connected_functions(local_queue, 1, preprocess_fn=lambda x: x + 1)
    fns[0](1)
    assert (await server.recv_async())[1] == 2
    await fns[0].aclose()


async def test_cancelled_caller_response_is_discarded():
    fns, server = get_connected_functions(local_queue, num_fns=1)
    cancelled = fns[0](1)
    kept = fns[0](2)
    cancelled.cancel()
    await answer(server, 2)
    assert await asyncio.wait_for(kept, 5) == 20
