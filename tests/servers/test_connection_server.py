import asyncio
import threading

import numpy as np
import pytest

import async_search as asr
from async_search.connections import get_connected_functions
from async_search.models import MLP
from async_search.queues import local_queue, thread_queue
from async_search.servers import CLOSE, DispatchPolicy

pytestmark = pytest.mark.timeout(60)

MODEL = MLP((3,), hidden_sizes=(8,), output_size=2, seed=4)


def requests(seed, count=40):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((rng.integers(1, 5), 3)).astype(np.float32)
            for _ in range(count)]


async def test_serve_connection_batches_requests_of_many_functions():
    fns, server_end = get_connected_functions(local_queue, num_fns=4)
    serving = asyncio.ensure_future(asr.serve_connection(MODEL, server_end))
    xs = requests(0)
    ys = await asyncio.wait_for(
        asyncio.gather(*(fns[i % 4](x) for i, x in enumerate(xs))), 10)
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, MODEL(x))
    server_end.inbox.put(CLOSE)
    stats = await asyncio.wait_for(serving, 10)
    assert stats["elements"] == sum(len(x) for x in xs)
    assert stats["mean_batch_size"] > 1


async def test_bad_request_over_a_connection_fails_alone():
    fns, server_end = get_connected_functions(local_queue, num_fns=1)
    serving = asyncio.ensure_future(asr.serve_connection(MODEL, server_end))
    good = fns[0](np.ones((1, 3), np.float32))
    bad = fns[0](np.ones((1, 4), np.float32))
    with pytest.raises(ValueError, match=r"expected \[n, 3\] float32"):
        await asyncio.wait_for(bad, 10)
    np.testing.assert_array_equal(await good, MODEL(np.ones((1, 3), np.float32)))
    server_end.inbox.put(CLOSE)
    await asyncio.wait_for(serving, 10)


async def test_clients_in_other_threads_with_their_own_loops_are_served():
    fns, server_end = get_connected_functions(thread_queue, num_fns=2, ordered=False)
    results = {}

    def client(i):
        async def run():
            xs = requests(i, count=20)
            ys = await asyncio.wait_for(asyncio.gather(*(fns[i](x) for x in xs)), 20)
            results[i] = all(np.array_equal(y, MODEL(x)) for x, y in zip(xs, ys))
        asyncio.run(run())

    serving = asyncio.ensure_future(asr.serve_connection(
        MODEL, server_end, policy=DispatchPolicy(max_batch_size=16)))
    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        await asyncio.to_thread(t.join, 30)
    server_end.inbox.put(CLOSE)
    stats = await asyncio.wait_for(serving, 10)
    assert results == {0: True, 1: True}
    assert max(stats["batch_size_histogram"]) <= 16
