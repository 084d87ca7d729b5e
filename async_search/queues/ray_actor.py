"""Queues between Ray tasks and actors."""

from __future__ import annotations

from async_search.queues.protocol import QueueLike

__all__ = ["ray_queue"]


def ray_queue(maxsize: int = 0) -> QueueLike:
    """Ray's own actor-backed queue (``ray.util.queue.Queue``; it has ``get_async``).
    Starts Ray on this machine if it is not running."""
    from async_search.ray_init import ensure_ray

    ensure_ray()
    from ray.util.queue import Queue

    return Queue(maxsize)
