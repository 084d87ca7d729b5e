"""The evaluate function of searches far from their server: one message per loop iteration.

Requests made in one loop iteration are checked when made, then travel together as one
message (one array); the response is split back into each request's future. Traffic
scales with loop iterations, not with requests, and the server sees one request per
message.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from async_search.base import Outputs, TensorSpec
from async_search.errors import ServerDiedError
from async_search.servers.requests import RequestChecker
from async_search.transport import concat_requests, split_outputs

__all__ = ["CoalescingClient"]

#: send(message_id, batch): puts one message on its way to a server.
Send = Callable[[int, np.ndarray], None]


class CoalescingClient:
    """An evaluate function whose requests of one loop iteration leave as one message.

    Args:
        send: ``send(message_id, batch)``; the response must come back through
            ``deliver(message_id, outputs_or_exception)``.
        input_spec: the model's input spec, to check requests when made (None: learn
            it from the first request).

    Example:
        >>> # client = CoalescingClient(lambda mid, x: write_frame(w, ("eval", mid, x)))
        >>> # y = await client(x)            # inside a search
        >>> # client.deliver(mid, outputs)   # when the response frame arrives
    """

    def __init__(self, send: Send, input_spec: TensorSpec | None = None):
        self._send = send
        self._check = RequestChecker(input_spec)
        self._xs: List[np.ndarray] = []
        self._futures: List[asyncio.Future] = []
        self._scheduled = False
        self._ids = itertools.count()
        #: message id -> (futures, sizes, batch): what is waiting for a response.
        self.in_flight: Dict[int, Tuple[List[asyncio.Future], List[int], np.ndarray]] = {}
        self.messages = 0
        self.requests = 0
        self._error: BaseException | None = None

    def __call__(self, x: np.ndarray) -> "asyncio.Future[Outputs]":
        x = self._check(x)
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._xs.append(x)
        self._futures.append(fut)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)  # after every search ready in this iteration
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        xs, futures = self._xs, self._futures
        self._xs, self._futures = [], []
        keep = [i for i, fut in enumerate(futures) if not fut.cancelled()]
        if len(keep) < len(futures):  # cancelled callers' requests are dropped here
            xs, futures = [xs[i] for i in keep], [futures[i] for i in keep]
        if not futures:
            return
        if self._error is not None:
            for fut in futures:
                fut.set_exception(self._error)
            return
        message_id = next(self._ids)
        batch = concat_requests(xs)
        self.in_flight[message_id] = (futures, [len(x) for x in xs], batch)
        self.messages += 1
        self.requests += len(futures)
        try:
            self._send(message_id, batch)
        except Exception as e:  # the way to the server is gone
            self.deliver(message_id, ServerDiedError(f"could not send a request: {e!r}"))

    def deliver(self, message_id: int, outputs: Any) -> None:
        """Resolves the futures of message ``message_id`` with its outputs (or error)."""
        entry = self.in_flight.pop(message_id, None)
        if entry is None:  # answered already (by a server that was thought dead)
            return
        futures, sizes, _ = entry
        if isinstance(outputs, BaseException):
            for fut in futures:
                if not fut.done():
                    fut.set_exception(outputs)
            return
        for fut, y in zip(futures, split_outputs(outputs, sizes)):
            if not fut.done():
                fut.set_result(y)

    def fail_all(self, error: BaseException) -> None:
        """Fails every waiting request, and every later one, with ``error``."""
        self._error = error
        for message_id in list(self.in_flight):
            self.deliver(message_id, error)
