import asyncio

import pytest


@pytest.fixture
def plain_loop():
    """A current event loop that is not running: what the prototype's callers had."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()
    asyncio.set_event_loop(None)
