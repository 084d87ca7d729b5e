"""Serving a Connection: requests from clients elsewhere, batched by a BatchingServer."""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Deque, Tuple

from async_search.batchers import Batcher
from async_search.connections import Connection
from async_search.servers.batching import BatchingServer
from async_search.servers.policy import DispatchPolicy

__all__ = ["serve_connection", "CLOSE"]

#: Send this on a server connection to end ``serve_connection`` (after it has answered
#: everything received before it).
CLOSE = "async_search.close"


async def serve_connection(model: Any, connection: Connection, *,
                           policy: DispatchPolicy = DispatchPolicy(),
                           batcher: Batcher | None = None) -> dict:
    """Serves ``(route, x)`` requests from ``connection`` until it receives ``CLOSE``.

    Each request joins the batches of a BatchingServer in this loop; its response is
    sent back as ``(route, outputs)``, or ``(route, exception)`` when it failed (a bad
    request, a model that raised). Routes are passed through untouched. Returns the
    server's stats.

    Example:
        >>> # clients, server_end = forked_pipe(thread_queue, num_clients=4)
        >>> # stats = await serve_connection(model, server_end)
    """
    replies = _OrderedReplies(connection)
    async with BatchingServer(model, policy, batcher) as evaluate:
        while True:
            message = await connection.recv_async()
            if message == CLOSE:
                break
            route, x = message
            try:
                fut = evaluate(x)
            except Exception as e:  # a bad request fails alone
                fut = asyncio.get_running_loop().create_future()
                fut.set_exception(e)
            replies.add(route, fut)
    return evaluate.stats


class _OrderedReplies:
    """Sends replies in the order the requests came, so that FIFO clients match them:
    a request that fails at once (or has no elements) must not overtake earlier ones."""

    def __init__(self, connection: Connection):
        self._connection = connection
        self._waiting: Deque[Tuple[Any, asyncio.Future]] = collections.deque()

    def add(self, route: Any, fut: asyncio.Future) -> None:
        self._waiting.append((route, fut))
        if fut.done():
            self._send_ready()
        else:
            fut.add_done_callback(self._send_ready)

    def _send_ready(self, _=None) -> None:
        waiting, connection = self._waiting, self._connection
        while waiting and waiting[0][1].done():
            route, fut = waiting.popleft()
            if fut.cancelled():
                continue
            error = fut.exception()
            connection.send((route, error if error is not None else fut.result()))
