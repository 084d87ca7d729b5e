import asyncio

import numpy as np
import pytest

from async_search.batchers import BatchSizeBatcher
from async_search.errors import ModelOutputError
from async_search.servers.responses import ResponseRouter


async def test_split_request_is_reassembled_when_batches_finish_out_of_order():
    loop = asyncio.get_running_loop()
    batcher = BatchSizeBatcher(3)
    futures = [loop.create_future() for _ in range(2)]
    batcher.extend([np.arange(2), np.arange(100, 107)], futures)
    batches = []
    while not batcher.empty():
        batches.append(batcher.pop_parts())
    router = ResponseRouter()
    for popped in reversed(batches):  # the last batch comes back first
        assert router.deliver(popped, popped.batch * 2, version=0) is None
    assert futures[0].result().tolist() == [0, 2]
    assert futures[1].result().tolist() == list(range(200, 214, 2))


async def test_router_reports_wrong_row_count_without_resolving():
    loop = asyncio.get_running_loop()
    batcher = BatchSizeBatcher(4)
    fut = loop.create_future()
    batcher.extend([np.arange(3)], [fut])
    popped = batcher.pop_parts()
    error = ResponseRouter().deliver(popped, np.zeros(2), version=0)
    assert isinstance(error, ModelOutputError) and not fut.done()


async def test_router_records_versions_only_for_requests_that_want_them():
    loop = asyncio.get_running_loop()
    batcher = BatchSizeBatcher(4)
    wanted, other = loop.create_future(), loop.create_future()
    batcher.extend([np.arange(1), np.arange(1)], [wanted, other])
    router = ResponseRouter()
    router.want_version(wanted)
    router.deliver(batcher.pop_parts(), np.zeros(2), version="v7")
    assert router.pop_version(wanted) == "v7" and router.pop_version(other) is None


async def test_fail_sets_the_error_on_every_request_of_the_batch():
    loop = asyncio.get_running_loop()
    batcher = BatchSizeBatcher(4)
    futures = [loop.create_future() for _ in range(2)]
    batcher.extend([np.arange(1), np.arange(2)], futures)
    ResponseRouter().fail(batcher.pop_parts(), KeyError("boom"))
    for fut in futures:
        with pytest.raises(KeyError):
            fut.result()
