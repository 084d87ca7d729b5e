import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_search import batchers
from async_search.batchers import BatchManager, BatchSizeBatcher, CostBatcher, FairBatcher
from async_search.errors import ModelOutputError
from tests.helpers import requests_of


def model(x):
    return x * 3 + 1


def run_manager(manager, requests, fn=model):
    for x in requests:
        manager.add_inputs(x)
    outputs, batches = [], []
    while not manager.empty():
        batch = manager.pop_batch()
        batches.append(batch)
        outputs.extend(manager.process_output(fn(batch)))
    return outputs, batches


def test_seed_example_gives_batches_8_8_2_and_responses_5_4_6_3():
    manager = BatchManager(BatchSizeBatcher(8))
    requests = requests_of((5, 4, 6, 3))
    outputs, batches = run_manager(manager, requests)
    assert [len(b) for b in batches] == [8, 8, 2]
    assert [len(y) for y in outputs] == [5, 4, 6, 3]
    for x, y in zip(requests, outputs):
        np.testing.assert_array_equal(y, model(x))


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), max_size=30), batch_size=st.integers(1, 64))
def test_batch_manager_returns_model_outputs_request_by_request(sizes, batch_size):
    requests = requests_of(sizes)
    outputs, batches = run_manager(BatchManager(BatchSizeBatcher(batch_size)), requests)
    assert len(outputs) == len(requests)
    for x, y in zip(requests, outputs):
        np.testing.assert_array_equal(y, model(x))
    assert all(len(b) <= batch_size for b in batches)
    # Every batch but the last is full: nothing is sent short while more is queued.
    assert all(len(b) == batch_size for b in batches[:-1])


@settings(max_examples=200, deadline=None)
@given(costs=st.lists(st.lists(st.integers(0, 12), max_size=8), max_size=20),
       max_cost=st.integers(1, 30))
def test_cost_batcher_bounds_batch_cost_and_returns_model_outputs(costs, max_cost):
    # Each element is [cost, id]; the cost function reads column 0.
    requests, next_id = [], 0
    for request_costs in costs:
        ids = np.arange(next_id, next_id + len(request_costs))
        next_id += len(request_costs)
        requests.append(np.stack([np.array(request_costs, np.int64).reshape(-1), ids], 1)
                        if request_costs else np.zeros((0, 2), np.int64))
    manager = BatchManager(CostBatcher(max_cost, cost_fn=lambda x: x[:, 0]))
    outputs, batches = run_manager(manager, requests)
    for x, y in zip(requests, outputs):
        np.testing.assert_array_equal(y, model(x))
    for b in batches:
        assert b[:, 0].sum() <= max_cost or len(b) == 1
    ids = np.concatenate([b[:, 1] for b in batches]) if batches else []
    np.testing.assert_array_equal(ids, np.arange(next_id))


def test_cost_batcher_sends_an_element_over_budget_alone():
    batcher = CostBatcher(5, cost_fn=lambda x: x)
    batcher.extend([np.array([2]), np.array([9]), np.array([1])])
    assert [batcher.pop().tolist() for _ in range(3)] == [[2], [9], [1]]


def test_cost_batcher_rejects_cost_fn_with_wrong_length():
    batcher = CostBatcher(5, cost_fn=lambda x: np.ones(len(x) + 1))
    with pytest.raises(ValueError, match="one cost per element"):
        batcher.append(np.zeros(3))


def test_zero_element_request_resolves_with_empty_output_of_right_shape():
    manager = BatchManager(BatchSizeBatcher(4))
    requests = [np.zeros((0, 3), np.float32)]
    outputs, batches = run_manager(manager, requests, fn=lambda x: x.sum(axis=1, keepdims=True))
    assert len(outputs) == 1 and outputs[0].shape == (0, 1)


def test_zero_element_requests_after_a_full_batch_ride_along():
    batcher = BatchSizeBatcher(2)
    for n in (2, 0, 0, 1):
        batcher.append(np.zeros((n, 1)), tag=n)
    first = batcher.pop_parts()
    assert len(first.batch) == 2 and first.tags == [2, 0, 0]
    assert batcher.pop_parts().tags == [1]


def test_request_split_across_batches_reports_head_and_tail():
    batcher = BatchSizeBatcher(4)
    batcher.append(np.arange(10), tag="a")
    first = batcher.pop_parts()
    assert first.tags == ["a"] and not first.head_continues and first.tail_size == 10
    second = batcher.pop_parts()
    assert second.head_continues and second.tail_size == 10
    third = batcher.pop_parts()
    assert third.head_continues and third.tail_size is None
    assert third.batch.tolist() == [8, 9] and batcher.empty()


def test_pop_parts_drops_requests_the_predicate_selects():
    batcher = BatchSizeBatcher(3)
    for tag in "abcde":
        batcher.append(np.array([ord(tag)]), tag=tag)
    popped = batcher.pop_parts(drop=lambda tag: tag in "bd")
    assert popped.tags == ["a", "c", "e"]
    assert batcher.empty() and batcher.queued == 0


@pytest.mark.parametrize("make", [BatchSizeBatcher, FairBatcher])
def test_pop_parts_drops_the_rest_of_a_request_already_part_batched(make):
    """A request cancelled (or failed) after its first piece left: its rest is not
    computed, and the requests behind it are batched as if it had never been."""
    batcher = make(2)
    batcher.extend([np.arange(3), np.array([7]), np.array([8])], ["a", "b", "c"])
    assert batcher.pop_parts().batch.tolist() == [0, 1]
    popped = batcher.pop_parts(drop=lambda tag: tag == "a")
    assert popped.tags == ["b", "c"] and popped.batch.tolist() == [7, 8]
    assert not popped.parts
    with pytest.raises(IndexError):  # what is left of "a" (FairBatcher: behind) goes
        batcher.pop_parts(drop=lambda tag: tag == "a")
    assert batcher.empty() and batcher.queued == 0


def test_pop_from_empty_batcher_raises_index_error():
    with pytest.raises(IndexError):
        BatchSizeBatcher(2).pop()


def test_batch_size_must_be_positive_integer():
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        BatchSizeBatcher(0)


@pytest.mark.parametrize("bad", [True, False, 2.0, "8", None])
def test_batch_size_refuses_a_bool_or_anything_but_an_integer(bad):
    message = f"batch_size must be an integer >= 1, got {bad!r}"
    with pytest.raises(ValueError, match=message):
        BatchSizeBatcher(bad)


def test_batch_size_takes_a_numpy_integer_as_a_python_int():
    assert type(BatchSizeBatcher(np.int64(8)).budget) is int


@pytest.mark.parametrize("bad", [True, 0, -1.0, float("nan"), None])
def test_cost_batcher_refuses_a_bool_or_a_budget_not_above_zero(bad):
    with pytest.raises(ValueError, match="max_cost must be a finite number > 0"):
        CostBatcher(bad, cost_fn=len)


def test_has_full_batch_counts_elements_not_requests():
    batcher = BatchSizeBatcher(4)
    batcher.append(np.zeros(3))
    assert not batcher.has_full_batch()
    batcher.append(np.zeros(1))
    assert batcher.has_full_batch()


def test_cost_batcher_extend_queues_nothing_when_cost_fn_raises():
    def cost(x):
        if (x < 0).any():
            raise ZeroDivisionError("no cost")
        return np.ones(len(x))

    b = CostBatcher(10, cost)
    b.extend([np.zeros(2)], ["a"])
    with pytest.raises(ZeroDivisionError):
        b.extend([np.ones(3), -np.ones(1), np.ones(2)], ["b", "c", "d"])
    assert len(b) == 1 and b.queued == 2
    assert b.pop_parts().tags == ["a"]


def test_pop_parts_that_cannot_build_its_batch_leaves_every_request_queued():
    b = BatchSizeBatcher(4)
    b.extend([np.zeros((3, 2)), np.ones((3, 2))], ["a", "b"])

    def broken(rows, like):
        raise MemoryError("no buffer")

    with pytest.raises(MemoryError):
        b.pop_parts(out=broken)
    assert len(b) == 2 and b.queued == 6
    popped = b.pop_parts()
    assert popped.tags == ["a", "b"] and len(popped.batch) == 4


@pytest.mark.parametrize("later, message", [
    (lambda y: (y, y), r"expected an array \[n, 2\] int64, got a tuple of 2 outputs"),
    (lambda y: y[:, :1], r"expected an array \[n, 2\] int64, got an array \[n, 1\] int64"),
    (lambda y: y.astype(np.float64), r"got an array \[n, 2\] float64"),
])
def test_batch_manager_refuses_outputs_that_change_structure(later, message):
    manager = BatchManager(BatchSizeBatcher(4))
    for x in requests_of((3, 3)):
        manager.add_inputs(x)
    assert len(manager.process_output(model(manager.pop_batch()))) == 1
    with pytest.raises(ModelOutputError, match=message):
        manager.process_output(later(model(manager.pop_batch())))


def test_batch_manager_casts_outputs_to_the_first_batch_dtype_of_the_same_kind():
    manager = BatchManager(BatchSizeBatcher(2))
    for x in requests_of((2, 2)):
        manager.add_inputs(x)
    first = manager.process_output(model(manager.pop_batch()))
    second = manager.process_output(model(manager.pop_batch()).astype(np.int32))
    assert first[0].dtype == second[0].dtype == np.int64


uniform_requests = st.tuples(
    st.lists(st.integers(0, 5), min_size=1, max_size=12),   # request sizes
    st.sampled_from([(), (3,), (2, 2)]),                      # element shape
    st.sampled_from([np.float32, np.int64, ">f8", np.bool_]),  # dtype, byte order too
    st.integers(1, 16),                                       # batch size
    st.booleans())                                            # a non-contiguous request


@given(uniform_requests)
@settings(max_examples=60, deadline=None)
def test_uniform_batches_joined_from_bytes_equal_concatenated_ones(case):
    sizes, shape, dtype, batch_size, strided = case
    requests = [(np.arange(n * int(np.prod(shape))) + i).astype(dtype).reshape(n, *shape)
                for i, n in enumerate(sizes)]
    if strided and requests[0].ndim > 1 and len(requests[0]):
        requests[0] = np.asfortranarray(np.repeat(requests[0], 2, axis=0))[::2]
    joined, plain = BatchSizeBatcher(batch_size), BatchSizeBatcher(batch_size)
    joined.extend(requests, list(range(len(requests))))
    plain.extend(requests, list(range(len(requests))))
    while not plain.empty():
        a, b = joined.pop_parts(uniform=True), plain.pop_parts()
        # np.concatenate makes the byte order native; a joined batch keeps the requests'.
        assert a.tags == b.tags and np.can_cast(a.batch.dtype, b.batch.dtype, "equiv")
        np.testing.assert_array_equal(a.batch, b.batch)
    assert joined.empty()


def test_uniform_batch_of_objects_falls_back_to_concatenate():
    b = BatchSizeBatcher(8)
    b.extend([np.array([[None, 1]], dtype=object), np.array([["x", 2]], dtype=object)])
    assert b.pop_parts(uniform=True).batch.tolist() == [[None, 1], ["x", 2]]


def test_batches_over_the_join_limit_are_built_in_the_pooled_buffer(monkeypatch):
    monkeypatch.setattr(batchers, "JOIN_BELOW_BYTES", 16)
    b = BatchSizeBatcher(8)
    b.extend([np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32)])
    buffer = np.empty((8, 2), np.float32)
    popped = b.pop_parts(out=lambda rows, like: buffer, uniform=True)
    assert popped.buffer is buffer and np.shares_memory(popped.batch, buffer)
    assert popped.batch.tolist() == [[1, 1], [1, 1], [0, 0], [0, 0]]
