"""The QueueLike protocol, and one queue factory per backend.

Connections are built on FIFO queues that follow ``queue.Queue``'s interface, so the
same connection code runs in one event loop, across threads, across processes or across
a Ray cluster. A queue that can also be awaited in the running loop (``get_async``)
wakes a waiting coroutine when an item arrives: no polling, no sleeping.

Factories take ``maxsize`` (0: unbounded) and return a new queue:

    >>> q = queue_factory("thread")(maxsize=0)
    >>> q.put(1); q.get()
    1
"""

from __future__ import annotations

import asyncio
import collections
import queue
from typing import Any, Callable, Deque, List, Protocol, Tuple, runtime_checkable

__all__ = [
    "QueueLike", "AsyncQueueLike", "QueueFactory", "LocalQueue", "ThreadQueue",
    "ProcessQueue", "local_queue", "thread_queue", "process_queue", "ray_queue",
    "queue_factory",
]


@runtime_checkable
class QueueLike(Protocol):
    """A FIFO queue with ``queue.Queue``'s interface (``queue.Empty``/``queue.Full``)."""

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None: ...

    def get(self, block: bool = True, timeout: float | None = None) -> Any: ...

    def put_nowait(self, item: Any) -> None: ...

    def get_nowait(self) -> Any: ...

    def qsize(self) -> int: ...


@runtime_checkable
class AsyncQueueLike(QueueLike, Protocol):
    """A QueueLike that a coroutine can await: ``item = await q.get_async()``."""

    async def get_async(self) -> Any: ...


#: maxsize -> a new queue.
QueueFactory = Callable[..., QueueLike]


class LocalQueue:
    """A queue for the coroutines of one event loop (not thread-safe).

    ``get_async`` sleeps until ``put`` wakes it. Within one thread a blocking ``get``
    on an empty queue could never return, so ``get`` never blocks: it raises
    ``queue.Empty`` instead.
    """

    def __init__(self, maxsize: int = 0):
        self.maxsize = maxsize
        self._items: Deque[Any] = collections.deque()
        self._waiters: Deque[asyncio.Future] = collections.deque()

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if self.maxsize > 0 and len(self._items) >= self.maxsize:
            raise queue.Full
        self._items.append(item)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    def put_nowait(self, item: Any) -> None:
        self.put(item, block=False)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not self._items:
            raise queue.Empty
        return self._items.popleft()

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def qsize(self) -> int:
        return len(self._items)

    async def get_async(self) -> Any:
        while not self._items:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                # Pass the wake-up on, so that an item is not left unclaimed.
                if self._items and waiter.done() and not waiter.cancelled():
                    self._wake_next()
                raise
        return self._items.popleft()

    def _wake_next(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class ThreadQueue(queue.Queue):
    """A ``queue.Queue`` that a coroutine can also await, woken by ``put`` from any thread.

    ``put`` from another thread wakes an awaiting coroutine with
    ``loop.call_soon_threadsafe``: the loop sleeps until the item is there.
    """

    def __init__(self, maxsize: int = 0):
        super().__init__(maxsize)
        self._async_waiters: List[Tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    def _put(self, item: Any) -> None:  # called by put() with self.mutex held
        super()._put(item)
        if self._async_waiters:
            loop, waiter = self._async_waiters.pop(0)
            try:
                loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # that loop is closed; nobody waits there any more
                pass

    async def get_async(self) -> Any:
        loop = asyncio.get_running_loop()
        while True:
            with self.mutex:
                if self._qsize():
                    item = self._get()
                    self.not_full.notify()
                    return item
                waiter = loop.create_future()
                self._async_waiters.append((loop, waiter))
            try:
                await waiter
            except asyncio.CancelledError:
                with self.mutex:
                    if (loop, waiter) in self._async_waiters:
                        self._async_waiters.remove((loop, waiter))
                    elif self._qsize() and self._async_waiters:
                        # We were woken and are leaving: pass the wake-up on.
                        next_loop, next_waiter = self._async_waiters.pop(0)
                        next_loop.call_soon_threadsafe(_wake, next_waiter)
                raise


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class ProcessQueue:
    """A ``multiprocessing`` queue between processes, awaitable without a thread.

    ``get_async`` waits for the queue's pipe to become readable (``loop.add_reader``),
    so a coroutine sleeps until an item arrives; when another process takes the item
    first, it goes back to waiting. Pass it to a child process as a Process argument.
    Plain multiprocessing queues were picked over ``Manager().Queue`` (the prototype's
    choice) by the figures of ``benchmarks/backends.py``: a manager proxies every call
    through a server process.
    """

    def __init__(self, maxsize: int = 0, context: Any = None):
        import multiprocessing

        self._queue = (context or multiprocessing.get_context("spawn")).Queue(maxsize)

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        self._queue.put(item, block, timeout)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        return self._queue.get(block, timeout)

    def put_nowait(self, item: Any) -> None:
        self._queue.put_nowait(item)

    def get_nowait(self) -> Any:
        return self._queue.get_nowait()

    def qsize(self) -> int:
        return self._queue.qsize()

    async def get_async(self) -> Any:
        loop = asyncio.get_running_loop()
        fd = self._queue._reader.fileno()  # the pipe that put() feeds
        while True:
            try:
                return self._queue.get_nowait()
            except queue.Empty:
                pass
            readable = loop.create_future()
            loop.add_reader(fd, _wake, readable)
            try:
                await readable
            finally:
                loop.remove_reader(fd)

    def close(self) -> None:
        """Releases the queue's pipe and feeder thread (this process's side)."""
        self._queue.close()
        self._queue.join_thread()


def local_queue(maxsize: int = 0) -> LocalQueue:
    """A queue for coroutines in one event loop."""
    return LocalQueue(maxsize)


def thread_queue(maxsize: int = 0) -> ThreadQueue:
    """A queue between threads of one process, awaitable from a loop."""
    return ThreadQueue(maxsize)


def process_queue(maxsize: int = 0) -> ProcessQueue:
    """A queue between processes (``multiprocessing``, spawn context)."""
    return ProcessQueue(maxsize)


def ray_queue(maxsize: int = 0) -> QueueLike:
    """A queue between Ray tasks and actors (``ray.util.queue.Queue``, an actor; it has
    ``get_async``). Starts Ray on this machine if it is not running."""
    from async_search.backends.ray_backend import ensure_ray

    ensure_ray()
    from ray.util.queue import Queue

    return Queue(maxsize)


_FACTORIES = {"local": local_queue, "thread": thread_queue, "process": process_queue,
              "ray": ray_queue}


def queue_factory(backend: str) -> QueueFactory:
    """The queue factory for a backend name: ``local``, ``thread``, ``process``, ``ray``.

    Raises:
        ValueError: for an unknown backend, naming the known ones.
    """
    try:
        return _FACTORIES[backend]
    except KeyError:
        raise ValueError(f"unknown queue backend {backend!r}; known: "
                         f"{', '.join(sorted(_FACTORIES))}") from None
