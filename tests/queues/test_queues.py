"""Queues: the QueueLike protocol, awaiting without polling, and ends of streams, for
the local, thread, process and socket queues."""

import asyncio
import io
import multiprocessing
import multiprocessing.queues
import os
import pickle
import queue
import struct
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_search.queues import (END_OF_STREAM, AsyncQueueLike, ClosedConnection,
                                 LocalQueue, ProcessQueue, QueueLike, SocketQueue,
                                 ThreadQueue, close_stream, is_end, local_queue,
                                 process_queue, queue_factory, ray_queue, socket_queue,
                                 thread_queue)
from tests.helpers import WAIT_S, within

pytestmark = pytest.mark.timeout(60)

SPAWN = multiprocessing.get_context("spawn")
CHILD_S = 60  # a spawned child imports numpy and this package: allow a loaded machine


async def until_waiting(getter):
    """Lets the loop run until ``getter`` (a task just made) sleeps in its await; a
    put after this must wake it (a put before would make the test pass trivially)."""
    for _ in range(5):
        await asyncio.sleep(0)
    assert not getter.done()


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


@pytest.mark.parametrize("kind", ["local", "thread", "process", "socket"])
def test_every_kind_takes_the_same_timeouts(kind):
    # NaN waited forever on a thread queue (queue.Queue's), raised a bare ValueError on
    # a process queue and OSError on its put; inf raised OverflowError on three kinds;
    # -1 was a ValueError on a thread queue only.
    q = queue_factory(kind)(0)
    for bad, error in ((float("nan"), ValueError), (True, TypeError), ("1", TypeError)):
        with pytest.raises(error, match="timeout must be a number of seconds"):
            q.get(timeout=bad)
    with pytest.raises(queue.Empty):
        q.get(timeout=-1)
    q.put(5)
    assert q.get(timeout=float("inf")) == 5
    for huge in (1e300, 10 ** 400):  # OverflowError from a thread or process queue
        q.put(6)
        assert q.get(timeout=huge) == 6
    if kind != "socket":  # unbounded: a put never waits
        full = queue_factory(kind)(1)
        full.put(0)
        with pytest.raises(ValueError, match="timeout must be"):
            full.put(1, timeout=float("nan"))
        with pytest.raises(queue.Full):
            full.put(1, timeout=-1)


async def test_a_cancelled_get_on_a_ray_queue_leaves_the_next_items_to_the_next_get(
        ray_session):
    # The cancelled get's call went on in the actor and took the next put's items,
    # which nobody read: item 0 was lost, and answers reached the wrong callers.
    q = ray_queue()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(q.get_async(), 0.3)
    for i in range(3):
        q.put(i)
    assert [await within(q.get_async(), f"item {i}") for i in range(3)] == [0, 1, 2]
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(q.get_async(), 0.3)
    q.put(3)
    await within(q.drain(), "the put")  # in a loop, puts leave at the iteration's end
    assert q.get(timeout=WAIT_S) == 3  # a blocking get reads the pending call too


def test_local_queue_get_never_blocks_the_loop_thread():
    with pytest.raises(queue.Empty):
        LocalQueue().get(block=True, timeout=None)


@pytest.mark.parametrize("factory", [local_queue, thread_queue])
async def test_get_async_sleeps_until_put_wakes_it(factory):
    q = factory()
    getter = asyncio.ensure_future(q.get_async())
    await until_waiting(getter)
    q.put("item")
    assert await within(getter, "the woken getter") == "item"


async def test_thread_queue_put_from_another_thread_wakes_the_loop():
    q = ThreadQueue()
    getter = asyncio.ensure_future(q.get_async())
    await until_waiting(getter)
    thread = threading.Thread(target=q.put, args=("from thread",))
    thread.start()
    assert await within(getter, "the woken getter") == "from thread"
    thread.join(WAIT_S)


@pytest.mark.parametrize("factory", [local_queue, thread_queue])
async def test_cancelled_getter_does_not_swallow_an_item(factory):
    q = factory()
    first = asyncio.ensure_future(q.get_async())
    second = asyncio.ensure_future(q.get_async())
    await until_waiting(second)
    first.cancel()
    q.put("item")
    assert await within(second, "the second getter") == "item"


def test_queue_factory_knows_every_backend_and_names_them_on_error():
    assert queue_factory("local") is local_queue
    assert queue_factory("thread") is thread_queue
    assert queue_factory("process") is process_queue
    assert queue_factory("socket") is socket_queue
    assert queue_factory("ray") is ray_queue
    with pytest.raises(ValueError, match="unknown queue backend 'gpu'; known: "
                                         "local, process, ray, socket, thread"):
        queue_factory("gpu")
    with pytest.raises(ValueError, match=r"unknown queue backend \['thread'\]"):
        queue_factory(["thread"])  # was a raw "unhashable type: 'list'"


@pytest.mark.parametrize("factory", [local_queue, thread_queue, process_queue])
@pytest.mark.parametrize("maxsize", ["x", -1, 2.5, True])
def test_a_queue_refuses_a_maxsize_that_is_not_an_integer_at_least_zero(factory, maxsize):
    # "x" was taken, and the first put raised "'>' not supported between str and int".
    with pytest.raises(ValueError, match="maxsize must be an integer >= 0"):
        factory(maxsize)


def test_close_stream_ends_a_local_queue_after_its_items():
    q = local_queue()
    q.put(1)
    close_stream(q)
    assert q.get() == 1
    assert is_end(q.get())
    assert is_end(pickle.loads(pickle.dumps(END_OF_STREAM)))


# -- ProcessQueue ---------------------------------------------------------------------------


def _put_when_told(q, item, go):
    assert go.wait(CHILD_S)
    q.put(item)


def test_process_queue_is_a_multiprocessing_queue():
    q = process_queue()
    assert isinstance(q, ProcessQueue) and isinstance(q, multiprocessing.queues.Queue)
    assert isinstance(q, AsyncQueueLike)
    q.put(1)
    assert q.get(timeout=WAIT_S) == 1
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)
    q.close()
    q.join_thread()


@pytest.mark.parametrize("how", ["put", "put_nowait"])
def test_an_item_that_cannot_be_pickled_raises_in_the_putter_and_takes_no_place(how):
    # The feeder thread pickles later: an item it cannot would be dropped with a
    # printed traceback, and the next one take its place (an ordered connected
    # function's answers would go to the wrong callers).
    q = process_queue()
    with pytest.raises(TypeError, match="pickle"):
        getattr(q, how)(threading.Lock())
    q.put(np.array([7, 7]))
    np.testing.assert_array_equal(q.get(timeout=WAIT_S), [7, 7])
    with pytest.raises(queue.Empty):
        q.get(timeout=0.2)


async def test_process_queue_get_async_wakes_on_a_put_from_another_process():
    q = process_queue()
    go = SPAWN.Event()
    child = SPAWN.Process(target=_put_when_told, args=(q, "from child", go))
    child.start()
    try:
        getter = asyncio.ensure_future(q.get_async())
        await until_waiting(getter)
        go.set()
        assert await within(getter, "the child's put", timeout=CHILD_S) == "from child"
    finally:
        await asyncio.to_thread(child.join, CHILD_S)
    q.put_nowait(1)
    assert await within(q.get_async(), "a put here") == 1
    q.close()
    q.join_thread()


async def test_process_queue_wakes_every_getter_waiting_in_one_loop():
    # Before, each getter registered its own reader on the pipe: the second replaced
    # the first's callback, and the first never woke although its item had come.
    q = process_queue()
    try:
        first = asyncio.ensure_future(q.get_async())
        await until_waiting(first)
        second = asyncio.ensure_future(q.get_async())
        await until_waiting(second)
        q.put("a")
        q.put("b")
        got = await within(asyncio.gather(first, second), "both getters")
        assert sorted(got) == ["a", "b"]
    finally:
        q.close()
        q.join_thread()


async def test_process_queue_a_cancelled_getter_leaves_the_others_waiting():
    q = process_queue()
    try:
        getters = [asyncio.ensure_future(q.get_async()) for _ in range(3)]
        await until_waiting(getters[-1])
        getters[0].cancel()
        q.put("a")
        assert await within(getters[1], "the second getter") == "a"
        getters[2].cancel()  # the last one waiting in this loop
        last = asyncio.ensure_future(q.get_async())
        await until_waiting(last)
        q.put("b")
        assert await within(last, "a getter after the cancelled ones") == "b"
    finally:
        for getter in getters:
            getter.cancel()
        q.close()
        q.join_thread()


def _put_then_exit(q, items):
    for item in items:
        q.put(item)
    q.close()
    q.join_thread()  # the items are in the pipe


def _die_in_the_middle_of_a_message(q):
    """What a kill leaves when it strikes while a large message is being written: its
    length, and part of its bytes."""
    os.write(q._writer.fileno(), (1_000_000).to_bytes(4, "big", signed=True) + b"x" * 100)
    os._exit(9)


async def test_process_queue_reader_only_gets_what_an_exited_writer_sent_then_closed():
    # Before, every process held the pipe's writing end: a reader of a writer that had
    # exited waited forever.
    q = process_queue()
    child = SPAWN.Process(target=_put_then_exit, args=(q, ["last", "words"]))
    child.start()
    try:
        assert q.reader_only() is q
        assert await within(q.get_async(), "item 1", timeout=CHILD_S) == "last"
        assert await within(q.get_async(), "item 2") == "words"
        with pytest.raises(ClosedConnection, match="gone"):
            await within(q.get_async(), "the end of the stream", timeout=CHILD_S)
        with pytest.raises(ClosedConnection):  # and from then on, blocking too
            q.get(timeout=WAIT_S)
        with pytest.raises(ClosedConnection, match="reader_only"):
            q.put("here")
    finally:
        await asyncio.to_thread(child.join, CHILD_S)
        if child.is_alive():
            child.kill()
            await asyncio.to_thread(child.join, CHILD_S)
    assert child.exitcode == 0


async def test_process_queue_reader_only_ends_when_a_writer_dies_in_a_message():
    # Before, the reader blocked inside the message's read, holding the loop's thread.
    q = process_queue()
    child = SPAWN.Process(target=_die_in_the_middle_of_a_message, args=(q,))
    child.start()
    try:
        q.reader_only()
        await asyncio.to_thread(child.join, CHILD_S)
        with pytest.raises(ClosedConnection, match="gone"):
            await within(q.get_async(), "the end of the stream")
    finally:
        if child.is_alive():
            child.kill()
        await asyncio.to_thread(child.join, CHILD_S)
    assert child.exitcode == 9


# -- ThreadQueue and LocalQueue: waiters that are gone -------------------------------------


def test_thread_queue_put_wakes_a_live_getter_after_one_whose_loop_closed():
    # Before, a put woke only the first waiter: when its loop was closed, the wake-up
    # was lost and a live getter slept although the item was there.
    q = ThreadQueue()
    dead = asyncio.new_event_loop()
    abandoned = dead.create_task(q.get_async())  # its loop closes while it waits
    dead.run_until_complete(asyncio.sleep(0))
    dead.close()

    async def live_getter():
        getter = asyncio.ensure_future(q.get_async())
        await until_waiting(getter)
        threading.Thread(target=q.put, args=("item",)).start()
        return await within(getter, "the live getter")

    assert asyncio.run(live_getter()) == "item"
    assert not abandoned.done()
    abandoned._log_destroy_pending = False  # its loop is gone: nothing can end it


@pytest.mark.parametrize("factory, waiters", [(local_queue, "_waiters"),
                                              (thread_queue, "_async_waiters")])
async def test_a_getter_that_timed_out_leaves_no_waiter_behind(factory, waiters):
    # Before, a local queue kept every cancelled waiter until a put came: a consumer
    # polling an idle queue with a timeout grew it without bound.
    q = factory()
    for _ in range(50):
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(q.get_async(), 0.0001)
    assert len(getattr(q, waiters)) == 0
    getter = asyncio.ensure_future(q.get_async())
    await until_waiting(getter)
    q.put("item")
    assert await within(getter, "a getter after them") == "item"


# -- SocketQueue ----------------------------------------------------------------------------


def test_socket_queue_is_fifo_outside_a_loop():
    q = SocketQueue()
    assert isinstance(q, QueueLike) and isinstance(q, AsyncQueueLike)
    items = [0, "one", (2, "two"), {"three": np.arange(3)}, None]
    for item in items:
        q.put(item)
    assert q.qsize() == len(items)
    got = [q.get(timeout=WAIT_S) for _ in items]
    assert got[:3] == items[:3] and got[4] is None
    np.testing.assert_array_equal(got[3]["three"], np.arange(3))
    assert q.qsize() == 0
    q.close()


def test_socket_queue_blocking_get_raises_empty_after_its_timeout():
    q = SocketQueue()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get(block=False)
    q.close()


@pytest.mark.parametrize("maxsize", [1, 10, -1])
def test_socket_queue_refuses_a_bound(maxsize):
    with pytest.raises(ValueError, match="unbounded"):
        SocketQueue(maxsize)
    with pytest.raises(ValueError, match="unbounded"):
        socket_queue(maxsize)


async def test_socket_queue_carries_arrays_large_ones_and_containers_in_a_loop():
    q = socket_queue()
    rng = np.random.default_rng(0)
    big = rng.standard_normal((1 << 20) + 3)  # > 8 MiB: more than a socket buffer holds
    assert big.nbytes > 4 << 20
    strided = np.arange(24, dtype=np.int16).reshape(4, 6)[:, ::2]  # not contiguous
    items = [big, {"x": np.ones((2, 3), np.float32), "n": 3},
             (np.zeros((1, 1)), "tuple", [np.int64(7)]), strided, "last"]
    for item in items:
        q.put(item)
    got = [await within(q.get_async(), "an item") for _ in items]
    np.testing.assert_array_equal(got[0], big)
    assert got[0].dtype == big.dtype
    assert set(got[1]) == {"x", "n"} and got[1]["n"] == 3
    np.testing.assert_array_equal(got[1]["x"], np.ones((2, 3), np.float32))
    assert got[1]["x"].dtype == np.float32
    assert isinstance(got[2], tuple) and got[2][1] == "tuple" and got[2][2] == [7]
    assert got[2][0].shape == (1, 1)
    np.testing.assert_array_equal(got[3], strided)
    assert got[4] == "last"
    q.close()


async def test_socket_queue_sends_the_puts_of_one_loop_iteration_together():
    q = socket_queue()
    for i in range(100):  # one iteration: nothing leaves until it ends
        q.put(i)
        assert q.qsize() == 0
    await within(q.drain(), "the frame to leave")
    assert q.qsize() == 100  # from none to all of them at once
    assert [q.get_nowait() for _ in range(100)] == list(range(100))
    q.put("next iteration")
    await within(q.drain(), "the next frame")
    assert q.qsize() == 1 and await within(q.get_async(), "it") == "next iteration"
    q.close()


async def test_socket_queue_get_async_wakes_on_a_put_in_the_loop():
    q = socket_queue()
    getter = asyncio.ensure_future(q.get_async())
    await until_waiting(getter)
    q.put("item")
    assert await within(getter, "the woken getter") == "item"
    q.close()


def test_close_stream_ends_a_socket_queue_after_its_items():
    q = SocketQueue()
    q.put(1)
    q.put(2)
    close_stream(q)
    assert q.get(timeout=WAIT_S) == 1 and q.get(timeout=WAIT_S) == 2
    for _ in range(2):  # and stays ended
        with pytest.raises(ClosedConnection):
            q.get(timeout=WAIT_S)
    q.close()


async def test_close_stream_ends_a_socket_queue_for_get_async():
    q = socket_queue()
    getter = asyncio.ensure_future(q.get_async())
    await until_waiting(getter)
    q.put("before")
    close_stream(q)
    assert await within(getter, "the item") == "before"
    for _ in range(2):
        with pytest.raises(ClosedConnection):
            await within(q.get_async(), "the end")
    q.close()


def test_socket_queue_put_after_its_reader_is_gone_raises_closed_connection():
    q = SocketQueue()
    q.writer_only()  # nobody here reads it, and nobody else holds the reading end
    with pytest.raises(ClosedConnection):
        q.put(np.zeros(1 << 20), timeout=WAIT_S)
    with pytest.raises(ClosedConnection):
        q.put(1)
    q.close()


async def test_socket_queue_put_of_an_unpicklable_item_fails_that_put_alone():
    q = socket_queue()
    q.put("before")
    # (Python 3.13 words it "Can't get local object")
    with pytest.raises(Exception, match="pickle|local object"):
        q.put(lambda: None)  # at once, in the caller: nothing of it is sent
    q.put("after")
    assert [await within(q.get_async(), "an item") for _ in range(2)] == ["before", "after"]
    with pytest.raises(Exception, match="pickle|local object"):
        SocketQueue().put(lambda: None)  # outside a loop too
    q.close()


def _quietly(fn, arg):
    """``fn(arg)`` in a thread whose failure the test reports itself."""
    try:
        fn(arg)
    except Exception:
        pass


def test_socket_queue_carries_a_zero_size_array_outside_a_loop():
    q = SocketQueue()
    thread = threading.Thread(target=_quietly, args=(q.put, (np.zeros((0, 3)), "after")),
                              daemon=True)
    thread.start()
    thread.join(5)
    try:
        assert not thread.is_alive(), "put of a zero-size array did not return"
        x, tag = q.get(timeout=WAIT_S)
        assert x.shape == (0, 3) and tag == "after"
    finally:
        q.close()  # a spinning put fails on the closed socket and ends
        thread.join(WAIT_S)


def test_socket_queue_carries_a_zero_size_array_in_a_loop():
    q = SocketQueue()
    got = []

    async def main():
        q.put(np.zeros((0, 3), np.float32))
        got.append(await asyncio.wait_for(q.get_async(), WAIT_S))

    thread = threading.Thread(target=_quietly, args=(asyncio.run, main()), daemon=True)
    thread.start()
    thread.join(5)
    try:
        assert not thread.is_alive(), "the loop is stuck in put"
        assert got[0].shape == (0, 3) and got[0].dtype == np.float32
    finally:
        q.close()
        thread.join(WAIT_S)


def _put_all(q, items, timeout=WAIT_S):
    """Puts ``items`` from a thread, outside a loop (a put blocks while the socket is
    full, so the reader must read meanwhile); returns the thread."""
    thread = threading.Thread(target=_quietly, args=(
        lambda items: [q.put(item, timeout=timeout) for item in items], items), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("in_a_loop", [False, True])
def test_socket_queue_frames_larger_than_what_it_reads_at_once_arrive_whole(in_a_loop):
    from async_search.queues.sockets import _CHUNK, _DIRECT

    # Around the size from which a frame is read in place, between small ones.
    sizes = [3, _CHUNK - 100, _DIRECT - 200, 5, _DIRECT + 1, 2, _DIRECT + _CHUNK, 7,
             4 * _DIRECT + 3, 0, 1]
    items = [(i, np.arange(n, dtype=np.uint8) ^ np.uint8(i)) for i, n in enumerate(sizes)]
    q = SocketQueue()
    writer = _put_all(q, items)
    try:
        if in_a_loop:
            async def main():
                return [await asyncio.wait_for(q.get_async(), WAIT_S) for _ in items]
            got = asyncio.run(main())
        else:
            got = [q.get(timeout=WAIT_S) for _ in items]
        writer.join(WAIT_S)
        for (i, x), (j, y) in zip(items, got):  # each still its own after later frames
            assert i == j
            np.testing.assert_array_equal(x, y)
        assert q.qsize() == 0
    finally:
        q.close()
        writer.join(WAIT_S)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 3 << 20), min_size=1, max_size=6))
def test_socket_queue_carries_any_sizes_of_frames_in_order(sizes):
    items = [np.full(n, i % 251, np.uint8) for i, n in enumerate(sizes)]
    q = SocketQueue()
    writer = _put_all(q, items)
    try:
        for i, n in enumerate(sizes):
            x = q.get(timeout=WAIT_S)
            assert len(x) == n and bool(np.all(x == i % 251))
    finally:
        q.close()
        writer.join(WAIT_S)


class _ScriptedSocket:
    """A reading end that hands out a byte stream in the given pieces, then its end
    (``recv_into`` returns 0), whatever size the reader asks for at a time: the
    reader's splitting of frames, apart from how a kernel happens to cut the stream."""

    def __init__(self, data: bytes, cuts):
        self.data, self.at = memoryview(data), 0
        self.pieces = list(cuts)
        # Something select always finds readable, as a socket with bytes or at its end.
        self._readable, writer = os.pipe()
        os.close(writer)

    def recv_into(self, into) -> int:
        if self.at >= len(self.data):
            return 0
        want = self.pieces.pop(0) if self.pieces else len(self.data)
        n = min(len(into), max(1, want), len(self.data) - self.at)
        into[:n] = self.data[self.at:self.at + n]
        self.at += n
        return n

    def fileno(self) -> int:
        return self._readable

    def close(self) -> None:
        if self._readable >= 0:
            os.close(self._readable)
            self._readable = -1


def _stream(items) -> bytes:
    from async_search.queues.sockets import encode_frame

    return b"".join(bytes(c) for item in items for c in encode_frame([item]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3 << 18), min_size=1, max_size=6),
       st.lists(st.integers(1, 1 << 19), max_size=40), st.booleans())
def test_the_reader_takes_every_whole_frame_however_the_stream_is_cut(sizes, cuts, cut_last):
    items = [np.full(n, i % 251, np.uint8) for i, n in enumerate(sizes)]
    data = _stream(items)
    if cut_last:  # the writer died inside its last frame: that one is lost
        data = data[:-1]
    q = SocketQueue()
    q._reader.close()
    q._reader = _ScriptedSocket(data, cuts)
    got = []
    with pytest.raises(ClosedConnection):
        while True:
            got.append(q.get(timeout=0))
    expected = items[:-1] if cut_last else items
    assert len(got) == len(expected)
    for x, y in zip(got, expected):
        np.testing.assert_array_equal(x, y)
    assert q._frame is None
    q.close()


def test_whole_frames_that_fill_the_last_read_before_the_end_are_taken():
    from async_search.queues.sockets import _CHUNK

    # Frames of exactly one chunk's bytes, then the writer's end: the read that
    # returns the chunk is followed, in the same call, by the one that sees the end.
    for n in range(_CHUNK - 400, _CHUNK):
        data = _stream([1, np.zeros(n, np.uint8)])
        if len(data) == _CHUNK:
            break
    assert len(data) == _CHUNK
    q = SocketQueue()
    q._reader.close()
    q._reader = _ScriptedSocket(data, [_CHUNK])
    assert q.get(timeout=0) == 1
    assert q.get(timeout=0).shape == (n,)
    with pytest.raises(ClosedConnection):
        q.get(timeout=0)
    q.close()


def test_an_end_of_stream_inside_a_large_frame_s_batch_ends_it_there():
    from async_search.queues.sockets import _DIRECT, encode_frame

    # A frame read in place holding an item and the end of the stream, then more bytes.
    frame = encode_frame([np.ones(2 * _DIRECT, np.uint8), END_OF_STREAM])
    data = b"".join(bytes(c) for c in frame) + _stream(["after the end"])
    q = SocketQueue()
    q._reader.close()
    q._reader = _ScriptedSocket(data, [100, 1 << 20])
    assert q.get(timeout=0).shape == (2 * _DIRECT,)
    with pytest.raises(ClosedConnection):
        q.get(timeout=0)
    q.close()


def test_a_writer_gone_in_the_middle_of_a_large_frame_ends_the_stream_after_what_came():
    from async_search.queues.sockets import _DIRECT, encode_frame

    q = SocketQueue()
    q.put("before")
    chunks = encode_frame([np.ones(4 * _DIRECT, np.uint8)])
    whole = b"".join(bytes(c) for c in chunks)
    half = threading.Thread(target=_quietly, args=(
        lambda part: q._send_blocking([part], WAIT_S), memoryview(whole[:len(whole) // 2])),
        daemon=True)
    half.start()
    try:
        assert q.get(timeout=WAIT_S) == "before"
        with pytest.raises(queue.Empty):  # half a frame: nothing to take yet
            q.get(timeout=0.2)
        half.join(WAIT_S)
        assert not half.is_alive()
        q._writer.close()  # the writing end goes, half-way through the frame
        q._writer = None
        with pytest.raises(ClosedConnection):
            q.get(timeout=WAIT_S)
        assert q._frame is None  # the half frame's buffer is let go
    finally:
        q.close()


def _put_when_told_then_exit(q, items, go):
    """Puts ``items`` when ``go`` is set, then exits without closing the stream."""
    q.writer_only()
    assert go.wait(CHILD_S)
    for item in items:
        q.put(item, timeout=CHILD_S)


def _put_then_hang(q, items, sent):
    """Puts ``items``, tells the parent, then waits to be killed."""
    q.writer_only()
    for item in items:
        q.put(item, timeout=CHILD_S)
    sent.set()
    threading.Event().wait(CHILD_S)


async def test_socket_queue_get_async_wakes_on_a_put_from_a_child_then_ends_when_it_exits():
    q = socket_queue()
    go = SPAWN.Event()
    items = ["from child", np.arange(5), {"k": (1, 2)}]
    child = SPAWN.Process(target=_put_when_told_then_exit, args=(q, items, go))
    child.start()
    try:
        q.reader_only()  # only the child writes: its exit ends the stream
        getter = asyncio.ensure_future(q.get_async())
        await until_waiting(getter)
        go.set()
        assert await within(getter, "the child's put", timeout=CHILD_S) == "from child"
        np.testing.assert_array_equal(await within(q.get_async(), "item 2"), np.arange(5))
        assert await within(q.get_async(), "item 3") == {"k": (1, 2)}
        with pytest.raises(ClosedConnection):
            await within(q.get_async(), "the end of the stream", timeout=CHILD_S)
        with pytest.raises(ClosedConnection):
            q.get(timeout=WAIT_S)
    finally:
        await asyncio.to_thread(child.join, CHILD_S)
        q.close()
    assert child.exitcode == 0


async def test_socket_queue_reader_gets_what_a_killed_child_sent_then_closed_connection():
    q = socket_queue()
    sent = SPAWN.Event()
    child = SPAWN.Process(target=_put_then_hang, args=(q, [1, 2], sent))
    child.start()
    try:
        q.reader_only()
        getter = asyncio.ensure_future(q.get_async())
        assert await within(asyncio.to_thread(sent.wait, CHILD_S), "the child's puts",
                            timeout=CHILD_S + 5)
        child.kill()
        assert await within(getter, "item 1") == 1
        assert await within(q.get_async(), "item 2") == 2
        with pytest.raises(ClosedConnection):
            await within(q.get_async(), "the end of the stream", timeout=CHILD_S)
    finally:
        if child.is_alive():
            child.kill()
        await asyncio.to_thread(child.join, CHILD_S)
        q.close()


def test_frames_round_trip_arrays_out_of_band_and_plain_objects():
    from async_search.queues.sockets import decode_frame, encode_frame

    big = np.random.default_rng(0).standard_normal((3000, 64)).astype(np.float32)
    message = [("eval", 1, big), {"k": (np.arange(3), "text")}, ("done", [])]
    chunks = encode_frame(message)
    assert any(c.nbytes == big.nbytes for c in chunks)  # the array's bytes, not a copy
    frame = memoryview(b"".join(bytes(c) for c in chunks)[8:])  # past the length prefix
    got = decode_frame(frame)
    np.testing.assert_array_equal(got[0][2], big)
    assert got[0][:2] == ("eval", 1)
    assert got[1]["k"][0].tolist() == [0, 1, 2] and got[1]["k"][1] == "text"
    assert got[2] == ("done", [])


@pytest.mark.parametrize("frame", [
    # an item of 5 header bytes and one of 9 counted, 5 sent: its sizes do not hold
    struct.pack("!QI", 4 + 8 + 5, 2) + struct.pack("!II", 5, 0) + b"junk!",
    # one item of 5 header bytes, and 3 bytes after it that no item claims
    struct.pack("!QI", 4 + 8 + 8, 1) + struct.pack("!II", 5, 0) + b"junk!xyz"])
async def test_a_frame_that_cannot_be_read_ends_the_stream_after_the_items_before_it(
        frame):
    """A corrupt frame (bytes from a broken or hostile writer) must not leave a reader
    waiting: it gets what came before, then ClosedConnection naming the frame."""
    q = SocketQueue()
    q.put("before")
    q.send_pending()  # in a loop, a put leaves at the end of the iteration
    q._send_blocking([memoryview(frame)], 5)
    assert await within(q.get_async(), "the item before") == "before"
    with pytest.raises(ClosedConnection, match="could not be read"):
        await within(q.get_async(), "the end of the stream")
    with pytest.raises(ClosedConnection, match="could not be read"):
        q.get(timeout=1)
    q.close()


async def test_an_item_that_is_no_pickle_in_a_frame_that_holds_fails_alone():
    # Its frame's counts and sizes hold: only that item is lost, not the stream.
    q = SocketQueue()
    q.put("before")
    q.send_pending()
    q._send_blocking(  # one item: a 5-byte header that does not unpickle
        [memoryview(struct.pack("!QI", 4 + 8 + 5, 1) + struct.pack("!II", 5, 0) + b"junk!")],
        5)
    q.put("after")
    q.send_pending()
    assert await within(q.get_async(), "the item before") == "before"
    with pytest.raises(pickle.UnpicklingError):
        await within(q.get_async(), "the junk item")
    assert await within(q.get_async(), "the item after") == "after"
    q.close()


async def test_a_frame_too_large_to_hold_ends_the_stream_after_the_items_before_it():
    """A length prefix from a broken or hostile writer that no memory can hold ends the
    stream, named, instead of failing the reader's callback and leaving it waiting."""
    import struct

    q = SocketQueue()
    q.put("before")
    q.send_pending()
    q._send_blocking([memoryview(struct.pack("!Q", 1 << 62) + bytes(100))], 5)
    assert await within(q.get_async(), "the item before") == "before"
    with pytest.raises(ClosedConnection, match="could not be held"):
        await within(q.get_async(), "the end of the stream")
    q.close()


async def test_socket_queue_on_a_tcp_connection_carries_frames_both_ways_then_ends():
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    to_server = SocketQueue.on_socket(writer=client)
    at_server = SocketQueue.on_socket(reader=server, writer=server.dup())
    back = SocketQueue.on_socket(reader=client.dup())
    to_server.put(np.arange(3))
    got = await within(at_server.get_async(), "the array at the server")
    np.testing.assert_array_equal(got, np.arange(3))
    at_server.put("answer")
    assert await within(back.get_async(), "the answer") == "answer"
    close_stream(to_server)
    with pytest.raises(ClosedConnection):
        await within(at_server.get_async(), "the end of the stream")
    for q in (to_server, at_server, back):
        q.close()


async def _a_cancelled_get(q):
    getting = asyncio.ensure_future(q.get_async())
    await asyncio.sleep(0.01)
    getting.cancel()
    await asyncio.gather(getting, return_exceptions=True)


async def test_a_socket_queue_whose_get_was_cancelled_is_let_go_and_reads_on():
    # A cancelled get (a serve_connection cancelled) left the socket registered with
    # the loop, which then held the queue and its two sockets for good.
    loop = asyncio.get_running_loop()
    q = socket_queue()
    await _a_cancelled_get(q)
    assert not loop.remove_reader(q._reader.fileno())  # (True: it was still watched)
    q.put("sent meanwhile")
    await asyncio.sleep(0.01)
    assert await within(q.get_async(), "the item put after the cancel") == "sent meanwhile"
    q.close()


class _LoadsWithAnOSError:
    def __reduce__(self):
        return (_missing_file, ())


def _missing_file():
    raise FileNotFoundError(2, "No such file", "/only/on/the/writer")


@pytest.mark.parametrize("in_a_loop", [False, True])
async def test_a_process_queue_item_whose_loading_raises_an_os_error_is_no_end(in_a_loop):
    # Loading raised inside multiprocessing's get, under the guard of the pipe's own
    # errors: a live writer's stream was taken for ended (ClosedConnection).
    from async_search.queues import process_queue

    q = process_queue()
    try:
        q.put(_LoadsWithAnOSError())
        q.put("after")
        for expected in (pickle.UnpicklingError, None):
            if expected is not None:
                with pytest.raises(expected, match="FileNotFoundError"):
                    await within(q.get_async(), "the item") if in_a_loop else q.get(
                        timeout=WAIT_S)
            else:
                got = await within(q.get_async(), "the next") if in_a_loop else q.get(
                    timeout=WAIT_S)
                assert got == "after"
    finally:
        q.close()


@pytest.mark.parametrize("length", [2 ** 40, 2 ** 63])
def test_a_process_queue_length_beyond_any_message_ends_the_stream(length):
    # The read allocated the claimed length first: MemoryError or OverflowError
    # escaped get, and the bytes after the length were read as messages.
    import struct

    from async_search.queues.process import ProcessQueue

    q = ProcessQueue()
    try:
        q._sem.acquire()
        os.write(q._writer.fileno(), struct.pack("!i", -1) + struct.pack("!Q", length))
        q.put("after the corrupt length")
        for _ in range(2):  # for good: what follows it is no message
            with pytest.raises(ClosedConnection, match="the stream is corrupt"):
                q.get(timeout=WAIT_S)
    finally:
        q.close()


class _LoadsWithAnEOFError:
    def __reduce__(self):
        return (np.load, (io.BytesIO(b""),))  # NumPy's EOFError: "No data left in file"


@pytest.mark.parametrize("unloadable, raised", [(_LoadsWithAnOSError, "FileNotFoundError"),
                                                (_LoadsWithAnEOFError, "No data left")])
async def test_a_socket_queue_item_that_does_not_load_fails_its_get_alone(unloadable,
                                                                          raised):
    # The frame failed whole: the items beside it were lost and the stream ended.
    from async_search.queues import socket_queue

    q = socket_queue()
    try:
        q.put("before")
        q.put(unloadable())
        q.put("after")
        q.send_pending()
        assert await within(q.get_async(), "the item before") == "before"
        with pytest.raises(pickle.UnpicklingError, match=raised):
            await within(q.get_async(), "the unloadable item")
        assert await within(q.get_async(), "the item after") == "after"
    finally:
        q.close()
