"""Waiting in tests: await a condition with a bound, never sleep and hope.

A test that needs something to have happened (a request reached the model, a server
marked a connection busy) waits for exactly that with ``wait_until``; the timeout only
stops a hang, and when it runs out the error names the condition. No test asserts how
long something took: speed belongs in ``benchmarks/``.
"""

import asyncio
import threading
from typing import Any, Awaitable, Callable, List, Optional, Sequence

import numpy as np

__all__ = ["WAIT_S", "wait_until", "within", "requests_of", "failures_in_threads"]

#: The default bound on a wait: long enough for a loaded CI machine, short enough that
#: a missing event fails the test instead of hanging it.
WAIT_S = 10.0


async def wait_until(predicate: Callable[[], Any], what: Optional[str] = None, *,
                     timeout: float = WAIT_S, interval: float = 0.001) -> None:
    """Returns as soon as ``predicate()`` is true, checking it at once and then every
    ``interval`` seconds (the event loop runs in between).

    Raises:
        TimeoutError: naming ``what`` (or the predicate) when it is still false after
            ``timeout`` seconds.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() >= deadline:
            name = what or getattr(predicate, "__qualname__", repr(predicate))
            raise TimeoutError(f"still not true after {timeout} s: {name}")
        await asyncio.sleep(interval)


async def within(awaitable: Awaitable, what: str, *, timeout: float = WAIT_S) -> Any:
    """``await awaitable``, bounded: its result, or TimeoutError naming ``what``."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"did not finish within {timeout} s: {what}") from None


def requests_of(sizes, width=2):
    """Requests with distinct values, so that any mix-up shows."""
    out, start = [], 0
    for n in sizes:
        out.append(np.arange(start, start + n * width, dtype=np.int64).reshape(n, width))
        start += n * width
    return out


def failures_in_threads(work: Callable[..., Any], args: Sequence[tuple],
                        timeout: float = 120.0) -> List[BaseException]:
    """Runs ``work(*a)`` for each ``a`` of ``args``, each in a thread of its own, all at
    once; what they raised (a thread still running after ``timeout`` counts too)."""
    failures: List[BaseException] = []

    def run(a: tuple) -> None:
        try:
            work(*a)
        except Exception as e:  # noqa: BLE001 - collected for the caller to assert on
            failures.append(e)

    threads = [threading.Thread(target=run, args=(a,)) for a in args]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        if thread.is_alive():
            failures.append(TimeoutError(f"a thread ran past {timeout} s"))
    return failures


def _cannot_load():
    raise RuntimeError("this object cannot be loaded here")


class LoadsNowhere:
    """Pickles, and raises when loaded (a class the receiving process would lack)."""

    def __reduce__(self):
        return (_cannot_load, ())


def ray_server_that_served(more_than: int = 0):
    """A live server actor of the Ray run going on that has served more than
    ``more_than`` elements, or None (asks each one; an actor of an earlier run may
    still be going away)."""
    import ray

    from async_search.backends.ray_backend import SERVER_NAME_PREFIX

    for name in sorted(ray.util.list_named_actors()):
        if not name.startswith(SERVER_NAME_PREFIX):
            continue
        try:
            actor = ray.get_actor(name)
            if ray.get(actor.elements.remote(), timeout=30) > more_than:
                return actor
        except (ValueError, ray.exceptions.RayActorError):
            continue
    return None
