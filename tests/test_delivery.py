import asyncio

import numpy as np
import pytest

from async_search.batchers import BatchSizeBatcher
from async_search.delivery import ResultDelivery
from async_search.wire import RowsFailed
from async_search.errors import ModelOutputError, ModelRaisedError


async def test_split_request_is_reassembled_when_batches_finish_out_of_order():
    loop = asyncio.get_running_loop()
    batcher = BatchSizeBatcher(3)
    futures = [loop.create_future() for _ in range(2)]
    batcher.extend([np.arange(2), np.arange(100, 107)], futures)
    batches = []
    while not batcher.empty():
        batches.append(batcher.pop_parts())
    router = ResultDelivery()
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
    error = ResultDelivery().deliver(popped, np.zeros(2), version=0)
    assert isinstance(error, ModelOutputError) and not fut.done()


async def test_router_records_versions_only_for_requests_that_want_them():
    loop = asyncio.get_running_loop()
    batcher = BatchSizeBatcher(4)
    wanted, other = loop.create_future(), loop.create_future()
    batcher.extend([np.arange(1), np.arange(1)], [wanted, other])
    router = ResultDelivery()
    router.want_version(wanted)
    router.deliver(batcher.pop_parts(), np.zeros(2), version="v7")
    assert router.pop_version(wanted) == "v7" and router.pop_version(other) is None


async def test_fail_sets_the_error_on_every_request_of_the_batch():
    loop = asyncio.get_running_loop()
    batcher = BatchSizeBatcher(4)
    futures = [loop.create_future() for _ in range(2)]
    batcher.extend([np.arange(1), np.arange(2)], futures)
    ResultDelivery().fail(batcher.pop_parts(), KeyError("boom"))
    for fut in futures:
        with pytest.raises(KeyError):
            fut.result()


def split_batches(loop, sizes, batch_size):
    batcher = BatchSizeBatcher(batch_size)
    futures = [loop.create_future() for _ in sizes]
    batcher.extend([np.arange(n, dtype=np.float32) for n in sizes], futures)
    batches = []
    while not batcher.empty():
        batches.append(batcher.pop_parts())
    return futures, batches


@pytest.mark.parametrize("failed_first", [True, False])
async def test_a_failed_batch_drops_the_pieces_its_requests_have_in_other_batches(
        failed_first):
    loop = asyncio.get_running_loop()
    futures, (first, second) = split_batches(loop, [2, 5], 4)  # [2 + 2 of 5], [3 of 5]
    router = ResultDelivery()
    if failed_first:
        router.fail(first, ArithmeticError("first batch"))
        assert router.deliver(second, second.batch * 2, version=0) is None
    else:
        assert router.deliver(first, first.batch * 2, version=0) is None
        assert router.held == 1
        router.fail(second, ArithmeticError("second batch"))
    assert router.held == 0
    assert isinstance(futures[1].exception(), ArithmeticError)


@pytest.mark.parametrize("failed_first", [True, False])
async def test_a_rowwise_request_keeps_the_rows_of_its_batches_that_did_not_fail(
        failed_first):
    loop = asyncio.get_running_loop()
    futures, batches = split_batches(loop, [2, 9], 4)  # [2 + 2 of 9], [4 of 9], [3 of 9]
    router = ResultDelivery()
    router.want_rowwise(futures[1])
    order = [1, 0, 2] if failed_first else [0, 2, 1]
    for i in order:
        if i == 1:
            router.fail(batches[i], ArithmeticError("the middle batch"))
            continue
        assert router.deliver(batches[i], batches[i].batch * 2, version=0) is None
    error = futures[1].exception()
    assert isinstance(error, RowsFailed) and isinstance(error.error, ArithmeticError)
    assert error.failed == [(2, 4)]  # rows 2..5 of the request
    assert [(offset, out.tolist()) for offset, out in error.computed] == [
        (0, [0.0, 2.0]), (6, [12.0, 14.0, 16.0])]
    assert futures[0].result().tolist() == [0.0, 2.0]  # not rowwise, not split: as ever
    assert router.held == 0


async def test_a_rowwise_request_whose_every_batch_failed_fails_with_the_error():
    loop = asyncio.get_running_loop()
    futures, batches = split_batches(loop, [6], 4)
    router = ResultDelivery()
    router.want_rowwise(futures[0])
    for i, popped in enumerate(batches):
        router.fail(popped, ArithmeticError(f"batch {i}"))
    assert type(futures[0].exception()) is ArithmeticError
    assert str(futures[0].exception()) == "batch 0" and router.held == 0


async def test_a_rowwise_request_with_no_failed_batch_is_delivered_whole():
    loop = asyncio.get_running_loop()
    futures, batches = split_batches(loop, [6], 4)
    router = ResultDelivery()
    router.want_rowwise(futures[0])
    for popped in reversed(batches):
        assert router.deliver(popped, popped.batch * 2, version=0) is None
    assert futures[0].result().tolist() == [0, 2, 4, 6, 8, 10]


async def test_a_rowwise_request_cancelled_between_batches_keeps_nothing():
    loop = asyncio.get_running_loop()
    futures, batches = split_batches(loop, [6], 4)
    router = ResultDelivery()
    router.want_rowwise(futures[0])
    router.fail(batches[0], ArithmeticError("first"))
    assert router.held == 1
    futures[0].cancel()
    await asyncio.sleep(0)  # done callbacks run
    router.deliver(batches[1], batches[1].batch * 2, version=0)
    assert router.held == 0 and not router._failed_rows and not router._rowwise


async def test_held_pieces_return_to_zero_after_many_partial_failures():
    loop = asyncio.get_running_loop()
    router = ResultDelivery()
    futures, batches = split_batches(loop, [5, 7, 3, 9, 6, 4, 8] * 40, 8)
    for i, popped in enumerate(batches):
        if i % 3 == 0:
            router.fail(popped, ArithmeticError(f"batch {i}"))
        else:
            assert router.deliver(popped, popped.batch * 2, version=0) is None
    assert router.held == 0
    assert all(fut.done() for fut in futures)


@pytest.mark.parametrize("first, later", [
    (np.zeros((2, 3)), (np.zeros((2, 3)), np.zeros((2, 3)))),
    (np.zeros((2, 3)), {"a": np.zeros((2, 3)), "b": np.zeros((2, 3))}),
    ((np.zeros((2, 3)), np.zeros(2)), np.zeros((2, 3))),
    ((np.zeros((2, 3)), np.zeros(2)), (np.zeros(2), np.zeros((2, 3)))),
    ({"p": np.zeros((2, 3))}, {"q": np.zeros((2, 3))}),
    (np.zeros((2, 3)), np.zeros((2, 4))),
    (np.zeros((2, 3), np.float32), np.zeros((2, 3), np.int32)),
])
async def test_outputs_that_change_structure_fail_their_batch_and_resolve_nothing(
        first, later):
    loop = asyncio.get_running_loop()
    router = ResultDelivery()
    futures, (popped,) = split_batches(loop, [1, 1], 4)
    assert router.deliver(popped, first, version=0) is None
    futures, (popped,) = split_batches(loop, [1, 1], 4)
    error = router.deliver(popped, later, version=0)
    assert isinstance(error, ModelOutputError)
    assert "expected" in str(error) and "got" in str(error)
    assert not any(fut.done() for fut in futures)


async def test_outputs_of_a_dtype_of_the_same_kind_are_cast_to_the_expected_one():
    loop = asyncio.get_running_loop()
    router = ResultDelivery(np.zeros((0, 2), np.float32))  # a declared float32 spec
    futures, (popped,) = split_batches(loop, [1, 2], 4)
    assert router.deliver(popped, np.ones((3, 2), np.float64), version=0) is None
    assert [fut.result().dtype for fut in futures] == [np.float32, np.float32]


@pytest.mark.parametrize("raised", [StopIteration("done"), asyncio.CancelledError(),
                                    SystemExit(3), KeyboardInterrupt()])
async def test_fail_wraps_what_a_future_cannot_carry(raised):
    loop = asyncio.get_running_loop()
    futures, (popped,) = split_batches(loop, [1, 2], 4)
    ResultDelivery().fail(popped, raised)
    for fut in futures:
        error = fut.exception()
        assert isinstance(error, ModelRaisedError) and error.__cause__ is raised
        assert type(raised).__name__ in str(error)


async def test_a_batch_of_zero_element_requests_neither_sets_nor_breaks_the_structure():
    loop = asyncio.get_running_loop()
    router = ResultDelivery()
    futures, (empty,) = split_batches(loop, [0, 0], 4)
    assert router.deliver(empty, np.zeros(0), version=0) is None  # a degenerate model
    assert router.structure is None and futures[0].result().shape == (0,)
    futures, (popped,) = split_batches(loop, [2], 4)
    assert router.deliver(popped, np.zeros((2, 3)), version=0) is None
    futures, (empty,) = split_batches(loop, [0], 4)
    assert router.deliver(empty, np.zeros(0), version=0) is None
    assert futures[0].result().shape == (0, 3)
