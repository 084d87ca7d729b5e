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


def test_until_answered_ends_with_the_handlers_the_grace_or_its_time():
    import time

    from async_search.http.front_lifetime import until_answered

    async def main():
        loop = asyncio.get_running_loop()
        quick = asyncio.ensure_future(asyncio.sleep(0.05))
        slow = asyncio.ensure_future(asyncio.sleep(30))
        never = loop.create_future()
        began = time.monotonic()
        await until_answered({quick}, never, 10)  # the handlers are done
        assert quick.done() and time.monotonic() - began < 5
        began = time.monotonic()
        await until_answered({slow}, never, 0.1)  # the time is up
        assert 0.09 < time.monotonic() - began < 5
        ended = loop.create_future()
        loop.call_later(0.05, ended.set_result, None)  # a second signal
        began = time.monotonic()
        await until_answered({slow}, ended, 10)
        assert time.monotonic() - began < 5 and not slow.done()
        slow.cancel()

    asyncio.run(main())
