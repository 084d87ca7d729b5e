"""A rowwise request some of whose rows the model's check_values refuses."""

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import async_search as asr
from async_search.errors import InputSpecError
from async_search.servers.refused_rows import refused_rows, rows_failed
from async_search.wire import RowsFailed

pytestmark = pytest.mark.timeout(60)


def refuse_negative(x):
    if (x < 0).any():
        raise InputSpecError("negative values are not taken")


class NonNegative:
    """x + 1; refuses negative values; fails any batch that holds a 99."""

    input_spec = asr.TensorSpec((1,), np.float32)

    def __call__(self, x):
        if (x == 99).any():
            raise RuntimeError("the model failed")
        return x + 1.0

    def check_values(self, x):
        refuse_negative(x)


ERRORS = [ValueError("a"), InputSpecError("b")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([None, 0, 1]), min_size=1, max_size=30).filter(
    lambda marks: any(m is not None for m in marks)))
def test_rows_failed_puts_every_row_in_exactly_one_range_or_piece_in_order(marks):
    errors = [None if m is None else ERRORS[m] for m in marks]
    failed = np.array([m is not None for m in marks])
    outputs = {"v": np.flatnonzero(~failed).astype(float)}  # each row's own index
    codes = np.array([-1 if m is None else m for m in marks])
    answer = rows_failed(codes, ERRORS, outputs if not failed.all() else None, version=3)
    covered = np.zeros(len(failed), int)
    for k, (offset, count) in enumerate(answer.failed):
        assert count > 0 and all(e is answer.error_of(k) for e in errors[offset:offset + count])
        covered[offset:offset + count] += 1
    for offset, piece in answer.computed:
        rows_here = np.arange(offset, offset + len(piece["v"]))
        assert piece["v"].tolist() == rows_here.tolist()  # the right rows, in place
        covered[rows_here] += 1
    assert (covered == 1).all() and answer.version == 3
    assert answer.failed == sorted(answer.failed)
    assert [o for o, _ in answer.computed] == sorted(o for o, _ in answer.computed)


def test_refused_rows_marks_the_rows_it_refuses_and_none_when_none_or_all_are():
    x = np.array([[1.0], [-1.0], [2.0], [-3.0]], np.float32)
    assert refused_rows(x, refuse_negative).tolist() == [False, True, False, True]
    assert refused_rows(abs(x), refuse_negative) is None
    assert refused_rows(-abs(x) - 1, refuse_negative) is None
    assert refused_rows(np.float32(1.0), refuse_negative) is None


async def test_a_rowwise_request_serves_the_rows_that_check_values_takes():
    async with asr.serve(NonNegative(), max_batch_size=64) as evaluate:
        x = np.array([[1.0], [-1.0], [-2.0], [3.0], [4.0], [-5.0]], np.float32)
        with pytest.raises(RowsFailed) as info:
            await asyncio.wait_for(evaluate.call_with_version(x, rowwise=True), 10)
        answer = info.value
        assert isinstance(answer.error, InputSpecError)
        assert answer.failed == [(1, 2), (5, 1)]
        assert [(o, p.ravel().tolist()) for o, p in answer.computed] == [
            (0, [2.0]), (3, [4.0, 5.0])]
        assert answer.version == evaluate.version
        # Not rowwise, the whole request fails as before, and so does one row alone.
        with pytest.raises(InputSpecError):
            evaluate.call_with_version(x)
        with pytest.raises(InputSpecError):
            evaluate.call_with_version(x[1:2], rowwise=True)
        assert evaluate.stats["failed_batches"] == 0


@pytest.mark.parametrize("max_batch_size", [1, 64])
async def test_refused_rows_keep_their_error_beside_rows_whose_batch_fails(max_batch_size):
    async with asr.serve(NonNegative(), max_batch_size=max_batch_size) as evaluate:
        x = np.array([[-1.0], [99.0], [2.0], [-3.0]], np.float32)
        with pytest.raises(RowsFailed) as info:
            await asyncio.wait_for(evaluate.call_with_version(x, rowwise=True), 10)
    answer = info.value
    errors = {row: answer.error_of(k) for k, (offset, count) in enumerate(answer.failed)
              for row in range(offset, offset + count)}
    assert isinstance(errors[0], InputSpecError) and isinstance(errors[3], InputSpecError)
    assert isinstance(errors[1], RuntimeError) and "the model failed" in str(errors[1])
    if max_batch_size == 1:  # row 2 had a batch of its own
        assert [(o, p.ravel().tolist()) for o, p in answer.computed] == [(2, [3.0])]
    else:  # with the poisoned row: failed too
        assert answer.computed == [] and errors[2] is errors[1]


async def test_cancelling_a_partly_refused_request_drops_the_rows_it_served():
    model = NonNegative()
    async with asr.serve(model, max_batch_size=64, max_delay=0.2) as evaluate:
        x = np.array([[1.0], [-1.0], [2.0]], np.float32)
        fut = evaluate.call_with_version(x, rowwise=True)
        await asyncio.sleep(0)
        fut.cancel()
        answer = await asyncio.wait_for(evaluate(np.ones((1, 1), np.float32)), 10)
        assert answer.tolist() == [[2.0]]
        assert evaluate.stats["elements"] == 1  # the cancelled rows never ran
