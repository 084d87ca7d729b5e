"""``serve``: batched serving of a model inside the running event loop."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Callable, Sequence

from async_search.checks import AsyncWithOnly
from async_search.batchers import Batcher
from async_search.servers.batch_size import AutoBatchSize
from async_search.servers.batching import BatchingServer
from async_search.servers.policy import DispatchPolicy
from async_search.servers.stats import TRACE_SIZE, BatchRecord


def serve(model: Any, max_batch_size: int | str | AutoBatchSize = 256,
          max_delay: float | None = None, pipeline_depth: int = 2, *,
          batcher: Batcher | None = None, model_thread: bool | str = "auto",
          num_workers: int = 1, on_batch: Callable[[BatchRecord], None] | None = None,
          devices: Sequence[Any] | None = None,
          trace_size: int | None = TRACE_SIZE,
          ) -> contextlib.AbstractAsyncContextManager[BatchingServer]:
    """Serve ``model`` in batches to every coroutine of the running loop.

    Yields ``evaluate``: ``await evaluate(x)`` with ``x[n, ...]`` returns the model's
    outputs for those ``n`` elements, batched with the requests of every other coroutine.
    ``evaluate.stats`` is a dict: batches, elements, mean_batch_size, model_time_s,
    wall_time_s, fraction_in_model, batch_size_histogram, reasons, queue wait.

    Batches are fair: a request larger than a batch is cut into pieces that take turns
    with the other requests (``FairBatcher``), so one large caller cannot hold back the
    rest; ``evaluate.at_priority(p)`` is an evaluate whose requests go first.

    Each call makes one server, entered once: a second ``async with`` on it raises
    RuntimeError (call ``serve`` again for another).

    On leaving the context, queued requests are served (or, when the body raised, fail
    with ServerClosedError), and the dispatch task and device threads end, each
    unloading its model. An exit that is cancelled (or ``evaluate.aclose(timeout=...)``
    that runs out) fails what is left at once and leaves each thread to end when its
    model returns.

    Args:
        model: ``ndarray [n, ...] -> outputs [n, ...]`` (an array, or a tuple or dict of
            arrays); its ``input_spec``, if declared, checks requests when made.
        max_batch_size: the most elements in one batch; ``"auto"`` (or an
            ``AutoBatchSize``): the size with the highest measured end-to-end rate,
            measured over powers of two from the largest down (``servers.batch_size``
            states the rule); ``evaluate.max_batch_size`` is the size chosen so far.
        max_delay: seconds a partial batch may wait for company; None sends it as soon
            as the model is free and no search has a request left to make.
        pipeline_depth: the most batches in flight at once per device worker.
        batcher: cuts the request stream into batches (overrides ``max_batch_size``),
            e.g. ``CostBatcher`` to bound the total cost of a batch.
        model_thread: where the model runs: ``"auto"`` (default) in a device thread,
            so searches go on while it computes, but on the loop while a batch takes
            under 200 us (the thread handoff would cost more); True: always in the
            thread; False: always on the loop. ``evaluate.stats`` says where batches ran.
        num_workers: device threads taking batches from one queue; more can be added
            and removed while serving (``evaluate.add_worker``, ``remove_worker``).
        on_batch: called with a ``BatchRecord(finished_s, size, model_s)`` as each
            batch comes back (a progress bar, say); ``evaluate.trace`` keeps the
            latest ``trace_size`` of them. What it raises is reported to the loop's
            exception handler and fails no request.
        devices: one device worker per device (each named: None is refused), taking
            batches from one queue, each with its own copy of the model,
            ``on_device(model, device)`` (the
            ``base.DeviceModel`` protocol, which the framework adapters meet; a plain
            function gets a TypeError). ``update_model`` reaches every copy: weights go
            to each copy's ``with_weights``, a new model is placed on each device.
        trace_size: how many of the latest batches ``evaluate.trace`` keeps (default
            10,000, about 1.3 MB: a server that runs for days stays bounded); None
            keeps every batch (a run that plots them all), 0 none.

    A request may carry a deadline, ``await evaluate(x, timeout=0.5)``: past it the
    caller gets RequestTimeoutError (a TimeoutError), and a request not batched by then
    is dropped before the model runs.

    ``evaluate`` also swaps models while serving: ``evaluate.update_model(model,
    version)``, ``await evaluate.with_version(x)`` and ``evaluate.version``.

    Example:
        >>> import asyncio, numpy as np
        >>> from async_search.models import MLP
        >>> async def main():
        ...     async with serve(MLP((4,)), max_batch_size=64) as evaluate:
        ...         ys = await asyncio.gather(*(evaluate(np.zeros((2, 4), np.float32))
        ...                                     for _ in range(10)))
        ...         return evaluate.stats["batches"], [y.shape for y in ys][0]
        >>> asyncio.run(main())
        (1, (2, 1))
    """
    return _EnteredOnce(_serving(model, max_batch_size, max_delay, pipeline_depth,
                                 batcher, model_thread, num_workers, on_batch, devices,
                                 trace_size))


@contextlib.asynccontextmanager
async def _serving(model: Any, max_batch_size: int | str | AutoBatchSize,
                   max_delay: float | None, pipeline_depth: int, batcher: Batcher | None,
                   model_thread: bool | str, num_workers: int,
                   on_batch: Callable[[BatchRecord], None] | None,
                   devices: Sequence[Any] | None,
                   trace_size: int | None) -> AsyncIterator[BatchingServer]:
    policy = DispatchPolicy(max_batch_size, max_delay, pipeline_depth)
    async with BatchingServer(model, policy, batcher, model_thread, num_workers,
                              on_batch, devices, trace_size) as evaluate:
        yield evaluate


class _EnteredOnce(AsyncWithOnly, contextlib.AbstractAsyncContextManager):
    """An async context manager that says so when entered a second time (contextlib's
    own raises a bare ``AttributeError: args`` then)."""

    _with_name = "asr.serve"

    def __init__(self, inner: contextlib.AbstractAsyncContextManager):
        self._inner = inner
        self._entered = False

    async def __aenter__(self) -> BatchingServer:
        if self._entered:
            raise RuntimeError("this serve(...) was entered before: each `async with` "
                               "needs a serve(...) of its own")
        self._entered = True
        server = await self._inner.__aenter__()
        # A notebook keeps ``evaluate = await asr.serve(m).__aenter__()`` across cells
        # and drops this object: its generator, collected, would close the server.
        server._entered_by = self
        return server

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._inner.__aexit__(*exc)
