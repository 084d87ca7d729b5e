"""The serving coroutine: requests from coroutines in one loop, batched into device threads.

A request flows: ``evaluate(x)`` checks ``x`` and stages it with its future; the dispatch
task, when a pipeline slot is free, lets ready searches take their turn, hands what is
staged to the Batcher and pops a batch; a device thread runs the model; the outputs come
back to the loop and a ResultDelivery slices them into the requests' futures. One future
per request, never per element.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import Any, Callable, Dict, Hashable, List, Sequence, Tuple

import numpy as np

from async_search.base import (Outputs, TensorSpec, first_version, input_spec_of,
                               on_device, output_spec_of, replaces_model, values_check_of)
from async_search.batchers import Batcher, FairBatcher, Popped
from async_search.checks import (AsyncWithOnly, check_callable, check_float,
                                 check_instance, check_int, is_async)
from async_search.deadlines import (Deadline, check_timeout, expire_due,
                                    track_deadline)
from async_search.delivery import ResultDelivery
from async_search.errors import (CloseTimeoutError, InputSpecError, ModelOutputError,
                                 ServerClosedError, ServerCrashedError, add_note,
                                 describe)
from async_search.requests import RequestChecker
from async_search.servers.batch_size import AutoBatchSize, BatchSizeTuner
from async_search.servers.buffers import BufferPool
from async_search.servers.policy import DispatchPolicy, Reason
from async_search.servers.priority import PriorityEvaluate
from async_search.servers.refused_rows import refused_rows, serve_the_rest
from async_search.servers.stats import TRACE_SIZE, BatchRecord, ServingStats, report_batch
from async_search.servers.workers import HOOKS_ON_LOOP, Workers, has_hooks, placement_of
from async_search.wire import RowsFailed


_done = asyncio.Future.done  # a request done before its batch: cancelled or failed
_DROPPED = "; a request not batched by then is dropped before the model runs"
_ndarray = np.ndarray
#: While a batch is in a device thread, a request lets go of the GIL for a moment at
#: most this often. The thread must take the GIL back to hand its batch over (and to
#: start the next), and CPython hands it over late to a thread waiting on a loop that
#: runs many short search steps: 15-65 ms a batch under 1024 MCTS searches here,
#: whatever the switch interval (benchmarks/fake_device.py), while the device idles.
#: ``time.sleep(0)`` is no wait: it returns at once, having let go of the GIL, which
#: the waiting thread then takes (CPython offers no event for that hand-over).
_LET_THREADS_IN_S = 0.001
_perf_counter = time.perf_counter
_sleep = time.sleep
_running_loop = asyncio._get_running_loop  # None outside a loop; the C one, fast


def _future_maker(loop: asyncio.AbstractEventLoop) -> Callable[[], asyncio.Future]:
    """``loop.create_future``, or the same future made without its Python frame when
    the loop is asyncio's own (whose ``create_future`` is ``Future(loop=self)``)."""
    if type(loop).create_future is asyncio.BaseEventLoop.create_future:
        return functools.partial(asyncio.Future, loop=loop)
    return loop.create_future


class _OutOfTime(Exception):
    """aclose's deadline came before what it waited for."""


class _LostLoop(RuntimeError):
    """Why a server whose event loop was closed under it takes nothing more."""


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def _retrieved(task: "asyncio.Task") -> None:
    if not task.cancelled():
        task.exception()


def _cancel_with(fut: asyncio.Future, paired: asyncio.Future) -> None:
    if paired.cancelled():
        fut.cancel()


class BatchingServer(AsyncWithOnly):
    """Serves a model to the coroutines of one event loop, in batches.

    The server is itself the evaluate function: ``await server(x)`` with ``x[n, ...]``
    returns the model's outputs for those ``n`` elements. Use it as an async context
    manager (``serve`` does); it owns its dispatch task and its device threads, and they
    end when the context is left.

    Args:
        model: a callable from a batch to outputs (``base.Model``); with an
            ``input_spec``, requests are checked against it when made, else against
            the first request (until a batch of it is answered, a request that does
            not fit it, made when every request of it is done, teaches it again: a
            first request the model refuses fails alone). Its ``version`` attribute,
            if any, is the first version.
        policy: batch size (or ``"auto"``: the size with the best measured end-to-end
            rate, ``servers.batch_size``), optional delay, pipeline depth (batches in
            flight per worker).
        batcher: how to cut the stream into batches; default
            ``FairBatcher(policy.max_batch_size)``: a request larger than a batch takes
            turns with the others, and ``at_priority`` queues go first (a
            ``BatchSizeBatcher`` is first in, first out; a ``CostBatcher`` bounds a
            batch by total cost).
        model_thread: where the model runs. ``"auto"`` (default): in a device thread,
            so that searches go on while it computes, but on the loop while its
            measured time per batch is below ``workers.INLINE_BELOW_S`` (200 us), where
            the thread handoff (tens of microseconds a batch) would cost more than the
            overlap gains; ``stats`` shows where batches ran. True: always in device
            threads; False: always on the loop.
        num_workers: device threads taking batches from one queue (each batch goes to
            the first free one).
        on_batch: called on the loop with a ``BatchRecord`` as each batch comes back
            and its results are delivered (progress bars, live metrics); what it raises
            goes to the loop's exception handler and fails no request.
        devices: one device thread per device (each named: None is refused), each
            with its own copy of the model,
            ``base.on_device(model, device)``, made when the server is entered (a model
            without ``on_device`` gets a TypeError then); ``update_model`` places a new
            model on every device, or passes weights to every copy.
        trace_size: how many of the latest batches ``trace`` keeps (default
            ``stats.TRACE_SIZE``, 10,000: a server that runs for days holds a bounded
            trace); None keeps every batch (a run that plots them all), 0 none.

    Faults (what a caller gets):
        - A request that does not fit the model's input raises InputSpecError when made.
        - A request whose cost the batcher cannot work out (a ``CostBatcher`` whose
          ``cost_fn`` raises, or gives a wrong number of costs) raises that error when
          made, noted as the batcher's; nothing is queued and the server serves on.
        - A request given a ``timeout`` fails with RequestTimeoutError (a TimeoutError)
          once it passes; if it has not reached a batch by then, it is dropped before
          the model runs, as a cancelled one is.
        - A model that raises fails the requests of that batch with its exception, and
          the next batch is served. What a future cannot carry as it is
          (StopIteration, a CancelledError raised by the model, SystemExit) fails the
          batch as ModelRaisedError, the original as its ``__cause__``; but with
          ``model_thread=False`` on the main thread a SystemExit, like a
          KeyboardInterrupt, is taken for the program's stop (a signal handler's
          ``sys.exit`` lands in whatever runs on the main thread): it crashes the
          server, as below, and goes on up (on a loop in another thread, where no
          signal handler runs, both fail their batch).
        - Every batch's outputs must keep the structure of the declared
          ``output_spec`` or, without one, of the first batch: the same kind (array,
          tuple of as many outputs, dict of the same keys), trailing shapes and row
          count. A dtype of the same kind is cast to the expected one (float64 outputs
          of a float32 model arrive as float32); a different kind (float for int) or any
          other change fails that batch alone with ModelOutputError, naming what was
          expected and what came. Nothing is delivered to the wrong caller, and
          ``update_model`` must keep that structure too.
        - When one batch of a request split across batches fails, the whole request
          fails and the pieces from its other batches are dropped.
        - Whatever kills the serving coroutine (a batcher that raises, a bug, a
          KeyboardInterrupt while the model runs on a main-thread loop, a SystemExit
          there with ``model_thread=False``, the dispatch task being cancelled) fails
          every queued and in-flight request with ServerCrashedError (a ServerClosedError;
          the cause is its ``__cause__``) and closes the server:
          later calls raise it at once, and leaving the context raises it when the body
          did not raise.
        - A request cancelled (or failed) while pieces of it are still queued: the rest
          is dropped before it reaches a batch.
        - An exit interrupted at any await (cancelled, once or twice) or out of
          ``aclose(timeout=...)``: every request still queued or in the model fails
          with ServerClosedError at once, and each device thread ends, unloading its
          model, when its batch returns (see ``aclose``).
    """

    def __init__(self, model: Any, policy: DispatchPolicy = DispatchPolicy(),
                 batcher: Batcher | None = None, model_thread: bool | str = "auto",
                 num_workers: int = 1,
                 on_batch: Callable[[BatchRecord], None] | None = None,
                 devices: Sequence[Any] | None = None,
                 trace_size: int | None = TRACE_SIZE):
        num_workers = check_int("num_workers", num_workers, minimum=1)  # (a Python int)
        check_callable("the model", model)
        check_callable("on_batch", on_batch, optional=True)
        if on_batch is not None and is_async(on_batch):
            raise TypeError("on_batch is called on the loop as each batch comes back, and "
                            "nothing awaits it: pass a plain function (one that needs to "
                            "await can start a task: asyncio.get_running_loop()"
                            ".create_task(...))")
        if batcher is not None:
            check_instance("batcher", batcher, Batcher, "FairBatcher(256)")
        self._placement = placement_of(model_thread)
        if num_workers > 1 and self._placement == "loop":
            raise ValueError("num_workers > 1 needs model_thread=True or 'auto'")
        if devices is not None:
            if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
                # "cuda:0" is not a list of devices: its characters would be.
                raise TypeError(f"devices is a sequence of devices (devices="
                                f"[{devices!r}] for one), got {devices!r}")
            devices = list(devices)
            if not devices:
                raise ValueError("devices must name at least one device, got none")
            if any(device is None for device in devices):
                # None is a worker that runs the model as given: every such worker
                # would share one model after update_model, on no device of its own.
                raise ValueError(f"devices must name each device (None is none), got "
                                 f"{devices!r}")
            if num_workers != 1:
                raise ValueError(f"devices gives one worker per device: leave num_workers "
                                 f"out (got num_workers={num_workers} and {len(devices)} "
                                 f"devices)")
            if self._placement == "loop":
                raise ValueError("devices need device threads: model_thread=True or 'auto'")
            num_workers = len(devices)
        self._devices = devices
        if self._placement == "loop" and has_hooks(model):  # never loaded on the loop
            raise ValueError(HOOKS_ON_LOOP)
        auto = policy.max_batch_size
        self._tuner = None
        if isinstance(auto, AutoBatchSize):
            if batcher is not None:
                raise ValueError(f"max_batch_size='auto' sizes the server's own batcher: "
                                 f"pass no batcher (got {type(batcher).__name__})")
            self._tuner = BatchSizeTuner(auto)
        size = self._tuner.size if self._tuner is not None else policy.max_batch_size
        self.policy = policy
        self.model_thread = model_thread
        self._on_batch = on_batch
        self._first_model = model
        self._swap_token = object()  # renewed at every update_model
        self._num_workers = num_workers
        self._closed_devices: List[Any] | None = None  # the threads' devices at close
        self._check = RequestChecker(input_spec_of(model), values=values_check_of(model),
                                     relearns=True)
        self._shape, self._dtype = self._check.shape, self._check.dtype
        #: The model's check_values: then every request takes the checked path.
        self._values = self._check.values
        self._batcher = batcher if batcher is not None else FairBatcher(size)
        self._budget = self._batcher.budget
        # A batcher whose costs may fail (a CostBatcher's cost_fn) prices each request
        # when it is made: a cost that cannot be computed is that request's failure.
        self._priced = self._batcher.priced
        out_spec = output_spec_of(model)
        self._responses = ResultDelivery(out_spec.empty(0) if out_spec is not None else None)
        self._pool = BufferPool(size)
        self._staged_xs: List[np.ndarray] = []
        self._staged_futures: List[asyncio.Future] = []
        self._staged_prices: List[Any] = []  # with a priced batcher: each one's price
        self._staged_urgent: List[Tuple[int, np.ndarray, asyncio.Future]] = []  # priority
        self._stats = ServingStats(trace_size)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None  # the thread of the loop it serves
        self._workers: Workers | None = None
        self._task: asyncio.Task | None = None
        self._wakeup: asyncio.Future | None = None  # the dispatch task sleeps on it
        self._full: asyncio.Future | None = None    # set when a batch fills (max_delay)
        self._slot: asyncio.Future | None = None    # set when a batch comes back
        self._in_flight = 0
        self._let_in_at = 0.0  # when a request last let a device thread take the GIL
        # Requests given a timeout, until they are done: their results are handed out
        # only within it (the timer may not have run when a late result comes).
        self._deadlines: Dict[asyncio.Future, Deadline] = {}
        self._flying: Dict[int, Any] = {}  # id -> Popped: batches the model has not
        #                                    given back (failed at once by a crash)
        self._since = 0.0  # when the queue last became non-empty, or the last dispatch
        self._closing = False
        self._closed = False
        # For the fast path of __call__: the full shape of the last request accepted
        # (rows included), and whether a request needs nothing but staging.
        self._last_shape: tuple | None = None
        self._quiet = False
        self._new_future: Callable[[], asyncio.Future] | None = None
        self._crashed: BaseException | None = None  # what killed the serving coroutine
        self._closer: asyncio.Future | None = None  # set once aclose has finished
        self._abandoned = False  # an interrupted close cancelled the dispatch task
        # What entered it for asr.serve, kept as long as the server is: collecting it
        # would close the server under a caller who still holds ``evaluate``.
        self._entered_by: object = None

    # -- the evaluate function --------------------------------------------------------
    def __call__(self, x: np.ndarray, timeout: float | None = None,
                 ) -> "asyncio.Future[Outputs]":
        """Queue ``x[n, ...]``; the returned future resolves with the model's outputs.

        ``timeout`` (seconds > 0): the request's deadline. Past it the future fails with
        RequestTimeoutError, and a request that has not reached a batch by then is
        dropped before the model runs (as a cancelled one is); one whose batch is in
        the model has its rows discarded when they come.

        Example:
            >>> import async_search as asr
            >>> from async_search.errors import RequestTimeoutError
            >>> def slow_model(x):
            ...     time.sleep(0.2)
            ...     return x
            >>> async def main():
            ...     async with asr.serve(slow_model) as evaluate:
            ...         try:
            ...             await evaluate(np.zeros((1, 4)), timeout=0.05)
            ...         except RequestTimeoutError:
            ...             return "timed out"
            >>> asyncio.run(main())
            'timed out'

        Raises:
            InputSpecError: (a ValueError) when ``x`` does not fit the model's input;
                nothing is queued.
            ValueError: for a ``timeout`` that is not a number > 0.
            ServerClosedError: when the server is closing or closed.
            RuntimeError: when the server was never entered.
        """
        # The common case: an array of the last accepted full shape (so the check is
        # one tuple comparison) while the dispatch task is awake and nothing else is
        # due (``_quiet``), with no deadline.
        if type(x) is _ndarray and x.shape == self._last_shape and (
                x.dtype is self._dtype) and self._quiet and timeout is None and (
                _running_loop() is self._loop):
            fut = self._new_future()
            self._staged_xs.append(x)
            self._staged_futures.append(fut)
            if self._in_flight:
                self._let_threads_in()
            return fut
        return self._call(x, 0, timeout)

    def _let_threads_in(self) -> None:
        """Lets go of the GIL for a moment (a waiting device thread takes it), at most
        every ``_LET_THREADS_IN_S``."""
        now = _perf_counter()
        if now - self._let_in_at >= _LET_THREADS_IN_S:
            self._let_in_at = now
            _sleep(0)

    def _call(self, x: np.ndarray, priority: int = 0, timeout: float | None = None,
              ) -> "asyncio.Future[Outputs]":
        if type(x) is not np.ndarray or x.shape[1:] != self._shape or (
                x.dtype is not self._dtype and x.dtype != self._dtype) or not x.ndim \
                or self._values is not None:
            x = self._checked(x)
        if timeout is not None:
            timeout = check_timeout(timeout)
        self._notice_a_closed_loop()
        if self._closing:
            raise self._closed_error()
        if self._new_future is None:
            raise RuntimeError("the server is not serving yet: call it inside its "
                               "context (async with)")
        running = _running_loop()
        if running is not self._loop and (
                running is not None or threading.get_ident() != self._thread
                or self._loop.is_running()):  # (then in another thread)
            self._refuse_other_threads("evaluate", running)
        fut = self._new_future()
        if not len(x):
            if self._responses.empty_output is not None:
                self._stats.requests += 1
                fut.set_result(self._responses.empty_result())
                return fut
        elif self._values is None and self._check.settled:
            # (else the fast path would skip check_values, or a provisional spec's
            # bookkeeping)
            self._last_shape = x.shape
        # Staged here and handed to the batcher in bulk when the dispatch task runs.
        if priority:
            self._staged_urgent.append((priority, x, fut))
        else:
            if self._priced:
                self._staged_prices.append(self._price(x))  # may raise: nothing staged
            self._staged_xs.append(x)
            self._staged_futures.append(fut)
        if not self._check.settled:  # (once staged: a request refused is none of them)
            self._check.note(fut)
        if timeout is not None:
            track_deadline(self._deadlines, fut, timeout, self._stats.count_timeout,
                           note=_DROPPED)
        wakeup = self._wakeup
        if wakeup is not None:  # the queue was empty and the dispatch task asleep
            self._wakeup = None
            self._since = time.perf_counter()
            self._update_quiet()
            wakeup.set_result(None)
        elif self._full is not None:
            try:
                self._unstage()
            except BaseException as e:  # the batcher failed (a bug in it)
                self._crash(e)  # fails ``fut`` too, with every other pending request
                if not isinstance(e, Exception):
                    raise
                return fut
            if self._batcher.queued >= self._budget:
                _resolve(self._full)
        if self._in_flight:
            self._let_threads_in()
        return fut

    def _price(self, x: np.ndarray) -> Any:
        """The batcher's price of ``x``; what it raises says that nothing was queued."""
        try:
            return self._batcher.price(x)
        except Exception as e:
            add_note(e, f"(raised by the server's {type(self._batcher).__name__} working "
                       f"out the cost of a request of shape {x.shape}: that request "
                       f"was not queued; the server serves on)")
            raise

    async def with_version(self, x: np.ndarray, timeout: float | None = None,
                           ) -> Tuple[Outputs, Hashable]:
        """``(outputs, version)``: the outputs for ``x`` and the model version that
        computed them (None for a request split across batches while the model was
        swapped, whose rows came from two versions); ``timeout`` as for a call."""
        return await self._versioned(self(x, timeout))

    async def _versioned(self, fut: asyncio.Future) -> Tuple[Outputs, Hashable]:
        if fut.done():
            return fut.result(), self.version
        self._responses.want_version(fut)
        try:
            outputs = await fut
        finally:
            version = self._responses.pop_version(fut)
        return outputs, version

    def at_priority(self, priority: int) -> PriorityEvaluate:
        """An evaluate function for this server whose requests are batched at
        ``priority`` (an integer; higher goes first; the server itself is priority 0).

        A batch is filled from the highest priority queued down, round robin within a
        level, so requests at a higher priority never wait behind lower ones (while
        they fill the batches, lower ones wait: strict priority, as in Triton).

        Example:
            >>> import async_search as asr
            >>> from async_search.models import MLP
            >>> async def main():
            ...     async with asr.serve(MLP((4,))) as evaluate:
            ...         urgent = evaluate.at_priority(1)
            ...         return (await urgent(np.zeros((2, 4), np.float32))).shape
            >>> asyncio.run(main())
            (2, 1)

        Raises:
            ValueError: when ``priority`` is not an integer, or the server was given a
                batcher other than a ``FairBatcher`` (priorities are its queues).
        """
        priority = check_int("priority", priority)
        if not isinstance(self._batcher, FairBatcher):
            raise ValueError(f"priorities need the server's FairBatcher (its default); "
                             f"this server batches with {type(self._batcher).__name__}")
        return PriorityEvaluate(self, priority)

    def call_with_version(self, x: np.ndarray, rowwise: bool = False,
                          ) -> "asyncio.Future[Tuple[Outputs, Hashable]]":
        """``with_version`` as a call that queues ``x`` at once: the returned future
        resolves with ``(outputs, version)``. A request queued after ``update_model``
        runs on the new model; one queued before may run on either. Cancelling the
        returned future drops the request.

        ``rowwise``: ``x`` holds the rows of several callers (a client's message), so a
        batch that fails fails only its rows: when some batches of ``x`` fail and
        others are computed, the future fails with ``wire.RowsFailed``, which
        carries the computed rows.

        A rowwise ``x`` some of whose rows the model's ``check_values`` refuses has
        the others served, and fails with a RowsFailed that fails the refused rows.

        Raises:
            InputSpecError, ServerClosedError: as calling the server does.
        """
        try:
            fut = self(x)
        except InputSpecError as error:
            refused = refused_rows(x, self._check) if (
                rowwise and self._values is not None) else None
            if refused is None:
                raise
            return serve_the_rest(x, refused, error,
                                  lambda kept: self.call_with_version(kept, True), self._loop)
        paired = self._loop.create_future()
        if fut.done():
            paired.set_result((fut.result(), self.version))
            return paired
        self._responses.want_version(fut)
        if rowwise:
            self._responses.want_rowwise(fut)
        fut.add_done_callback(functools.partial(self._pair_version, paired))
        paired.add_done_callback(functools.partial(_cancel_with, fut))
        return paired

    def _pair_version(self, paired: asyncio.Future, fut: asyncio.Future) -> None:
        version = self._responses.pop_version(fut)
        if paired.done():
            return
        if fut.cancelled():
            paired.cancel()
        elif fut.exception() is not None:
            error = fut.exception()
            if isinstance(error, RowsFailed):
                error.version = version
            paired.set_exception(error)
        else:
            paired.set_result((fut.result(), version))

    def _checked(self, x) -> np.ndarray:
        learnt = self._check.spec
        x = self._check(x)  # raises, or learns the spec (again, when none of it waits)
        if learnt is not None and self._check.spec is not learnt:
            # Every request of the spec before is done (failed, cancelled or past its
            # deadline): none of them may join a batch of the new one.
            self._take_queued()
        self._shape, self._dtype = self._check.shape, self._check.dtype
        return x

    @property
    def stats(self) -> dict:
        """batches, elements, mean_batch_size, model_time_s, wall_time_s,
        fraction_in_model (model time over wall time per device worker, at most 1),
        batch_size_histogram, reasons, queue wait, failed_batches,
        workers, version, buffers_allocated, buffers_reused, and where the model ran:
        model_placement (thread, loop or auto), batches_on_loop, batches_in_thread; with
        ``devices``: devices (one a worker); with ``max_batch_size="auto"``:
        auto_batch_size (the size now, whether it is settled, the rate measured at each
        size tried, the largest size still tried)."""
        stats = self._stats.as_dict()
        stats["workers"] = self.num_workers
        stats["version"] = self.version
        stats["buffers_allocated"] = self._pool.allocated
        stats["buffers_reused"] = self._pool.reused
        workers = self._workers
        stats["model_placement"] = self._placement
        stats["batches_on_loop"] = workers.batches_on_loop if workers is not None else 0
        stats["batches_in_thread"] = workers.batches_in_thread if workers is not None else 0
        devices = self._devices
        if workers is not None and workers.threaded:  # those of the threads now
            devices = self._closed_devices if self._closed else workers.devices
        if devices is not None and any(d is not None for d in devices):
            stats["devices"] = [None if device is None else str(device)
                                for device in devices]
        if self._tuner is not None:
            stats["auto_batch_size"] = self._tuner.report()
        return stats

    @property
    def input_spec(self) -> TensorSpec | None:
        """The spec requests are checked against: declared by the model, or learned from
        the first request once a request of it was answered (None before: a first
        request the model refuses, or its caller gives up on, fixes nothing)."""
        return self._check.spec if self._check.settled else None

    @property
    def trace(self) -> List[BatchRecord]:
        """A BatchRecord (finished_s, size, model_s) for each of the latest
        ``trace_size`` batches (every batch with ``trace_size=None``), in order."""
        return list(self._stats.trace)

    # -- the model --------------------------------------------------------------------
    @property
    def model(self) -> Any:
        """The model that new batches run on."""
        return self._workers.model if self._workers is not None else self._first_model

    @property
    def swap_token(self) -> object:
        """An object renewed at every ``update_model``: a result cache in front tells a
        swap by it and the version label, so that a model swapped away and back again
        (under one label) while a request was computed starts a new generation."""
        return self._swap_token

    @property
    def version(self) -> Hashable:
        """The version of the model that new batches run on."""
        if self._workers is not None:
            return self._workers.version
        return first_version(self._first_model)  # the model's own, or 0

    def update_model(self, model_or_weights: Any, version: Hashable) -> None:
        """Swaps the model between batches, without stopping the searches.

        A callable becomes the model; anything else is passed to the current model's
        ``with_weights(weights)``, which returns the new model (so is a framework's net
        that the current adapter takes as weights: a ``torch.nn.Module`` for a
        ``TorchModel``, a Keras model for a ``TensorFlowModel``). Batches that a worker has
        started finish on the old model; every later batch runs on the new one and its
        results carry ``version`` (see ``with_version``). The new model must return
        outputs of the structure the server expects (see Faults above).

        Raises:
            ValueError: when the new model declares an ``input_spec`` other than the
                one requests are checked against, or an ``output_spec`` that does not
                fit the outputs the server expects; nothing is swapped.
        """
        self.prepare_update(model_or_weights, version)()

    def prepare_update(self, model_or_weights: Any, version: Hashable,
                       ) -> Callable[[], None]:
        """Every check of ``update_model``, and the new model made, without the swap:
        returns the swap, to call before anything else changes the server (no await
        between). A ``Router`` prepares each of its servers' before it swaps any, so
        that one that refuses leaves none on the other model.

        Raises:
            what ``update_model`` raises; ServerClosedError or RuntimeError when the
            server is not serving. Nothing has changed then.
        """
        self._require_running("update_model")
        new_model = replaces_model(self.model, model_or_weights)
        served_input = self._served_input()
        given_input = input_spec_of(model_or_weights) if new_model else None
        if new_model:
            self._refuse_other_specs(model_or_weights, served_input, "update_model")
        swap_models = self._workers.prepare_model(model_or_weights, version)

        def swap() -> None:
            swap_models()
            self._swap_token = object()
            if isinstance(given_input, TensorSpec) and served_input is None:
                # No request yet: the new model's declared spec checks them from now on.
                self._check = RequestChecker(given_input)
                self._shape, self._dtype = self._check.shape, self._check.dtype
            if new_model:  # weights alone keep the model's check_values
                self._check.values = self._values = values_check_of(model_or_weights)
                self._last_shape = None

        return swap

    def _served_input(self) -> TensorSpec | None:
        """The spec requests are checked against, where a model must take it: a
        provisional spec gives way to a declared one, unless a request of it still
        waits (the new model would get it, and a batch of two shapes could form)."""
        return self._check.spec if self._check.settled or self._check.waits() else None

    def _refuse_other_specs(self, model: Any, served_input: TensorSpec | None,
                            what: str) -> None:
        """ValueError naming ``what`` when ``model`` declares an ``input_spec`` other
        than ``served_input`` (requests are checked against it: every one would fail
        inside the model instead), or an ``output_spec`` that does not fit the outputs
        the server expects."""
        given_input = input_spec_of(model)
        if isinstance(given_input, TensorSpec) and served_input is not None \
                and given_input != served_input:
            raise ValueError(f"{what}: the new model takes {given_input.describe()}, "
                             f"the server's requests are {served_input.describe()}; serve "
                             f"it in a server of its own")
        spec = output_spec_of(model)
        expected = self._responses.structure
        if spec is not None and expected is not None:
            try:
                expected.conform(spec.empty(0), expected_from="the served outputs")
            except ModelOutputError as e:
                raise ValueError(f"{what}: the new model's output_spec does not fit: "
                                 f"{e}") from None

    @property
    def num_workers(self) -> int:
        """Device workers serving now (after close: those it had when it closed)."""
        if self._workers is None or self._closed:
            return self._num_workers
        return len(self._workers)

    async def add_worker(self, model: Any = None, device: Any = None) -> None:
        """Starts another device thread that takes batches from the same queue, with its
        own ``model``, or the current model's copy on ``device`` (``on_device``), or the
        current model itself.

        Raises:
            TypeError: when ``model`` is not callable (or the copy on ``device`` is not:
                see ``base.on_device``).
            ValueError: when ``model`` declares an ``input_spec`` or ``output_spec``
                that ``update_model`` would refuse: its batches would fail.
        """
        self._require_running("add_worker")
        if model is not None:
            check_callable("add_worker's model", model)
            self._refuse_other_specs(model, self._served_input(), "add_worker")
        self._workers.add(model, device=device)
        self._wake_dispatch()

    async def remove_worker(self) -> None:
        """Ends one device thread once the batches queued before this call are done."""
        self._require_running("remove_worker")
        await self._workers.remove()

    def _refuse_other_threads(self, what: str, running: Any = None) -> None:
        """RuntimeError when called from another event loop or thread than the one the
        server serves: its queues and futures belong to that loop's thread, a call from
        elsewhere would race with it, and what it awaits could only be awaited there
        (an ``aclose`` from another thread hung for good, and so did the owner's)."""
        running = running or _running_loop()
        if running is self._loop or (running is None and not self._loop.is_running()
                                     and threading.get_ident() == self._thread):
            return
        raise RuntimeError(
            f"this server serves the event loop it was entered in, and {what} was "
            f"called from " + ("another thread" if running is None else
                               "another event loop") + ": serve that loop its own "
            "server, or hand the call to the server's loop "
            "(asyncio.run_coroutine_threadsafe, or loop.call_soon_threadsafe)")

    def _require_running(self, what: str) -> None:
        self._notice_a_closed_loop()
        if self._crashed is not None:
            raise self._closed_error()
        if self._workers is None or self._new_future is None or self._closed:
            raise RuntimeError("the server is not serving: use it inside its context")
        self._refuse_other_threads(what)

    # -- lifetime ---------------------------------------------------------------------
    async def __aenter__(self) -> "BatchingServer":
        if self._loop is not None:
            raise RuntimeError("a BatchingServer can be entered once")
        # A batcher holds its server's queue: two open servers on one would take each
        # other's requests to their own models.
        holder = self._batcher._server
        if holder is not None and not holder._closed:
            raise ValueError("this batcher already batches for another open server: "
                             "give each serve its own batcher")
        devices = self._devices
        # A copy of the model per device, made here before any thread starts (on_device
        # raises TypeError for a model that cannot place itself: nothing is left then).
        copies = [on_device(self._first_model, device) for device in devices or ()]
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()  # the loop's: where calls come from
        self._since = time.perf_counter()
        self._stats.start_clock()  # serving starts here, not when it was built
        self._workers = Workers(copies[0] if copies else self._first_model, self.version,
                                self._loop, placement=self._placement,
                                on_count=self._stats.workers_changed)
        try:
            if copies:
                for copy, device in zip(copies, devices):
                    self._workers.add(copy, device=device, copy=True)
            elif self._placement != "loop":
                for _ in range(self._num_workers):
                    self._workers.add()
        except BaseException as e:  # a thread that could not start: end those that did
            started = len(self._workers)
            self._workers.stop(discard_queued=True)
            self._workers = None  # not serving: calls and changes say so
            if isinstance(e, RuntimeError) and "thread" in str(e):
                # Python's "can't start new thread" names no argument.
                add_note(e, f"(while starting device thread {started + 1} of "
                            f"{len(devices) if devices else self._num_workers}: "
                            f"num_workers or devices asks for more threads than this "
                            f"process can start)")
            raise
        self._stats.workers_changed(self.num_workers)
        self._new_future = _future_maker(self._loop)
        self._task = self._loop.create_task(self._dispatch_loop())
        # What ends the task is reported as the crash (ServerCrashedError's cause), not
        # as asyncio's "Task exception was never retrieved".
        self._task.add_done_callback(_retrieved)
        self._update_quiet()
        self._batcher._server = self  # once open: a failed enter leaves it free
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self.aclose(drain=exc_type is None)

    async def aclose(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop taking requests; serve the queued ones (``drain``) or fail them.

        Returns when every request has its result or error, the dispatch task has ended
        and the device threads have stopped (each unloads its model on its way out).

        The exit holds whatever interrupts it: cancelled at any of its awaits (once, or
        again while it closes), or out of ``timeout`` seconds (a model that never
        returns), it fails every request still queued or in the model with
        ServerClosedError, ends the dispatch task and tells every device thread to end,
        before the interruption goes on, without awaiting anything. A thread whose model
        is still computing then ends, unloading it, once the model returns: no thread
        outlives the server longer than its last batch.

        Raises:
            CloseTimeoutError: when ``timeout`` ran out; it says what was abandoned
                (batches still in the model, requests failed, threads still running).
            ServerCrashedError: when the serving coroutine had died and ``drain`` was
                asked (the requests it failed already got this error).
        """
        if self._loop is None or self._new_future is None or self._closed:
            return  # never entered, or its enter failed (and ended what it started)
        if self._loop.is_closed():
            # Its loop was closed while it served, and the collector now closes the
            # coroutine that held it: nothing on that loop can be resolved any more,
            # but its device threads must still end.
            self._notice_a_closed_loop()
            self._workers.stop(discard_queued=True)
            self._finish_close()
            return
        self._refuse_other_threads("aclose")  # before anything changes
        if timeout is not None:
            timeout = check_float("timeout", timeout, minimum=0)
        deadline = None if timeout is None else self._loop.time() + timeout
        if self._closer is not None:  # another aclose is under way: wait for it
            if not await self._until(self._closer, deadline):
                raise CloseTimeoutError(f"the server did not close within {timeout} s: "
                                        f"another aclose is still waiting for it")
            return
        self._closer = self._loop.create_future()
        self._num_workers = len(self._workers)  # what stats report once closed
        self._closed_devices = self._workers.devices
        self._closing = True
        self._update_quiet()
        if not drain:
            self._fail_queued(ServerClosedError(
                "the server closed before this request was batched"))
        if self._full is not None:  # a partial batch waiting out max_delay: no more
            _resolve(self._full)
        self._wake_dispatch()
        try:
            # Each wait is bounded by the deadline, and none of them cancels what it
            # waits for: an interruption lands in the handler below, which closes.
            if not await self._until(self._task, deadline):
                raise _OutOfTime
            # After a crash every request has failed already, and a batch may never come
            # back (the crash came before its device got it): no waiting for those.
            while self._in_flight and self._crashed is None:
                self._slot = self._loop.create_future()
                if not await self._until(self._slot, deadline):
                    raise _OutOfTime
            self._workers.stop(discard_queued=self._crashed is not None)
            if not await self._until(self._workers.ended(), deadline):
                raise _OutOfTime
            self._workers.join_ended()
        except BaseException as e:
            out_of_time = isinstance(e, _OutOfTime)
            why = (f"it did not finish closing within {timeout} s" if out_of_time
                   else f"its exit was interrupted by {describe(e)}")
            abandoned = self._abandon(why)
            if out_of_time:
                raise abandoned from None
            raise
        finally:
            self._finish_close()
        if self._crashed is not None and drain:
            raise self._closed_error()

    async def _until(self, awaitable: "asyncio.Future", deadline: float | None) -> bool:
        """Waits for ``awaitable`` (never cancelling it) until ``deadline``; False when
        the deadline came first."""
        if awaitable.done():
            return True
        done, _ = await asyncio.wait((awaitable,), timeout=self._remaining(deadline))
        return bool(done)

    def _remaining(self, deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - self._loop.time())

    def _abandon(self, why: str) -> CloseTimeoutError:
        """Closes now, without awaiting anything (the exit was interrupted): fails every
        request queued or in the model, ends the dispatch task and tells the device
        threads to end after the batch each computes. Returns what was abandoned."""
        self._closing = True
        self._update_quiet()
        if self._loop.is_closed():  # closed with its loop: no future can be resolved
            self._workers.stop(discard_queued=True)
            threads = tuple(self._workers.running)
            return CloseTimeoutError(f"the server closed with its event loop ({why}); "
                                     f"device threads still running: {threads}",
                                     threads=threads)
        flying = list(self._flying.values())
        self._flying.clear()  # what a device returns later finds them failed
        if not self._task.done():
            self._abandoned = True  # its cancellation is the close, not a crash
            self._task.cancel()
        # Batches queued for a device thread and not started are dropped: they never
        # reached the model, and are not counted as in it.
        never_ran = {id(token) for token in self._workers.stop(discard_queued=True)}
        in_model = [popped for popped in flying if id(popped) not in never_ran]
        failed = 0
        for batches, where in ((in_model, "was in the model"),
                               ([p for p in flying if id(p) in never_ran],
                                "waited for the model, which it never reached")):
            error = ServerClosedError(f"the server closed ({why}) while this request's "
                                      f"batch {where}")
            for popped in batches:
                failed += sum(1 for fut in popped.tags if not fut.done())
                self._responses.fail(popped, error)
        failed += self._fail_queued(ServerClosedError(
            f"the server closed ({why}) before this request was batched"))
        threads = self._workers.running
        dropped = len(flying) - len(in_model)
        running = (f"device thread(s) {', '.join(threads)} still run the model and will "
                   f"unload it and end when it returns" if threads else
                   "no device thread is left")
        return CloseTimeoutError(
            f"the server closed ({why}): {len(in_model)} batch(es) were still in the "
            f"model" + (f" and {dropped} more waited for it (dropped)" if dropped else "")
            + f"; {failed} request(s) failed with ServerClosedError; {running}",
            batches_in_model=len(in_model), requests_failed=failed, threads=tuple(threads))

    def _finish_close(self) -> None:
        self._stats.close()
        self._closed = True
        lost_loop = self._loop.is_closed()
        if lost_loop:
            # No future on it can be resolved any more: its requests are dropped, not
            # left in the batcher for the next server that takes it to compute.
            self._take_queued()
        if self._batcher._server is self:  # free for the next server
            self._batcher._server = None
        if lost_loop:
            return
        self._fail_queued(ServerClosedError("the server closed"))  # if the task died
        if self._closer is not None and not self._closer.done():
            self._closer.set_result(None)

    def _wake_dispatch(self) -> None:
        for waiter in (self._wakeup, self._slot):
            if waiter is not None:
                _resolve(waiter)
        self._wakeup = self._slot = None
        self._update_quiet()

    def _update_quiet(self) -> None:
        """Whether a request may only be staged: the server is open, its dispatch task
        awake (``_wakeup``) and no batch waiting to fill (``_full``)."""
        self._quiet = (self._loop is not None and not self._closing
                       and self._wakeup is None and self._full is None
                       and not self._priced)

    def _closed_error(self) -> ServerClosedError:
        """What a call to a closing or closed server raises."""
        cause = self._crashed
        if cause is None:
            if not self._closed:  # (aclose in another task, or the exit under way)
                return ServerClosedError("the server is closing (its context is being "
                                         "left, or aclose was called): it takes no more "
                                         "requests")
            return ServerClosedError("the server is closed: evaluate called after its "
                                     "context was left (or aclose)")
        if isinstance(cause, _LostLoop) or (isinstance(cause, asyncio.CancelledError)
                                             and self._loop.is_closed()):
            # (asyncio.run cancels every task of a loop it closes, the dispatch task
            # among them, when a server outlives the run it was entered in)
            return ServerCrashedError(
                "the server's event loop was closed while it served (its `async with` "
                "block was never left): it takes no more requests, and requests made "
                "before stay unanswered on that loop")
        error = ServerCrashedError(
            f"the server crashed: its serving coroutine died of {describe(cause)}; every "
            f"pending request failed and it takes no more")
        error.__cause__ = cause
        return error

    def _notice_a_closed_loop(self) -> None:
        """When the loop the server serves was closed while it served (its ``async
        with`` never left): nothing on that loop can be resolved any more, so the
        server takes nothing more (``_closed_error``) and its device threads end after
        the batch each computes."""
        if self._closing or self._new_future is None or not self._loop.is_closed():
            return  # (never entered, or its enter failed: it says it is not serving)
        if self._crashed is None:
            self._crashed = _LostLoop()
        self._closing = True
        self._update_quiet()
        self._workers.stop(discard_queued=True)  # (made before _new_future)

    def _crash(self, cause: BaseException) -> None:
        """The serving coroutine died of ``cause``: fail every pending request (queued,
        staged and in flight) and close the server, so that no request waits forever
        and later calls raise at once."""
        if self._crashed is None:
            self._crashed = cause
        self._closing = True
        self._update_quiet()
        error = self._closed_error()
        flying = list(self._flying.values())
        self._flying.clear()  # what comes back from a device later finds them failed
        for popped in flying:
            self._responses.fail(popped, error)
        self._fail_queued(error)
        if self._full is not None:
            _resolve(self._full)
        self._wake_dispatch()

    # -- dispatch ---------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        batcher, loop = self._batcher, self._loop
        try:
            while True:
                self._unstage()
                if batcher.empty():
                    if self._closing:
                        return
                    # The last batch's callers ask again as soon as they run: one
                    # loop iteration lets them (their calls are only staged) before
                    # the task sleeps, which costs them no wakeup.
                    await asyncio.sleep(0)
                    self._unstage()
                    if not batcher.empty():
                        self._since = time.perf_counter()  # the queue's oldest request
                        continue
                    if self._closing:
                        return
                    popped = None  # idle: hold nothing of the last batch
                    self._wakeup = loop.create_future()
                    self._update_quiet()
                    await self._wakeup
                    continue
                if self._in_flight >= self.policy.pipeline_depth * len(self._workers):
                    self._slot = loop.create_future()
                    await self._slot
                    continue
                reason = await self._wait_for_company()  # it leaves nothing staged
                if batcher.empty():
                    continue
                try:
                    popped = batcher.pop_parts(
                        self._done_or_due if self._deadlines else _done,
                        self._pool.take, uniform=True)  # checked in __call__
                except IndexError:  # every queued request was cancelled
                    continue
                self._in_flight += 1
                self._flying[id(popped)] = popped  # out of the batcher: a crash fails it
                now = time.perf_counter()
                self._stats.record_dispatch(len(popped.batch), reason, now - self._since,
                                            popped.starting if popped.parts else
                                            len(popped.tags))
                self._since = now
                self._workers.submit(popped, popped.batch, self._on_done)
                if reason is Reason.FULL and not self._in_flight:
                    # The model ran on the loop and more full batches may follow (a
                    # large request): let the searches run between them, or no one
                    # else could even make a request until the large one is done.
                    await asyncio.sleep(0)
        except BaseException as e:
            if isinstance(e, GeneratorExit):  # closed with its loop: nobody is waiting,
                self._notice_a_closed_loop()  # but its device threads must still end
                raise
            if self._abandoned and isinstance(e, asyncio.CancelledError):
                raise  # cancelled by an interrupted close, which failed everything
            # Whatever ends this task fails every pending request and closes the server.
            self._crash(e)
            if not isinstance(e, Exception):
                raise  # a cancellation or KeyboardInterrupt goes on; aclose reports

    async def _wait_for_company(self) -> Reason:
        """Lets ready searches queue their requests; returns why the batch may leave."""
        # (self._budget read at each test: max_batch_size="auto" may change it meanwhile)
        batcher = self._batcher
        self._unstage()
        if batcher.queued >= self._budget:
            return Reason.FULL
        if self._closing:
            return Reason.CLOSING
        while True:  # until a loop iteration passes with no new request
            seen = len(batcher)  # only this task takes requests out of the batcher
            await asyncio.sleep(0)
            self._unstage()
            if batcher.queued >= self._budget:
                return Reason.FULL
            if len(batcher) == seen:
                break
        delay = self.policy.max_delay
        if delay and not self._closing:
            remaining = self._since + delay - time.perf_counter()
            if remaining > 0:
                self._full = full = self._loop.create_future()
                self._update_quiet()
                timer = self._loop.call_later(remaining, _resolve, full)
                try:
                    await full
                finally:
                    timer.cancel()
                    self._full = None
                    self._update_quiet()
                self._unstage()
                if batcher.queued >= self._budget:
                    return Reason.FULL
                return Reason.CLOSING if self._closing else Reason.DELAY
        return Reason.IDLE

    def _unstage(self) -> None:
        """Hands the requests staged since the last call to the batcher."""
        if self._staged_xs:
            if self._priced:
                prices, self._staged_prices = self._staged_prices, []
                self._batcher.extend(self._staged_xs, self._staged_futures, prices)
            else:
                self._batcher.extend(self._staged_xs, self._staged_futures)
            self._staged_xs, self._staged_futures = [], []
        if self._staged_urgent:
            urgent, self._staged_urgent = self._staged_urgent, []
            for priority, x, fut in urgent:
                self._batcher.append(x, fut, priority=priority)

    # -- results ----------------------------------------------------------------------
    def _done_or_due(self, fut: asyncio.Future) -> bool:
        """Whether a request about to be batched is done, or past its deadline (failed
        now: a loop kept busy may not have run its timer yet), so that it is dropped
        before the model runs."""
        if fut.done():
            return True
        deadline = self._deadlines.get(fut)
        if deadline is None:
            return False
        deadline.expire_if_due()
        return fut.done()

    def _on_done(self, popped: Popped, outputs: Outputs, error: BaseException | None,
                 seconds: float, version: Hashable) -> None:
        # Called on the loop by a device thread (call_soon_threadsafe) or, inline, by the
        # dispatch task: whatever escapes would leave this batch's futures unresolved,
        # so what cannot be handled as this batch's error crashes the server.
        try:
            self._in_flight -= 1
            flying = self._flying.pop(id(popped), None)
            slot, self._slot = self._slot, None
            if slot is not None:
                _resolve(slot)
            if flying is None:  # its futures failed already (a crash, an abandoned close)
                self._responses.fail(popped, self._closed_error())
                return
            record = None
            try:
                record = self._stats.record_model(len(popped.batch), seconds,
                                                  error is not None)
                if popped.buffer is not None:
                    self._pool.give_back(popped.buffer, outputs)
                if self._deadlines:  # results that came late are not handed out
                    expire_due(self._deadlines, popped.tags)
                if error is None:
                    error = self._responses.deliver(popped, outputs, version)
                    if error is not None:  # ModelOutputError: the batch failed too
                        self._stats.failed_batches += 1
                if self._tuner is not None and len(popped.batch):
                    # What was answered: a size whose batches fail (out of memory) is
                    # worth nothing, however fast they fail.
                    self._tune(len(popped.batch), 0 if error is not None else None)
            except Exception as e:  # never leave a request of this batch unresolved
                error = e
            if error is not None:
                self._responses.fail(popped, error)
            if error is None and not self._check.settled:
                self._check.settle_by(popped.batch)
            if self._on_batch is not None and record is not None:
                report_batch(self._on_batch, record)
        except BaseException as e:
            self._crash(e)
            self._responses.fail(popped, self._closed_error())
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise

    def _tune(self, size: int, answered: int | None) -> None:
        """max_batch_size='auto': one more batch back (``answered``: None for all its
        elements); the tuner may change the cap (the batches in flight were cut under
        the old one)."""
        tuner = self._tuner
        cap = tuner.record(size, tuner.auto.clock(), self._in_flight, answered)
        if cap is not None:
            self._batcher.budget = self._budget = cap
            self._pool.resize(cap)
            if self._full is not None and self._batcher.queued >= cap:
                # A smaller cap made the waiting batch full: it waits for no one (a
                # request arriving would tell, but none may come within max_delay).
                _resolve(self._full)

    @property
    def max_batch_size(self) -> int:
        """The most elements in a batch now (with ``max_batch_size="auto"``: the size
        the server has chosen so far)."""
        return self._budget

    def _take_queued(self) -> list:
        """Takes every request staged or queued out of the server and its batcher (never
        calls the batcher's cost); returns their futures."""
        futures = self._staged_futures + [fut for _, _, fut in self._staged_urgent]
        self._staged_xs, self._staged_futures, self._staged_urgent = [], [], []
        self._staged_prices = []
        try:
            futures = futures + self._batcher.clear()
        except Exception:  # noqa: BLE001 - a broken batcher: take its requests as they are
            futures = futures + list(getattr(self._batcher, "_tags", []))
        self._responses.forget(futures)
        return futures

    def _fail_queued(self, error: BaseException) -> int:
        """Fails every request staged or queued (never calls the batcher's cost);
        returns how many were not done yet."""
        failed = 0
        for fut in self._take_queued():
            if not fut.done():
                fut.set_exception(error)
                failed += 1
        return failed
