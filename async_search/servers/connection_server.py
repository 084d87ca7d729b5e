"""Serving a Connection: requests from clients elsewhere, batched by a BatchingServer.

Messages on the server connection, handled in the order they arrive:

- ``(route, x)``: evaluate ``x``; answered ``(route, outputs)`` or ``(route, error)``.
- ``(route, VersionedRequest(x))``: the same, answered ``(route, (outputs, version))``
  with the model version that computed the outputs (None when the request was split
  across batches while the model was swapped).
- ``(route, ModelUpdate(model, version))``: swap the model; answered ``(route,
  version)`` once swapped, or ``(route, error)`` when the swap failed (serving goes on
  with the old model).
- ``ModelUpdate(model, version)`` with no route: swap the model, answer nothing; if the
  swap fails, ``serve_connection`` ends with that error.
- ``CLOSE``: stop, after answering everything received before it.

Every request received after an update runs on the new model; requests received before
it may run on either (a batch that a device thread has started finishes on the old one).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any, Deque, Hashable, Tuple

import numpy as np

from async_search.batchers import Batcher
from async_search.connections import Connection
from async_search.servers.batching import BatchingServer
from async_search.servers.policy import DispatchPolicy

__all__ = ["serve_connection", "CLOSE", "ModelUpdate", "VersionedRequest"]

#: Send this on a server connection to end ``serve_connection`` (after it has answered
#: everything received before it).
CLOSE = "async_search.close"


@dataclasses.dataclass(frozen=True)
class ModelUpdate:
    """A message that swaps the served model (``BatchingServer.update_model``).

    Attributes:
        model: the new model (a callable), or weights for the current model's
            ``with_weights(weights)``.
        version: the new model's version, reported with every result it computes.

    Example:
        >>> # server_end.inbox.put(ModelUpdate(new_model, 2))     # no answer
        >>> # await fn(ModelUpdate(new_weights, 3))               # a client: answers 3
    """

    model: Any
    version: Hashable


@dataclasses.dataclass(frozen=True)
class VersionedRequest:
    """A request whose answer carries the model version: ``(outputs, version)``.

    Attributes:
        x: the request, an array ``[n, ...]`` as for a plain request.

    Example:
        >>> # outputs, version = await fn(VersionedRequest(x))
    """

    x: np.ndarray


async def serve_connection(model: Any, connection: Connection, *,
                           policy: DispatchPolicy = DispatchPolicy(),
                           batcher: Batcher | None = None) -> dict:
    """Serves ``(route, x)`` requests from ``connection`` until it receives ``CLOSE``.

    Each request joins the batches of a BatchingServer in this loop; its response is
    sent back as ``(route, outputs)``, or ``(route, exception)`` when it failed (a bad
    request, a model that raised). Routes are passed through untouched. A
    ``VersionedRequest`` payload is answered with ``(outputs, version)``; a
    ``ModelUpdate`` swaps the model for every request received after it (see the module
    docstring for the messages and their answers). Returns the server's stats.

    Raises:
        Exception: what a route-less ``ModelUpdate`` raised when it failed.

    Example:
        >>> # clients, server_end = forked_pipe(thread_queue, num_clients=4)
        >>> # stats = await serve_connection(model, server_end)
    """
    replies = _OrderedReplies(connection)
    loop = asyncio.get_running_loop()
    async with BatchingServer(model, policy, batcher) as evaluate:
        while True:
            message = await connection.recv_async()
            if isinstance(message, ModelUpdate):
                evaluate.update_model(message.model, message.version)
                continue
            if message == CLOSE:
                break
            route, x = message
            try:
                if isinstance(x, VersionedRequest):
                    fut = evaluate.call_with_version(x.x)
                elif isinstance(x, ModelUpdate):
                    evaluate.update_model(x.model, x.version)
                    fut = loop.create_future()
                    fut.set_result(x.version)
                else:
                    fut = evaluate(x)
            except Exception as e:  # a bad request (or update) fails alone
                fut = loop.create_future()
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
