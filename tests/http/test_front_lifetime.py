"""FrontLifetime: leaving a front's context, or aclose, runs its exit stack once."""

from __future__ import annotations

import asyncio
import contextlib

from async_search.http.front_lifetime import FrontLifetime


class _Front(FrontLifetime):
    def __init__(self, log: list):
        self.log = log

    async def __aenter__(self):
        stack = contextlib.AsyncExitStack()
        stack.callback(self.log.append, "drained")
        self._exit = stack
        return self


def test_leaving_the_context_drains_once_after_aclose():
    log: list = []

    async def main():
        async with _Front(log) as front:
            await asyncio.gather(front.aclose(), front.aclose())
            assert log == ["drained"]

    asyncio.run(main())
    assert log == ["drained"]


def test_a_front_never_entered_closes_without_error():
    asyncio.run(_Front([]).aclose())
