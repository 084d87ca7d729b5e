"""A multiprocessing queue between processes that a coroutine can await without a thread.

Ends of a stream: ``close_stream`` works as on every queue. A writer process that is gone
is noticed only by a reader that called ``reader_only()``: every process that holds a
``multiprocessing`` queue holds its pipe's writing end too, so otherwise the pipe never
reports its end. Without it, a reader of a writer that exited waits forever, and a
writer killed in the middle of a message (a large one, blocked on a full pipe) leaves
the reading thread blocked inside that message's read. With it too, while another
writer lives: the writers share one pipe, and its end comes only when all are gone.
``get_async`` reads a message whole once its first bytes arrive, so there the blocked
reader is the event loop itself (until the last writer exits). Where a writer may die
mid-message, give each writer its own ``SocketQueue`` (as the process backend does),
which notices a dead writer by itself.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.queues
import queue
import time
from multiprocessing.reduction import ForkingPickler as _ForkingPickler
from typing import Any, Dict, List

from async_search.checks import check_int
from async_search.queues.protocol import ClosedConnection, load_error, wait_timeout


class ProcessQueue(multiprocessing.queues.Queue):
    """A ``multiprocessing`` queue (spawn context) whose ``get_async`` needs no thread.

    ``get_async`` waits for the queue's pipe to become readable (``loop.add_reader``,
    once per loop however many coroutines wait), so a coroutine sleeps until an item
    arrives; when another process takes the item first, it goes back to waiting. Pass it
    to a child process as a Process argument. Any number of processes may put and get.
    (A ``multiprocessing.Manager().Queue``, the prototype's choice, is a QueueLike
    factory too, but proxies every call through the manager's process:
    ``benchmarks/backends.py`` measures the difference.)

    A process that only gets should call ``reader_only()`` once the writing processes
    have started: then, when they are all gone, its readers get ``ClosedConnection``
    after the items sent before (see the module's docstring).

    Example:
        >>> q = ProcessQueue(); q.put(1); q.get(timeout=5)
        1
    """

    def __init__(self, maxsize: int = 0, *, ctx: Any = None):
        super().__init__(maxsize, ctx=ctx or multiprocessing.get_context("spawn"))

    def _reset(self, after_fork: bool = False) -> None:  # in __init__, unpickling, fork
        super()._reset(after_fork)
        # Per loop: the coroutines waiting there; the loop watches the pipe while any do.
        self._async_waiters: Dict[asyncio.AbstractEventLoop, List[asyncio.Future]] = {}
        self._corrupt: str | None = None  # why the stream can be read no further

    def reader_only(self) -> "ProcessQueue":
        """Closes this process's writing end of the pipe: this process only gets, and
        its readers get ``ClosedConnection`` once every other process that holds the
        queue is gone (a writer killed in the middle of a message included). Call it
        after the processes that put have started, in a process that has not put;
        every reading process must call it. Returns self."""
        if not self._writer.closed:
            self._writer.close()
        self.put = self.put_nowait = _refuse_put  # (an instance's own: no cost elsewhere)
        return self

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        """``multiprocessing.Queue.put``, but an item that cannot be pickled raises
        here, in the caller, and nothing is queued: the queue's feeder thread pickles
        later, and one it cannot would be dropped with a printed traceback, the next
        item arriving in its place (a connected function's answers would then go to the
        wrong callers). It costs a second pickling of each item."""
        timeout = wait_timeout(timeout)
        _ForkingPickler.dumps(obj)  # raises what the feeder would meet
        super().put(obj, block, timeout)

    def put_nowait(self, obj: Any) -> None:
        self.put(obj, False)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """``multiprocessing.Queue.get``; raises ``ClosedConnection`` once the pipe has
        ended (after ``reader_only``, when every writing process is gone)."""
        timeout = wait_timeout(timeout)
        if self._closed:  # multiprocessing's ValueError, raised by every later get
            raise ClosedConnection("this queue was closed in this process (close()): "
                                   "nothing more can be read from it")
        if self._corrupt is not None:  # what follows a bad length is no message
            raise ClosedConnection(self._corrupt)
        try:
            data = self._get_bytes(block, timeout)
        except (EOFError, OSError) as e:  # the pipe's end, or in the middle of a message
            raise ClosedConnection(f"every process writing to this queue is gone "
                                   f"({type(e).__name__}: {e})") from e
        except (MemoryError, OverflowError) as e:  # a length no message has: the
            # bytes after it cannot be read as messages either, now or later
            self._corrupt = (f"the stream is corrupt: a message's length is beyond any "
                             f"message ({type(e).__name__})")
            raise ClosedConnection(self._corrupt) from e
        try:
            return _ForkingPickler.loads(data)
        except (EOFError, OSError) as e:  # the message's own loading, not the pipe
            raise load_error(e) from e

    def _get_bytes(self, block: bool, timeout: float | None) -> bytes:
        """``multiprocessing.Queue.get`` without its unpickling (CPython 3.11's)."""
        if block and timeout is None:
            with self._rlock:
                data = self._recv_bytes()
            self._sem.release()
            return data
        deadline = time.monotonic() + timeout if block else None
        if not self._rlock.acquire(block, timeout):
            raise queue.Empty
        try:
            if not self._poll(deadline - time.monotonic() if block else 0.0):
                raise queue.Empty
            data = self._recv_bytes()
            self._sem.release()
        finally:
            self._rlock.release()
        return data

    def get_nowait(self) -> Any:
        return self.get(False)

    async def get_async(self) -> Any:
        try:
            return self.get_nowait()
        except queue.Empty:
            pass
        loop = asyncio.get_running_loop()
        while True:
            waiters = self._async_waiters.get(loop)
            if waiters is None:  # the first to wait in this loop: watch the pipe
                waiters = self._async_waiters[loop] = []
                loop.add_reader(self._reader.fileno(), self._on_readable, loop)
            waiter = loop.create_future()
            waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in waiters:  # not woken: no longer waiting
                    waiters.remove(waiter)
                    if not waiters and self._async_waiters.get(loop) is waiters:
                        self._stop_watching(loop)
                raise
            try:
                return self.get_nowait()
            except queue.Empty:  # another reader took it first: wait again
                pass

    def _on_readable(self, loop: asyncio.AbstractEventLoop) -> None:
        # Level-triggered: stop watching, and wake every waiter of this loop; each tries
        # to take an item, and those that find none watch again.
        waiters = self._async_waiters.get(loop)
        self._stop_watching(loop)
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            waiters.clear()  # woken: a cancelled one must not stop the next watch

    def _stop_watching(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._async_waiters.pop(loop, None) is not None and not loop.is_closed():
            loop.remove_reader(self._reader.fileno())


def _refuse_put(*args: Any, **kwargs: Any) -> None:
    raise ClosedConnection("cannot put on this process queue: this process called "
                           "reader_only(), it only gets")


def process_queue(maxsize: int = 0) -> ProcessQueue:
    """A queue between processes (``multiprocessing``, spawn context)."""
    return ProcessQueue(check_int("maxsize", maxsize, minimum=0))
