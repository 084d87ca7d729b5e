"""A queue between two processes over a socket pair: one frame per loop iteration.

``SocketQueue`` is the process backend's transport. One process puts, another gets.
Puts made in one loop iteration leave as one frame (a pickled list, protocol 5, every
NumPy array's bytes written straight from its memory, out of band), so traffic scales
with loop iterations, not with messages. Reading is event-driven (``loop.add_reader``):
a waiting coroutine sleeps until a frame arrives. Writing never blocks the loop: what
the socket cannot take at once waits in a buffer until it is writable, so two processes
writing to each other cannot deadlock. Outside a running loop, ``put`` and ``get``
block like ``queue.Queue``'s.

A frame is never cut: a ``put`` outside a loop that times out (or, with ``block=False``,
finds the socket full) raises ``queue.Full`` only before the first byte of its frame is
written; once the frame has begun, the put succeeds and the rest of the frame waits in
the buffer, to leave first with the next put (or ``drain``). A queue may be used in one
event loop after another (two ``asyncio.run`` calls): it registers with the loop that is
running, and what a loop that ended left unsent leaves first.

The end of the stream is ``END_OF_STREAM`` (``close_stream``) or the writer's end of
the socket closing (its process exited or died): either way a reader gets
``ClosedConnection`` once the items before it are taken. An item that arrives whole but
does not load here (a class this process lacks) fails its own ``get`` with what loading
raised; bytes that are no frame end the stream.

The items are pickles, and loading a pickle can run any code its writer chose: connect
only processes you trust (this process's children, a Ray cluster's tasks past its
token), never a port others can reach.

    >>> import numpy as np
    >>> q = SocketQueue()
    >>> q.put({"x": np.arange(3)}); q.get(timeout=5)["x"].tolist()
    [0, 1, 2]
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import pickle
import queue
import select
import socket
import struct
import time
from typing import Any, Deque, List

import numpy as np

from async_search.queues.protocol import ClosedConnection, is_end, load_error, wait_timeout


# A frame: its length after this prefix, the number of items, then each item: its pickled
# header's length and number of out-of-band buffers, each buffer's length, the header,
# the buffers. Items are pickled one by one when put, so that one that cannot travel
# fails its own put, at once, and never the frame it would have joined.
_PREFIX = struct.Struct("!Q")
_ITEMS = struct.Struct("!I")
_COUNTS = struct.Struct("!II")
_CHUNK = 1 << 18
#: A frame with more than this left to come when its head arrives is read in place,
#: not through the chunk (benchmarks/socket_queue.py, the reader's CPU per MB against
#: reading every byte through the chunk, pair by pair: 1.0-1.35x less at 512 KB frames,
#: 0.9-3.5x at 1 MB, 1.6-3.0x at 4 MB); a small rest is not worth a buffer of its own.
_DIRECT = _CHUNK // 4
_IOV_MAX = 512
_READER_CLOSED = "this socket queue's reading end is closed here"


def encode_item(item: Any) -> List[memoryview]:
    """``item`` as the byte chunks of one item of a frame; arrays are views of their own
    memory.

    Raises:
        Exception: what pickling raised, when ``item`` cannot travel.
    """
    buffers: List[pickle.PickleBuffer] = []
    header = pickle.dumps(item, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    sizes = struct.pack(f"!{len(views)}Q", *(v.nbytes for v in views))
    return [memoryview(_COUNTS.pack(len(header), len(views)) + sizes + header), *views]


def frame_of(items: List[List[memoryview]]) -> List[memoryview]:
    """The chunks of one frame holding the encoded ``items``."""
    chunks = [c for item in items for c in item]
    length = _ITEMS.size + sum(c.nbytes for c in chunks)
    return [memoryview(_PREFIX.pack(length) + _ITEMS.pack(len(items))), *chunks]


def encode_frame(items: List[Any]) -> List[memoryview]:
    """``items`` as the byte chunks of one frame (``decode_frame`` gives them back)."""
    return frame_of([encode_item(item) for item in items])


class _LoadFailed:
    """An item whose bytes arrived whole but did not unpickle: its get raises why."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def decode_frame(frame: memoryview, keep_going: bool = False) -> List[Any]:
    """The items of one frame (without its length prefix); arrays are views of it.
    Raises when the frame's own structure (its counts and sizes) does not hold; with
    ``keep_going``, an item that does not load within a frame that holds (a class this
    process lacks, a reducer that raises) becomes a ``_LoadFailed``, failing its own
    get, instead of failing the frame."""
    (count,) = _ITEMS.unpack_from(frame)
    at = _ITEMS.size
    parts = []
    for _ in range(count):
        header_length, num_buffers = _COUNTS.unpack_from(frame, at)
        at += _COUNTS.size
        sizes = struct.unpack_from(f"!{num_buffers}Q", frame, at)
        at += 8 * num_buffers
        header = frame[at:at + header_length]
        at += header_length
        buffers = []
        for size in sizes:
            buffers.append(frame[at:at + size])
            at += size
        if at > len(frame):
            raise ValueError(f"an item runs {at - len(frame)} bytes past its frame")
        parts.append((header, buffers))
    if at != len(frame):
        raise ValueError(f"{len(frame) - at} bytes follow the frame's {count} items")
    items = []
    for header, buffers in parts:
        try:
            items.append(pickle.loads(header, buffers=buffers))
        except Exception as e:  # noqa: BLE001 - whatever loading this item raised
            if not keep_going:
                raise
            items.append(_LoadFailed(load_error(e)))
    return items


def _bytes_views(chunks: List[memoryview]) -> List[memoryview]:
    """The non-empty chunks as byte views (``sendmsg`` of an empty one sends nothing,
    which would leave it at the head of the unsent list forever)."""
    return [c.cast("B") if c.format != "B" else c for c in chunks if c.nbytes]


def _drop_sent(chunks: Deque[memoryview], sent: int) -> None:
    """Drops the first ``sent`` bytes of ``chunks`` (whole chunks, then part of one)."""
    while sent:
        head = chunks[0]
        if sent >= head.nbytes:
            sent -= head.nbytes
            chunks.popleft()
        else:
            chunks[0] = head[sent:]
            sent = 0


class SocketQueue:
    """A one-way FIFO queue from one process to another over a socket pair.

    Make it in the parent and pass it to the child as a Process argument (spawn). Each
    side then keeps only its own end (``reader_only`` / ``writer_only``), so that a
    reader learns when the writing process is gone. Not thread-safe: one loop (or one
    thread) per side.

    Args:
        maxsize: must be 0: in a running loop a socket queue is unbounded (a full
            socket buffers in this process instead of blocking the loop). Outside a
            loop, ``put`` writes the item into the socket and returns once it is
            written: an item larger than the socket's buffer waits for the reader (two
            sync ends that each put a large item before reading wait on each other).
    """

    #: One writing process only: frames from two writers on one socket would interleave.
    single_writer = True

    def __init__(self, maxsize: int = 0):
        if maxsize:
            raise ValueError(f"a SocketQueue is unbounded: maxsize must be 0, got {maxsize!r}")
        self._writer, self._reader = socket.socketpair()
        self._setup()

    def _setup(self) -> None:
        for sock in (self._writer, self._reader):
            if sock is not None:
                sock.setblocking(False)
        self._items: Deque[Any] = collections.deque()
        self._inbuf = bytearray()
        self._chunk: bytearray | None = None
        self._frame: memoryview | None = None  # a large frame being read in place
        self._filled = 0                       # ... and its bytes read so far
        self._eof = False
        self._ended = "the writing end closed the stream"  # why, once _eof
        self._unreadable: BaseException | None = None
        self._waiters: List[asyncio.Future] = []
        self._reading_loop: asyncio.AbstractEventLoop | None = None
        self._outgoing: List[Any] = []
        self._scheduled: asyncio.AbstractEventLoop | None = None
        self._unsent: Deque[memoryview] = collections.deque()
        self._writing_loop: asyncio.AbstractEventLoop | None = None
        self._drained: List[asyncio.Future] = []
        self._broken: BaseException | None = None

    @classmethod
    def on_socket(cls, *, reader: socket.socket | None = None,
                  writer: socket.socket | None = None) -> "SocketQueue":
        """A queue over connected sockets of its own (a TCP connection, say) instead of
        a new socket pair: it gets from ``reader`` and puts to ``writer``; either may be
        None for a one-way end. The queue owns them and closes them with itself. The
        peer must be trusted: what it sends is unpickled here.

        Example:
            >>> import socket
            >>> a, b = socket.socketpair()
            >>> sender, receiver = SocketQueue.on_socket(writer=a), SocketQueue.on_socket(reader=b)
            >>> sender.put("hello"); receiver.get(timeout=5)
            'hello'
        """
        queue = cls.__new__(cls)
        queue.__setstate__({"writer": writer, "reader": reader})
        return queue

    def __getstate__(self) -> dict:
        return {"writer": self._writer, "reader": self._reader}

    def __setstate__(self, state: dict) -> None:
        self._writer, self._reader = state["writer"], state["reader"]
        self._setup()

    @property
    def unreadable(self) -> BaseException | None:
        """Why a frame could not be read, when that ended the stream (bytes that are
        no frame: its counts and sizes do not hold); None otherwise. An item that does
        not load within a frame that holds fails its own get instead."""
        return self._unreadable

    # -- ends ---------------------------------------------------------------------------

    def reader_only(self) -> "SocketQueue":
        """Closes this process's writing end: this process only gets (what was not
        sent yet is dropped, and ``drain`` returns). Returns self."""
        self._stop_writing()
        self._outgoing = []
        self._scheduled = None
        self._unsent.clear()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._wake_drained()
        return self

    def writer_only(self) -> "SocketQueue":
        """Closes this process's reading end: this process only puts (a ``get`` here
        raises ``ClosedConnection`` once the items that arrived are taken). Returns
        self."""
        self._stop_reading()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._wake_readers()
        return self

    def close(self) -> None:
        """Releases both ends in this process: what was not sent yet is dropped (a
        ``drain`` waiting for it returns) and a ``get`` raises ``ClosedConnection``
        once the items that arrived are taken."""
        self.writer_only()
        self.reader_only()

    # -- putting ------------------------------------------------------------------------

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Sends ``item``; in a running loop it leaves with this iteration's frame and
        ``block`` and ``timeout`` do not matter (the loop never blocks).

        Outside a loop it is written at once, after what earlier puts left unsent,
        waiting up to ``timeout`` seconds for the socket (not at all unless ``block``).
        Once the first byte of its frame is written the put succeeds: what the socket
        did not take by then waits in this process and leaves first with the next put
        (or ``drain``), so that a frame is never cut.

        Raises:
            queue.Full: outside a loop, nothing of the item could be written in time
                (nothing of it is sent; the queue stays usable).
            ClosedConnection: the reading end is gone (or this process closed it).
            Exception: what pickling raised, when ``item`` cannot travel (nothing is
                sent; the queue stays usable).
        """
        timeout = wait_timeout(timeout)
        if self._broken is not None or self._writer is None:
            raise ClosedConnection(f"cannot put on this socket queue: "
                                   f"{self._broken or 'its writing end is closed here'}")
        encoded = encode_item(item)  # raises here when ``item`` cannot travel
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._send_blocking(frame_of([encoded]), timeout, block)
            return
        self._outgoing.append(encoded)
        if self._scheduled is not loop:  # None, or a loop that ended before sending
            self._scheduled = loop
            loop.call_soon(self._flush)

    def put_nowait(self, item: Any) -> None:
        self.put(item, block=False)

    async def drain(self) -> None:
        """Returns once everything put has been handed to the socket, or once nothing
        can be sent any more: the reading end is gone, or ``close`` (``reader_only``)
        dropped what was unsent. It never raises for either: a ``put`` does."""
        loop = asyncio.get_running_loop()
        while self._broken is None and self._writer is not None:
            if self._scheduled is not None and self._scheduled is not loop:
                self._flush()  # puts of a loop that ended before it sent them
            if self._unsent and self._writing_loop is not loop:
                self._stop_writing()  # left by a loop that ended, or by a put outside one
                self._send_some()
            if self._scheduled is None and not self._unsent:
                return
            fut = loop.create_future()
            self._drained.append(fut)
            await fut

    def send_pending(self) -> None:
        """Sends now what this loop iteration has put so far, as one frame, instead of
        at the end of the iteration: for a caller that coalesces its own messages and
        has put its last one of the iteration."""
        if self._outgoing:
            self._flush()

    def _flush(self) -> None:
        self._scheduled = None
        items, self._outgoing = self._outgoing, []
        if not items:  # sent already by send_pending
            return
        if self._writer is None or self._broken is not None:
            return self._wake_drained()
        chunks = frame_of(items)
        self._unsent.extend(_bytes_views(chunks))
        writing = self._writing_loop
        if writing is None:
            self._send_some()
        elif writing is not asyncio._get_running_loop():  # one that ended: what it
            self._stop_writing()                          # left goes first, from here
            self._send_some()

    def _send_some(self) -> None:
        unsent = self._unsent
        try:
            while unsent:
                _drop_sent(unsent, self._writer.sendmsg(
                    list(itertools.islice(unsent, _IOV_MAX))))
        except BlockingIOError:
            pass
        except OSError as e:  # the reading process is gone
            self._broken = ClosedConnection(f"the reading end closed ({e!r})")
            unsent.clear()
        if unsent and self._writing_loop is None:
            self._writing_loop = asyncio.get_running_loop()
            self._writing_loop.add_writer(self._writer.fileno(), self._send_some)
        elif not unsent:
            self._stop_writing()
            self._wake_drained()

    def _stop_writing(self) -> None:
        if self._writing_loop is not None:
            if self._writer is not None and not self._writing_loop.is_closed():
                self._writing_loop.remove_writer(self._writer.fileno())
            self._writing_loop = None

    def _wake_drained(self) -> None:
        drained, self._drained = self._drained, []
        for fut in drained:
            if not fut.done():
                try:
                    fut.set_result(None)
                except RuntimeError:  # its loop is closed: nobody awaits it any more
                    pass

    def _send_blocking(self, chunks: List[memoryview], timeout: float | None,
                       block: bool = True) -> None:
        """Writes one frame outside a loop, after what earlier puts left unsent (a frame
        a loop that ended did not finish, the rest of one a put that timed out began).

        Raises:
            queue.Full: not a byte of the frame was written in time (nothing of it is
                kept).
            ClosedConnection: the reading end is gone.
        """
        deadline = None if timeout is None or not block else time.monotonic() + timeout
        if self._writing_loop is not None:  # registered with a loop that is not running
            self._stop_writing()
        if self._outgoing:  # puts of a loop that ended before it sent them
            self._scheduled = None
            items, self._outgoing = self._outgoing, []
            self._unsent.extend(_bytes_views(frame_of(items)))
        if self._unsent and not self._send_within(self._unsent, block, deadline):
            raise queue.Full  # the frames before it are not out: this one is not begun
        frame = collections.deque(_bytes_views(chunks))
        head = frame[0]  # stays at the head, whole, until a byte of it is written
        if not self._send_within(frame, block, deadline):
            if frame[0] is head:
                raise queue.Full  # nothing of it written: as if never put
            self._unsent.extend(frame)  # begun: its rest leaves first with the next put

    def _send_within(self, chunks: Deque[memoryview], block: bool,
                     deadline: float | None) -> bool:
        """Writes ``chunks`` (dropping what is written), waiting for the socket until
        ``deadline`` (None: for ever) when ``block``; True once all are written."""
        writer = self._writer  # a close from another thread fails the send, below
        if writer is None:
            raise ClosedConnection("cannot put on this socket queue: its writing end "
                                   "is closed here")
        try:
            while chunks:
                try:
                    sent = writer.sendmsg(list(itertools.islice(chunks, _IOV_MAX)))
                except BlockingIOError:
                    if not block:
                        return False
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    if not select.select([], [writer], [], left)[1]:
                        return False
                    continue
                _drop_sent(chunks, sent)
        except (OSError, ValueError) as e:  # the reading end is gone (or ours closed)
            self._broken = ClosedConnection(f"the reading end closed ({e!r})")
            self._unsent.clear()
            raise self._broken from e
        return True

    # -- getting ------------------------------------------------------------------------

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next item; blocks up to ``timeout`` seconds when ``block``.

        Raises:
            queue.Empty: nothing arrived in time.
            ClosedConnection: the stream ended and every item before its end is taken.
        """
        timeout = wait_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._read_available()
            if self._items:
                return _taken(self._items.popleft())
            if self._eof:
                raise ClosedConnection(self._ended)
            reader = self._reader
            if reader is None:
                raise ClosedConnection(_READER_CLOSED)
            if not block:
                raise queue.Empty
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([reader], [], [], left)[0]:
                raise queue.Empty

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def qsize(self) -> int:
        """Items that have arrived and are not taken yet."""
        self._read_available()
        return len(self._items)

    async def get_async(self) -> Any:
        """The next item, awaited: the coroutine sleeps until a frame arrives.

        Raises:
            ClosedConnection: the stream ended and every item before its end is taken.
        """
        while True:
            if self._items:
                return _taken(self._items.popleft())
            if self._eof:
                raise ClosedConnection(self._ended)
            if self._reader is None:
                raise ClosedConnection(_READER_CLOSED)
            loop = asyncio.get_running_loop()
            if self._reading_loop is not loop:  # None, or a loop that ended
                self._unwatch()
                self._reading_loop = loop   # level-triggered: bytes that came before
                loop.add_reader(self._reader.fileno(), self._on_readable)  # wake us
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                if waiter.cancelled() and not self._waiters:
                    # Nobody reads now (a cancelled server): the loop lets go of the
                    # socket, or it would hold this queue and its sockets for good. The
                    # next get watches it again; what came meanwhile waits in the socket.
                    self._unwatch()

    def _on_readable(self) -> None:
        self._read_available()
        if self._items or self._eof:
            self._wake_readers()

    def _wake_readers(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                try:
                    waiter.set_result(None)
                except RuntimeError:  # its loop is closed: nobody awaits it any more
                    pass

    def _stop_reading(self) -> None:
        self._frame = None  # no more bytes come: a frame half-read is dropped, not kept
        self._unwatch()

    def _unwatch(self) -> None:
        """Unregisters the reader from the loop it was registered with (a frame half-read
        stays: its rest still comes)."""
        if self._reading_loop is not None:
            if self._reader is not None and not self._reading_loop.is_closed():
                self._reading_loop.remove_reader(self._reader.fileno())
            self._reading_loop = None

    def _read_available(self) -> None:
        if self._eof or self._reader is None:
            return
        buf = self._inbuf
        chunk = self._chunk
        if chunk is None:  # recv(n) would allocate n bytes each call: read into one
            chunk = self._chunk = bytearray(_CHUNK)
        while True:
            frame = self._frame
            into = chunk if frame is None else frame[self._filled:]
            try:
                size = self._reader.recv_into(into)
            except BlockingIOError:
                break
            except OSError:
                size = 0
            if not size:
                self._eof = True
                self._stop_reading()
                break
            if frame is None:
                buf += memoryview(chunk)[:size]
            else:  # a large frame's bytes, straight into place
                self._filled += size
                if self._filled == len(frame):
                    self._frame = None
                    if not self._take_frame(frame):
                        break
            if size < len(into):  # the socket has nothing more for now
                break
        self._split_frames()

    def _split_frames(self) -> None:
        """Takes the whole frames of ``_inbuf``; a large frame whose head has come
        moves into a buffer of its own (``_frame``), which the next reads fill in
        place: the rest of its bytes are copied once, by the kernel."""
        buf = self._inbuf
        at, end = 0, len(buf)
        # After the socket's end too: the whole frames that came before it count.
        while end - at >= _PREFIX.size:
            (length,) = _PREFIX.unpack_from(buf, at)
            start = at + _PREFIX.size
            have = end - start
            if have < length:
                if length - have > _DIRECT and not self._eof:  # the rest can still come
                    try:
                        frame = memoryview(np.empty(length, np.uint8))  # no zeroing
                    except (MemoryError, ValueError) as e:  # a broken or hostile length
                        self._end(f"a frame of {length} bytes announced by the writing "
                                  f"end could not be held: {type(e).__name__}: {e}")
                        at = end
                        break
                    with memoryview(buf) as head:  # released before buf shrinks
                        frame[:have] = head[start:end]
                    self._frame, self._filled = frame, have
                    at = end
                break
            at = start + length
            # A copy: the arrays it holds view it, and the buffer moves on.
            if not self._take_frame(memoryview(buf[start:at])):
                break
        if at:
            del buf[:at]

    def _end(self, why: str) -> None:
        """Ends the stream here, for ``why``: the items before are kept."""
        self._ended = why
        self._eof = True
        self._stop_reading()

    def _take_frame(self, frame: memoryview) -> bool:
        """Queues the items of one whole frame (arrays are views of it); False when
        the stream ends in it (an end of stream, or a frame that does not load)."""
        try:
            items = decode_frame(frame, keep_going=True)
        except Exception as e:  # a frame that does not load: nothing after it can
            # be trusted, so the stream ends here (the items before it are kept)
            self._unreadable = e
            self._end(f"a frame from the writing end could not be read: "
                      f"{type(e).__name__}: {e}")
            return False
        for item in items:
            if is_end(item):
                self._end(self._ended)
                return False
            self._items.append(item)
        return True


def _taken(item: Any) -> Any:
    if type(item) is _LoadFailed:
        raise item.error
    return item


def socket_queue(maxsize: int = 0) -> SocketQueue:
    """A queue from one process to another over a socket pair (see ``SocketQueue``)."""
    return SocketQueue(maxsize)
