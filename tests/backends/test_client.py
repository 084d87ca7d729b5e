import asyncio
import re

import numpy as np
import pytest

from async_search.backends.client import CoalescingClient
from async_search.base import TensorSpec
from async_search.connections import pipe
from async_search.errors import InputSpecError, ModelOutputError, ServerDiedError
from async_search.queues import local_queue
from async_search.wire import pack_error
from async_search.wire import RowsFailed, VersionedRequest, VersionSubscription

pytestmark = pytest.mark.timeout(30)


def client_and_server(spec=None):
    server, client_end = pipe(local_queue)
    return CoalescingClient(client_end, spec), server


def received(server, version=0):
    """The batches waiting on the server end (each a VersionedRequest). The client's
    subscription, its first message, is answered at once with ``version``."""
    out = []
    while server.poll():
        message = server.recv()
        if isinstance(message, VersionSubscription):
            server.send((version, 0))
            continue
        assert isinstance(message, VersionedRequest)
        out.append(message.x.copy())
    return out


async def settle():
    for _ in range(10):
        await asyncio.sleep(0)


async def test_requests_of_one_iteration_leave_as_one_message_and_come_back_split():
    client, server = client_and_server(TensorSpec((2,), np.float32))
    futures = [client(np.full((n, 2), n, np.float32)) for n in (1, 3, 2)]
    await asyncio.sleep(0)
    (batch,) = received(server)
    assert batch.shape == (6, 2)
    server.send((batch * 10, 0))
    results = await asyncio.wait_for(asyncio.gather(*futures), 5)
    for n, y in zip((1, 3, 2), results):
        np.testing.assert_array_equal(y, np.full((n, 2), 10 * n))


async def test_each_iteration_sends_its_own_message():
    client, server = client_and_server()

    async def search(delay):
        for _ in range(delay):
            await asyncio.sleep(0)
        return client(np.zeros((1, 1), np.float32))

    await asyncio.gather(search(0), search(0), search(3))
    await asyncio.sleep(0)
    assert [len(batch) for batch in received(server)] == [2, 1]


async def test_a_message_leaves_at_once_when_it_holds_message_requests():
    server, client_end = pipe(local_queue)
    client = CoalescingClient(client_end, message_requests=2)
    futures = [client(np.full((1, 1), k, np.float32)) for k in range(5)]
    # Two waves of 2 left as they filled, within this iteration; the fifth waits for
    # the iteration's end.
    assert [b[:, 0].tolist() for b in received(server)] == [[0, 1], [2, 3]]
    await asyncio.sleep(0)
    (last,) = received(server)
    assert last[:, 0].tolist() == [4]
    for batch in ([[0], [1]], [[2], [3]], [[4]]):
        server.send((np.array(batch, np.float32) * 10, 0))
    results = await asyncio.wait_for(asyncio.gather(*futures), 5)
    assert [y[0, 0] for y in results] == [0, 10, 20, 30, 40]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_message_requests_must_be_a_positive_integer(bad):
    _, client_end = pipe(local_queue)
    with pytest.raises(ValueError, match="message_requests"):
        CoalescingClient(client_end, message_requests=bad)


async def test_bad_requests_fail_when_made_and_cancelled_ones_are_not_sent():
    client, server = client_and_server(TensorSpec((2,), np.float32))
    with pytest.raises(InputSpecError):
        client(np.zeros((1, 3), np.float32))
    cancelled = client(np.full((1, 2), 7, np.float32))
    kept = client(np.full((1, 2), 1, np.float32))
    cancelled.cancel()
    await asyncio.sleep(0)
    (batch,) = received(server)
    assert batch.tolist() == [[1.0, 1.0]]
    server.send((batch, 0))
    assert (await asyncio.wait_for(kept, 5)).tolist() == [[1.0, 1.0]]


async def test_a_closed_server_end_fails_waiting_and_later_requests():
    client, server = client_and_server()
    waiting = client(np.zeros((1, 1), np.float32))
    await asyncio.sleep(0)
    server.close()
    with pytest.raises(ServerDiedError):
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(ServerDiedError):
        client(np.zeros((1, 1), np.float32))


@pytest.mark.parametrize("portable", [False, True])
async def test_an_error_answer_fails_every_request_of_its_message(portable):
    client, server = client_and_server()
    futures = [client(np.zeros((1, 1), np.float32)) for _ in range(3)]
    await asyncio.sleep(0)
    received(server)
    error = KeyError("model raised")
    server.send(pack_error(error) if portable else error)
    outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 5)
    assert all(isinstance(o, KeyError) for o in outcomes)


async def test_a_first_request_the_server_refuses_does_not_fix_the_learnt_spec():
    # The client learnt [n] float64 from an empty np.array([]) and refused every later
    # [n, 2] float32 request of every search in its process.
    client, server = client_and_server()
    first = client(np.array([]))
    await asyncio.sleep(0)
    received(server)
    server.send(pack_error(ValueError("takes [n, 2] float32")))
    with pytest.raises(ValueError, match="takes"):
        await asyncio.wait_for(first, 5)
    good = client(np.ones((1, 2), np.float32))
    await asyncio.sleep(0)
    (batch,) = received(server)
    server.send((batch * 3, 0))
    np.testing.assert_array_equal(await asyncio.wait_for(good, 5), [[3.0, 3.0]])
    with pytest.raises(InputSpecError):  # answered once: the spec stays
        client(np.array([]))


async def test_a_first_request_its_caller_cancelled_does_not_fix_the_learnt_spec():
    client, server = client_and_server()
    client(np.ones((1, 3), np.float32)).cancel()  # dropped before it left
    await asyncio.sleep(0)
    assert received(server) == []
    good = client(np.ones((1, 4), np.float32))
    await asyncio.sleep(0)
    assert client.input_spec is None  # not answered yet: none holds
    (batch,) = received(server)
    server.send((batch * 2, 0))
    np.testing.assert_array_equal(await asyncio.wait_for(good, 5), [[2.0] * 4])
    assert client.input_spec == TensorSpec((4,), np.float32)


async def test_answers_that_arrive_read_only_are_the_callers_to_write():
    # Ray's actor calls hand arrays over read-only (from its object store): a search's
    # y += 1 raised "output array is read-only" there, and nowhere else.
    client, server = client_and_server()
    futures = [client(np.ones((1, 2), np.float32)) for _ in range(2)]
    await asyncio.sleep(0)
    (batch,) = received(server)
    answer = batch * 3
    answer.flags.writeable = False
    server.send((answer, 0))
    for y in await asyncio.wait_for(asyncio.gather(*futures), 5):
        y += 1  # raised ValueError before
        np.testing.assert_array_equal(y, [[4.0, 4.0]])


async def test_with_version_reports_the_version_sent_back_with_the_message():
    client, server = client_and_server()
    pairs = [asyncio.ensure_future(client.with_version(np.full((n, 1), n, np.float32)))
             for n in (2, 1)]
    plain = asyncio.ensure_future(client(np.zeros((1, 1), np.float32)))
    await settle()  # the tasks make their requests, then the message leaves
    (batch,) = received(server)
    server.send((batch * 10, 7))
    (y2, v2), (y1, v1) = await asyncio.wait_for(asyncio.gather(*pairs), 5)
    assert (y2.tolist(), v2, y1.tolist(), v1) == ([[20.0], [20.0]], 7, [[10.0]], 7)
    assert (await plain).tolist() == [[0.0]]
    mixed = asyncio.ensure_future(client.with_version(np.ones((1, 1), np.float32)))
    await settle()
    (batch,) = received(server)
    server.send((batch, None))  # rows from two versions
    assert (await asyncio.wait_for(mixed, 5))[1] is None


async def test_a_request_past_its_deadline_fails_there_and_its_late_rows_are_discarded():
    from async_search.errors import RequestTimeoutError

    client, server = client_and_server(TensorSpec((1,), np.float32))
    late = client(np.full((1, 1), 7, np.float32), timeout=0.05)
    mate = client(np.ones((1, 1), np.float32))  # same message, no deadline
    await asyncio.sleep(0)
    (batch,) = received(server)  # sent in the iteration it was made
    with pytest.raises(RequestTimeoutError, match="timeout of 0.05 s"):
        await asyncio.wait_for(late, 5)  # the server has not answered
    server.send((batch * 10, 0))  # the answer comes late: its rows are discarded
    assert (await asyncio.wait_for(mate, 5)).tolist() == [[10.0]]
    loop = asyncio.get_running_loop()
    assert not [h for h in loop._scheduled if not h.cancelled()]  # no timer left
    with pytest.raises(ValueError, match="timeout must be a finite number > 0"):
        client(np.ones((1, 1), np.float32), timeout=-1)
    assert client._xs == []  # nothing queued
    versioned = asyncio.ensure_future(
        client.with_version(np.full((1, 1), 2, np.float32), timeout=30))
    await settle()
    (batch,) = received(server)
    server.send((batch * 10, 3))
    y, version = await asyncio.wait_for(versioned, 5)
    assert (y.tolist(), version) == ([[20.0]], 3)


async def test_an_answer_read_after_the_deadline_but_before_its_timer_is_a_timeout():
    # The answer's callback ran before the overdue timer (both ready in one loop
    # iteration, the loop held by a search): the caller got a late result.
    import time

    from async_search.errors import RequestTimeoutError

    client, server = client_and_server(TensorSpec((1,), np.float32))
    late = client(np.full((1, 1), 7, np.float32), timeout=0.02)
    mate = client(np.ones((1, 1), np.float32))
    await asyncio.sleep(0)
    (batch,) = received(server)
    server.send((batch * 10, 0))
    time.sleep(0.05)  # a search step holds the loop past the deadline
    with pytest.raises(RequestTimeoutError, match="timeout of 0.02 s"):
        await asyncio.wait_for(late, 5)
    assert (await asyncio.wait_for(mate, 5)).tolist() == [[10.0]]


@pytest.mark.parametrize("portable", [True, False])
async def test_a_failed_batch_of_a_message_fails_only_the_requests_with_rows_in_it(
        portable):
    import async_search as asr
    from async_search.servers import DispatchPolicy

    def model(x):
        if (x < 0).any():
            raise ArithmeticError("a negative input")
        return 2 * x

    server, client_end = pipe(local_queue)
    serving = asyncio.ensure_future(asr.serve_connection(
        model, server, policy=DispatchPolicy(max_batch_size=2), portable=portable))
    client = CoalescingClient(client_end, TensorSpec((1,), np.float32))
    xs = [np.array([[1], [2], [3]], np.float32), np.array([[-4]], np.float32),
          np.array([[5], [6]], np.float32), np.array([[7]], np.float32)]
    # rows 1 2 | 3 -4 | 5 6 | 7: the second batch fails, and with it the first and
    # second requests; the third and fourth get their rows
    futures = [client(x) for x in xs]
    versioned = client.with_version(np.array([[8]], np.float32))  # a later message
    done = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)
    assert [type(d).__name__ for d in done[:2]] == ["ArithmeticError"] * 2
    assert done[2].tolist() == [[10.0], [12.0]] and done[3].tolist() == [[14.0]]
    y, version = await asyncio.wait_for(versioned, 10)
    assert y.tolist() == [[16.0]] and version == 0
    client_end.close()
    await asyncio.wait_for(serving, 10)


@pytest.mark.parametrize("some_computed", [False, True])
async def test_a_zero_row_request_beside_failed_rows_only_ends_and_the_connection_lives(
        some_computed):
    # The model raises on one row of the message and check_values refuses another: a
    # 0-row request in it gets its empty outputs when some rows were computed (here, in
    # batches of one row), and fails with the first error when none were, as when a
    # whole message fails; either way the connection serves on.
    import async_search as asr
    from async_search.servers import DispatchPolicy

    class Model:
        def __call__(self, x):
            if (x[:, 0] == -1).any():
                raise ArithmeticError("the model fails on -1")
            return 2 * x

        def check_values(self, x):
            if (x[:, 0] == -2).any():
                raise InputSpecError("-2 is refused")

    server, client_end = pipe(local_queue)
    serving = asyncio.ensure_future(asr.serve_connection(
        Model(), server, portable=True,
        policy=DispatchPolicy(max_batch_size=1 if some_computed else 8)))
    client = CoalescingClient(client_end)
    xs = [np.array([[-1, 0]], np.float32), np.zeros((0, 2), np.float32),
          np.array([[-2, 0]], np.float32)]
    if some_computed:
        xs.append(np.array([[4, 4]], np.float32))
    done = await asyncio.wait_for(asyncio.gather(*(client(x) for x in xs),
                                                 return_exceptions=True), 10)
    assert type(done[0]).__name__ == "ArithmeticError"
    assert isinstance(done[2], (ArithmeticError, InputSpecError))
    if some_computed:
        assert done[1].shape == (0, 2) and done[1].dtype == np.float32
        assert done[3].tolist() == [[8.0, 8.0]]
    else:
        assert type(done[1]).__name__ == "ArithmeticError"
    after = await asyncio.wait_for(client(np.full((1, 2), 3, np.float32)), 10)
    assert after.tolist() == [[6.0, 6.0]]
    client_end.close()
    await asyncio.wait_for(serving, 10)


async def test_aclose_fails_requests_waiting_for_an_answer_and_refuses_later_calls():
    import time

    import async_search as asr
    from async_search.errors import ServerClosedError
    from async_search.models import with_spec

    def slow(x):
        time.sleep(0.2)
        return x.sum(axis=1)

    server, client_end = pipe(local_queue)
    serving = asyncio.ensure_future(asr.serve_connection(
        with_spec(slow, (4,), np.float32), server))
    client = CoalescingClient(client_end)
    sent = client(np.ones((2, 4), np.float32))
    await asyncio.sleep(0.01)  # the message has left
    queued = client(np.ones((1, 4), np.float32))  # made, not sent yet
    await client.aclose()
    for fut in (sent, queued):
        with pytest.raises(ServerClosedError, match="aclose"):
            await asyncio.wait_for(fut, 5)
    with pytest.raises(ServerClosedError):
        client(np.ones((1, 4), np.float32))
    client_end.close()
    await asyncio.wait_for(serving, 10)


@pytest.mark.parametrize("answer, message", [
    # Rows 0-1 failed, and a piece said to start at 0 covered all six: the requests
    # after the first got rows shifted from their neighbours, without an error.
    (lambda y: RowsFailed(ValueError("x"), [(0, 1)], [(0, y)], 0),
     "in part, inconsistently: row 0 is in 2 ranges or pieces"),
    (lambda y: RowsFailed(ValueError("x"), [(0, 1)], [(1, y[1:2])], 0),
     "in part, inconsistently: row 2 is in 0 ranges or pieces"),
    (lambda y: RowsFailed(ValueError("x"), [(100, 1)], [(0, y)], 0),
     r"in part, inconsistently: failed range \(100, 1\) is not within 6 rows"),
    (lambda y: 5, r"sent a malformed answer \(int\), not \(outputs, version\)"),
    (lambda y: (y, 0, 1), r"sent a malformed answer \(tuple\), not \(outputs, version\)"),
])
async def test_an_answer_that_breaks_its_own_promise_fails_every_request_it_answers(
        answer, message):
    client, server = client_and_server(TensorSpec((3,), np.float32))
    futures = [client(np.full((2, 3), i, np.float32)) for i in (1, 2, 3)]
    await asyncio.sleep(0)
    (batch,) = received(server)
    server.send(answer(batch.sum(axis=1, keepdims=True)))
    results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 5)
    for result in results:
        assert isinstance(result, ModelOutputError), result
        assert re.search(message, str(result)), str(result)
