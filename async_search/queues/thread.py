"""A queue between the threads of one process that a coroutine can await."""

from __future__ import annotations

import asyncio
import queue
from typing import Any, List, Tuple

from async_search.checks import check_int
from async_search.queues.protocol import wait_timeout


class ThreadQueue(queue.Queue):
    """A ``queue.Queue`` that a coroutine can also await, woken by ``put`` from any thread.

    ``put`` from another thread wakes an awaiting coroutine with
    ``loop.call_soon_threadsafe``: the loop sleeps until the item is there.

    Example:
        >>> q = ThreadQueue(); q.put(1); q.get()
        1
    """

    def __init__(self, maxsize: int = 0):
        super().__init__(maxsize)
        self._async_waiters: List[Tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, wait_timeout(timeout))

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        return super().get(block, wait_timeout(timeout))

    def _put(self, item: Any) -> None:  # called by put() with self.mutex held
        super()._put(item)
        if self._async_waiters:
            self._wake_one()

    def _wake_one(self) -> None:  # with self.mutex held
        """Wakes the first waiter whose loop still runs (one whose loop was closed while
        it waited is dropped: the wake-up goes on to the next)."""
        waiters = self._async_waiters
        while waiters:
            loop, waiter = waiters.pop(0)
            try:
                loop.call_soon_threadsafe(_wake, waiter)
                return
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
                        self._wake_one()
                raise


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


def thread_queue(maxsize: int = 0) -> ThreadQueue:
    """A queue between threads of one process, awaitable from a loop."""
    return ThreadQueue(check_int("maxsize", maxsize, minimum=0))
