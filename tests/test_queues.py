import asyncio
import queue
import threading

import pytest

from async_search.queues import (AsyncQueueLike, LocalQueue, QueueLike, ThreadQueue,
                                 local_queue, process_queue, queue_factory, thread_queue)

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("factory", [local_queue, thread_queue])
def test_queues_follow_the_queue_like_protocol_and_are_fifo(factory):
    q = factory()
    assert isinstance(q, QueueLike) and isinstance(q, AsyncQueueLike)
    for i in range(3):
        q.put_nowait(i)
    assert q.qsize() == 3
    assert [q.get_nowait() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(queue.Empty):
        q.get_nowait()


@pytest.mark.parametrize("factory", [local_queue, thread_queue])
def test_bounded_queue_raises_full(factory):
    q = factory(maxsize=1)
    q.put_nowait("a")
    with pytest.raises(queue.Full):
        q.put_nowait("b")


def test_local_queue_get_never_blocks_the_loop_thread():
    with pytest.raises(queue.Empty):
        LocalQueue().get(block=True, timeout=None)


@pytest.mark.parametrize("factory", [local_queue, thread_queue])
async def test_get_async_sleeps_until_put_wakes_it(factory):
    q = factory()
    getter = asyncio.ensure_future(q.get_async())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not getter.done()
    q.put("item")
    assert await asyncio.wait_for(getter, 5) == "item"


async def test_thread_queue_put_from_another_thread_wakes_the_loop():
    q = ThreadQueue()
    threading.Timer(0.05, q.put, args=("from thread",)).start()
    assert await asyncio.wait_for(q.get_async(), 5) == "from thread"


@pytest.mark.parametrize("factory", [local_queue, thread_queue])
async def test_cancelled_getter_does_not_swallow_an_item(factory):
    q = factory()
    first = asyncio.ensure_future(q.get_async())
    second = asyncio.ensure_future(q.get_async())
    await asyncio.sleep(0)
    first.cancel()
    q.put("item")
    assert await asyncio.wait_for(second, 5) == "item"


def test_queue_factory_names_known_backends_on_error():
    assert queue_factory("thread") is thread_queue
    with pytest.raises(ValueError,
                       match="unknown queue backend 'gpu'; known: local, process, ray, thread"):
        queue_factory("gpu")


def _put_later(q, item, delay):
    import time
    time.sleep(delay)
    q.put(item)


async def test_process_queue_get_async_wakes_on_a_put_from_another_process():
    import multiprocessing
    q = process_queue()
    assert isinstance(q, AsyncQueueLike)
    child = multiprocessing.get_context("spawn").Process(target=_put_later,
                                                         args=(q, "from child", 0.2))
    child.start()
    try:
        assert await asyncio.wait_for(q.get_async(), 30) == "from child"
    finally:
        child.join(10)
    q.put_nowait(1)
    assert await asyncio.wait_for(q.get_async(), 5) == 1
    q.close()
