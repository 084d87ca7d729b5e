"""The serving coroutine: requests from coroutines in one loop, batched into a device thread.

A request flows: ``evaluate(x)`` checks ``x`` and queues it in a Batcher with its future;
the dispatch task, when a pipeline slot is free, lets ready searches take their turn and
then pops a batch; the device thread runs the model; the outputs come back to the loop
and are sliced into each request's future. One future per request, never per element.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, List

import numpy as np

from async_search.base import Outputs, input_spec_of, output_spec_of
from async_search.batchers import Batcher, BatchSizeBatcher, Popped, Unbatcher, unbatcher_for
from async_search.errors import ModelOutputError, ServerClosedError
from async_search.servers.device import DeviceThread, InlineDevice
from async_search.servers.policy import DispatchPolicy, Reason
from async_search.servers.requests import RequestChecker
from async_search.servers.stats import ServingStats

__all__ = ["BatchingServer"]

_cancelled = asyncio.Future.cancelled


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class BatchingServer:
    """Serves a model to the coroutines of one event loop, in batches.

    The server is itself the evaluate function: ``await server(x)`` with ``x[n, ...]``
    returns the model's outputs for those ``n`` elements. Use it as an async context
    manager (``serve`` does); it owns its dispatch task and its device thread, and both
    end when the context is left.

    Args:
        model: a callable from a batch to outputs (``base.Model``); with an
            ``input_spec``, requests are checked against it when made, else against
            the first request.
        policy: batch size, optional delay, pipeline depth.
        batcher: how to cut the stream into batches; default
            ``BatchSizeBatcher(policy.max_batch_size)`` (a ``CostBatcher`` bounds a batch
            by total cost instead).
        model_thread: run the model in a dedicated thread (default), so that searches
            go on while it computes; False runs it on the loop, which saves the thread
            handoff (tens of microseconds a batch) for models that take microseconds.
    """

    def __init__(self, model: Any, policy: DispatchPolicy = DispatchPolicy(),
                 batcher: Batcher | None = None, model_thread: bool = True):
        self.model = model
        self.model_thread = model_thread
        self.policy = policy
        self._check = RequestChecker(input_spec_of(model))
        self._shape, self._dtype = self._check.shape, self._check.dtype
        self._batcher = batcher if batcher is not None else BatchSizeBatcher(
            policy.max_batch_size)
        self._budget = self._batcher.budget
        out_spec = output_spec_of(model)
        self._empty_output = out_spec.empty(0) if out_spec is not None else None
        self._ops: Unbatcher | None = None
        self._staged_xs: List[np.ndarray] = []
        self._staged_futures: List[asyncio.Future] = []
        self._stats = ServingStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._device: DeviceThread | InlineDevice | None = None
        self._task: asyncio.Task | None = None
        self._wakeup: asyncio.Future | None = None  # the dispatch task sleeps on it
        self._full: asyncio.Future | None = None    # set when a batch fills (max_delay)
        self._slot: asyncio.Future | None = None    # set when a batch comes back
        self._in_flight = 0
        self._since = 0.0  # when the queue last became non-empty, or the last dispatch
        self._partial: dict = {}  # future of a split request -> [size, received, pieces]
        self._closing = False
        self._closed = False

    # -- the evaluate function --------------------------------------------------------
    def __call__(self, x: np.ndarray) -> "asyncio.Future[Outputs]":
        """Queue ``x[n, ...]``; the returned future resolves with the model's outputs.

        Raises:
            InputSpecError: (a ValueError) when ``x`` does not fit the model's input;
                nothing is queued.
            ServerClosedError: when the server is closing or closed.
        """
        if type(x) is not np.ndarray or x.shape[1:] != self._shape or (
                x.dtype is not self._dtype and x.dtype != self._dtype) or not x.ndim:
            x = self._checked(x)
        if self._closing:
            raise ServerClosedError("the server is closed: evaluate called after its "
                                    "context was left")
        fut = self._loop.create_future()
        if not len(x) and self._empty_output is not None:
            fut.set_result(self._empty_output)
            return fut
        # Staged here and handed to the batcher in bulk when the dispatch task runs.
        self._staged_xs.append(x)
        self._staged_futures.append(fut)
        wakeup = self._wakeup
        if wakeup is not None:  # the queue was empty and the dispatch task asleep
            self._wakeup = None
            self._since = time.perf_counter()
            wakeup.set_result(None)
        elif self._full is not None:
            self._unstage()
            if self._batcher.queued >= self._budget:
                _resolve(self._full)
        return fut

    def _unstage(self) -> None:
        """Hands the requests staged since the last call to the batcher."""
        if self._staged_xs:
            self._batcher.extend(self._staged_xs, self._staged_futures)
            self._staged_xs, self._staged_futures = [], []

    def _checked(self, x) -> np.ndarray:
        x = self._check(x)  # raises, or learns the spec from the first request
        self._shape, self._dtype = self._check.shape, self._check.dtype
        return x

    @property
    def stats(self) -> dict:
        """batches, elements, mean_batch_size, model_time_s, wall_time_s,
        fraction_in_model, batch_size_histogram, reasons, queue wait, failed_batches."""
        return self._stats.as_dict()

    # -- lifetime ---------------------------------------------------------------------
    async def __aenter__(self) -> "BatchingServer":
        if self._loop is not None:
            raise RuntimeError("a BatchingServer can be entered once")
        self._loop = asyncio.get_running_loop()
        device = DeviceThread if self.model_thread else InlineDevice
        self._device = device(self.model, self._loop).start()
        self._task = self._loop.create_task(self._dispatch_loop())
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self.aclose(drain=exc_type is None)

    async def aclose(self, drain: bool = True) -> None:
        """Stop taking requests; serve the queued ones (``drain``) or fail them.

        Returns when every request has its result or error, the dispatch task has ended
        and the device thread has stopped.
        """
        if self._closed:
            return
        self._closing = True
        if not drain:
            self._fail_queued(ServerClosedError(
                "the server closed before this request was batched"))
        if self._wakeup is not None:
            _resolve(self._wakeup)
        try:
            await asyncio.shield(self._task)
        finally:
            while self._in_flight:
                self._slot = self._loop.create_future()
                await self._slot
            self._device.stop()
            self._fail_queued(ServerClosedError("the server closed"))  # if the task died
            self._stats.close()
            self._closed = True

    # -- dispatch ---------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        batcher, loop, depth = self._batcher, self._loop, self.policy.pipeline_depth
        try:
            while True:
                self._unstage()
                if batcher.empty():
                    if self._closing:
                        return
                    self._wakeup = loop.create_future()
                    await self._wakeup
                    continue
                if self._in_flight >= depth:
                    self._slot = loop.create_future()
                    await self._slot
                    continue
                reason = await self._wait_for_company()
                self._unstage()
                if batcher.empty():
                    continue
                try:
                    popped = batcher.pop_parts(_cancelled)
                except IndexError:  # every queued request was cancelled
                    continue
                now = time.perf_counter()
                self._stats.record_dispatch(len(popped.batch), reason, now - self._since)
                self._since = now
                self._in_flight += 1
                self._device.submit(popped, popped.batch, self._on_done)
        except BaseException as e:
            self._fail_queued(e if isinstance(e, Exception) else ServerClosedError(
                "the dispatch task was cancelled"))
            raise

    async def _wait_for_company(self) -> Reason:
        """Lets ready searches queue their requests; returns why the batch may leave."""
        batcher, budget = self._batcher, self._budget
        self._unstage()
        if batcher.queued >= budget:
            return Reason.FULL
        if self._closing:
            return Reason.CLOSING
        while True:  # until a loop iteration passes with no new request
            seen = len(batcher)  # only this task takes requests out of the batcher
            await asyncio.sleep(0)
            self._unstage()
            if batcher.queued >= budget:
                return Reason.FULL
            if len(batcher) == seen:
                break
        delay = self.policy.max_delay
        if delay and not self._closing:
            remaining = self._since + delay - time.perf_counter()
            if remaining > 0:
                self._full = full = self._loop.create_future()
                timer = self._loop.call_later(remaining, _resolve, full)
                try:
                    await full
                finally:
                    timer.cancel()
                    self._full = None
                return Reason.FULL if batcher.queued >= budget else Reason.DELAY
        return Reason.IDLE

    # -- results ----------------------------------------------------------------------
    def _on_done(self, popped: Popped, outputs: Outputs, error: BaseException | None,
                 seconds: float) -> None:
        self._in_flight -= 1
        self._stats.record_model(seconds, error is not None)
        slot = self._slot
        if slot is not None:
            self._slot = None
            slot.set_result(None)
        if error is None:
            error = self._route(popped, outputs)
        if error is not None:
            for fut in popped.tags:
                self._partial.pop(fut, None)
                if not fut.done():
                    fut.set_exception(error)

    def _route(self, popped: Popped, outputs: Outputs) -> Exception | None:
        """Slices the batch outputs into the requests' futures; an error if it cannot."""
        ops = self._ops
        try:
            if ops is None:
                ops = self._ops = unbatcher_for(outputs)
            rows = ops.num_rows(outputs)
        except (ModelOutputError, TypeError) as e:
            return e if isinstance(e, ModelOutputError) else ModelOutputError(
                f"the model's outputs have no batch dimension: {e}")
        size = len(popped.batch)
        if rows != size:
            return ModelOutputError(
                f"the model returned {rows} rows for a batch of {size} elements: it must "
                f"return one output row per input element")
        if self._empty_output is None:
            self._empty_output = ops.slice(outputs, 0, 0)
        tags, pieces = popped.tags, popped.pieces
        whole = not popped.head_continues and popped.tail_size is None
        if whole and size == len(tags) and type(outputs) is np.ndarray and (
                min(map(len, pieces)) == 1):
            # Every request is one element: hand out row views made in C.
            rows = zip(tags, outputs[:, None])
            while True:
                try:
                    for fut, row in rows:
                        fut.set_result(row)
                    return None
                except asyncio.InvalidStateError:  # a caller cancelled after batching
                    continue
        last = len(tags) - 1
        start = 0
        for i, (fut, piece) in enumerate(zip(tags, pieces)):
            stop = start + len(piece)
            out = ops.slice(outputs, start, stop)
            start = stop
            if i == 0 and popped.head_continues:
                self._add_piece(fut, None, out)
            elif i == last and popped.tail_size is not None:
                self._add_piece(fut, popped.tail_size, out)
            elif not fut.done():
                fut.set_result(out)
        return None

    def _add_piece(self, fut: asyncio.Future, total: int | None, piece: Outputs) -> None:
        """One piece of a request split across batches; resolves it with the last."""
        state = self._partial.get(fut)
        if state is None:
            state = self._partial[fut] = [total, 0, []]
        state[1] += self._ops.num_rows(piece)
        state[2].append(piece)
        if state[1] == state[0]:
            del self._partial[fut]
            if not fut.done():
                fut.set_result(self._ops.concat(state[2]))

    def _fail_queued(self, error: BaseException) -> None:
        self._unstage()
        for fut in self._batcher.clear():
            self._partial.pop(fut, None)
            if not fut.done():
                fut.set_exception(error)
