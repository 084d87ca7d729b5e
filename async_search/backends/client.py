"""The evaluate function of searches far from their server: one message per loop iteration.

Requests made in one loop iteration are checked when made, then travel together as one
message (one array) over a connection; the answer is sliced back into each request's
future. Traffic scales with loop iterations, not with requests, and the server sees one
request per message. Used by every backend whose searches are in another process.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Callable, ClassVar, Hashable, List, Tuple

import numpy as np

from async_search.base import Outputs, TensorSpec
from async_search.connections import ConnectedFunction, Connection, FifoConnectedFunction
from async_search.errors import InputSpecError, ServerDiedError
from async_search.queues import ClosedConnection
from async_search.remote import Failure, unpack_error
from async_search.servers.connection_server import VersionedRequest
from async_search.servers.requests import RequestChecker
from async_search.servers.responses import ResultDelivery

__all__ = ["CoalescingClient", "Message"]

_cancelled = asyncio.Future.cancelled


@dataclasses.dataclass
class Message:
    """The requests of one loop iteration, sent as one array; the receiver of its answer.

    ``pieces[i]`` is request ``tags[i]``'s array (the futures are the tags); ``batch``
    is their concatenation. A message is never split, so its first request never
    continues an earlier one and its last never goes on in a later one. Its answer is
    ``(outputs, version)``, a ``remote.Failure`` or an exception; ``set_result`` and
    ``set_exception`` hand it straight to the requests' futures (a connected function
    resolves a message as it would a future: no future, no callback per message).
    """

    batch: np.ndarray
    tags: List[asyncio.Future]
    pieces: List[np.ndarray]
    on_answer: Callable[["Message", Any], None]
    head_continues: ClassVar[bool] = False
    tail_size: ClassVar[None] = None
    head_offset: ClassVar[int] = 0
    parts: ClassVar[None] = None  # every request whole (see batchers.Popped)

    def done(self) -> bool:
        return False  # a cancelled caller is skipped when its rows are delivered

    def set_result(self, answer: Any) -> None:
        self.on_answer(self, answer)

    def set_exception(self, error: BaseException) -> None:
        self.on_answer(self, error)


class CoalescingClient:
    """An evaluate function whose requests of one loop iteration leave as one message.

    Args:
        connection: a client end served by ``serve_connection`` (answers in order), or
            a connected function to send messages with (an ``UnorderedConnectedFunction``
            for several servers on one stream).
        input_spec: the model's input spec, to check requests when made (None: learn it
            from the first request).
        where: names the server in errors (``"the serving process"``).

    Example:
        >>> # client = CoalescingClient(client_end, spec)
        >>> # y = await client(x)                      # inside a search
        >>> # y, version = await client.with_version(x)
    """

    def __init__(self, connection: Connection | ConnectedFunction,
                 input_spec: TensorSpec | None = None, *, where: str = "the server"):
        self._messages = connection if isinstance(connection, ConnectedFunction) else (
            FifoConnectedFunction(connection))
        self._connection = self._messages.connection
        self._check = RequestChecker(input_spec)
        self._shape, self._dtype = self._check.shape, self._check.dtype
        self._delivery = ResultDelivery()
        self._where = where
        self._loop: asyncio.AbstractEventLoop | None = None
        self._xs: List[np.ndarray] = []
        self._futures: List[asyncio.Future] = []
        self._scheduled = False
        self._in_flight = 0

    @property
    def num_in_flight(self) -> int:
        """Messages sent and not answered yet."""
        return self._in_flight

    def __call__(self, x: np.ndarray) -> "asyncio.Future[Outputs]":
        if type(x) is not np.ndarray or x.shape[1:] != self._shape or (
                x.dtype is not self._dtype and x.dtype != self._dtype) or not x.ndim:
            x = self._check(x)  # raises, or learns the spec from the first request
            self._shape, self._dtype = self._check.shape, self._check.dtype
        if self._messages.error is not None:
            raise self._messages.error
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._xs.append(x)
        self._futures.append(fut)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)  # after every search ready in this iteration
        return fut

    async def with_version(self, x: np.ndarray) -> Tuple[Outputs, Hashable]:
        """``(outputs, version)``: the outputs for ``x`` and the model version the server
        reported for the message that carried it (None when a swap split that message
        across batches, or when the server reports no version)."""
        fut = self(x)
        self._delivery.want_version(fut)
        try:
            outputs = await fut
        finally:
            version = self._delivery.pop_version(fut)
        return outputs, version

    def _flush(self) -> None:
        self._scheduled = False
        xs, futures = self._xs, self._futures
        self._xs, self._futures = [], []
        if any(map(_cancelled, futures)):  # cancelled callers' requests are dropped here
            keep = [i for i, fut in enumerate(futures) if not fut.cancelled()]
            xs, futures = [xs[i] for i in keep], [futures[i] for i in keep]
        if not futures:
            return
        message = Message(xs[0] if len(xs) == 1 else np.concatenate(xs), futures, xs,
                          self._answered)
        try:
            self._messages.submit(VersionedRequest(message.batch), message)
            self._connection.send_pending()  # this iteration's one message: no wait
        except ServerDiedError as e:
            self._delivery.fail(message, e)
            return
        except ClosedConnection as e:  # the way to the server is gone
            self._delivery.fail(message, ServerDiedError(
                f"could not send a request to {self._where}: {e}"))
            return
        except Exception as e:  # the requests cannot travel (object arrays, say)
            self._delivery.fail(message, InputSpecError(
                f"these requests cannot be sent to {self._where}: "
                f"{type(e).__name__}: {e}"))
            return
        self._in_flight += 1

    def _answered(self, message: Message, answer: Any) -> None:
        self._in_flight -= 1
        if isinstance(answer, BaseException):
            error: BaseException | None = answer
        elif isinstance(answer, Failure):  # the model raised, or the request was bad
            error = unpack_error(answer, f"raised in {self._where}")
        else:
            outputs, version = answer
            error = self._delivery.deliver(message, outputs, version)
        if error is not None:
            self._delivery.fail(message, error)
