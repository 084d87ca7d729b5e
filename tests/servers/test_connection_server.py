"""serve_connection: every payload received is answered in order, batched by one
BatchingServer, until every stream has ended (its clients closed it)."""

import asyncio
import threading

import numpy as np
import pytest

import async_search as asr
from async_search.backends.client import CoalescingClient
from async_search.connections import (Connection, FifoConnectedFunction,
                                      PassThroughConnection, UnorderedConnectedFunction,
                                      get_connected_functions, pipe)
from async_search.errors import (ConnectionGoneError, MalformedMessageError, ModelOutputError,
                                 ServerDiedError)
from async_search.models import MLP
from async_search.queues import close_stream, local_queue, socket_queue, thread_queue
from async_search.servers import (BatchingServer, DispatchPolicy, ModelUpdate,
                                  VersionedRequest)
from async_search.servers.connection_server import ConnectionServer
from async_search.wire import RowsFailed
from async_search.wire import Failure
from async_search.wire import VersionSubscription
from tests.helpers import LoadsNowhere, WAIT_S, wait_until, within

pytestmark = pytest.mark.timeout(60)

MODEL = MLP((3,), hidden_sizes=(8,), output_size=2, seed=4)


def requests(seed, count=40):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((rng.integers(1, 5), 3)).astype(np.float32)
            for _ in range(count)]


def close_all(fns):
    """Each client tells the server it sends nothing more."""
    for fn in fns:
        fn.connection.close()


async def still_serving(serving):
    """Lets the loop run a few times; ``serving`` must not have returned."""
    for _ in range(10):
        await asyncio.sleep(0)
    assert not serving.done()


async def test_serve_connection_batches_requests_of_many_functions():
    fns, server_end = get_connected_functions(local_queue, 4, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(MODEL, server_end))
    xs = requests(0)
    ys = await within(asyncio.gather(*(fns[i % 4](x) for i, x in enumerate(xs))),
                      "the answers")
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, MODEL(x))
    close_all(fns[:3])
    await still_serving(serving)  # one client has not closed yet
    fns[3].connection.close()
    stats = await within(serving, "serving to end once every client closed")
    assert stats["elements"] == sum(len(x) for x in xs)
    assert stats["mean_batch_size"] > 1


async def test_closing_the_server_ends_inbound_ends_serving():
    fns, server_end = get_connected_functions(local_queue, 2, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(MODEL, server_end))
    x = np.ones((2, 3), np.float32)
    fut = fns[1](x)
    close_stream(server_end.inbound)  # after the request: it is still answered
    np.testing.assert_array_equal(await within(fut, "the answer"), MODEL(x))
    stats = await within(serving, "serving to end")
    assert stats["elements"] == 2


async def test_bad_request_over_a_connection_fails_alone():
    (fn,), server_end = get_connected_functions(local_queue, 1, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(MODEL, server_end))
    good = fn(np.ones((1, 3), np.float32))
    bad = fn(np.ones((1, 4), np.float32))
    after = fn(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"expected \[n, 3\] float32"):
        await within(bad, "the failure")
    np.testing.assert_array_equal(await within(good, "good"),
                                  MODEL(np.ones((1, 3), np.float32)))
    np.testing.assert_array_equal(await within(after, "after"),
                                  MODEL(np.zeros((2, 3), np.float32)))
    fn.connection.close()
    await within(serving, "serving to end")


async def test_clients_in_other_threads_with_their_own_loops_are_served():
    fns, server_end = get_connected_functions(thread_queue, 2, ordered=False)
    results = {}

    def client(i):
        async def run():
            xs = requests(i, count=20)
            ys = await asyncio.wait_for(asyncio.gather(*(fns[i](x) for x in xs)), WAIT_S)
            results[i] = all(np.array_equal(y, MODEL(x)) for x, y in zip(xs, ys))
        try:
            asyncio.run(run())
        finally:
            fns[i].connection.close()  # from this thread: the server ends after both

    serving = asyncio.ensure_future(asr.serve_connection(
        MODEL, server_end, policy=DispatchPolicy(max_batch_size=16)))
    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    stats = await within(serving, "serving to end once both threads closed", timeout=30)
    for t in threads:
        await asyncio.to_thread(t.join, WAIT_S)
    assert results == {0: True, 1: True}
    assert stats["elements"] > 0 and max(stats["batch_size_histogram"]) <= 16


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
    fns, server_end = get_connected_functions(thread_queue, 2, ordered=True)
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
            await asyncio.wait_for(asyncio.gather(*(search(i) for i in range(4))), 30)
        try:
            asyncio.run(run())
        finally:
            searcher_fn.connection.close()

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
            answer = await within(updater_fn(ModelUpdate(model_or_weights, version)),
                                  f"update {version}")
            pushes["answered"] += 1
            assert answer == version
    finally:
        await asyncio.to_thread(thread.join, 30)
        updater_fn.connection.close()
    stats = await within(serving, "serving to end")
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


async def test_an_update_that_fails_is_answered_with_its_error_and_serving_goes_on():
    (fn,), server_end = get_connected_functions(local_queue, 1, ordered=True)
    no_weights = VersionModel(0).__call__  # a model without with_weights
    serving = asyncio.ensure_future(asr.serve_connection(no_weights, server_end))
    with pytest.raises(TypeError, match="pass a new model instead"):
        await within(fn(ModelUpdate([np.zeros(3)], 1)), "the failed update")
    good = fn(VersionedRequest(np.ones((1, 3), np.float32)))
    bad = fn(VersionedRequest(np.zeros((1, 4), np.float32)))
    with pytest.raises(ValueError, match=r"expected \[n, 3\] float32"):
        await within(bad, "the bad request")
    y, version = await within(good, "the good request")
    assert version == 0 and y.tolist() == [[0.0]]
    assert await within(fn(ModelUpdate(VersionModel(7), "seven")), "an update") == "seven"
    y, version = await within(fn(VersionedRequest(np.ones((2, 3), np.float32))), "after")
    assert version == "seven" and y.tolist() == [[7.0], [7.0]]
    fn.connection.close()
    assert (await within(serving, "serving to end"))["version"] == "seven"


class TaggedModel:
    """Each output row is the input row's sum and the model's tag (which server)."""

    def __init__(self, tag):
        self.tag = tag

    def __call__(self, x):
        return np.stack([x.sum(axis=1), np.full(len(x), self.tag, np.float32)], axis=1)


def check_tagged(x, y, tags):
    assert y.shape == (len(x), 2)
    np.testing.assert_allclose(y[:, 0], x.sum(axis=1), rtol=1e-6)
    assert len(set(y[:, 1].tolist())) == 1 and y[0, 1] in tags
    return int(y[0, 1])


async def test_several_servers_on_one_stream_answer_every_request():
    fns, server_end = get_connected_functions(local_queue, 3, ordered=False)
    servers = [server_end, server_end.copy()]
    serving = [asyncio.ensure_future(asr.serve_connection(TaggedModel(tag), s))
               for tag, s in zip((1, 2), servers)]
    xs = requests(1, count=30)
    ys = await within(asyncio.gather(*(fns[i % 3](x) for i, x in enumerate(xs))),
                      "a burst of answers")
    tags = [check_tagged(x, y, {1, 2}) for x, y in zip(xs, ys)]
    for i, x in enumerate(xs[:6]):  # one at a time: the servers take turns waiting
        y = await within(fns[i % 3](x), "a single answer")
        tags.append(check_tagged(x, y, {1, 2}))
    assert set(tags) == {1, 2}
    close_all(fns)
    stats = await within(asyncio.gather(*serving), "both servers to end")
    assert sum(s["elements"] for s in stats) == sum(len(x) for x in xs + xs[:6])


async def test_serve_connection_serves_a_list_of_connections_with_one_server():
    (fa,), server_a = get_connected_functions(local_queue, 1, ordered=True)
    fbs, server_b = get_connected_functions(thread_queue, 2, ordered=False)
    serving = asyncio.ensure_future(asr.serve_connection(
        MODEL, [server_a, server_b], policy=DispatchPolicy(max_batch_size=64)))
    xs = requests(2, count=30)
    fns = [fa, *fbs]
    ys = await within(asyncio.gather(*(fns[i % 3](x) for i, x in enumerate(xs))),
                      "the answers")
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, MODEL(x))
    fa.connection.close()
    await still_serving(serving)
    x = np.ones((3, 3), np.float32)
    np.testing.assert_array_equal(await within(fbs[1](x), "served after a closed"), MODEL(x))
    close_all(fbs)
    stats = await within(serving, "serving to end once every stream ended")
    assert stats["elements"] == sum(len(x) for x in xs) + 3  # one server counted them all
    assert stats["batches"] < len(xs)


async def test_a_running_batching_server_is_used_and_not_closed():
    (fn,), server_end = get_connected_functions(local_queue, 1, ordered=True)
    async with BatchingServer(MODEL) as evaluate:
        serving = asyncio.ensure_future(asr.serve_connection(evaluate, server_end))
        x = np.ones((2, 3), np.float32)
        np.testing.assert_array_equal(await within(fn(x), "the answer"), MODEL(x))
        fn.connection.close()
        stats = await within(serving, "serving to end")
        assert stats["elements"] == 2
        np.testing.assert_array_equal(await within(evaluate(x), "a direct call"), MODEL(x))
        assert evaluate.stats["elements"] == 4


def lambdas(x):
    out = np.empty((len(x), 1), dtype=object)
    for i in range(len(x)):
        out[i, 0] = lambda: i
    return out


def strings(x):
    return np.array([[f"row{i}"] for i in range(len(x))], dtype=object)


class Raw:
    """A receiver (``submit``) that keeps the answer as it came off the wire."""

    def __init__(self):
        self.answer = asyncio.get_running_loop().create_future()

    def done(self):
        return False

    def set_result(self, answer):
        self.answer.set_result(answer)

    def set_exception(self, answer):
        self.answer.set_result(answer)


def raw(fn, message) -> asyncio.Future:
    """The answer to ``message`` as it came, a Failure or a RowsFailed included."""
    receiver = Raw()
    fn.submit(message, receiver)
    return receiver.answer


async def test_portable_answers_an_exception_with_a_failure():
    (fn,), server_end = get_connected_functions(local_queue, 1, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(MODEL, server_end, portable=True))
    bad = raw(fn, np.ones((1, 4), np.float32))
    bad_call = fn(np.ones((1, 4), np.float32))
    good = fn(np.ones((1, 3), np.float32))
    versioned = fn(VersionedRequest(np.ones((2, 3), np.float32)))
    failure = await within(bad, "the failure")
    assert isinstance(failure, Failure) and isinstance(failure.error, ValueError)
    assert "expected [n, 3] float32" in str(failure.error) and failure.traceback
    # A call's future fails with the exception the Failure carries (not a result)
    with pytest.raises(ValueError, match=r"expected \[n, 3\] float32") as raised:
        await within(bad_call, "the failed call")
    assert "raised by the server" in raised.value.__notes__
    np.testing.assert_array_equal(await within(good, "good"),
                                  MODEL(np.ones((1, 3), np.float32)))
    y, version = await within(versioned, "versioned")
    np.testing.assert_array_equal(y, MODEL(np.ones((2, 3), np.float32)))
    assert version == 0  # the model's own version, or 0
    fn.connection.close()
    await within(serving, "serving to end")


def raises_on_negative(outputs):
    def model(x):
        if (x < 0).any():
            raise ArithmeticError("a negative input")
        return outputs(x)
    return model


@pytest.mark.parametrize("portable", [True, False])
async def test_a_rowwise_request_split_across_batches_gets_the_rows_computed(portable):
    (fn,), server_end = get_connected_functions(local_queue, 1, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(
        raises_on_negative(lambda x: 2 * x), server_end,
        policy=DispatchPolicy(max_batch_size=2), portable=portable))
    x = np.array([[1], [-1], [2], [3], [4]], np.float32)  # batches 1 -1 | 2 3 | 4
    answer = await within(raw(fn, VersionedRequest(x, rowwise=True)), "the answer")
    assert isinstance(answer, RowsFailed) and answer.failed == [(0, 2)]
    assert [(o, y.tolist()) for o, y in answer.computed] == [(2, [[4.0], [6.0]]),
                                                            (4, [[8.0]])]
    assert answer.version == 0
    error = answer.error.error if portable else answer.error
    assert isinstance(error, ArithmeticError)
    assert isinstance(answer.error, Failure) == portable
    whole = fn(VersionedRequest(x))  # not rowwise: it fails whole, as a plain request
    with pytest.raises(ArithmeticError):
        await within(whole, "the failure")
    fn.connection.close()
    await within(serving, "serving to end")


async def test_computed_rows_that_cannot_travel_fail_the_portable_answer():
    (fn,), server_end = get_connected_functions(local_queue, 1, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(
        raises_on_negative(lambdas), server_end, policy=DispatchPolicy(max_batch_size=1),
        portable=True))
    x = np.array([[1], [-1]], np.float32)
    answer = await within(raw(fn, VersionedRequest(x, rowwise=True)), "the answer")
    assert isinstance(answer, Failure) and isinstance(answer.error, ModelOutputError)
    assert "cannot be sent" in str(answer.error)
    fn.connection.close()
    await within(serving, "serving to end")


@pytest.mark.parametrize("portable", [True, False])
async def test_portable_checks_that_outputs_with_objects_pickle(portable):
    (f_lambdas,), end_lambdas = get_connected_functions(local_queue, 1, ordered=True)
    (f_strings,), end_strings = get_connected_functions(local_queue, 1, ordered=True)
    serving = asyncio.ensure_future(asyncio.gather(
        asr.serve_connection(lambdas, end_lambdas, portable=portable),
        asr.serve_connection(strings, end_strings, portable=portable)))
    x = np.ones((2, 3), np.float32)
    answer = await within(raw(f_lambdas, x), "the lambdas")
    if portable:
        assert isinstance(answer, Failure) and isinstance(answer.error, ModelOutputError)
        assert "cannot be sent" in str(answer.error)
    else:  # in one process nothing is checked
        assert answer.shape == (2, 1) and answer[1, 0]() == 1
    assert (await within(f_strings(x), "the strings")).tolist() == [["row0"], ["row1"]]
    close_all([f_lambdas, f_strings])
    await within(serving, "serving to end")


async def test_a_client_whose_connection_breaks_does_not_stop_the_others():
    server_a, client_a = pipe(socket_queue)
    server_b, client_b = pipe(socket_queue)
    fa, fb = FifoConnectedFunction(client_a), FifoConnectedFunction(client_b)
    serving = asyncio.ensure_future(asr.serve_connection(MODEL, [server_a, server_b]))
    xs = requests(3, count=20)
    doomed = [fa(x) for x in xs[:10]]
    kept = [fb(x) for x in xs]
    client_a.inbound.close()  # client a's side is gone: its answers cannot be sent
    for fut in doomed:
        with pytest.raises(ServerDiedError):
            await within(fut, "the doomed request")
    ys = await within(asyncio.gather(*kept), "the other client's answers")
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, MODEL(x))
    y = await within(fb(xs[0]), "an answer after the break")
    np.testing.assert_array_equal(y, MODEL(xs[0]))
    await still_serving(serving)
    client_a.close()
    client_b.close()
    stats = await within(serving, "serving to end")
    assert stats["elements"] >= sum(len(x) for x in xs) + len(xs[0])
    for q in (client_a.outbound, client_b.inbound, client_b.outbound):
        q.close()


# -- swaps reach every subscribed client before they return ------------------------------
@pytest.mark.parametrize("factory", [local_queue, thread_queue, socket_queue])
async def test_a_swap_returns_once_every_client_knows_the_new_version(factory):
    ends = [pipe(factory) for _ in range(3)]
    async with BatchingServer(VersionModel(0)) as evaluate:
        connections = ConnectionServer(evaluate)
        serving = asyncio.ensure_future(connections.serve([s for s, _ in ends]))
        clients = [CoalescingClient(c) for _, c in ends]
        y = await within(clients[0](np.zeros((1, 3), np.float32)), "a first answer")
        assert y.tolist() == [[0.0]]
        await wait_until(lambda: connections.num_subscribers == 3, "every subscription")
        assert [c.version for c in clients] == [0, 0, 0]
        tokens = [c.swap_token for c in clients]
        for version in (1, 1, "two"):  # the same label twice: a swap all the same
            await within(connections.update_model(VersionModel(len(tokens)), version),
                         f"the swap to {version}")
            # At the moment it returns, every client already knows: not a moment later.
            assert [c.version for c in clients] == [version] * 3
            assert all(c.swap_token is not t for c, t in zip(clients, tokens))
            tokens = [c.swap_token for c in clients]
        y, version = await within(clients[2].with_version(np.zeros((2, 3), np.float32)),
                                  "an answer after the swaps")
        assert version == "two" and connections.swaps == 3
        for _, c in ends:
            c.close()
        await within(serving, "serving to end")
        await asyncio.gather(*(c.aclose() for c in clients))


async def test_a_client_that_never_acknowledges_is_cut_off_after_the_timeout():
    (deaf,), deaf_end = get_connected_functions(local_queue, 1, ordered=True)
    server_end, client_end = pipe(local_queue)
    async with BatchingServer(VersionModel(0)) as evaluate:
        connections = ConnectionServer(evaluate, ack_timeout=0.2)
        serving = asyncio.ensure_future(connections.serve([deaf_end, server_end]))
        listening = CoalescingClient(client_end)
        # A client that subscribes but never reads its notices (its loop stopped).
        assert await within(deaf(VersionSubscription()), "the subscription") == (0, 0)
        await within(listening(np.zeros((1, 3), np.float32)), "an answer")
        await within(connections.update_model(VersionModel(1), 1), "the swap")
        assert listening.version == 1 and connections.num_subscribers == 1
        # The deaf client's stream was closed: it cannot serve version 0 any more.
        with pytest.raises(ConnectionGoneError, match="closed"):
            await within(deaf(np.zeros((1, 3), np.float32)), "the cut-off client")
        y = await within(listening(np.zeros((1, 3), np.float32)), "the other client")
        assert y.tolist() == [[1.0]]
        client_end.close()
        deaf.connection.close()
        await within(serving, "serving to end")
        await listening.aclose()


async def test_a_client_that_closes_does_not_hold_a_swap():
    server_end, client_end = pipe(local_queue)
    async with BatchingServer(VersionModel(0)) as evaluate:
        connections = ConnectionServer(evaluate, ack_timeout=60)
        serving = asyncio.ensure_future(connections.serve(server_end))
        fn = FifoConnectedFunction(client_end)
        assert await within(fn(VersionSubscription()), "the subscription") == (0, 0)
        swap = asyncio.ensure_future(connections.update_model(VersionModel(1), 1))
        await still_serving(swap)  # it waits for the acknowledgement
        client_end.close()  # ... which never comes: the client is done
        await within(swap, "the swap, once the client closed")
        await within(serving, "serving to end")


async def test_subscribers_behind_a_forked_pipe_each_acknowledge_and_may_close():
    fns, server_end = get_connected_functions(local_queue, 3, ordered=True)
    async with BatchingServer(VersionModel(0)) as evaluate:
        connections = ConnectionServer(evaluate, ack_timeout=60)
        serving = asyncio.ensure_future(connections.serve(server_end))
        clients = [CoalescingClient(fn) for fn in fns[:2]]
        for c in clients:
            await within(c(np.zeros((1, 3), np.float32)), "an answer")
        assert await within(fns[2](VersionSubscription()), "a deaf subscription") == (0, 0)
        swap = asyncio.ensure_future(connections.update_model(VersionModel(1), 1))
        await still_serving(swap)  # the third client has not acknowledged
        assert [c.version for c in clients] == [1, 1]
        fns[2].connection.close()  # it is done: the swap waits no longer
        await within(swap, "the swap")
        for fn in fns[:2]:
            fn.connection.close()
        await within(serving, "serving to end")
        await asyncio.gather(*(c.aclose() for c in clients))


async def test_a_model_update_message_is_answered_once_every_client_knows():
    fns, server_end = get_connected_functions(local_queue, 2, ordered=True)
    listener, updater = CoalescingClient(fns[0]), fns[1]
    serving = asyncio.ensure_future(asr.serve_connection(VersionModel(0), server_end))
    await within(listener(np.zeros((1, 3), np.float32)), "an answer")
    assert await within(updater(ModelUpdate(VersionModel(5), 5)), "the update") == 5
    assert listener.version == 5
    for fn in fns:
        fn.connection.close()
    await within(serving, "serving to end")
    await listener.aclose()


async def test_a_portable_server_refuses_a_label_that_cannot_reach_its_clients():
    async with BatchingServer(VersionModel(0)) as evaluate:
        connections = ConnectionServer(evaluate, portable=True)
        with pytest.raises(TypeError, match="must pickle to reach clients"):
            await connections.update_model(VersionModel(1), lambda: "a label")
        assert evaluate.version == 0 and connections.swaps == 0
        with pytest.raises(ValueError, match="ack_timeout"):
            ConnectionServer(evaluate, ack_timeout=0)


async def test_serving_ends_by_closing_its_end_so_later_calls_fail_at_once():
    server_end, client_end = pipe(socket_queue)
    fn = FifoConnectedFunction(client_end)
    serving = asyncio.ensure_future(asr.serve_connection(MODEL, server_end))
    x = np.ones((1, 3), np.float32)
    np.testing.assert_array_equal(await within(fn(x), "an answer"), MODEL(x))
    close_stream(client_end.outbound)  # the client's stream ends behind its back
    await within(serving, "serving to end")
    with pytest.raises(ConnectionGoneError):  # the server closed its end: no hang
        await within(fn(x), "the call after the server's end closed")
    with pytest.raises(ConnectionGoneError):
        fn(x)  # and at once from then on



@pytest.mark.parametrize("queue_factory", [local_queue, thread_queue, socket_queue])
async def test_a_cancelled_server_answers_what_it_took_then_later_calls_fail_at_once(
        queue_factory):
    # Cancelling the serving task kills it: its end was never closed, and every call
    # made after it waited forever.
    release = threading.Event()

    def slow(x):
        release.wait(WAIT_S)
        return 2 * x

    fns, server_end = get_connected_functions(queue_factory, 1, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(slow, server_end))
    x = np.ones((1, 3), np.float32)
    taken = asyncio.ensure_future(fns[0](x))
    await wait_until(lambda: serving.done() or server_end.num_waiting() == 0
                     and not taken.done(), "the request to be read")
    await asyncio.sleep(0.05)  # (it reaches the model)
    serving.cancel()
    await asyncio.sleep(0.05)
    release.set()  # (the cancel waits for the batch in the model)
    with pytest.raises(asyncio.CancelledError):
        await within(serving, "the cancel to end serving")
    np.testing.assert_array_equal(await within(taken, "the answer in flight"), 2 * x)
    with pytest.raises(ConnectionGoneError):  # not a wait for an answer that cannot come
        await within(fns[0](x), "a call after the server was cancelled")


async def test_a_server_cancelled_while_its_last_answers_are_out_still_closes_its_end():
    # The stream ended (the client closed it) and serving waits for the answers still
    # in the model: a cancel there (serve cancels every stream when one fails) left the
    # end open for good.
    release = threading.Event()

    def slow(x):
        release.wait(WAIT_S)
        return 2 * x

    (fn,), server_end = get_connected_functions(local_queue, 1, ordered=True)
    async with BatchingServer(slow, DispatchPolicy()) as evaluate:
        serving = asyncio.ensure_future(ConnectionServer(evaluate).serve(server_end))
        x = np.ones((1, 2), np.float32)
        taken = asyncio.ensure_future(fn(x))
        await asyncio.sleep(0.05)  # (it reaches the model)
        fn.connection.close()  # the stream ends: serving waits for that answer
        await asyncio.sleep(0.05)
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        assert not server_end.closed
        release.set()
        np.testing.assert_array_equal(await within(taken, "the answer"), 2 * x)
        await wait_until(lambda: server_end.closed, "the end to be closed")


async def test_a_message_no_answer_can_reach_is_dropped_and_the_others_served():
    bad_client, bad_server = pipe(local_queue)
    good_client, good_server = pipe(local_queue)
    good = UnorderedConnectedFunction(good_client)
    reported = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
    serving = asyncio.ensure_future(asr.serve_connection(
        lambda x: 2 * x, [PassThroughConnection(bad_server),
                          PassThroughConnection(good_server)]))
    bad_client.send(np.ones((1, 2)))  # a bare payload, not (key, value): no key
    assert (await within(good(np.ones((1, 2))), "a good call")).tolist() == [[2.0, 2.0]]
    assert not serving.done()
    assert [type(c["exception"]).__name__ for c in reported] == ["MalformedMessageError"]
    bad_client.close()
    good_client.close()
    await within(serving, "serving to end")
    await good.aclose()


class BrokenConnection(Connection):
    """A connection whose receiving side fails for good (a broken transport)."""

    def __init__(self):
        super().__init__(local_queue(), local_queue())

    async def recv_async(self):
        raise OSError("the transport broke")


async def test_a_connection_that_fails_stops_the_others_being_served_with_it():
    (fn,), good_end = get_connected_functions(local_queue, 1, ordered=True)
    serving = asyncio.ensure_future(
        asr.serve_connection(lambda x: 2 * x, [good_end, BrokenConnection()]))
    with pytest.raises(OSError, match="the transport broke"):
        await within(serving, "serving to fail")
    await asyncio.sleep(0)
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()
              and "_serve" in repr(t.get_coro())]
    assert others == []  # the good connection's serving task was stopped too


async def test_a_portable_answer_of_two_arrays_is_not_checked_by_a_pickle_trip(
        monkeypatch):
    from async_search.servers import connection_server

    trips = []
    real = connection_server.round_trips
    monkeypatch.setattr(connection_server, "round_trips",
                        lambda obj: trips.append(obj) or real(obj))
    (fn,), server_end = get_connected_functions(local_queue, 1, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(
        lambda x: (2 * x, x.sum(axis=1)), server_end, portable=True))
    for _ in range(5):  # a policy and a value: two arrays, not (outputs, version)
        policy, value = await within(fn(np.ones((2, 3), np.float32)), "an answer")
        assert policy.shape == (2, 3) and value.tolist() == [3.0, 3.0]
    assert trips == []
    fn.connection.close()
    await within(serving, "serving to end")


class LoadsWithAnOSError:
    """Pickles, but loading it raises an OSError (a file only the sender has)."""

    def __reduce__(self):
        return (_open_missing, ())


def _open_missing():
    raise FileNotFoundError(2, "No such file", "/only/on/the/client")


@pytest.mark.parametrize("queue_name", ["process_queue", "socket_queue"])
@pytest.mark.parametrize("unloadable", [LoadsNowhere, LoadsWithAnOSError])
async def test_a_request_that_cannot_be_loaded_is_answered_in_its_turn_with_why(
        queue_name, unloadable):
    # It was dropped unanswered: the next request got its answer, the one after the
    # next one's, and the last waited forever. Over a socket queue it ended the
    # connection (its frame did not load, the requests beside it were lost), and over
    # a process queue so did one whose loading raised an OSError (taken for the pipe's).
    from async_search.connections import get_connected_functions
    from async_search import queues

    (fn,), end = get_connected_functions(getattr(queues, queue_name), 1, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(lambda x: 2 * x, end))
    try:
        calls = [fn(LoadsNowhere()), fn(np.full((1, 2), 1.0)), fn(np.full((1, 2), 10.0))]
        with pytest.raises(MalformedMessageError, match=r"^the server could not load "
                                                        r"this request \((RuntimeError|"
                                                        r"UnpicklingError): "):
            await within(calls[0], "the unloadable request's answer")
        assert (await within(calls[1], "an answer")).tolist() == [[2.0, 2.0]]
        assert (await within(calls[2], "an answer")).tolist() == [[20.0, 20.0]]
        assert not serving.done()
    finally:
        fn.connection.close()
        await within(serving, "serve_connection's end")


@pytest.mark.parametrize("ordered", [True, False])  # a forked end, a pass-through end
async def test_a_request_that_cannot_be_loaded_ends_a_keyed_ends_clients(ordered):
    # Its sender's key was inside what failed to load: it was dropped, and that
    # client's next request got the answer meant for the lost one. No client can be
    # told which answer is missing, so every client's calls fail, none is misanswered.
    from async_search.connections import get_connected_functions
    from async_search.queues import process_queue

    (bad, good), end = get_connected_functions(process_queue, 2, ordered=ordered)
    loop = asyncio.get_running_loop()
    reported = []
    loop.set_exception_handler(lambda _, context: reported.append(context["message"]))
    serving = asyncio.ensure_future(asr.serve_connection(lambda x: 2 * x, end))
    try:
        lost = bad(LoadsNowhere())
        await within(serving, "serve_connection to end the connection")
        with pytest.raises(ConnectionGoneError):
            await within(lost, "the lost request's failure")
        for fn in (bad, good):  # later calls fail at once
            with pytest.raises(ConnectionGoneError):
                await within(fn(np.ones((1, 2))), "a failed call")
        assert reported == ["serve_connection ended a keyed connection: a message with "
                            "an unknown key could not be loaded"]
    finally:
        for fn in (bad, good):
            fn.connection.close()
        loop.set_exception_handler(None)


@pytest.mark.parametrize("queue_kind", [local_queue, thread_queue])
async def test_clients_that_never_closed_hear_that_the_forked_end_is_done(queue_kind):
    # close_stream on the inbound queue ended serve_connection, and a later call of a
    # client that had not closed waited forever.
    from async_search.connections import get_connected_functions

    (a, b), end = get_connected_functions(queue_kind, 2, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(lambda x: 2 * x, end))
    assert (await within(a(np.ones((1, 2))), "an answer")).tolist() == [[2.0, 2.0]]
    close_stream(end.inbound)
    await within(serving, "serve_connection's end")
    for fn in (a, b):
        with pytest.raises(ConnectionGoneError):
            await within(fn(np.ones((1, 2))), "the call's failure")


@pytest.mark.parametrize("connection, kwargs, message", [
    ("conn", {}, "serves a server end .*got 'conn'"),
    (None, {}, "serves a server end .*got None"),
    ([None], {}, "serves a server end .*got None"),
    ("ok", {"policy": None}, "policy must be a DispatchPolicy, got None"),
])
async def test_serve_connection_refuses_what_is_not_a_server_end_naming_it(
        connection, kwargs, message):
    # A raw "'str' object has no attribute 'acquire'", or "'NoneType' object is not
    # iterable".
    if connection == "ok":
        connection = pipe(local_queue)[0]
    with pytest.raises(TypeError, match=message):
        await asr.serve_connection(lambda x: x, connection, **kwargs)


async def test_serve_connection_refuses_an_end_whose_queue_cannot_be_awaited():
    # It called the loop's exception handler without end, never yielding: a
    # wait_for around it never fired.
    import queue

    from async_search.connections import forked_pipe

    server_end, clients = forked_pipe(queue.Queue, 1)
    clients[0].send(np.ones((1, 2)))
    with pytest.raises(TypeError, match="queue cannot be awaited.*not queue.Queue"):
        await within(asr.serve_connection(lambda x: 2 * x, server_end), "the refusal")


async def test_serving_an_end_whose_queue_this_process_closed_ends_at_once():
    # multiprocessing's "Queue is closed" ValueError, raised at every read, was taken
    # for a message that failed to load: the loop never yielded again.
    from async_search.queues import process_queue

    server_end, client_end = pipe(process_queue)
    server_end.inbound.close()
    stats = await within(asr.serve_connection(lambda x: x, server_end), "the end")
    assert stats["elements"] == 0


async def test_serve_connection_takes_a_generator_of_server_ends():
    server_end, client_end = pipe(local_queue)
    serving = asyncio.ensure_future(
        asr.serve_connection(lambda x: 2 * x, (end for end in [server_end])))
    client = CoalescingClient(client_end)
    assert (await within(client(np.ones((1, 2))), "an answer")).tolist() == [[2.0, 2.0]]
    client_end.close()
    await within(serving, "serve_connection's end")


@pytest.mark.parametrize("kind", ["process", "socket"])
async def test_an_answer_that_does_not_pickle_fails_its_request_alone(kind):
    # With portable=False one such answer marked the client gone: every later answer
    # on the connection was dropped, and both clients waited forever.
    from async_search.connections import get_connected_functions
    from async_search.queues import queue_factory

    def model(x):
        out = x.astype(object)
        if (x < 0).any():
            out[:] = threading.Lock()
        return out

    (a, b), end = get_connected_functions(queue_factory(kind), 2, ordered=True)
    serving = asyncio.ensure_future(asr.serve_connection(model, end))
    try:
        with pytest.raises(ModelOutputError, match="cannot be sent to the client"):
            await within(a(np.full((1, 2), -1)), "the failed request's answer")
        for fn in (b, a):
            y = await within(fn(np.ones((1, 2), np.int64)), "an answer")
            assert y.tolist() == [[1, 1]]
    finally:
        a.connection.close()
        b.connection.close()
        await within(serving, "serve_connection's end")
