"""CoalescedRequests: what the process and HTTP clients share of a loop iteration's
requests (taking them, done ones dropped; the version of an answer)."""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

import numpy as np
import pytest

from async_search.coalescing import CoalescedRequests
from async_search.delivery import ResultDelivery

pytestmark = pytest.mark.timeout(60)


class _Message(NamedTuple):
    """A message of whole requests (a ``base.BatchParts``)."""

    batch: np.ndarray
    tags: list
    pieces: list
    parts: Any = None


class _Client(CoalescedRequests):
    """Queues each call; nothing is sent (a test delivers by hand)."""

    def __init__(self):
        self._xs, self._futures, self._scheduled = [], [], False
        self._delivery = ResultDelivery()

    def __call__(self, x, timeout=None):
        fut = asyncio.get_running_loop().create_future()
        self._xs.append(x)
        self._futures.append(fut)
        return fut


def test_requests_whose_futures_are_done_are_dropped_when_taken():
    async def main():
        client = _Client()
        kept, cancelled, last = (client(np.full((1, 1), i)) for i in range(3))
        cancelled.cancel()
        xs, futures = client._take_queued()
        assert [x.item() for x in xs] == [0, 2] and futures == [kept, last]
        assert client._take_queued() == ([], [])  # the queue was emptied

    asyncio.run(main())


def test_with_version_returns_the_version_its_answer_came_with():
    async def main():
        client = _Client()
        answer = asyncio.ensure_future(client.with_version(np.ones((1, 1))))
        await asyncio.sleep(0)
        xs, futures = client._take_queued()
        client._delivery.deliver(_Message(xs[0], futures, xs), 2 * xs[0], "v7")
        outputs, version = await answer
        assert outputs.tolist() == [[2.0]] and version == "v7"
        assert client._delivery.pop_version(futures[0]) is None  # nothing kept

    asyncio.run(main())
