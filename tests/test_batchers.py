import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_search import batchers
from async_search.batchers import BatchManager, BatchSizeBatcher, CostBatcher, FairBatcher
from async_search.errors import InputSpecError, ModelOutputError
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


def test_batch_manager_refuses_a_batcher_that_reorders_split_requests():
    # A FairBatcher sends the rest of a split request to the back: read in order, its
    # outputs would go to the requests after it.
    with pytest.raises(ValueError, match="keeps that order"):
        BatchManager(FairBatcher(4))
    manager = BatchManager(BatchSizeBatcher(4))
    requests = [np.arange(10), np.array([100]), np.array([200])]
    outputs, _ = run_manager(manager, requests, fn=lambda x: x)
    assert [o.tolist() for o in outputs] == [r.tolist() for r in requests]


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


# -- FairBatcher: round robin between requests, priorities, full batches -----------------

def test_fair_batcher_keeps_the_seed_example_8_8_2():
    manager_batches = []
    batcher = FairBatcher(8)
    for i, n in enumerate((5, 4, 6, 3)):
        batcher.append(np.arange(n), tag=i)
    while not batcher.empty():
        manager_batches.append(len(batcher.pop()))
    assert manager_batches == [8, 8, 2]


def test_fair_batcher_sends_the_rest_of_a_split_request_behind_the_others():
    batcher = FairBatcher(4)
    batcher.extend([np.arange(100, 110), np.array([1])], ["hog", "a"])
    first = batcher.pop_parts()
    assert first.tags == ["hog"] and first.parts == {0: (0, 10)} and first.tail_size == 10
    batcher.append(np.array([2]), "b")  # after the hog's rest: behind it
    second = batcher.pop_parts()
    assert second.tags == ["a", "hog"] and second.batch.tolist() == [1, 100 + 4, 105, 106]
    assert second.parts == {1: (4, 10)}
    third = batcher.pop_parts()
    assert third.tags == ["b", "hog"] and third.batch.tolist() == [2, 107, 108, 109]
    assert third.parts == {1: (7, 10)} and third.tail_size is None and batcher.empty()


def test_fair_batcher_fills_a_batch_from_the_highest_priority_down():
    batcher = FairBatcher(4)
    batcher.extend([np.array([0, 0, 0])], ["low"])
    batcher.append(np.array([5, 5]), "urgent", priority=5)
    batcher.append(np.array([1]), "one", priority=1)
    batcher.append(np.array([-1]), "below", priority=-1)
    assert len(batcher) == 4 and batcher.queued == 7
    popped = batcher.pop_parts()
    assert popped.tags == ["urgent", "one", "low"] and popped.batch.tolist() == [5, 5, 1, 0]
    assert popped.parts == {2: (0, 3)} and batcher.queued == 3
    assert batcher.pop_parts().tags == ["low", "below"] and batcher.empty()


def test_fair_batcher_priority_must_be_an_integer():
    with pytest.raises(ValueError, match="priority must be an integer, got 1.5"):
        FairBatcher(4).append(np.zeros(1), priority=1.5)
    with pytest.raises(ValueError, match="priority must be an integer, got True"):
        FairBatcher(4).append(np.zeros(1), priority=True)


def test_fair_batcher_clear_returns_every_tag_of_every_priority():
    batcher = FairBatcher(2)
    batcher.extend([np.arange(5)], ["a"])
    batcher.pop_parts()
    batcher.append(np.zeros(1), "b", priority=2)
    batcher.append(np.zeros(1), "c", priority=-3)
    assert batcher.clear() == ["b", "a", "c"]
    assert batcher.empty() and batcher.queued == 0 and len(batcher) == 0


# One step of a property test: add a request (size, priority), pop a batch, or cancel
# a request (by its number among those added; one that does not exist is skipped).
fair_steps = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 30), st.sampled_from([0, 0, 0, 1, -1, 3, -4, 7])),
    st.tuples(st.just("pop")),
    st.tuples(st.just("cancel"), st.integers(0, 40))), max_size=60)


def run_fair(batch_size, steps):
    """Runs ``steps``, then pops until empty. Returns the requests, their priorities,
    and per batch: the Popped and what each live request (added, not cancelled, not
    wholly batched) still held just before it."""
    batcher = FairBatcher(batch_size)
    requests, priorities, cancelled, batches = [], [], set(), []
    left = {}  # request number -> elements not yet batched (live requests only)

    def pop():
        try:
            popped = batcher.pop_parts(drop=lambda tag: tag in cancelled)
        except IndexError:  # everything queued was cancelled
            assert not left
            return
        batches.append((popped, dict(left)))
        for i, piece in zip(popped.tags, popped.pieces):
            assert i in left, "a cancelled or finished request was batched"
            left[i] -= len(piece)
            assert left[i] >= 0
            if not left[i]:
                del left[i]

    for step in steps:
        if step[0] == "add":
            _, n, priority = step
            start = sum(len(x) for x in requests)
            requests.append(np.arange(start, start + n))
            priorities.append(priority)
            left[len(requests) - 1] = n
            batcher.append(requests[-1], len(requests) - 1, priority=priority)
        elif step[0] == "cancel":
            if step[1] < len(requests):
                cancelled.add(step[1])
                left.pop(step[1], None)
        elif not batcher.empty():
            pop()
        # What the batcher keeps count of as the levels change equals a recount.
        lanes = batcher._lanes.values()
        assert len(batcher) == len(batcher._xs) + sum(map(len, lanes))
        assert batcher.queued == batcher._total - batcher._start + sum(
            lane.queued for lane in lanes)
        assert batcher._order == sorted(-p for p in batcher._lanes)
    while not batcher.empty():
        pop()
    assert not left, "a live request was never batched whole"
    return requests, priorities, cancelled, batches, batcher


@settings(max_examples=300, deadline=None)
@given(batch_size=st.integers(1, 12), steps=fair_steps)
def test_fair_batcher_delivers_every_element_once_in_order_in_full_batches(batch_size,
                                                                          steps):
    requests, priorities, cancelled, batches, batcher = run_fair(batch_size, steps)
    assert batcher.empty() and batcher.queued == 0 and len(batcher) == 0
    received = {i: [] for i in range(len(requests))}  # (offset, rows) in batch order
    for popped, live in batches:
        size = len(popped.batch)
        # Full while enough is queued: all it can take of what live requests hold.
        assert size == min(batch_size, sum(live.values()))
        assert len(set(popped.tags)) == len(popped.tags)  # one piece per request
        assert np.array_equal(popped.batch, np.concatenate(popped.pieces))
        parts = popped.parts or {}
        for k, (i, piece) in enumerate(zip(popped.tags, popped.pieces)):
            offset, total = parts.get(k, (0, len(requests[i])))
            assert total == len(requests[i])
            assert np.array_equal(piece, requests[i][offset:offset + len(piece)])
            received[i].append((offset, len(piece)))
            live[i] -= len(piece)
        # Strict priority: what is left behind this batch is of no higher priority
        # than any element in it.
        taken = [priorities[i] for i, piece in zip(popped.tags, popped.pieces)
                 if len(piece)]
        if taken:
            assert all(priorities[i] <= min(taken) for i, n in live.items() if n)
    for i, pieces in received.items():
        done = 0
        for offset, rows in pieces:  # in order within a request: no gap, no overlap
            assert offset == done
            done += rows
        assert done == len(requests[i]) or i in cancelled


@settings(max_examples=200, deadline=None)
@given(batch_size=st.integers(1, 8), sizes=st.lists(st.integers(0, 40), max_size=12),
       later=st.lists(st.integers(0, 40), max_size=12))
def test_fair_batcher_starts_a_request_within_one_batch_per_request_ahead(
        batch_size, sizes, later):
    """Round robin: each batch takes the front request whole or moves its rest behind,
    so a request starts within (requests ahead of it when it was queued) + 1 batches,
    however large they are; requests queued later never get ahead of it."""
    batcher = FairBatcher(batch_size)
    batcher.extend([np.arange(n) for n in sizes], [("old", i) for i in range(len(sizes))])
    batcher.pop_parts() if not batcher.empty() else None
    ahead = len(batcher)
    batcher.append(np.arange(1), "new")
    pops = 0
    while True:
        for n in later[pops:pops + 1]:  # more traffic while it waits
            batcher.append(np.arange(n), "later")
        popped = batcher.pop_parts()
        pops += 1
        if "new" in popped.tags:
            break
    assert pops <= ahead + 1


def test_a_cost_batcher_prices_a_request_before_it_is_queued():
    calls = []

    def cost(x):
        calls.append(len(x))
        if (x < 0).any():
            raise ZeroDivisionError("no cost")
        return x.astype(float)

    b = CostBatcher(10, cost)
    assert b.priced and not BatchSizeBatcher(4).priced and not FairBatcher(4).priced
    prices = [b.price(np.array([4.0, 4.0])), b.price(np.array([3.0]))]
    with pytest.raises(ZeroDivisionError):
        b.price(np.array([-1.0]))
    assert b.empty()  # pricing queues nothing
    b.extend([np.array([4.0, 4.0]), np.array([3.0])], ["a", "b"], prices)
    assert calls == [2, 1, 1]  # extend with prices never calls cost_fn again
    assert b.pop_parts().tags == ["a"] and b.pop_parts().tags == ["b"]
    with pytest.raises(ValueError, match="2 requests but 1 prices"):
        b.extend([np.zeros(1), np.zeros(1)], prices=prices[:1])
    with pytest.raises(ValueError, match="one cost per element"):
        CostBatcher(10, lambda x: np.ones(len(x) + 1)).price(np.zeros(2))
    # Costs that would poison the running totals of every request after them.
    for bad, named in [(-1.0, "-1.0"), (np.nan, "nan"), (np.inf, "inf")]:
        with pytest.raises(ValueError, match=f"finite costs >= 0, got {named}"):
            CostBatcher(10, lambda x: x).price(np.array([1.0, bad]))


def test_a_batcher_that_defines_a_cost_is_priced_and_prices_in_bulk():
    class Squares(batchers.Batcher):
        budget = 10

        def _cost(self, x):
            return len(x) ** 2

        def _split(self, i, offset, room, limit=None):
            return 0, 0.0

    b = Squares()
    assert Squares.priced and b.price(np.zeros(3)) == 9
    b.extend([np.zeros(1), np.zeros(2)], ["a", "b"], prices=[1, 4])
    assert b.queued == 5 and b.pop_parts().tags == ["a", "b"]
    sizes = BatchSizeBatcher(4)
    sizes.extend([np.zeros(3)], prices=[sizes.price(np.zeros(3))])
    assert sizes.queued == 3


# -- BatchManager: outputs measured against their batch ----------------------------------

def test_batch_manager_refuses_outputs_with_more_rows_than_their_batch():
    manager = BatchManager(BatchSizeBatcher(8))
    manager.add_inputs(np.arange(5)); manager.add_inputs(np.arange(100, 104))
    batch = manager.pop_batch()  # 5 + 3 of the 4: the request of 4 goes on
    with pytest.raises(ModelOutputError, match="returned 9 rows for a batch of 8"):
        manager.process_output(np.concatenate([batch, [-1]]))
    outputs = manager.process_output(batch) + manager.process_output(manager.pop_batch())
    assert [y.tolist() for y in outputs] == [list(range(5)), [100, 101, 102, 103]]


def test_batch_manager_refuses_outputs_with_fewer_rows_than_their_batch():
    manager = BatchManager(BatchSizeBatcher(8))
    for k in range(3):
        manager.add_inputs(np.arange(4) + 10 * k)
    batch = manager.pop_batch()
    with pytest.raises(ModelOutputError, match="returned 7 rows for a batch of 8"):
        manager.process_output(batch[:7])
    outputs = manager.process_output(batch) + manager.process_output(manager.pop_batch())
    assert [y.tolist() for y in outputs] == [[0, 1, 2, 3], [10, 11, 12, 13],
                                             [20, 21, 22, 23]]


def test_batch_manager_takes_nothing_from_outputs_it_refuses():
    """The refused outputs complete no request: the right ones, passed after, give every
    request of the batch (with the first batch's outputs, and with a later one's)."""
    manager = BatchManager(BatchSizeBatcher(6))
    for k in range(4):
        manager.add_inputs(np.arange(3) + 10 * k)
    batch = manager.pop_batch()
    with pytest.raises(ModelOutputError, match="returned 7 rows for a batch of 6"):
        manager.process_output(np.arange(7))
    first = manager.process_output(batch)
    assert [y.tolist() for y in first] == [[0, 1, 2], [10, 11, 12]]
    batch = manager.pop_batch()
    with pytest.raises(ModelOutputError, match="returned 5 rows for a batch of 6"):
        manager.process_output(batch[:5])
    assert [y.tolist() for y in manager.process_output(batch)] == [[20, 21, 22],
                                                                  [30, 31, 32]]


@pytest.mark.parametrize("as_dict", [False, True])
def test_batch_manager_counts_the_rows_of_tuple_and_dict_outputs(as_dict):
    manager = BatchManager(BatchSizeBatcher(4))
    for x in requests_of((2, 3)):
        manager.add_inputs(x)
    batch = manager.pop_batch()

    def policy_value(x):
        p, v = x * 2, x.sum(axis=1)
        return {"policy": p, "value": v} if as_dict else (p, v)

    with pytest.raises(ModelOutputError, match="returned 5 rows for a batch of 4"):
        manager.process_output(policy_value(np.concatenate([batch, batch[:1]])))
    assert len(manager.process_output(policy_value(batch))) == 1
    last = manager.process_output(policy_value(manager.pop_batch()))
    assert last[0][0 if not as_dict else "policy"].tolist() == (requests_of((2, 3))[1]
                                                                * 2).tolist()


def test_batch_manager_refuses_outputs_when_no_popped_batch_awaits_them():
    manager = BatchManager(BatchSizeBatcher(4))
    manager.add_inputs(np.arange(3))
    with pytest.raises(ModelOutputError, match="no popped batch awaits outputs"):
        manager.process_output(np.arange(3))
    batch = manager.pop_batch()
    assert [y.tolist() for y in manager.process_output(batch)] == [[0, 1, 2]]
    with pytest.raises(ModelOutputError, match="no popped batch awaits outputs"):
        manager.process_output(batch)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 12), max_size=12), batch_size=st.integers(1, 10),
       wrong=st.lists(st.integers(-3, 3), max_size=12), as_tuple=st.booleans())
def test_batch_manager_refuses_every_wrong_row_count_and_delivers_each_request_its_own(
        sizes, batch_size, wrong, as_tuple):
    """Before each batch's right outputs, outputs with ``wrong[i]`` rows more (or fewer)
    are passed: each such call raises naming both counts and changes nothing, so every
    request still gets exactly its own rows."""
    requests = requests_of(sizes)
    manager = BatchManager(BatchSizeBatcher(batch_size))
    for x in requests:
        manager.add_inputs(x)

    def fn(x):
        return (model(x), x[:, :1]) if as_tuple else model(x)

    outputs, i = [], 0
    while not manager.empty():
        batch = manager.pop_batch()
        delta = wrong[i] if i < len(wrong) else 0
        i += 1
        if delta and len(batch) + delta >= 0:
            bad = batch[:len(batch) + delta] if delta < 0 else np.concatenate(
                [batch, np.full((delta, batch.shape[1]), -1, batch.dtype)])
            with pytest.raises(ModelOutputError,
                               match=f"returned {len(bad)} rows for a batch of "
                                     f"{len(batch)} elements"):
                manager.process_output(fn(bad))
        outputs.extend(manager.process_output(fn(batch)))
    assert len(outputs) == len(requests)
    for x, y in zip(requests, outputs):
        np.testing.assert_array_equal(y[0] if as_tuple else y, model(x))


# -- CostBatcher: no empty batch ---------------------------------------------------------

@pytest.mark.parametrize("max_cost, costs, batches", [
    (4, [[5]], [[5]]),
    (4, [[2, 9]], [[2], [9]]),
    (4, [[0, 0, 9]], [[0, 0], [9]]),
    (4, [[5], [1]], [[5], [1]]),
    (4, [[9], [0]], [[9], [0]]),
    # The rest of [0.1, 0.3] fits by its own running costs, not by the queue's.
    (0.3, [[0.1, 0.2], [0.1, 0.3]], [[0.1], [0.2], [0.1], [0.3]]),
])
def test_cost_batcher_pops_no_empty_batch_after_an_element_over_budget(max_cost, costs,
                                                                       batches):
    """A request whose last element went alone (or whose rest fit after all) leaves the
    queue with it: no later batch holds an empty piece of it (or is empty)."""
    batcher = CostBatcher(max_cost, cost_fn=lambda x: x.astype(float))
    batcher.extend([np.array(c) for c in costs], list(range(len(costs))))
    popped = []
    while not batcher.empty():
        parts = batcher.pop_parts()
        assert all(len(piece) for piece in parts.pieces)
        popped.append(parts.batch.tolist())
    assert popped == batches
    assert batcher.queued == 0 and len(batcher) == 0


@settings(max_examples=300, deadline=None)
@given(costs=st.lists(st.lists(st.sampled_from([0.0, 0.1, 0.3, 1.0, 2.5, 7.0, 40.0]),
                                max_size=6), max_size=12),
       max_cost=st.sampled_from([0.3, 1.0, 4.0, 6.5]))
def test_cost_batcher_pops_every_element_once_in_order_and_no_empty_piece(costs,
                                                                          max_cost):
    """Elements over budget, costs of zero and costs that do not add up exactly in
    floating point: each batch is within budget unless it is one element alone, holds
    no empty piece of a request with elements (a batch of 0 rows holds only requests of
    0 elements), and the batches hold every element once, in order."""
    batcher = CostBatcher(max_cost, cost_fn=lambda x: x[:, 0])
    requests, next_id = [], 0
    for c in costs:
        ids = np.arange(next_id, next_id + len(c), dtype=float)
        next_id += len(c)
        requests.append(np.stack([np.array(c, float), ids], 1) if c else np.zeros((0, 2)))
    batcher.extend(requests, list(range(len(requests))))
    batches = []
    while not batcher.empty():
        popped = batcher.pop_parts()
        batches.append(popped.batch)
        assert len(batches) <= len(requests) + next_id, "a batcher that never empties"
        for tag, piece in zip(popped.tags, popped.pieces):
            assert len(piece) or not len(requests[tag]), "an empty piece of a request"
        if not len(popped.batch):
            assert all(not len(requests[tag]) for tag in popped.tags)
    for b in batches:
        assert b[:, 0].sum() <= max_cost + 1e-9 or len(b) == 1
    ids = np.concatenate([b[:, 1] for b in batches]) if batches else np.zeros(0)
    np.testing.assert_array_equal(ids, np.arange(next_id))
    assert abs(batcher.queued) < 1e-9


# -- BatchManager: one element spec -----------------------------------------------------

def test_batch_manager_refuses_a_request_of_another_element_shape_and_keeps_the_queue():
    manager = BatchManager(BatchSizeBatcher(4))
    manager.add_inputs(np.ones((2, 3)))
    with pytest.raises(InputSpecError,
                       match=r"expected \[n, 3\], given \[2, 4\]"):
        manager.add_inputs(np.ones((2, 4)))
    manager.add_inputs(np.ones((2, 3)) * 2)
    assert manager.batcher.queued == 4 and len(manager.batcher) == 2
    batch = manager.pop_batch()
    assert batch.shape == (4, 3) and manager.empty()
    assert [y.tolist() for y in manager.process_output(batch)] == [[[1.0] * 3] * 2,
                                                                  [[2.0] * 3] * 2]


@pytest.mark.parametrize("first, later, batch_dtype", [
    ([1, 2], np.array([3], np.int32), np.int64),  # a Python list, then an int32 array
    (np.zeros(2, np.float32), [0.5], np.float64),
    (np.array(["ab"]), np.array(["abc"]), np.dtype("<U3")),  # each its own width
])
def test_batch_manager_batches_requests_of_other_dtypes_as_numpy_joins_them(
        first, later, batch_dtype):
    manager = BatchManager(BatchSizeBatcher(4))
    manager.add_inputs(first)
    manager.add_inputs(later)
    batch = manager.pop_batch()
    assert batch.dtype == batch_dtype
    np.testing.assert_array_equal(batch, np.concatenate([first, later]))
    ys = manager.process_output(batch)
    np.testing.assert_array_equal(np.concatenate(ys), batch)


def test_batch_manager_takes_an_identity_models_outputs_of_floats_then_of_ints():
    # Numbers join: a float request and an int one made a float batch, then an int
    # batch, whose int outputs were refused against the float batch's; the int request
    # was left half answered.
    manager = BatchManager(BatchSizeBatcher(2))
    manager.add_inputs(np.array([1.5]))
    manager.add_inputs(np.array([1, 2]))
    (first,) = manager.process_output(manager.pop_batch() * 2)  # [1.5, 1.]: floats
    (second,) = manager.process_output(manager.pop_batch() * 2)  # [2]: ints
    assert first.tolist() == [3.0] and second.tolist() == [2.0, 4.0]
    manager.add_inputs(np.array([3, 4]))
    with pytest.raises(ModelOutputError, match=r"do not match the first integer batch's: "
                                               r"expected an array \[n\] int64, got "
                                               r"an array \[n\] float64"):
        manager.process_output(manager.pop_batch() * 0.5)  # an int batch's are ints


def test_batch_manager_refuses_another_shape_at_a_new_dtype_kinds_first_batch():
    # Structures kept per dtype kind took any structure at a kind's first batch: a
    # tuple after arrays was delivered.
    manager = BatchManager(BatchSizeBatcher(2))
    manager.add_inputs(np.array([1, 2]))
    manager.add_inputs(np.array([0.5, 1.5]))
    batch = manager.pop_batch()
    assert manager.process_output(np.zeros((2, 4), np.float32))[0].shape == (2, 4)
    batch = manager.pop_batch()
    with pytest.raises(ModelOutputError, match=r"expected an array \[n, 4\] float32 "
                                               r"\(any dtypes\), got a tuple of 2"):
        manager.process_output((np.zeros((2, 7)), np.zeros(2)))
    (y,) = manager.process_output(np.zeros((2, 4)))  # its own dtype, the same shape
    assert y.dtype == np.float64 and len(batch) == 2


@pytest.mark.parametrize("later", [
    np.array(["2020-01-01"], "datetime64[D]"),  # no dtype holds both: pops would fail
    np.array(["a"]),  # would reach the model as text
    np.array([{}], object),
])
def test_batch_manager_refuses_a_request_of_another_kind_and_keeps_serving(later):
    manager = BatchManager(BatchSizeBatcher(4))
    manager.add_inputs(np.zeros(1, np.float32))
    with pytest.raises(InputSpecError, match="cannot join requests of float32"):
        manager.add_inputs(later)
    manager.add_inputs(np.ones(1, np.float32))
    batch = manager.pop_batch()
    assert batch.dtype == np.float32 and batch.tolist() == [0.0, 1.0]


def test_batch_manager_gives_the_model_its_own_byte_order():
    manager = BatchManager(BatchSizeBatcher(4))
    manager.add_inputs(np.arange(3, dtype=">f4"))
    batch = manager.pop_batch()
    assert batch.dtype.isnative and batch.tolist() == [0.0, 1.0, 2.0]


def test_batch_manager_keeps_the_first_request_element_spec_for_its_lifetime():
    manager = BatchManager(BatchSizeBatcher(4))
    manager.add_inputs(np.zeros((1, 3)))
    manager.process_output(manager.pop_batch())
    assert manager.empty()
    with pytest.raises(InputSpecError, match=r"expected \[n, 3\], given \[1, 4\]"):
        manager.add_inputs(np.zeros((1, 4)))
    with pytest.raises(ValueError, match="batch dimension"):  # an InputSpecError too
        manager.add_inputs(np.float64(1.0))
    with pytest.raises(InputSpecError, match=r"rows of one shape \(expected \[n, 3\]\)"):
        manager.add_inputs([[1.0, 2.0, 3.0], [4.0]])  # ragged
    assert manager.empty()


@pytest.mark.parametrize("first, later", [
    (np.array(["2020-01-01"], "datetime64[D]"), np.array([1], "timedelta64[D]")),
    (np.array(["ab"]), np.array([b"\xff"])),  # bytes among text: no decoding them
])
def test_batch_manager_refuses_dtypes_numpy_promotes_but_cannot_join(first, later):
    manager = BatchManager(BatchSizeBatcher(4))
    manager.add_inputs(first)
    with pytest.raises(InputSpecError, match="cannot join"):
        manager.add_inputs(later)
    assert manager.pop_batch().dtype == first.dtype


def test_batch_manager_takes_ml_dtypes_floats_among_floats():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    manager = BatchManager(BatchSizeBatcher(4))
    manager.add_inputs(np.zeros(1, np.float32))
    manager.add_inputs(np.ones(1, ml_dtypes.bfloat16))
    assert manager.pop_batch().tolist() == [0.0, 1.0]


@pytest.mark.parametrize("unbatcher", [None, "numpy"])
def test_batch_manager_delivers_a_list_of_outputs_as_a_tuple_row_by_row(unbatcher):
    # With its own NumpyUnbatcher the first request got both rows, the second none;
    # without one, a list was refused with a message saying lists are taken.
    from async_search.unbatchers import NumpyUnbatcher
    m = BatchManager(BatchSizeBatcher(8), NumpyUnbatcher() if unbatcher else None)
    m.add_inputs(np.array([1]))
    m.add_inputs(np.array([2]))
    batch = m.pop_batch()
    first, second = m.process_output([batch * 10, batch])
    assert type(first) is tuple and [v.tolist() for v in first] == [[10], [1]]
    assert [v.tolist() for v in second] == [[20], [2]]


@pytest.mark.parametrize("args, message", [
    ((5,), "batcher must be a Batcher instance, such as BatchSizeBatcher(8); got int 5"),
    ((BatchSizeBatcher,), "got the class BatchSizeBatcher"),
    ((BatchSizeBatcher(2), 5), "unbatcher must be an Unbatcher instance"),
])
def test_batch_manager_refuses_what_is_not_a_batcher_or_unbatcher_when_made(args, message):
    with pytest.raises(TypeError) as raised:
        BatchManager(*args)
    assert message in str(raised.value)


def test_batch_manager_with_its_own_unbatcher_refuses_outputs_without_rows():
    from async_search.unbatchers import NumpyUnbatcher
    m = BatchManager(BatchSizeBatcher(8), NumpyUnbatcher())
    m.add_inputs(np.arange(3))
    batch = m.pop_batch()
    with pytest.raises(ModelOutputError, match="no batch dimension"):
        m.process_output(None)
    assert [y.tolist() for y in m.process_output(batch)] == [[0, 1, 2]]


def test_a_batcher_pickles_without_the_server_it_batches_for():
    import pickle
    b = BatchSizeBatcher(4)
    b._server = object()  # as an open server marks it
    copy = pickle.loads(pickle.dumps(b))
    assert copy._server is None and copy.budget == 4


def test_a_pop_that_fails_after_dropping_a_lanes_request_leaves_the_counts_true():
    # The levels' counts were settled only when a pop ended well: a batch that could not
    # be built after a drop left them wrong for good (the emptied level never went, and
    # every later pop raised IndexError while empty() said False).
    b = FairBatcher(8)
    b.append(np.zeros((1, 3)), "cancelled", priority=2)
    b.append(np.zeros((1, 3)), "a", priority=1)
    b.append(np.zeros((1, 3)), "c")

    def no_buffer(rows, like):
        raise MemoryError("pool exhausted")

    with pytest.raises(MemoryError):
        b.pop_parts(drop=lambda tag: tag == "cancelled", out=no_buffer)
    assert len(b) == 2 and b.queued == 2
    assert b.pop_parts().tags == ["a", "c"]
    assert b.empty() and len(b) == 0 and b.queued == 0
