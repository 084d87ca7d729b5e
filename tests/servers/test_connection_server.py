import asyncio
import threading

import numpy as np
import pytest

import async_search as asr
from async_search.connections import get_connected_functions
from async_search.models import MLP
from async_search.queues import local_queue, thread_queue
from async_search.servers import CLOSE, DispatchPolicy, ModelUpdate, VersionedRequest

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


class VersionModel:
    """Every output row is the model's version; ``with_weights(w)`` is version ``w``."""

    def __init__(self, version=0):
        self.version = version

    def __call__(self, x):
        return np.full((len(x), 1), self.version, np.float32)

    def with_weights(self, weights):
        return VersionModel(weights)


async def test_model_updates_on_a_thread_connection_reach_every_later_request():
    """A searcher thread (its own loop, four concurrent searches) asks with
    VersionedRequest while this loop sends ModelUpdate 1 (a model), 2 (weights) and 3
    (which ends the searches) from another client. A request sent after an update was
    answered must be answered by that version or a later one, never an older one."""
    fns, server_end = get_connected_functions(thread_queue, num_fns=2)
    searcher_fn, updater_fn = fns
    pushes = {"sent": 0, "answered": 0}  # how many updates were sent, and answered
    records = []
    wanted = {"count": 0}
    enough = threading.Event()

    def searcher():
        async def search(i):
            while True:
                x = np.zeros((1 + i % 3, 3), np.float32)
                i += 1
                answered_before = pushes["answered"]
                y, version = await searcher_fn(VersionedRequest(x))
                records.append((answered_before, pushes["sent"], version, y.min(), y.max()))
                if len(records) >= wanted["count"]:
                    enough.set()
                if y.max() >= 3:
                    return

        async def run():
            await asyncio.wait_for(asyncio.gather(*(search(i) for i in range(4))), 60)
        asyncio.run(run())

    serving = asyncio.ensure_future(asr.serve_connection(
        VersionModel(0), server_end, policy=DispatchPolicy(max_batch_size=4)))
    thread = threading.Thread(target=searcher)
    thread.start()
    try:
        for version, model_or_weights in ((1, VersionModel(1)), (2, 2), (3, VersionModel(3))):
            enough.clear()
            wanted["count"] = len(records) + 20
            assert await asyncio.to_thread(enough.wait, 30)
            pushes["sent"] += 1
            answer = await asyncio.wait_for(
                updater_fn(ModelUpdate(model_or_weights, version)), 10)
            pushes["answered"] += 1
            assert answer == version
    finally:
        await asyncio.to_thread(thread.join, 60)
    server_end.inbox.put(CLOSE)
    stats = await asyncio.wait_for(serving, 10)
    assert stats["version"] == 3
    phases = set()
    for low, high, version, low_row, high_row in records:
        assert low <= low_row <= high_row <= high
        if version is not None:
            assert low_row == high_row == version
        if low == high:  # no update was sent while it was served
            assert version == low
            phases.add(low)
    assert {0, 1, 2} <= phases


async def test_a_bare_model_update_swaps_the_model_for_the_requests_after_it():
    fns, server_end = get_connected_functions(local_queue, num_fns=1)
    serving = asyncio.ensure_future(asr.serve_connection(VersionModel(0), server_end))
    x = np.zeros((2, 3), np.float32)
    y, version = await asyncio.wait_for(fns[0](VersionedRequest(x)), 10)
    assert version == 0 and y.tolist() == [[0.0], [0.0]]
    server_end.inbox.put(ModelUpdate(VersionModel(5), "five"))  # no answer comes back
    after = fns[0](VersionedRequest(x))
    plain = fns[0](x)
    y, version = await asyncio.wait_for(after, 10)
    assert version == "five" and y.tolist() == [[5.0], [5.0]]
    assert (await asyncio.wait_for(plain, 10)).tolist() == [[5.0], [5.0]]
    server_end.inbox.put(CLOSE)
    assert (await asyncio.wait_for(serving, 10))["version"] == "five"


async def test_an_update_that_fails_is_answered_with_its_error_and_serving_goes_on():
    fns, server_end = get_connected_functions(local_queue, num_fns=1)
    no_weights = VersionModel(0).__call__  # a model without with_weights
    serving = asyncio.ensure_future(asr.serve_connection(no_weights, server_end))
    with pytest.raises(TypeError, match="pass a new model instead"):
        await asyncio.wait_for(fns[0](ModelUpdate([np.zeros(3)], 1)), 10)
    good = fns[0](VersionedRequest(np.ones((1, 3), np.float32)))
    bad = fns[0](VersionedRequest(np.zeros((1, 4), np.float32)))
    with pytest.raises(ValueError, match=r"expected \[n, 3\] float32"):
        await asyncio.wait_for(bad, 10)
    y, version = await asyncio.wait_for(good, 10)
    assert version == 0 and y.tolist() == [[0.0]]
    server_end.inbox.put(CLOSE)
    await asyncio.wait_for(serving, 10)


async def test_a_bare_update_that_fails_ends_serving_and_answers_what_was_queued():
    fns, server_end = get_connected_functions(local_queue, num_fns=1)
    serving = asyncio.ensure_future(asr.serve_connection(VersionModel(0).__call__,
                                                         server_end))
    queued = fns[0](np.zeros((1, 3), np.float32))
    server_end.inbox.put(ModelUpdate([np.zeros(3)], 1))
    with pytest.raises(TypeError, match="pass a new model instead"):
        await asyncio.wait_for(serving, 10)
    try:  # served before the update, or failed as the server closed: never left waiting
        assert (await asyncio.wait_for(queued, 10)).tolist() == [[0.0]]
    except asr.ServerClosedError:
        pass
