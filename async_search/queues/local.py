"""A queue for the coroutines of one event loop."""

from __future__ import annotations

import asyncio
import collections
import queue
from typing import Any, Deque

from async_search.checks import check_int
from async_search.queues.protocol import wait_timeout


class LocalQueue:
    """A queue for the coroutines of one event loop (not thread-safe).

    ``get_async`` sleeps until ``put`` wakes it. Within one thread a blocking ``get``
    on an empty queue could never return, so ``get`` never blocks: it raises
    ``queue.Empty`` instead.

    Example:
        >>> q = LocalQueue(); q.put(1); q.get()
        1
    """

    def __init__(self, maxsize: int = 0):
        self.maxsize = maxsize
        self._items: Deque[Any] = collections.deque()
        self._waiters: Deque[asyncio.Future] = collections.deque()

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        wait_timeout(timeout)  # never waits (one thread), but takes what the others take
        if self.maxsize > 0 and len(self._items) >= self.maxsize:
            raise queue.Full
        self._items.append(item)
        self._wake_next()

    def put_nowait(self, item: Any) -> None:
        self.put(item, block=False)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        wait_timeout(timeout)
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
                if waiter.done() and not waiter.cancelled():
                    # Woken, then cancelled: pass the wake-up on, so that an item is
                    # not left unclaimed.
                    if self._items:
                        self._wake_next()
                else:  # still waiting: forget it (a getter that times out leaves none)
                    try:
                        self._waiters.remove(waiter)
                    except ValueError:  # a wake-up already skipped it
                        pass
                raise
        return self._items.popleft()

    def _wake_next(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def local_queue(maxsize: int = 0) -> LocalQueue:
    """A queue for coroutines in one event loop."""
    return LocalQueue(check_int("maxsize", maxsize, minimum=0))
