"""What a queue must do to carry a connection, and how a stream of messages ends.

A ``QueueLike`` follows ``queue.Queue``'s interface (``queue.Empty``, ``queue.Full``);
an ``AsyncQueueLike`` can also be awaited (``await q.get_async()``) so that a coroutine
sleeps until an item arrives. A stream ends when its sender closes it: it puts
``END_OF_STREAM``, which a reader gets after the items put before it and a
``Connection`` turns into ``ClosedConnection``. Socket and Ray queues keep it at their
head; from the others a reader takes it like any item, and a ``Connection`` that takes
it puts it back, so that every reader of one queue sees it.
"""

from __future__ import annotations

import math
import numbers
import pickle
import threading
from typing import Any, Callable, Protocol, runtime_checkable

from async_search.errors import ClosedConnection  # noqa: F401 - re-exported here


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


def load_error(error: Exception) -> Exception:
    """What loading one message raised, as its reader raises it: an OSError or EOFError
    (a file only the writer has, a reducer reading past its data) as an
    ``UnpicklingError``, so that it is never taken for the stream's own end.

    Example:
        >>> load_error(EOFError("no data")).args
        ('a message did not load: EOFError: no data',)
    """
    if not isinstance(error, (OSError, EOFError)):
        return error
    return pickle.UnpicklingError(f"a message did not load: {type(error).__name__}: "
                                  f"{error}").with_traceback(error.__traceback__)


def wait_timeout(timeout: Any) -> float | None:
    """A blocking ``put``'s or ``get``'s ``timeout`` as every queue here takes it: None,
    inf or anything past the longest wait the platform's locks take (about 292 years:
    ``threading.TIMEOUT_MAX``) waits as long as it takes, a number below 0 does not
    wait (0).

    Raises:
        ValueError: NaN (``queue.Queue`` would wait forever on it).
        TypeError: not a real number (a bool is not one).

    Example:
        >>> wait_timeout(float("inf")), wait_timeout(-1), wait_timeout(2)
        (None, 0.0, 2.0)
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    try:
        seconds = float(timeout)
    except OverflowError:  # an int past the floats: as long as it takes, or no wait
        return None if timeout > 0 else 0.0
    if math.isnan(seconds):
        raise ValueError("timeout must be a number of seconds or None, got nan")
    # (past TIMEOUT_MAX a lock's wait raises OverflowError)
    return None if seconds >= threading.TIMEOUT_MAX else max(seconds, 0.0)


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
