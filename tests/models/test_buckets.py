import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_search.base import TensorSpec
from async_search.errors import InputSpecError, ModelOutputError
from async_search.models.buckets import (BucketedModel, PaddedBatches, adapter_spec,
                                         bucket_sizes, host_rows, power_of_two_sizes,
                                         run_in_chunks)

pytestmark = pytest.mark.timeout(120)


def test_power_of_two_sizes_end_at_the_maximum():
    assert power_of_two_sizes(1) == (1,)
    assert power_of_two_sizes(8) == (1, 2, 4, 8)
    assert power_of_two_sizes(12) == (1, 2, 4, 8, 12)
    with pytest.raises(ValueError, match="got 0"):
        power_of_two_sizes(0)
    with pytest.raises(ValueError,
                       match="max_batch_size must be an integer >= 1, got True"):
        power_of_two_sizes(True)



def test_bucket_sizes_are_sorted_without_duplicates_and_checked():
    assert bucket_sizes(8) == (1, 2, 4, 8)
    assert bucket_sizes(None, (64, 8, 8, 1)) == (1, 8, 64)
    assert bucket_sizes(64, (64, 8, 8, 1)) == (1, 8, 64)
    assert bucket_sizes() == bucket_sizes(1024)


def test_max_batch_size_is_checked_and_bounds_the_batch_sizes_given_with_it():
    # With batch_sizes, max_batch_size was not even checked, and sizes over it were
    # passed to the net though the docs call it the largest batch passed at once.
    with pytest.raises(ValueError, match=r"batch_sizes go up to 64, over max_batch_size=8"):
        bucket_sizes(8, (64, 8))
    for bad in (0, -5, "x", 2.5):
        with pytest.raises(ValueError, match="max_batch_size must be an integer >= 1"):
            bucket_sizes(bad, (4,))
    with pytest.raises(ValueError,
                       match=r"batch_sizes\[1\] must be an integer >= 1, got 0"):
        bucket_sizes(8, (4, 0))
    with pytest.raises(ValueError, match="got True"):
        bucket_sizes(8, (True,))
    assert bucket_sizes(8, (2 ** i for i in range(3))) == (1, 2, 4)  # any iterable
    for nothing in ((), [], "", "8", iter(()), 8, 2.5, {}, np.array(8)):  # no powers of two, characters, keys
        with pytest.raises(ValueError, match="at least one integer"):
            bucket_sizes(8, nothing)


def test_a_batch_goes_to_the_smallest_bucket_that_holds_it():
    padded = PaddedBatches(TensorSpec((2,), np.float32), (1, 4, 16))
    assert [padded.bucket(n) for n in (0, 1, 2, 4, 5, 16, 17)] == [1, 1, 4, 4, 16, 16, 16]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 16), min_size=1, max_size=12))
def test_pad_rows_are_zero_whatever_came_before(sizes):
    padded = PaddedBatches(TensorSpec((3,), np.int32), (1, 2, 4, 8, 16))
    for k, n in enumerate(sizes):
        batch = np.full((n, 3), k + 1, np.int32)
        buffer, size = padded.pad(batch)
        assert size == padded.bucket(max(n, 1)) and buffer.shape == (size, 3)
        np.testing.assert_array_equal(buffer[:n], batch)
        assert not buffer[n:].any(), "rows of an earlier batch left in the padding"


def test_a_bucket_reuses_its_buffer_and_clears_only_what_was_written():
    allocated = []

    def allocate(shape, dtype):
        allocated.append(shape)
        return np.zeros(shape, dtype)

    padded = PaddedBatches(TensorSpec((2,), np.float32), (8,), allocate)
    first, _ = padded.pad(np.ones((5, 2), np.float32))
    first[6:] = 7  # rows no batch wrote: left as they are (a caller's poison, say)
    second, _ = padded.pad(np.ones((2, 2), np.float32))
    assert second is first and allocated == [(8, 2)]
    assert not second[2:5].any() and (second[6:] == 7).all()


def test_large_batches_run_in_chunks_of_the_largest_bucket():
    seen = []

    def run(chunk):
        seen.append(len(chunk))
        return chunk * 2, chunk.sum(axis=1)

    x = np.arange(42).reshape(21, 2)
    doubled, extra = run_in_chunks(x, 8, run)
    assert seen == [8, 8, 5]
    np.testing.assert_array_equal(doubled, x * 2)
    np.testing.assert_array_equal(extra, x.sum(axis=1))
    assert run_in_chunks(x[:8], 8, run)[0].shape == (8, 2) and seen[-1] == 8


def test_a_batch_that_fills_its_bucket_may_run_without_a_copy():
    padded = PaddedBatches(TensorSpec((2,), np.float32), (1, 4))
    exact = np.ones((4, 2), np.float32)
    assert padded.pad(exact, copy=False)[0] is exact
    assert padded.pad(exact)[0] is not exact  # copy=True (the default) always copies
    for other in (np.ones((3, 2), np.float32), np.ones((4, 2), np.float64),
                  np.ones((2, 4), np.float32).T, np.ones((4, 2), np.float32)[::-1]):
        assert padded.pad(other, copy=False)[0] is not other
    frozen = np.ones((4, 2), np.float32)
    frozen.flags.writeable = False
    assert padded.pad(frozen, copy=False)[0] is not frozen


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 6), pad=st.integers(0, 3),
       dtype=st.sampled_from([np.float16, np.float32, np.int16, np.int64, np.bool_]))
def test_host_rows_are_the_batchs_rows_with_reduced_floats_widened(n, pad, dtype):
    size = max(n, 1) + pad
    out = (np.arange(size * 3).reshape(size, 3) % 5).astype(dtype)
    rows = host_rows(out, n, size)
    np.testing.assert_array_equal(rows, out[:n])
    assert rows.dtype == (np.float32 if dtype is np.float16 else dtype)
    for wrong in (out[:-1], np.concatenate([out, out[:1]]), np.asarray(out[0, 0])):
        with pytest.raises(ModelOutputError, match="row"):
            host_rows(wrong, n, size)


class Doubling(BucketedModel):
    batch_sizes = (1, 4)
    input_spec = TensorSpec((2,), np.float32)

    def __init__(self):
        self.runs = []

    def _run(self, batch):
        self.runs.append(len(batch))
        return batch * 2


def test_a_bucketed_model_checks_each_batch_before_it_runs():
    model = Doubling()
    for bad in (np.ones(2, np.float32), np.ones((3, 2), np.float64), np.ones((3, 3), np.float32),
                np.float32(1.0), [[1.0, 2.0]], None):
        with pytest.raises(InputSpecError):
            model(bad)
    assert model.runs == []
    np.testing.assert_array_equal(model(np.ones((6, 2), np.float32)), np.full((6, 2), 2.0))
    assert model.runs == [4, 2]
    subclass = np.ma.masked_array(np.ones((1, 2), np.float32), mask=False)
    assert type(model(subclass)) is np.ndarray  # a plain view, as a server makes it
    swapped = np.ones((1, 2), np.dtype(np.float32).newbyteorder())
    assert model(swapped).dtype == np.float32  # the same values in this byte order


def test_an_adapter_spec_must_be_a_tensor_spec():
    spec = TensorSpec((2,), np.float32)
    assert adapter_spec(spec) is spec
    for bad in (None, (2,), np.float32, "float32"):
        with pytest.raises(TypeError, match="TensorSpec"):
            adapter_spec(bad)
