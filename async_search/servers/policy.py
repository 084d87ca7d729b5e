"""When a batch leaves: the dispatch policy and the reasons a batch left."""

from __future__ import annotations

import dataclasses
import enum
from typing import Union

from async_search.checks import check_float, check_int, is_int
from async_search.servers.batch_size import AutoBatchSize


class Reason(str, enum.Enum):
    """Why a batch was sent to the model."""

    FULL = "full"        # the queued requests filled a batch
    IDLE = "idle"        # a loop iteration passed with no new request
    DELAY = "delay"      # max_delay ran out while waiting for a fuller batch
    CLOSING = "closing"  # the server was draining its queue on close


@dataclasses.dataclass(frozen=True)
class DispatchPolicy:
    """How a server cuts the request stream into batches.

    When the model is free (fewer than ``pipeline_depth`` batches in flight per device
    worker), the server lets every search that is ready to run take its turn, until one
    loop iteration passes with no new request, then sends what is queued, up to
    ``max_batch_size`` elements.
    With ``max_delay`` (seconds) a partial batch waits that long after its oldest request
    for company; a full batch never waits. ``max_batch_size="auto"`` (or an
    ``AutoBatchSize``) lets the server pick the size with the highest measured
    end-to-end rate (``servers.batch_size``); it is stored as an ``AutoBatchSize``.

    Example:
        >>> DispatchPolicy(max_batch_size=256, max_delay=0.002).pipeline_depth
        2
    """

    max_batch_size: Union[int, AutoBatchSize] = 256
    max_delay: float | None = None
    pipeline_depth: int = 2

    def __post_init__(self):
        # Stored as plain Python numbers: a NumPy integer is accepted, a bool never.
        set_ = object.__setattr__
        size = self.max_batch_size
        if isinstance(size, str) and size == "auto":
            set_(self, "max_batch_size", AutoBatchSize())
        elif not isinstance(size, AutoBatchSize):
            if not is_int(size) or size < 1:
                raise ValueError(f"max_batch_size must be an integer >= 1, 'auto' or an "
                                 f"AutoBatchSize, got {size!r}")
            set_(self, "max_batch_size", int(size))
        if self.max_delay is not None:
            set_(self, "max_delay", check_float("max_delay", self.max_delay, minimum=0))
        set_(self, "pipeline_depth", check_int("pipeline_depth", self.pipeline_depth,
                                               minimum=1))
