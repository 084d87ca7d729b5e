"""Request deadlines: ``evaluate(x, timeout=...)``, as Triton's per-request timeout.

Past its deadline a request fails with RequestTimeoutError (a TimeoutError). Where the
request waits in a queue that drops done futures (a server's batcher), it is dropped
before the model runs, as a cancelled request is: ``expire_after`` fails the future at
the deadline. An evaluate function that only awaits others (a router, a cache) bounds
the await instead: ``within_deadline`` cancels it at the deadline, which drops the
requests it made that are not batched yet.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Dict, Iterable

from async_search.checks import check_float
from async_search.errors import RequestTimeoutError


def check_timeout(timeout: Any) -> float:
    """``timeout`` as a float of seconds; ValueError unless it is a finite number > 0.

    Example:
        >>> check_timeout(0.5)
        0.5
    """
    return check_float("timeout", timeout, minimum=0, strict=True)


class Deadline:
    """The deadline ``expire_after`` set on a future: ``expire_if_due`` fails it at once
    once the deadline has passed, for a result that comes after it, before the loop has
    run the timer (a model on the loop, a loop kept busy by a search). ``registry``:
    a dict that holds it under its future until the future is done."""

    __slots__ = ("fut", "timeout", "on_expiry", "note", "timer", "registry")

    def __init__(self, fut: asyncio.Future, timeout: float,
                 on_expiry: Callable[[], None] | None, note: str,
                 registry: "Dict[asyncio.Future, Deadline] | None" = None):
        self.fut, self.timeout, self.on_expiry, self.note = fut, timeout, on_expiry, note
        self.timer = fut.get_loop().call_later(timeout, self._expire)
        self.registry = registry
        if registry is not None:
            registry[fut] = self
        fut.add_done_callback(self._done)  # one callback: the timer, the registry

    def expire_if_due(self) -> None:
        """Fails the future now if its deadline has passed and it is not done."""
        if not self.fut.done() and self.timer.when() <= self.fut.get_loop().time():
            self._expire()

    def _expire(self) -> None:
        _expire(self.fut, self.timeout, self.on_expiry, self.note)

    def _done(self, fut: asyncio.Future) -> None:
        self.timer.cancel()
        if self.registry is not None:
            self.registry.pop(fut, None)


def expire_due(deadlines: Dict[asyncio.Future, Deadline], futures: Iterable) -> None:
    """Fails each of ``futures`` whose deadline (in ``deadlines``) has passed: called
    before a batch's results are handed out, for a result that came late."""
    for fut in futures:
        deadline = deadlines.get(fut)
        if deadline is not None:
            deadline.expire_if_due()


def track_deadline(deadlines: Dict[asyncio.Future, Deadline], fut: asyncio.Future,
                   timeout: float, on_expiry: Callable[[], None] | None = None, *,
                   note: str = "") -> None:
    """``expire_after``, the deadline kept in ``deadlines`` until ``fut`` is done."""
    Deadline(fut, timeout, on_expiry, note, deadlines)


def expire_after(fut: asyncio.Future, timeout: float,
                 on_expiry: Callable[[], None] | None = None, *,
                 note: str = "") -> Deadline:
    """Fails ``fut`` with RequestTimeoutError ``timeout`` seconds from now unless it is
    done by then (the message ends with ``note``; ``on_expiry`` is called). The timer
    goes as soon as ``fut`` is done, so that nothing of the request outlives it.
    Returns the ``Deadline``, whose ``expire_if_due`` a deliverer calls before handing
    out a result that may come late.

    Example:
        >>> async def main():
        ...     fut = asyncio.get_running_loop().create_future()
        ...     expire_after(fut, 0.01)
        ...     try:
        ...         await fut
        ...     except RequestTimeoutError:
        ...         return "expired"
        >>> asyncio.run(main())
        'expired'
    """
    return Deadline(fut, timeout, on_expiry, note)


#: The message of the cancellation ``within_deadline`` sends at the deadline: what an
#: evaluate function that awaits others (a router) reads to count the timeout against
#: the server it waited on.
DEADLINE_PASSED = "async_search: the request's deadline passed"


def deadline_passed(error: BaseException) -> bool:
    """Whether ``error`` is the cancellation ``within_deadline`` sent at a deadline."""
    return isinstance(error, asyncio.CancelledError) and error.args[:1] == (
        DEADLINE_PASSED,)


async def within_deadline(awaitable: Awaitable, timeout: float) -> Any:
    """``await awaitable``, or RequestTimeoutError once ``timeout`` seconds have passed
    (the awaitable is then cancelled). A TimeoutError the awaitable raises itself, or a
    cancellation of the caller, goes on as it is.

    Example:
        >>> async def main():
        ...     fast = await within_deadline(asyncio.sleep(0, "done"), 0.5)
        ...     try:
        ...         await within_deadline(asyncio.sleep(10), 0.01)
        ...     except RequestTimeoutError:
        ...         return fast, "timed out"
        >>> asyncio.run(main())
        ('done', 'timed out')
    """
    task = asyncio.ensure_future(awaitable)
    loop = task.get_loop()
    expired = []

    def expire() -> None:
        expired.append(True)
        task.cancel(DEADLINE_PASSED)

    before = cancellations()  # the caller's own, from a cancellation it swallowed
    due = loop.time() + timeout
    timer = loop.call_later(timeout, expire)
    try:
        result = await task
    except asyncio.CancelledError:
        if not expired or not task.cancelled() or cancellations() != before:
            raise  # the caller was cancelled
        raise RequestTimeoutError(
            f"no answer within the request's timeout of {timeout:g} s") from None
    finally:
        timer.cancel()
    if expired or loop.time() >= due:
        # The answer came in the loop iteration the deadline fell in, before the timer
        # ran (a model that computes on the loop past the deadline), or the loop was
        # busy past the deadline when it came: the caller sees it late all the same.
        raise RequestTimeoutError(
            f"no answer within the request's timeout of {timeout:g} s (it came "
            f"{loop.time() - due:.3g} s late)")
    return result


def cancellations() -> int:
    """How many cancellations of the running task are pending (Python 3.11's
    ``Task.cancelling``; 0 where it cannot tell): compared before and after an await,
    it tells a cancellation of the caller from one a callee raised."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling() if cancelling is not None else 0


def _expire(fut: asyncio.Future, timeout: float, on_expiry: Callable[[], None] | None,
            note: str) -> None:
    if not fut.done():
        fut.set_exception(RequestTimeoutError(
            f"no answer within the request's timeout of {timeout:g} s{note}"))
        if on_expiry is not None:
            on_expiry()
