"""What a queue must do to carry a connection, and how a stream of messages ends.

A ``QueueLike`` follows ``queue.Queue``'s interface (``queue.Empty``, ``queue.Full``);
an ``AsyncQueueLike`` can also be awaited (``await q.get_async()``) so that a coroutine
sleeps until an item arrives. A stream ends when its sender closes it: it puts
``END_OF_STREAM``, which every reader sees after the items put before it (it stays at the
head, so several readers of one queue all see it) and turns into ``ClosedConnection``.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from async_search.errors import ClosedConnection


@runtime_checkable
class QueueLike(Protocol):
    """A FIFO queue with ``queue.Queue``'s interface (``queue.Empty``/``queue.Full``)."""

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None: ...

    def get(self, block: bool = True, timeout: float | None = None) -> Any: ...

    def put_nowait(self, item: Any) -> None: ...

    def get_nowait(self) -> Any: ...

    def qsize(self) -> int: ...


@runtime_checkable
class AsyncQueueLike(QueueLike, Protocol):
    """A QueueLike that a coroutine can await: ``item = await q.get_async()``."""

    async def get_async(self) -> Any: ...


#: ``factory(maxsize)`` -> a new queue (``queue.Queue`` itself is one).
QueueFactory = Callable[..., QueueLike]


class _EndOfStream:
    """The marker a sender puts to close a stream; one instance, even after pickling."""

    def __reduce__(self):
        return (_end_of_stream, ())

    def __repr__(self) -> str:
        return "END_OF_STREAM"


END_OF_STREAM = _EndOfStream()


def _end_of_stream() -> _EndOfStream:
    return END_OF_STREAM


def is_end(item: Any) -> bool:
    """True for the end-of-stream marker (after any number of pickle round trips)."""
    return item is END_OF_STREAM


def close_stream(queue: QueueLike) -> None:
    """Ends the stream on ``queue``: its readers get what was put before, then
    ``ClosedConnection``. Works on any QueueLike (a marker travels like an item)."""
    queue.put(END_OF_STREAM)
