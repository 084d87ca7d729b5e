"""The requests of one event-loop iteration, gathered to leave a client as one message.

Searches that are ready in the same iteration of the event loop each call the client;
the client queues each request and, at the first of the iteration, schedules one flush
with ``call_soon``, which runs after all of them and sends what was queued together.
The process client (``backends.client.CoalescingClient``) and the HTTP client
(``http.client.RemoteEvaluate``) both work this way; ``CoalescedRequests`` is what they
share. It lives below both, so that neither imports the other's side.

A request is queued inline in each client's ``__call__`` (a method here would cost a
call per request); what runs once per iteration or once per versioned request is here.
"""

from __future__ import annotations

import asyncio
from typing import Hashable, List, Tuple

import numpy as np

from async_search.base import Outputs
from async_search.delivery import ResultDelivery
from async_search.requests import RequestChecker

_done = asyncio.Future.done


class CoalescedRequests:
    """A client's requests queued in this loop iteration, and the versions of answers.

    A subclass sets ``_xs`` and ``_futures`` (empty lists), ``_scheduled`` (False) and
    ``_delivery`` (a ``ResultDelivery``) when made; its ``__call__(x, timeout)`` returns
    the future of ``x``'s outputs.
    """

    _xs: List[np.ndarray]  #: The requests queued in this iteration, in order.
    _futures: List[asyncio.Future]  #: Their futures, in the same order.
    _scheduled: bool  #: Whether this iteration's flush is scheduled.
    _delivery: ResultDelivery  #: Delivers the answers into the futures.
    _check: RequestChecker  #: Checks each request (and learns the spec, unless given).
    _shape: tuple | None  #: The spec's element shape and dtype, read inline by calls.
    _dtype: np.dtype | None

    async def with_version(self, x: np.ndarray, timeout: float | None = None,
                           ) -> Tuple[Outputs, Hashable]:
        """``(outputs, version)``: the outputs for ``x`` and the model version the server
        reported for the message that carried it (None when the server reports none, or
        when a swap split that message across batches); ``timeout`` as for a call."""
        fut = self(x, timeout)
        self._delivery.want_version(fut)
        try:
            outputs = await fut
        finally:
            version = self._delivery.pop_version(fut)
        return outputs, version

    def _take_queued(self) -> Tuple[List[np.ndarray], List[asyncio.Future]]:
        """The requests queued in this iteration and their futures, taken from the
        queue; those whose futures are done (cancelled or expired) are dropped here,
        before they leave."""
        xs, futures = self._xs, self._futures
        self._xs, self._futures = [], []
        if any(map(_done, futures)):
            keep = [i for i, fut in enumerate(futures) if not fut.done()]
            xs, futures = [xs[i] for i in keep], [futures[i] for i in keep]
        return xs, futures
