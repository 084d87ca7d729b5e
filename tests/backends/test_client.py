import asyncio

import numpy as np
import pytest

from async_search.backends.client import CoalescingClient
from async_search.base import TensorSpec
from async_search.errors import InputSpecError, ServerDiedError

pytestmark = pytest.mark.timeout(30)


class Recorder:
    def __init__(self):
        self.sent = []

    def __call__(self, message_id, batch):
        self.sent.append((message_id, batch.copy()))


async def test_requests_of_one_iteration_leave_as_one_message_and_come_back_split():
    sent = Recorder()
    client = CoalescingClient(sent, TensorSpec((2,), np.float32))
    futures = [client(np.full((n, 2), n, np.float32)) for n in (1, 3, 2)]
    await asyncio.sleep(0)
    assert len(sent.sent) == 1 and sent.sent[0][1].shape == (6, 2)
    message_id, batch = sent.sent[0]
    client.deliver(message_id, batch * 10)
    for n, fut in zip((1, 3, 2), futures):
        np.testing.assert_array_equal(fut.result(), np.full((n, 2), 10 * n))


async def test_each_iteration_sends_its_own_message():
    sent = Recorder()
    client = CoalescingClient(sent)

    async def search(delay):
        for _ in range(delay):
            await asyncio.sleep(0)
        return client(np.zeros((1, 1), np.float32))

    await asyncio.gather(search(0), search(0), search(3))
    await asyncio.sleep(0)
    assert [len(batch) for _, batch in sent.sent] == [2, 1]


async def test_bad_requests_fail_when_made_and_cancelled_ones_are_not_sent():
    sent = Recorder()
    client = CoalescingClient(sent, TensorSpec((2,), np.float32))
    with pytest.raises(InputSpecError):
        client(np.zeros((1, 3), np.float32))
    cancelled = client(np.full((1, 2), 7, np.float32))
    kept = client(np.full((1, 2), 1, np.float32))
    cancelled.cancel()
    await asyncio.sleep(0)
    assert len(sent.sent) == 1 and sent.sent[0][1].tolist() == [[1.0, 1.0]]
    client.deliver(sent.sent[0][0], sent.sent[0][1])
    assert kept.result().tolist() == [[1.0, 1.0]]


async def test_fail_all_fails_waiting_and_later_requests():
    client = CoalescingClient(Recorder())
    waiting = client(np.zeros((1, 1), np.float32))
    await asyncio.sleep(0)
    client.fail_all(ServerDiedError("gone"))
    with pytest.raises(ServerDiedError):
        waiting.result()
    with pytest.raises(ServerDiedError):
        client(np.zeros((1, 1), np.float32))


async def test_an_error_response_fails_every_request_of_its_message():
    sent = Recorder()
    client = CoalescingClient(sent)
    futures = [client(np.zeros((1, 1), np.float32)) for _ in range(3)]
    await asyncio.sleep(0)
    client.deliver(sent.sent[0][0], KeyError("model raised"))
    assert all(isinstance(f.exception(), KeyError) for f in futures)


async def test_with_version_reports_the_version_sent_back_with_the_message():
    sent = Recorder()
    client = CoalescingClient(sent)
    pairs = [asyncio.ensure_future(client.with_version(np.full((n, 1), n, np.float32)))
             for n in (2, 1)]
    plain = asyncio.ensure_future(client(np.zeros((1, 1), np.float32)))
    for _ in range(10):  # the tasks make their requests, then the message leaves
        await asyncio.sleep(0)
    ((message_id, batch),) = sent.sent
    client.deliver(message_id, batch * 10, 7)
    (y2, v2), (y1, v1) = await asyncio.wait_for(asyncio.gather(*pairs), 5)
    assert (y2.tolist(), v2, y1.tolist(), v1) == ([[20.0], [20.0]], 7, [[10.0]], 7)
    assert (await plain).tolist() == [[0.0]]
    mixed = asyncio.ensure_future(client.with_version(np.ones((1, 1), np.float32)))
    for _ in range(10):
        await asyncio.sleep(0)
    client.deliver(sent.sent[1][0], sent.sent[1][1], None)  # rows from two versions
    assert (await asyncio.wait_for(mixed, 5))[1] is None
