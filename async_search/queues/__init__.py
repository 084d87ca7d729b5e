"""The QueueLike protocol, and one queue per placement: loop, threads, processes, Ray.

Connections are built on FIFO queues that follow ``queue.Queue``'s interface, so the
same connection code runs in one event loop, across threads, across processes or across
a Ray cluster. A queue that can also be awaited in the running loop (``get_async``)
wakes a waiting coroutine when an item arrives: no polling, no sleeping.

- ``local_queue``: coroutines of one loop (``queues/local.py``)
- ``thread_queue``: threads of one process (``queues/thread.py``)
- ``process_queue``: processes, any number of writers and readers (``queues/process.py``)
- ``socket_queue``: one process to another, one frame per loop iteration; the process
  backend's transport (``queues/sockets.py``)
- ``ray_queue``: Ray tasks and actors (``queues/ray_actor.py``)

``queue.Queue`` and ``multiprocessing.Manager().Queue`` are factories too (the
prototype's), though they cannot be awaited. Factories take ``maxsize`` (0: unbounded):

    >>> q = queue_factory("thread")(0)
    >>> q.put(1); q.get()
    1
"""

from __future__ import annotations

from async_search.queues.local import LocalQueue, local_queue
from async_search.queues.process import ProcessQueue, process_queue
from async_search.queues.protocol import (END_OF_STREAM, AsyncQueueLike, ClosedConnection,
                                          QueueFactory, QueueLike, close_stream, is_end)
from async_search.queues.sockets import SocketQueue, socket_queue
from async_search.queues.thread import ThreadQueue, thread_queue

__all__ = [
    "QueueLike", "AsyncQueueLike", "QueueFactory", "ClosedConnection", "END_OF_STREAM",
    "close_stream", "is_end", "LocalQueue", "ThreadQueue", "ProcessQueue", "SocketQueue",
    "local_queue", "thread_queue", "process_queue", "socket_queue", "ray_queue",
    "queue_factory",
]


def ray_queue(maxsize: int = 0) -> QueueLike:
    """A queue between Ray tasks and actors, awaitable (see ``queues/ray_actor.py``).
    Starts Ray on this machine if it is not running."""
    from async_search.queues.ray_actor import ray_queue as make

    return make(maxsize)


_FACTORIES = {"local": local_queue, "thread": thread_queue, "process": process_queue,
              "socket": socket_queue, "ray": ray_queue}


def queue_factory(backend: str) -> QueueFactory:
    """The queue factory for a placement: ``local``, ``thread``, ``process``,
    ``socket``, ``ray``.

    Raises:
        ValueError: for an unknown name, naming the known ones.
    """
    try:
        return _FACTORIES[backend]
    except (KeyError, TypeError):  # (a list is no name either)
        raise ValueError(f"unknown queue backend {backend!r}; known: "
                         f"{', '.join(sorted(_FACTORIES))}") from None
