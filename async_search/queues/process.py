"""A multiprocessing queue between processes that a coroutine can await without a thread."""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.queues
import queue
from typing import Any


class ProcessQueue(multiprocessing.queues.Queue):
    """A ``multiprocessing`` queue (spawn context) whose ``get_async`` needs no thread.

    ``get_async`` waits for the queue's pipe to become readable (``loop.add_reader``),
    so a coroutine sleeps until an item arrives; when another process takes the item
    first, it goes back to waiting. Pass it to a child process as a Process argument.
    Any number of processes may put and get. (A ``multiprocessing.Manager().Queue``, the
    prototype's choice, is a QueueLike factory too, but proxies every call through the
    manager's process: ``benchmarks/backends.py`` measures the difference.)

    Example:
        >>> q = ProcessQueue(); q.put(1); q.get(timeout=5)
        1
    """

    def __init__(self, maxsize: int = 0, *, ctx: Any = None):
        super().__init__(maxsize, ctx=ctx or multiprocessing.get_context("spawn"))

    async def get_async(self) -> Any:
        loop = asyncio.get_running_loop()
        fd = self._reader.fileno()  # the pipe that put() feeds (this queue's own field)
        while True:
            try:
                return self.get_nowait()
            except queue.Empty:
                pass
            readable = loop.create_future()
            loop.add_reader(fd, _wake, readable)
            try:
                await readable
            finally:
                loop.remove_reader(fd)


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


def process_queue(maxsize: int = 0) -> ProcessQueue:
    """A queue between processes (``multiprocessing``, spawn context)."""
    return ProcessQueue(maxsize)
