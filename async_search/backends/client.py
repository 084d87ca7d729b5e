"""The evaluate function of searches far from their server: one message per loop iteration.

Requests made in one loop iteration are checked when made, then travel together as one
message (one array); the response is split back into each request's future. Traffic
scales with loop iterations, not with requests, and the server sees one request per
message.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable, Dict, Hashable, List, Tuple

import numpy as np

from async_search.base import Outputs, TensorSpec
from async_search.batchers import Popped
from async_search.errors import ServerDiedError
from async_search.servers.requests import RequestChecker
from async_search.servers.responses import ResultDelivery
from async_search.transport import concat_requests

__all__ = ["CoalescingClient"]

_cancelled = asyncio.Future.cancelled

#: send(message_id, batch): puts one message on its way to a server.
Send = Callable[[int, np.ndarray], None]


class CoalescingClient:
    """An evaluate function whose requests of one loop iteration leave as one message.

    Args:
        send: ``send(message_id, batch)``; the response must come back through
            ``deliver(message_id, outputs_or_exception, version)``.
        input_spec: the model's input spec, to check requests when made (None: learn
            it from the first request).

    Example:
        >>> # client = CoalescingClient(lambda mid, x: write_frame(w, ("eval", mid, x)))
        >>> # y = await client(x)            # inside a search
        >>> # y, version = await client.with_version(x)
        >>> # client.deliver(mid, outputs)   # when the response frame arrives
    """

    def __init__(self, send: Send, input_spec: TensorSpec | None = None):
        self._send = send
        self._check = RequestChecker(input_spec)
        self._shape, self._dtype = self._check.shape, self._check.dtype
        self._responses = ResultDelivery()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._xs: List[np.ndarray] = []
        self._futures: List[asyncio.Future] = []
        self._scheduled = False
        self._ids = itertools.count()
        #: message id -> the message (its requests' futures and arrays), until answered.
        self.in_flight: Dict[int, Popped] = {}
        self._error: BaseException | None = None

    def __call__(self, x: np.ndarray) -> "asyncio.Future[Outputs]":
        if type(x) is not np.ndarray or x.shape[1:] != self._shape or (
                x.dtype is not self._dtype and x.dtype != self._dtype) or not x.ndim:
            x = self._check(x)  # raises, or learns the spec from the first request
            self._shape, self._dtype = self._check.shape, self._check.dtype
        if self._error is not None:
            raise self._error
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
        reported for the message that carried it (None when that message's rows came
        from two versions, a swap having split it across batches, or when the server
        reports no version)."""
        fut = self(x)
        self._responses.want_version(fut)
        try:
            outputs = await fut
        finally:
            version = self._responses.pop_version(fut)
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
        if self._error is not None:
            for fut in futures:
                fut.set_exception(self._error)
            return
        message_id = next(self._ids)
        batch = concat_requests(xs)
        self.in_flight[message_id] = Popped(batch, futures, xs, False, None)
        try:
            self._send(message_id, batch)
        except Exception as e:  # the way to the server is gone
            self.deliver(message_id, ServerDiedError(f"could not send a request: {e!r}"))

    def deliver(self, message_id: int, outputs: Any, version: Hashable = None) -> None:
        """Resolves the futures of message ``message_id`` with its outputs (or error);
        ``version``: the model version that computed them, for ``with_version``."""
        message = self.in_flight.pop(message_id, None)
        if message is None:  # answered already (by a server that was thought dead)
            return
        error = outputs if isinstance(outputs, BaseException) else (
            self._responses.deliver(message, outputs, version))
        if error is not None:
            self._responses.fail(message, error)

    def fail_in_flight(self, error: BaseException) -> None:
        """Fails every request waiting for an answer with ``error`` (when an answer
        arrived that cannot be read, so that its message is unknown); later requests
        are sent as usual."""
        for message_id in list(self.in_flight):
            self.deliver(message_id, error)

    def fail_all(self, error: BaseException) -> None:
        """Fails every waiting request, and every later one, with ``error``."""
        self._error = error
        for message_id in list(self.in_flight):
            self.deliver(message_id, error)
