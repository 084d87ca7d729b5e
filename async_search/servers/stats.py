"""What a server measures: batches, elements, sizes, time in the model, queue wait."""

from __future__ import annotations

import collections
import time
from typing import Dict

from async_search.servers.policy import Reason

__all__ = ["ServingStats"]


class ServingStats:
    """Counts kept per batch (never per request) by a serving loop.

    ``as_dict()`` gives: batches, elements, mean_batch_size, model_time_s, wall_time_s,
    fraction_in_model, batch_size_histogram (size -> batches), reasons (why batches
    left -> batches), queue_wait_mean_s and queue_wait_max_s (how long the oldest
    request of each batch waited before the batch left), failed_batches.
    """

    def __init__(self):
        self.start = time.perf_counter()
        self.stop: float | None = None
        self.batches = 0
        self.elements = 0
        self.failed_batches = 0
        self.model_time = 0.0
        self.queue_wait_total = 0.0
        self.queue_wait_max = 0.0
        self.histogram: Dict[int, int] = collections.Counter()
        self.reasons: Dict[str, int] = collections.Counter()

    def record_dispatch(self, size: int, reason: Reason, queue_wait: float) -> None:
        """A batch of ``size`` elements left, its oldest request queued ``queue_wait`` s."""
        self.batches += 1
        self.elements += size
        self.histogram[size] += 1
        self.reasons[reason.value] += 1
        self.queue_wait_total += queue_wait
        if queue_wait > self.queue_wait_max:
            self.queue_wait_max = queue_wait

    def record_model(self, seconds: float, failed: bool) -> None:
        """The model ran a batch for ``seconds``; ``failed`` if it raised."""
        self.model_time += seconds
        self.failed_batches += failed

    def close(self) -> None:
        """Stop the wall clock."""
        if self.stop is None:
            self.stop = time.perf_counter()

    def as_dict(self) -> dict:
        wall = (self.stop or time.perf_counter()) - self.start
        batches = self.batches
        return {
            "batches": batches,
            "elements": self.elements,
            "mean_batch_size": self.elements / batches if batches else 0.0,
            "model_time_s": self.model_time,
            "wall_time_s": wall,
            "fraction_in_model": self.model_time / wall if wall > 0 else 0.0,
            "batch_size_histogram": dict(sorted(self.histogram.items())),
            "reasons": dict(self.reasons),
            "queue_wait_mean_s": self.queue_wait_total / batches if batches else 0.0,
            "queue_wait_max_s": self.queue_wait_max,
            "failed_batches": self.failed_batches,
        }
