import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_search import batchers
from async_search.batchers import BatchManager, BatchSizeBatcher
from async_search.errors import ModelOutputError
from async_search.unbatchers import NumpyUnbatcher, TreeUnbatcher, Unbatcher, unbatcher_for
from tests.helpers import requests_of


def run_manager(manager, requests, fn):
    for x in requests:
        manager.add_inputs(x)
    outputs = []
    while not manager.empty():
        outputs.extend(manager.process_output(fn(manager.pop_batch())))
    return outputs


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(0, 20), max_size=15), batch_size=st.integers(1, 16),
       as_dict=st.booleans())
def test_tree_unbatcher_splits_tuple_and_dict_outputs(sizes, batch_size, as_dict):
    def policy_value(x):
        p, v = x * 2, x.sum(axis=1, keepdims=True)
        return {"policy": p, "value": v} if as_dict else (p, v)

    requests = requests_of(sizes)
    outputs = run_manager(BatchManager(BatchSizeBatcher(batch_size)), requests,
                          fn=policy_value)
    for x, y in zip(requests, outputs):
        expected = policy_value(x)
        keys = expected.keys() if as_dict else range(2)
        for k in keys:
            np.testing.assert_array_equal(y[k], expected[k])


def test_unbatcher_for_picks_by_output_type():
    assert isinstance(unbatcher_for(np.zeros(2)), NumpyUnbatcher)
    assert isinstance(unbatcher_for((np.zeros(2),)), TreeUnbatcher)
    with pytest.raises(ModelOutputError, match="got list"):
        unbatcher_for([1, 2])


def test_more_output_rows_than_registered_raises_model_output_error():
    unbatcher = NumpyUnbatcher()
    unbatcher.register(2)
    with pytest.raises(ModelOutputError, match="1 more output rows"):
        unbatcher.unbatch(np.zeros(3))


def test_tree_outputs_that_disagree_on_rows_raise():
    with pytest.raises(ModelOutputError, match="disagree"):
        TreeUnbatcher().num_rows((np.zeros(2), np.zeros(3)))


def test_batchers_re_exports_the_numpy_unbatcher_of_the_public_contract():
    assert batchers.NumpyUnbatcher is NumpyUnbatcher
    assert "NumpyUnbatcher" in batchers.__all__


def test_a_request_split_across_batches_is_joined_in_order():
    unbatcher = NumpyUnbatcher()
    for n in (3, 5):
        unbatcher.register(n)
    assert [y.tolist() for y in unbatcher.unbatch(np.arange(4))] == [[0, 1, 2]]
    assert len(unbatcher) == 1 and not unbatcher.empty()
    assert [y.tolist() for y in unbatcher.unbatch(np.arange(4, 8))] == [[3, 4, 5, 6, 7]]
    assert unbatcher.empty()


def test_a_subclass_may_say_how_to_measure_slice_and_join():
    class ListUnbatcher(Unbatcher):
        def num_rows(self, outputs):
            return len(outputs)

        def slice(self, outputs, start, stop):
            return outputs[start:stop]

        def concat(self, pieces):
            return sum(pieces, [])

    unbatcher = ListUnbatcher()
    unbatcher.register(3)
    assert unbatcher.unbatch([1, 2]) == [] and unbatcher.unbatch([3]) == [[1, 2, 3]]


def test_unbatcher_that_refuses_too_many_rows_keeps_every_request_registered():
    unbatcher = NumpyUnbatcher()
    for n in (3, 3):
        unbatcher.register(n)
    with pytest.raises(ModelOutputError, match="1 more output rows") as refused:
        unbatcher.unbatch(np.arange(7))
    assert len(unbatcher) == 2
    assert "7 given, 6 awaited" in str(refused.value)
    assert [y.tolist() for y in unbatcher.unbatch(np.arange(6))] == [[0, 1, 2], [3, 4, 5]]
    assert unbatcher.empty()


def test_unbatcher_that_refuses_too_many_rows_keeps_a_part_received_request():
    unbatcher = NumpyUnbatcher()
    for n in (3, 2):
        unbatcher.register(n)
    assert unbatcher.unbatch(np.arange(2)) == []
    with pytest.raises(ModelOutputError, match="1 more output rows"):
        unbatcher.unbatch(np.arange(2, 6))  # 4 rows, 3 awaited
    assert len(unbatcher) == 2
    assert [y.tolist() for y in unbatcher.unbatch(np.arange(2, 5))] == [[0, 1, 2], [3, 4]]


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 10), max_size=10),
       cuts=st.lists(st.integers(0, 12), max_size=20),
       surplus=st.lists(st.integers(0, 3), max_size=20))
def test_unbatcher_rows_go_to_their_requests_whatever_surplus_it_refuses(sizes, cuts,
                                                                        surplus):
    """Rows arrive in batches of ``cuts`` rows; before each, a batch of more rows than
    are awaited is sometimes tried: it raises and changes nothing."""
    unbatcher = NumpyUnbatcher()
    for n in sizes:
        unbatcher.register(n)
    rows_ = np.arange(sum(sizes))
    outputs, start = [], 0
    for i in range(len(cuts) + 1):
        left = len(rows_) - start
        step = min(cuts[i], left) if i < len(cuts) else left
        extra = surplus[i] if i < len(surplus) else 0
        if extra:
            with pytest.raises(ModelOutputError, match=f"{extra} more output rows"):
                unbatcher.unbatch(np.arange(left + extra))
        outputs += unbatcher.unbatch(rows_[start:start + step])
        start += step
    assert unbatcher.empty()
    expected = np.split(rows_, np.cumsum(sizes)[:-1]) if sizes else []
    assert [y.tolist() for y in outputs] == [e.tolist() for e in expected]


def test_an_unbatcher_gives_each_request_its_rows_of_a_list_of_arrays():
    u = NumpyUnbatcher()
    u.register(1)
    u.register(1)
    first, second = u.unbatch([np.array([10, 20]), np.array([30, 40])])
    assert [v.tolist() for v in first] == [[10], [30]]
    assert [v.tolist() for v in second] == [[20], [40]]


@pytest.mark.parametrize("n", [-1, 1.5, "2", None, True])
def test_register_refuses_what_is_not_a_number_of_elements(n):
    u = NumpyUnbatcher()
    with pytest.raises(ValueError, match="number of elements"):
        u.register(n)
    assert u.empty()


def test_register_takes_numpy_integers_and_zero():
    u = NumpyUnbatcher()
    u.register(np.int64(2))
    u.register(0)
    assert [y.tolist() for y in u.unbatch(np.arange(2))] == [[0, 1], []]
