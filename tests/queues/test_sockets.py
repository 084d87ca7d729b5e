"""SocketQueue's faults: puts that time out or must not block never cut a frame, a queue
used in one event loop after another, and what close and writer_only leave to drain and
get. (Its everyday behaviour is tested with the other queues, in test_queues.py.)"""

import asyncio
import queue
import threading

import numpy as np
import pytest

from async_search.queues import ClosedConnection, SocketQueue, socket_queue
from tests.helpers import WAIT_S, within

pytestmark = pytest.mark.timeout(60)

#: More than a socket pair's buffers hold: a put of it outside a loop cannot finish
#: before somebody reads.
BIG = 4_000_000


def _big(value=1):
    return np.full(BIG, value, np.uint8)


class _Reader:
    """Gets from ``q`` in a thread until its stream stays empty for ``idle`` seconds or
    ends: ``items`` (arrays as ``("array", shape, first value)``), then ``"EMPTY"`` or
    ``"CLOSED"``."""

    def __init__(self, q, idle=1.0):
        self.items = []
        self._q, self._idle = q, idle
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            try:
                item = self._q.get(timeout=self._idle)
            except queue.Empty:
                self.items.append("EMPTY")
                return
            except ClosedConnection:
                self.items.append("CLOSED")
                return
            if isinstance(item, np.ndarray):
                item = ("array", item.shape, int(item[0]))
            self.items.append(item)

    def join(self):
        self._thread.join(WAIT_S + self._idle)
        assert not self._thread.is_alive(), "the reader did not finish"
        return self.items


def _in_thread(fn):
    """``fn()`` in a thread, joined within WAIT_S: what it returned or raised."""
    out = {}

    def run():
        try:
            out["returned"] = fn()
        except BaseException as e:  # reported by the test
            out["raised"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "it blocked"
    return out


def test_socket_queue_says_it_takes_one_writer_only():
    assert SocketQueue.single_writer is True


# -- puts outside a loop: a timeout or block=False never cuts a frame ---------------------


def test_socket_put_that_times_out_mid_frame_keeps_the_rest_and_the_stream_whole():
    q = SocketQueue()
    try:
        q.put(_big(7), timeout=0.1)  # nobody reads: its frame begins and cannot end
        reader = _Reader(q)
        q.put("hello", timeout=WAIT_S)  # the rest of the big frame goes first
        q.put("world", timeout=WAIT_S)
        assert reader.join() == [("array", (BIG,), 7), "hello", "world", "EMPTY"]
    finally:
        q.close()


def test_socket_put_with_a_timeout_raises_full_only_before_its_frame_begins():
    q = SocketQueue()
    try:
        q.put(_big(1), timeout=0.1)  # begun, not finished
        with pytest.raises(queue.Full):
            q.put("not sent", timeout=0.1)  # the frame before it is not out: not begun
        reader = _Reader(q)
        q.put("sent", timeout=WAIT_S)
        assert reader.join() == [("array", (BIG,), 1), "sent", "EMPTY"]
    finally:
        q.close()


def _put_in_a_new_loop(q: SocketQueue, item) -> None:
    """Puts ``item`` in a loop of its own and waits until its frames have left."""
    async def put():
        q.put(item)
        await within(q.drain(), "the frames to leave")

    asyncio.run(put())


def test_socket_put_in_a_loop_finishes_first_the_frame_a_timed_out_put_began():
    q = SocketQueue()
    try:
        q.put(_big(4), timeout=0.1)  # begun outside a loop, not finished
        reader = _Reader(q)

        _put_in_a_new_loop(q, "after")
        assert reader.join() == [("array", (BIG,), 4), "after", "EMPTY"]
    finally:
        q.close()


def test_socket_put_nowait_does_not_block_on_a_full_socket():
    q = SocketQueue()
    try:
        out = _in_thread(lambda: q.put_nowait(_big(3)))  # what the socket takes goes
        assert out == {"returned": None}
        for put in (q.put_nowait, lambda item: q.put(item, block=False)):
            out = _in_thread(lambda: put("not sent"))
            assert isinstance(out.get("raised"), queue.Full)
        reader = _Reader(q)
        q.put("sent", timeout=WAIT_S)
        assert reader.join() == [("array", (BIG,), 3), "sent", "EMPTY"]
    finally:
        q.close()


def test_socket_put_nowait_raises_full_before_writing_a_byte():
    q = SocketQueue()
    try:
        filler = b"\0" * 65536
        while True:  # the socket full, with nothing of a frame unsent here
            try:
                q._writer.send(filler)
            except BlockingIOError:
                break
        out = _in_thread(lambda: q.put_nowait("x"))
        assert isinstance(out.get("raised"), queue.Full)
        assert not q._unsent  # nothing of it kept to be sent later
    finally:
        q.close()


# -- one event loop after another --------------------------------------------------------


def test_socket_get_async_works_in_a_second_event_loop():
    q = SocketQueue()

    async def get_one():
        return await within(q.get_async(), "an item")

    try:
        q.put("first")
        assert asyncio.run(get_one()) == "first"
        q.put("second")
        assert asyncio.run(get_one()) == "second"

        async def put_and_get(item):
            q.put(item)
            return await within(q.get_async(), "an item put in this loop")

        assert asyncio.run(put_and_get("third")) == "third"
    finally:
        q.close()


def _loop_that_ends_mid_frame(q, value):
    """Puts a big array in a loop that ends (and closes) before its frame is out."""

    async def put():
        q.put(_big(value))
        await asyncio.sleep(0)  # the frame begins; the socket fills
        await asyncio.sleep(0)

    asyncio.run(put())
    assert q._unsent  # what the ended loop left


def test_socket_put_outside_a_loop_sends_first_what_a_loop_that_ended_left():
    q = SocketQueue()
    try:
        _loop_that_ends_mid_frame(q, 5)
        reader = _Reader(q)
        q.put("hello", timeout=WAIT_S)
        assert reader.join() == [("array", (BIG,), 5), "hello", "EMPTY"]
    finally:
        q.close()


def test_socket_put_in_a_new_loop_sends_first_what_a_loop_that_ended_left():
    q = SocketQueue()
    try:
        _loop_that_ends_mid_frame(q, 6)
        reader = _Reader(q)

        _put_in_a_new_loop(q, "hello")
        assert reader.join() == [("array", (BIG,), 6), "hello", "EMPTY"]
    finally:
        q.close()


def test_socket_drain_in_a_new_loop_sends_what_a_loop_that_ended_left():
    q = SocketQueue()
    try:
        _loop_that_ends_mid_frame(q, 8)
        reader = _Reader(q)

        async def drain():
            await within(q.drain(), "the frame to leave")

        asyncio.run(drain())
        assert not q._unsent
        assert reader.join() == [("array", (BIG,), 8), "EMPTY"]
    finally:
        q.close()


def test_socket_puts_of_a_loop_that_stopped_before_sending_them_leave_later():
    q = SocketQueue()
    loop = asyncio.new_event_loop()
    try:
        # The put schedules its frame for the end of the iteration; the loop stops first.
        loop.call_soon(lambda: (q.put("a"), loop.stop()))
        loop.run_forever()
        loop.close()
        q.put("b", timeout=WAIT_S)  # outside a loop: "a" leaves first
        assert [q.get(timeout=WAIT_S), q.get(timeout=WAIT_S)] == ["a", "b"]

        loop = asyncio.new_event_loop()
        loop.call_soon(lambda: (q.put("c"), loop.stop()))
        loop.run_forever()
        loop.close()

        async def put_and_get():
            q.put("d")  # in a new loop: "c" leaves with it, first
            return [await within(q.get_async(), "an item") for _ in range(2)]

        assert asyncio.run(put_and_get()) == ["c", "d"]
    finally:
        loop.close()
        q.close()


# -- closing --------------------------------------------------------------------------


async def test_socket_drain_returns_when_the_queue_is_closed_with_data_unsent():
    q = socket_queue()
    q.put(_big())  # nobody reads: most of it stays unsent
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert q._unsent
    drain = asyncio.ensure_future(q.drain())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not drain.done()
    q.close()  # drops what was unsent
    await within(drain, "drain after close")
    await within(q.drain(), "a drain after close")  # and at once after


@pytest.mark.parametrize("how", ["close", "writer_only"])
def test_socket_get_without_a_reading_end_raises_closed_connection(how):
    q = SocketQueue()
    q.put("arrived")
    assert q.qsize() == 1  # read in before the end is closed
    getattr(q, how)()
    assert q.get(timeout=WAIT_S) == "arrived"  # what arrived is still taken
    for get in (lambda: q.get(timeout=WAIT_S), q.get_nowait, lambda: q.get()):
        with pytest.raises(ClosedConnection):
            get()
    with pytest.raises(ClosedConnection):
        asyncio.run(q.get_async())
    q.close()


async def test_socket_get_async_waiting_wakes_with_closed_connection_on_writer_only():
    q = socket_queue()
    getter = asyncio.ensure_future(q.get_async())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not getter.done()
    q.writer_only()
    with pytest.raises(ClosedConnection):
        await within(getter, "the getter woken by writer_only")
    q.close()
