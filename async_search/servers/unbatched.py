"""The synchronous baseline: every request is its own batch, run on the spot."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Hashable, List, Tuple

import numpy as np

from async_search.base import (Outputs, first_version, input_spec_of, output_spec_of,
                               values_check_of)
from async_search.checks import check_callable
from async_search.deadlines import check_timeout
from async_search.delivery import ResultDelivery
from async_search.errors import RequestTimeoutError, deliverable
from async_search.requests import RequestChecker
from async_search.servers.policy import Reason
from async_search.servers.stats import TRACE_SIZE, BatchRecord, ServingStats, report_batch

#: How often (seconds) a call lets the loop run first: a search over ``immediate``
#: never waits otherwise, so a cancellation (Ctrl-C, SIGTERM, a deadline around it)
#: would land only once the whole search is done.
YIELD_EVERY_S = 0.05


class Immediate:
    """Calls the model directly with each request as its batch, on the event loop.

    It has the call shape of ``serve``'s evaluate and checks requests and outputs the
    same way (outputs without one row per element, or whose structure differs from the
    declared ``output_spec`` or the first call's, raise ``ModelOutputError``; a dtype of
    the same kind is cast), so a search runs unchanged against it; it is what batched
    serving is measured against.
    It measures itself as a BatchingServer does: the same ``stats`` keys, a ``trace``
    of BatchRecord and an ``on_batch`` callback, so that runs read either the same way.

    Args:
        model: ``ndarray [n, ...] -> outputs [n, ...]``; its ``input_spec``, if
            declared, checks requests.
        on_batch: called with a ``BatchRecord(finished_s, size, model_s)`` after each
            model call (a progress bar, say); ``trace`` keeps the latest of them.
        trace_size: how many of the latest model calls ``trace`` keeps (default
            ``stats.TRACE_SIZE``); None keeps every one, 0 none.
    """

    def __init__(self, model: Any, *,
                 on_batch: Callable[[BatchRecord], None] | None = None,
                 trace_size: int | None = TRACE_SIZE):
        check_callable("the model", model)
        check_callable("on_batch", on_batch, optional=True)
        self.model = model
        self._on_batch = on_batch
        # The model's check_values too, as a server's: the JAX adapter refuses values
        # it would compute wrongly (int64 past int32 without x64, say)
        self._check = RequestChecker(input_spec_of(model), values=values_check_of(model),
                                     relearns=True)
        self._stats = ServingStats(trace_size)
        # As a server's: every call's outputs keep the declared spec's structure or,
        # without one, the first call's; a zero-row call gets the empty output.
        spec = output_spec_of(model)
        self._outputs = ResultDelivery(spec.empty(0) if spec is not None else None)
        self._yielded = time.perf_counter()
        #: The loop whose timers this instance waits for, while every call yields (None
        #: when none): see ``_let_the_loop_run``.
        self._yielding: asyncio.AbstractEventLoop | None = None

    async def __call__(self, x: np.ndarray, timeout: float | None = None) -> Outputs:
        """``model(x)``, now. ``timeout``: as a server's, the request's deadline; the
        model runs at once, on the caller's loop, so the deadline cannot drop it, but
        outputs that come past it are discarded: RequestTimeoutError, as from a
        server."""
        x = self._check(x)
        if timeout is not None:
            timeout = check_timeout(timeout)
        if not self._check.settled:  # a learnt spec, not answered yet
            return await self._first_call(x, timeout)
        if self._yielding is not None or (
                time.perf_counter() - self._yielded >= YIELD_EVERY_S):
            await self._let_the_loop_run()
        return self._answer(x, timeout)

    async def _first_call(self, x: np.ndarray, timeout: float | None) -> Outputs:
        """A call under a spec learnt from a first request and not answered yet: its
        answer settles the spec; while none is under way, a request that does not fit
        teaches it again (as a server's), so a first request the model refuses fails
        alone."""
        under_way = asyncio.get_running_loop().create_future()  # (what the checker
        self._check.note(under_way)                              # asks of each call)
        try:
            await self._let_the_loop_run()
            y = self._answer(x, timeout)
        finally:
            under_way.cancel()
        if len(x):  # (an empty one may not reach the model)
            self._check.settle_by(x)
        return y

    def _answer(self, x: np.ndarray, timeout: float | None) -> Outputs:
        if not len(x) and self._outputs.empty_output is not None:
            # As a server answers it: a request but no batch, and no model call.
            self._stats.requests += 1
            return self._outputs.empty_result()
        # One request, one batch, sent at once: no queue wait, and it leaves as soon as
        # it is made (a BatchingServer's IDLE reason: nothing else was waiting).
        self._stats.record_dispatch(len(x), Reason.IDLE, 0.0, requests=1)
        start = time.perf_counter()
        try:
            y = self._outputs.conformed(self.model(x), len(x))
        except (KeyboardInterrupt, SystemExit):  # the caller's own interrupt or exit
            self._record(len(x), time.perf_counter() - start, failed=True)
            raise
        except BaseException as e:
            self._record(len(x), time.perf_counter() - start, failed=True)
            # As a server delivers it: the model's CancelledError must not read as the
            # search's own cancellation, nor its StopIteration end a coroutine.
            error = deliverable(e)
            if error is e:
                raise
            raise error from e
        seconds = time.perf_counter() - start
        self._record(len(x), seconds, failed=False)
        if timeout is not None and seconds > timeout:
            self._stats.timed_out += 1
            raise RequestTimeoutError(f"the model took {seconds:.3g} s, past the "
                                      f"request's timeout of {timeout:g} s")
        return y

    async def _let_the_loop_run(self) -> None:
        """Yields to the loop (where a pending cancellation lands), and has every call
        yield until the loop has run its timers: each search ready in this pass of the
        loop would otherwise run another 50 ms first, and a deadline around N searches
        would land N x 50 ms late."""
        loop = asyncio.get_running_loop()
        if self._yielding is not loop:  # (a loop that ended never ran the timer)
            self._yielding = loop
            loop.call_at(loop.time(), self._loop_ran, loop)  # due now: after this pass
        await asyncio.sleep(0)

    def _loop_ran(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._yielding is loop:
            self._yielding = None
            self._yielded = time.perf_counter()

    async def with_version(self, x: np.ndarray, timeout: float | None = None,
                           ) -> Tuple[Outputs, Hashable]:
        """``(outputs, version)``, as a BatchingServer's."""
        return await self(x, timeout), self.version

    def _record(self, size: int, seconds: float, failed: bool) -> None:
        record = self._stats.record_model(size, seconds, failed)
        if self._on_batch is not None:
            report_batch(self._on_batch, record)

    @property
    def version(self) -> Hashable:
        """The model's version: its own ``version``, or 0 (as a server reports it)."""
        return first_version(self.model)

    @property
    def stats(self) -> dict:
        """The keys of ``BatchingServer.stats``: batches, elements, mean_batch_size,
        model_time_s, wall_time_s, fraction_in_model, batch_size_histogram, reasons,
        queue wait (always 0), failed_batches, workers (1), version, buffers_allocated
        and buffers_reused (0: the request is the batch), model_placement (``loop``:
        the model runs in the caller's loop), batches_on_loop and batches_in_thread."""
        stats = self._stats.as_dict()
        stats["workers"] = 1
        stats["version"] = self.version
        stats["buffers_allocated"] = 0
        stats["buffers_reused"] = 0
        stats["model_placement"] = "loop"
        stats["batches_on_loop"] = stats["batches"]
        stats["batches_in_thread"] = 0
        return stats

    @property
    def trace(self) -> List[BatchRecord]:
        """A BatchRecord (finished_s, size, model_s) for each of the latest
        ``trace_size`` model calls, in order."""
        return list(self._stats.trace)


def immediate(model: Any, *,
              on_batch: Callable[[BatchRecord], None] | None = None,
              trace_size: int | None = TRACE_SIZE) -> Immediate:
    """An evaluate function with no batching: ``await ev(x)`` is ``model(x)``.

    Args:
        model: ``ndarray [n, ...] -> outputs [n, ...]``.
        on_batch: called with a ``BatchRecord`` after each model call, as ``serve``'s.
        trace_size: how many of the latest model calls ``trace`` keeps (default
            10,000); None keeps every one (a run that plots them all), 0 none.

    Example:
        >>> from async_search.models import MLP
        >>> ev = immediate(MLP((4,), output_size=1))
        >>> import asyncio
        >>> async def main():
        ...     return await ev(np.zeros((2, 4), np.float32))
        >>> asyncio.run(main()).shape
        (2, 1)
        >>> ev.stats["batches"], len(ev.trace)
        (1, 1)
    """
    return Immediate(model, on_batch=on_batch, trace_size=trace_size)
