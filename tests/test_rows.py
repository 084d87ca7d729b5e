import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_search import rows
from async_search.errors import ModelOutputError
from async_search.rows import OutputStructure

KINDS = ("array", "tuple", "dict")


def outputs_of(kind, n, seed=0):
    """Outputs of ``n`` rows with distinct values, so that any mix-up shows."""
    rng = np.random.default_rng(seed)
    policy = rng.integers(0, 1000, (n, 3)).astype(np.float32)
    value = np.arange(n, dtype=np.int64)
    if kind == "array":
        return policy
    if kind == "tuple":
        return (policy, value)
    return {"policy": policy, "value": value}


def leaves(outputs):
    if isinstance(outputs, np.ndarray):
        return [outputs]
    return list(outputs.values()) if isinstance(outputs, dict) else list(outputs)


def assert_outputs_equal(a, b):
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == list(b)
    for x, y in zip(leaves(a), leaves(b), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(KINDS), sizes=st.lists(st.integers(0, 9), min_size=1,
                                                    max_size=12))
def test_split_then_concatenate_is_the_identity(kind, sizes):
    y = outputs_of(kind, sum(sizes))
    pieces = rows.split(y, sizes)
    assert [rows.count(p) for p in pieces] == sizes
    assert_outputs_equal(rows.concatenate(pieces), y)


@settings(max_examples=50, deadline=None)
@given(kind=st.sampled_from(KINDS), sizes=st.lists(st.integers(1, 5), min_size=1,
                                                    max_size=6))
def test_split_pieces_are_views_not_copies(kind, sizes):
    y = outputs_of(kind, sum(sizes))
    for piece in rows.split(y, sizes):
        for leaf, whole in zip(leaves(piece), leaves(y)):
            assert leaf.base is whole or leaf.base is whole.base
            assert np.shares_memory(leaf, whole)


def test_split_leaves_out_rows_past_the_sizes():
    assert [p.tolist() for p in rows.split(np.arange(5), [1, 2])] == [[0], [1, 2]]


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(KINDS), n=st.integers(0, 12), data=st.data())
def test_take_agrees_with_numpy_slicing_and_indexing(kind, n, data):
    y = outputs_of(kind, n)
    start = data.draw(st.integers(-n - 2, n + 2))
    stop = data.draw(st.integers(-n - 2, n + 2))
    step = data.draw(st.sampled_from([1, 2, -1]))
    index = data.draw(st.one_of(
        st.just(slice(start, stop, step)),
        st.lists(st.integers(0, n - 1), max_size=8).map(
            lambda index: np.array(index, np.int64)) if n else
        st.just(np.array([], np.int64))))
    taken = rows.take(y, index)
    assert type(taken) is type(y)
    expected = [leaf[index] for leaf in leaves(y)]
    for got, want in zip(leaves(taken), expected, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
def test_count_is_the_number_of_rows(kind):
    assert rows.count(outputs_of(kind, 7)) == 7


def test_count_refuses_leaves_that_disagree_or_no_leaves():
    with pytest.raises(ModelOutputError, match=r"disagree on the number of rows: \[2, 3\]"):
        rows.count((np.zeros(2), np.zeros(3)))
    with pytest.raises(ModelOutputError, match="empty tuple or dict"):
        rows.count({})


def test_the_fast_path_also_takes_an_ndarray_subclass():
    y = np.ma.masked_array(np.arange(4))
    assert rows.count(y) == 4
    assert rows.take(y, slice(1, 3)).tolist() == [1, 2]
    assert [p.tolist() for p in rows.split(y, [3, 1])] == [[0, 1, 2], [3]]


@pytest.mark.parametrize("kind", KINDS)
def test_rows_of_and_stack_are_inverses(kind):
    y = outputs_of(kind, 4)
    per_element = rows.rows_of(y)
    assert len(per_element) == 4
    assert_outputs_equal(rows.stack(per_element), y)


@pytest.mark.parametrize("kind", KINDS)
def test_assemble_puts_each_part_row_at_its_index(kind):
    y = outputs_of(kind, 5)
    first, second = np.array([4, 0, 2]), np.array([1, 3])
    parts = [rows.take(y, first), rows.take(y, second)]
    assert_outputs_equal(rows.assemble(parts, [first, second], 5), y)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("wrong", ["one row for three", "another trailing shape"])
def test_assemble_refuses_a_part_that_is_not_one_row_per_index(kind, wrong):
    # numpy would broadcast one row into every place of its part (other elements'
    # answers), or fail with its own words on a trailing shape
    y = outputs_of(kind, 5)
    first, second = np.array([4, 0, 2]), np.array([1, 3])
    bad = (rows.take(y, first[:1]) if wrong == "one row for three"
           else rows.map_leaves(lambda a: a[:, None], rows.take(y, first)))
    with pytest.raises(ModelOutputError, match="a part of 3 elements has outputs of shape"):
        rows.assemble([rows.take(y, second), bad], [second, first], 5)


@pytest.mark.parametrize("kind", KINDS)
def test_frozen_copy_is_a_read_only_copy(kind):
    y = outputs_of(kind, 3)
    frozen = rows.frozen_copy(y)
    assert_outputs_equal(frozen, y)
    for leaf, original in zip(leaves(frozen), leaves(y)):
        assert not leaf.flags.writeable and not np.shares_memory(leaf, original)


def test_map_leaves_keeps_the_structure_and_turns_a_list_into_a_tuple():
    assert rows.map_leaves(len, {"a": [1, 2]}) == {"a": 2}
    assert rows.map_leaves(len, [[1], [2, 3]]) == (1, 2)


# -- check -------------------------------------------------------------------------------

CHANGES = {
    "another kind": lambda y: (y,) if isinstance(y, np.ndarray) else y["policy"]
    if isinstance(y, dict) else {"policy": y[0]},
    "another trailing shape": lambda y: rows.map_leaves(lambda a: a[:, None], y),
    "a dtype of another kind": lambda y: rows.map_leaves(
        lambda a: a.astype(np.complex64), y),
    "another arity or keys": lambda y: (y, y) if isinstance(y, np.ndarray) else (
        {**y, "extra": y["value"]} if isinstance(y, dict) else (*y, y[1])),
    "no batch dimension": lambda y: rows.map_leaves(lambda a: a[0], y),
}


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(KINDS), change=st.sampled_from(sorted(CHANGES)),
       first=st.integers(1, 6), later=st.integers(1, 6))
def test_check_refuses_a_changed_structure(kind, change, first, later):
    _, structure = rows.check(outputs_of(kind, first))
    changed = CHANGES[change](outputs_of(kind, later))
    with pytest.raises(ModelOutputError, match="the model's outputs"):
        rows.check(changed, structure)


@settings(max_examples=50, deadline=None)
@given(kind=st.sampled_from(KINDS), first=st.integers(0, 6), later=st.integers(0, 6))
def test_check_accepts_the_same_structure_whatever_the_batch_size(kind, first, later):
    _, structure = rows.check(outputs_of(kind, first))
    y = outputs_of(kind, later)
    checked, again = rows.check(y, structure)
    assert checked is y and again == structure


@pytest.mark.parametrize("kind", KINDS)
def test_check_casts_a_dtype_of_the_same_kind(kind):
    _, structure = rows.check(outputs_of(kind, 2))
    wider = rows.map_leaves(
        lambda a: a.astype(np.float64 if a.dtype.kind == "f" else np.int32),
        outputs_of(kind, 3))
    checked, _ = rows.check(wider, structure)
    assert_outputs_equal(checked, outputs_of(kind, 3))


@pytest.mark.parametrize("first, later", [
    (np.zeros((1, 1), np.int32), np.full((2, 1), 3_000_000_000, np.int64)),
    (np.zeros((1, 1), np.int32), np.full((2, 1), -3_000_000_000, np.int64)),
    (np.zeros((1, 1), np.uint8), np.full((2, 1), 300, np.uint16)),
    (np.array([["a"]]), np.array([["hello"], ["b"]])),
    (np.array([[b"a"]]), np.array([[b"hello"], [b"b"]])),
    (np.zeros((1, 1), "datetime64[s]"), np.full((2, 1), 1, "datetime64[ns]")),
    # numpy calls seconds into nanoseconds a safe cast: past 2262 it wraps.
    (np.zeros((1, 1), "datetime64[ns]"), np.array([["2500-01-01"]], "datetime64[s]")),
    (np.zeros((1, 1), "timedelta64[ns]"), np.array([[10 ** 12]], "timedelta64[s]")),
    (np.zeros((1, 1), np.float32), np.array([[1.0], [1e300]])),  # finite into inf
    (np.zeros((1, 1), np.complex64), np.array([[1e300 + 1j]])),
])
def test_check_refuses_a_cast_that_would_change_a_value(first, later):
    _, structure = rows.check(first)
    with pytest.raises(ModelOutputError, match="cannot|can hold|past"):
        rows.check(later, structure)
    with pytest.raises(ModelOutputError, match="cannot|can hold|past"):  # inside a tuple too
        rows.check((later, later), rows.check((first, first))[1])


@pytest.mark.parametrize("first, later", [
    (np.zeros((1, 1), np.int32), np.full((2, 1), 2 ** 31 - 1, np.int64)),
    (np.zeros((1, 1), np.int32), np.zeros((0, 1), np.int64)),  # no rows: nothing lost
    (np.zeros((1, 1), np.uint8), np.full((2, 1), 255, np.uint16)),
    (np.array([["hello"]]), np.array([["a"], ["b"]])),  # a shorter string fits
    (np.array([["a"]]), np.array([["a"], ["b"]], "<U5")),  # a wider type, short values
    (np.array([[b"a"]]), np.array([[b"a"], [b""]], "S5")),
    (np.zeros((1, 1), np.float16), np.full((2, 1), 1e-3, np.float64)),  # precision goes
    (np.zeros((1, 1), np.float32), np.array([[np.inf], [np.nan], [-np.inf]])),
    (np.zeros((1, 1), "datetime64[ns]"), np.array([["2000-01-01"], ["NaT"]], "datetime64[s]")),
])
def test_check_casts_a_same_kind_dtype_whose_values_fit(first, later):
    _, structure = rows.check(first)
    checked, _ = rows.check(later, structure)
    assert checked.dtype == first.dtype
    np.testing.assert_array_equal(checked, later.astype(first.dtype))


def test_check_names_both_structures_and_where_the_expected_one_came_from():
    _, structure = rows.check(np.zeros((2, 4), np.float32))
    with pytest.raises(ModelOutputError, match=(
            r"do not match the declared spec: expected an array \[n, 4\] float32, "
            r"got a tuple of 2 outputs \(\[n, 4\] float32, \[n\] int64\)")):
        rows.check((np.zeros((2, 4), np.float32), np.zeros(2, np.int64)), structure,
                   expected_from="the declared spec")


@pytest.mark.parametrize("outputs, message", [
    ([np.zeros(2)], "got list"),
    (np.float32(1.0), "got float32"),
    (np.zeros(()), "0-d array"),
    ((np.zeros(2), 3.0), "output 1 is a float"),
])
def test_check_refuses_what_is_not_outputs(outputs, message):
    with pytest.raises(ModelOutputError, match=message):
        rows.check(outputs)


def test_dict_structure_ignores_key_order():
    a = OutputStructure.of({"p": np.zeros((1, 2)), "v": np.zeros(1)})
    b = OutputStructure.of({"v": np.zeros(3), "p": np.zeros((3, 2))})
    assert a == b
    assert a.describe() == "a dict {'p': [n, 2] float64, 'v': [n] float64}"


def test_check_refuses_a_complex_value_that_the_cast_makes_not_finite():
    _, structure = rows.check(np.zeros((1, 1), np.complex64))
    with pytest.raises(ModelOutputError, match="past complex64's range"):
        rows.check(np.array([[np.nan + 1e300j]]), structure)


def test_a_list_of_arrays_is_cut_leaf_by_leaf_as_count_reads_it():
    # count read a list as outputs (one row per element of each array), while take and
    # split sliced the list itself: an unbatcher gave one request every row.
    y = [np.arange(4), np.arange(4) * 10]
    assert rows.count(y) == 4
    taken = rows.take(y, slice(1, 3))
    assert type(taken) is tuple and [v.tolist() for v in taken] == [[1, 2], [10, 20]]
    pieces = rows.split(y, [1, 3])
    assert [[v.tolist() for v in p] for p in pieces] == [[[0], [0]], [[1, 2, 3],
                                                                      [10, 20, 30]]]
    joined = rows.concatenate([list(p) for p in pieces])
    assert [v.tolist() for v in joined] == [[0, 1, 2, 3], [0, 10, 20, 30]]


def test_plain_gives_the_machine_s_byte_order_to_every_output():
    # joined rows (split requests, a cache) and the wire are native: a lone batch's
    # slice kept the model's byte order, so an answer's dtype hung on batch timing
    swapped = np.arange(4, dtype=">f4")
    record = np.zeros(2, [("a", ">i4"), ("b", "<f8")])
    for outputs in (swapped, (swapped, np.zeros(4)), {"x": swapped, "y": record}):
        got = rows.plain(outputs)
        for leaf in rows.leaves(got):
            assert leaf.dtype.isnative
        for before, after in zip(rows.leaves(outputs), rows.leaves(got)):
            assert before.tolist() == after.tolist()
    native = np.arange(3.0)
    assert rows.plain(native) is native  # nothing copied when nothing differs

