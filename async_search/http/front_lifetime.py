"""A front's life, the same for the HTTP and the gRPC front: what it serves once
entered, and how it ends.

A front's ``__aenter__`` starts its parts in an ``AsyncExitStack``, each pushing its
undoing, the drain last (so it runs first), and keeps the stack as ``_exit``. Leaving
the context, or ``aclose`` before that, runs the stack once: a caller may drain several
fronts at once (``asyncio.gather`` of their ``aclose``) before their contexts end.
"""

from __future__ import annotations

import asyncio
import contextlib

from typing import TYPE_CHECKING

from async_search.checks import AsyncWithOnly

if TYPE_CHECKING:
    from async_search.http.repository import ModelRepository


class FrontLifetime(AsyncWithOnly):
    """The exit of a front: ``aclose`` (and leaving the context) drains and stops it once.

    Subclasses set ``_exit`` (None until entered) and fill it in ``__aenter__``, and
    set ``_repository`` there too.

    Example:
        >>> import asyncio
        >>> class Front(FrontLifetime):
        ...     async def __aenter__(self):
        ...         self._exit = contextlib.AsyncExitStack()
        ...         self._exit.callback(print, "drained")
        ...         return self
        >>> async def main():
        ...     async with Front() as front:
        ...         await front.aclose()  # drains now; leaving the context does nothing
        >>> asyncio.run(main())
        drained
    """

    _exit: contextlib.AsyncExitStack | None = None  #: What leaving the context closes.
    _repository: "ModelRepository | None" = None  #: What it serves, once entered.

    @property
    def repository(self) -> "ModelRepository":
        """The models served (set when the front is entered: a ``GrpcFront`` beside
        an ``HttpFront`` may serve the same ones)."""
        if self._repository is None:
            raise RuntimeError(f"{type(self).__name__}.repository is set when the front "
                               f"is entered (async with)")
        return self._repository

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Drains and stops the front (what leaving its context does); a second call
        does nothing, so a caller may drain several fronts at once before their
        contexts end."""
        exit_stack, self._exit = self._exit, None
        if exit_stack is not None:
            await exit_stack.aclose()


async def until_answered(handling: set, grace_ended: "asyncio.Future", seconds: float,
                         ) -> None:
    """Returns once every task in ``handling`` (the requests in the handlers, a set the
    handlers keep) is done, ``grace_ended`` is (a second signal), or ``seconds`` passed:
    a drain's grace."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not grace_ended.done():
        waiting = [task for task in handling if not task.done()]
        left = deadline - loop.time()
        if not waiting or left <= 0:
            return
        await asyncio.wait([*waiting, grace_ended], timeout=left,
                           return_when=asyncio.FIRST_COMPLETED)


def cut_message(stopping: str, grace_ended: bool, seconds: float) -> str:
    """What a request cut by a drain is told: a second signal ended the grace, or the
    grace of ``seconds`` ran out."""
    return f"{stopping}: " + (
        "a second signal ended the shutdown grace before the request finished"
        if grace_ended else
        f"the request did not finish within the shutdown grace of {seconds:g} s")
