"""What a server measures: batches, elements, sizes, time in the model, queue wait."""

from __future__ import annotations

import asyncio
import bisect
import collections
import math
import time
from typing import Callable, Deque, Dict, List, NamedTuple, Tuple

from async_search.checks import check_int
from async_search.servers.policy import Reason


#: How many BatchRecords a server keeps by default: the latest 10,000 batches (about
#: 1.3 MB), so that a server that runs for days holds a bounded trace. A run that plots
#: every batch asks for ``trace_size=None``.
TRACE_SIZE = 10_000

#: Upper bounds (seconds) of the per-batch model-time and queue-wait histograms.
TIME_BUCKETS_S: Tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0)


class BatchRecord(NamedTuple):
    """One batch, as the trace keeps it."""

    finished_s: float
    """When the model finished it, in seconds since the server started."""
    size: int
    """Elements in the batch."""
    model_s: float
    """Seconds the model took on it."""


class ServingStats:
    """Counts kept per batch (never per request) by a serving loop.

    ``as_dict()`` gives: requests (counted as they start in a batch), batches,
    elements, mean_batch_size, model_time_s, wall_time_s, fraction_in_model (model
    time over the worker-seconds served: per device worker, at most 1),
    batch_size_histogram (size -> batches), reasons (why batches left -> batches),
    queue_wait_mean_s and queue_wait_max_s (how long each batch's queue waited before
    the batch left: since the previous batch left, or since a request came to an empty
    queue; behind a backlog its oldest request waited longer, through earlier batches),
    model_time_histogram and queue_wait_histogram (upper bound in seconds, ``inf`` last
    -> batches, not cumulative), failed_batches (the model raised, or its outputs could
    not be handed out: ``ModelOutputError``),
    std_batch_size, timed_out (requests whose deadline passed before their answer);
    started_at is the server's start on the ``time.perf_counter`` clock. ``trace``
    keeps a BatchRecord for each of the latest ``trace_size`` batches (None: every
    batch), for plots; every other figure is a count, of constant size.
    """

    def __init__(self, trace_size: int | None = TRACE_SIZE):
        if trace_size is not None:  # 0 keeps none
            trace_size = check_int("trace_size", trace_size, minimum=0)
        self.start = time.perf_counter()
        self.stop: float | None = None
        # Worker-seconds so far: fraction_in_model is per device worker, whose number
        # may change while serving (add_worker, remove_worker).
        self._workers = 1
        self._workers_since = self.start
        self._worker_seconds = 0.0
        self.requests = 0
        self.batches = 0
        self.elements = 0
        self.failed_batches = 0
        self.model_time = 0.0
        self.queue_wait_total = 0.0
        self.queue_wait_max = 0.0
        self.histogram: Dict[int, int] = collections.Counter()
        self.reasons: Dict[str, int] = collections.Counter()
        self.timed_out = 0
        self.trace: Deque[BatchRecord] = collections.deque(maxlen=trace_size)
        self.model_time_counts = [0] * (len(TIME_BUCKETS_S) + 1)
        self.queue_wait_counts = [0] * (len(TIME_BUCKETS_S) + 1)

    def record_dispatch(self, size: int, reason: Reason, queue_wait: float,
                        requests: int = 0) -> None:
        """A batch of ``size`` elements left, its queue having waited ``queue_wait`` s
        (since the previous batch left, or a request came to an empty queue);
        ``requests`` of its requests start in it."""
        self.requests += requests
        self.batches += 1
        self.elements += size
        self.histogram[size] += 1
        self.reasons[reason.value] += 1
        self.queue_wait_total += queue_wait
        self.queue_wait_counts[bisect.bisect_left(TIME_BUCKETS_S, queue_wait)] += 1
        if queue_wait > self.queue_wait_max:
            self.queue_wait_max = queue_wait

    def count_timeout(self) -> None:
        """A request's deadline passed before its answer came."""
        self.timed_out += 1

    def record_model(self, size: int, seconds: float, failed: bool) -> BatchRecord:
        """The model ran a batch of ``size`` for ``seconds``; ``failed`` if it raised."""
        self.model_time += seconds
        self.model_time_counts[bisect.bisect_left(TIME_BUCKETS_S, seconds)] += 1
        self.failed_batches += failed
        record = BatchRecord(time.perf_counter() - self.start, size, seconds)
        self.trace.append(record)
        return record

    def start_clock(self) -> None:
        """The wall clock starts now: a server built a while before it serves counted
        that while as serving time (a fraction in the model of 0.29 for 0.99)."""
        self.start = self._workers_since = time.perf_counter()

    def close(self) -> None:
        """Stop the wall clock."""
        if self.stop is None:
            self.stop = time.perf_counter()

    def workers_changed(self, workers: int) -> None:
        """The device workers serving from now on (at least 1 is counted); nothing
        once the clock has stopped (a thread left running past a close ends later)."""
        if self.stop is not None:
            return
        now = time.perf_counter()
        self._worker_seconds += self._workers * (now - self._workers_since)
        self._workers, self._workers_since = max(workers, 1), now

    def as_dict(self) -> dict:
        end = self.stop or time.perf_counter()
        wall = end - self.start
        worker_seconds = self._worker_seconds + self._workers * max(
            end - self._workers_since, 0.0)
        batches = self.batches
        mean = self.elements / batches if batches else 0.0
        variance = (sum(n * (size - mean) ** 2 for size, n in self.histogram.items())
                    / batches if batches else 0.0)
        return {
            "started_at": self.start,
            "requests": self.requests,
            "batches": batches,
            "elements": self.elements,
            "mean_batch_size": mean,
            "std_batch_size": math.sqrt(variance),
            "model_time_s": self.model_time,
            "wall_time_s": wall,
            "fraction_in_model": (self.model_time / worker_seconds if worker_seconds > 0
                                  else 0.0),
            "batch_size_histogram": dict(sorted(self.histogram.items())),
            "reasons": dict(self.reasons),
            "queue_wait_mean_s": self.queue_wait_total / batches if batches else 0.0,
            "queue_wait_max_s": self.queue_wait_max,
            "model_time_histogram": _by_bound(self.model_time_counts),
            "queue_wait_histogram": _by_bound(self.queue_wait_counts),
            "failed_batches": self.failed_batches,
            "timed_out": self.timed_out,
        }


def report_batch(on_batch: Callable[["BatchRecord"], None], record: "BatchRecord") -> None:
    """``on_batch(record)``, on the loop. What it raises goes to the loop's exception
    handler (logged, as asyncio does for a callback) and fails no request: a progress
    bar's bug must not fail the batch the model computed."""
    try:
        on_batch(record)
    # (a CancelledError or GeneratorExit from a plain call is the hook's bug, not a
    # cancellation: nothing awaits in it)
    except (Exception, asyncio.CancelledError, GeneratorExit) as e:  # noqa: BLE001
        asyncio.get_running_loop().call_exception_handler({
            "message": f"on_batch raised on {record!r}", "exception": e})


def _by_bound(counts: List[int]) -> Dict[float, int]:
    return dict(zip((*TIME_BUCKETS_S, math.inf), counts))
