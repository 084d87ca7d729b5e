"""When a batch leaves: the dispatch policy and the reasons a batch left."""

from __future__ import annotations

import dataclasses
import enum

__all__ = ["DispatchPolicy", "Reason"]


class Reason(str, enum.Enum):
    """Why a batch was sent to the model."""

    FULL = "full"        # the queued requests filled a batch
    IDLE = "idle"        # a loop iteration passed with no new request
    DELAY = "delay"      # max_delay ran out while waiting for a fuller batch
    CLOSING = "closing"  # the server was draining its queue on close


@dataclasses.dataclass(frozen=True)
class DispatchPolicy:
    """How a server cuts the request stream into batches.

    When the model is free (fewer than ``pipeline_depth`` batches in flight), the server
    lets every search that is ready to run take its turn, until one loop iteration passes
    with no new request, then sends what is queued, up to ``max_batch_size`` elements.
    With ``max_delay`` (seconds) a partial batch waits that long after its oldest request
    for company; a full batch never waits.

    Example:
        >>> DispatchPolicy(max_batch_size=256, max_delay=0.002).pipeline_depth
        2
    """

    max_batch_size: int = 256
    max_delay: float | None = None
    pipeline_depth: int = 2

    def __post_init__(self):
        if not isinstance(self.max_batch_size, int) or self.max_batch_size < 1:
            raise ValueError(
                f"max_batch_size must be an integer >= 1, got {self.max_batch_size!r}")
        if self.max_delay is not None and not self.max_delay >= 0:
            raise ValueError(f"max_delay must be None or >= 0 seconds, got {self.max_delay!r}")
        if not isinstance(self.pipeline_depth, int) or self.pipeline_depth < 1:
            raise ValueError(
                f"pipeline_depth must be an integer >= 1, got {self.pipeline_depth!r}")
