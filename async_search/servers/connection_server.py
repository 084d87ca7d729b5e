"""Serving connections: requests from clients elsewhere, batched by one BatchingServer.

Every payload received on a connection gets exactly one answer, sent back in the order
received (so FIFO clients, forked pipes and pass-through keys all match them):

- ``x`` (an array ``[n, ...]``): answered with the outputs, or with the exception when
  the request failed (a bad request, a model that raised).
- ``VersionedRequest(x)``: answered with ``(outputs, version)``, the model version that
  computed them (None when the request was split across batches while the model was
  swapped).
- ``ModelUpdate(model, version)``: swaps the model; answered with ``version`` once
  swapped, or with the exception (serving goes on with the old model).

A connection is served until its stream ends: its clients closed it, or the process at
the other end is gone. Every request received after an update runs on the new model;
requests received before it may run on either (a batch that a device thread has started
finishes on the old one).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any, Callable, Deque, Hashable, Sequence, Union

import numpy as np

from async_search.batchers import Batcher
from async_search.connections import Connection
from async_search.errors import ModelOutputError, ServerClosedError
from async_search.queues import ClosedConnection
from async_search.remote import pack_error, plain_outputs, round_trips
from async_search.servers.batching import BatchingServer
from async_search.servers.policy import DispatchPolicy

__all__ = ["serve_connection", "ModelUpdate", "VersionedRequest"]


@dataclasses.dataclass(frozen=True)
class ModelUpdate:
    """A message that swaps the served model (``BatchingServer.update_model``).

    Attributes:
        model: the new model (a callable), or weights for the current model's
            ``with_weights(weights)``.
        version: the new model's version, reported with every result it computes.

    Example:
        >>> # await fn(ModelUpdate(new_weights, 3))     # a client: answered 3 once swapped
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

    def __reduce__(self):  # one per message between processes: pickle it lean
        return VersionedRequest, (self.x,)


async def serve_connection(model: Union[Any, BatchingServer],
                           connection: Union[Connection, Sequence[Connection]], *,
                           policy: DispatchPolicy = DispatchPolicy(),
                           batcher: Batcher | None = None, portable: bool = False) -> dict:
    """Serves the payloads received on ``connection`` (or on each of several) until
    every stream has ended; returns the server's stats.

    Every request joins the batches of one BatchingServer in this loop, whichever
    connection it came on; each answer goes back on its own connection, in order (see
    the module docstring for the messages and their answers).

    Args:
        model: the model to serve (a BatchingServer is made and closed here), or a
            running BatchingServer to serve with (its owner closes it).
        connection: a server end (``forked_pipe``'s, a ``PassThroughConnection``...), or
            several, served together.
        policy, batcher: how batches are made (when a model is given).
        portable: make every answer travel to another process: an exception becomes a
            ``remote.Failure`` (which always pickles), and outputs holding objects that
            do not survive pickling fail with ModelOutputError.

    Example:
        >>> # server_end, client_ends = forked_pipe(thread_queue, 4)
        >>> # stats = await serve_connection(model, server_end)   # until clients close
    """
    connections = [connection] if isinstance(connection, Connection) else list(connection)
    if isinstance(model, BatchingServer):
        await asyncio.gather(*(_serve(model, c, portable) for c in connections))
        return model.stats
    async with BatchingServer(model, policy, batcher) as evaluate:
        await asyncio.gather(*(_serve(evaluate, c, portable) for c in connections))
    return evaluate.stats


async def _serve(evaluate: BatchingServer, connection: Connection, portable: bool) -> None:
    replies = _OrderedReplies(connection, _portable if portable else _as_is)
    loop = asyncio.get_running_loop()
    while True:
        try:
            message = await connection.recv_async()
        except ClosedConnection:
            break
        try:
            if isinstance(message, VersionedRequest):
                fut = evaluate.call_with_version(message.x)
            elif isinstance(message, ModelUpdate):
                evaluate.update_model(message.model, message.version)
                fut = loop.create_future()
                fut.set_result(message.version)
            else:
                fut = evaluate(message)
        except Exception as e:  # a bad request (or update) fails alone
            fut = loop.create_future()
            fut.set_exception(e)
        replies.add(fut)
    await replies.finished()


def _as_is(answer: Any) -> Any:
    return answer


def _portable(answer: Any) -> Any:
    """``answer`` as something that loads in another process (see ``remote``)."""
    if isinstance(answer, BaseException):
        return pack_error(answer)
    outputs, version = answer if isinstance(answer, tuple) and len(answer) == 2 else (
        answer, None)
    if not plain_outputs(outputs, version):  # objects in them: check the trip
        ok, why = round_trips(answer)
        if not ok:
            return pack_error(ModelOutputError(
                f"the model's outputs ({type(outputs).__name__}) cannot be sent to the "
                f"client process: {type(why).__name__}: {why}"))
    return answer


class _OrderedReplies:
    """Sends answers in the order the requests came, so that FIFO clients match them:
    a request that fails at once (or has no elements) must not overtake earlier ones.
    Nothing raised while answering escapes into a callback."""

    def __init__(self, connection: Connection, prepare: Callable[[Any], Any]):
        self._connection = connection
        self._prepare = prepare
        self._waiting: Deque[asyncio.Future] = collections.deque()
        self._gone = False  # the other end cannot be reached: answers are dropped
        self._done: asyncio.Future | None = None

    def add(self, fut: asyncio.Future) -> None:
        self._waiting.append(fut)
        if fut.done():
            self._send_ready()
        else:
            fut.add_done_callback(self._send_ready)

    async def finished(self) -> None:
        """Returns once every answer has been sent (or dropped, its client gone)."""
        if self._waiting:
            self._done = asyncio.get_running_loop().create_future()
            await self._done

    def _send_ready(self, _=None) -> None:
        waiting, connection = self._waiting, self._connection
        while waiting and waiting[0].done():
            fut = waiting.popleft()
            if fut.cancelled():
                answer: Any = ServerClosedError(
                    "the server dropped this request (it is stopping)")
            else:
                error = fut.exception()
                answer = error if error is not None else fut.result()
            if self._gone:
                continue
            try:
                connection.send(self._prepare(answer))
            except Exception:  # the client is gone (its process died): nobody waits
                self._gone = True
        if not self._gone:
            try:  # the answers ready now leave together, without waiting for the
                connection.send_pending()  # end of the loop iteration
            except Exception:
                self._gone = True
        if not waiting and self._done is not None and not self._done.done():
            self._done.set_result(None)
