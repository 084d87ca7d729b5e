"""The replay buffer: a ring of samples, uniform seeded sampling, symmetry, save/load."""

import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from async_search.errors import CheckpointError
from async_search.training.replay import ReplayBuffer, mirror_columns

SHAPE = (2, 6, 7)  # Connect Four's encoding
ACTIONS = 7


def samples(n, start=0, seed=None):
    """``n`` distinct samples: sample i has x filled with i (plus noise when seeded),
    a policy row with a positive weight on every column, and value i."""
    rng = np.random.default_rng(start if seed is None else seed)
    ids = np.arange(start, start + n, dtype=np.float32)
    x = np.broadcast_to(ids[:, None, None, None], (n, *SHAPE)).copy()
    if seed is not None:
        x = x + rng.random((n, *SHAPE), dtype=np.float32)
    policy = rng.integers(1, 10, (n, ACTIONS)).astype(np.float32)
    return x, policy, ids.copy()


def ids_of(batch):
    return batch.value.astype(int).tolist()


def snapshot(buf):
    a = buf.arrays()
    return (len(buf), buf.added, a.x.copy(), None if a.policy is None else a.policy.copy(),
            a.value.copy())


def assert_same(before, after):
    assert before[:2] == after[:2]
    for a, b in zip(before[2:], after[2:]):
        if a is None:
            assert b is None
        else:
            np.testing.assert_array_equal(a, b)


# -- adding and the ring ----------------------------------------------------------------


def test_adding_whole_games_appends_them_in_order():
    buf = ReplayBuffer(100, seed=0)
    buf.add(*samples(5))
    buf.add(*samples(3, start=5))
    assert len(buf) == 8 and buf.added == 8
    assert buf.state_shape == SHAPE and buf.num_actions == ACTIONS
    a = buf.arrays()
    assert a.x.shape == (8, *SHAPE) and a.policy.shape == (8, ACTIONS)
    assert ids_of(a) == list(range(8))
    assert (a.x[:, 0, 0, 0] == np.arange(8)).all()


def test_a_full_ring_overwrites_the_oldest_first_and_arrays_lists_oldest_first():
    buf = ReplayBuffer(10, seed=0)
    buf.add(*samples(6))
    buf.add(*samples(6, start=6))   # overwrites 0, 1
    assert len(buf) == 10 and buf.added == 12
    assert ids_of(buf.arrays()) == list(range(2, 12))
    buf.add(*samples(3, start=12))  # overwrites 2, 3, 4
    assert ids_of(buf.arrays()) == list(range(5, 15))
    assert (buf.arrays().x[:, 1, 5, 6] == np.arange(5, 15)).all()


def test_an_add_larger_than_the_capacity_keeps_only_its_newest_samples():
    buf = ReplayBuffer(4, seed=0)
    buf.add(*samples(3))
    buf.add(*samples(10, start=3))
    assert len(buf) == 4 and buf.added == 13  # 3, then 10 (only the 4 newest kept)
    assert ids_of(buf.arrays()) == [9, 10, 11, 12]
    buf.add(*samples(1, start=13))
    assert ids_of(buf.arrays()) == [10, 11, 12, 13]


def test_added_counts_every_sample_of_an_oversized_add_though_only_the_newest_are_kept():
    # Resumed runs check added against the samples their history made: counting only
    # those kept, a round larger than the buffer could never be resumed.
    buf = ReplayBuffer(4, seed=0)
    buf.add(*samples(10))
    assert buf.added == 10 and ids_of(buf.arrays()) == [6, 7, 8, 9]


def test_an_empty_add_shapes_nothing():
    buf = ReplayBuffer(4, seed=0)
    buf.add(np.zeros((0,)), None, np.zeros(0))
    assert len(buf) == 0 and buf.added == 0
    buf.add(*samples(2))  # its own shape and policy, not the empty add's
    assert len(buf) == 2


def test_policy_rows_near_the_largest_float32_are_normalised_not_zeroed():
    buf = ReplayBuffer(4, seed=0)
    x, _, value = samples(1)
    buf.add(x, np.full((1, ACTIONS), 3e38, np.float32), value)
    held = buf.arrays().policy
    np.testing.assert_allclose(held.sum(axis=1), 1.0, rtol=1e-6)


def test_policy_rows_are_normalised_to_sum_one():
    buf = ReplayBuffer(20, seed=0)
    x, policy, value = samples(6)
    buf.add(x, policy, value)
    held = buf.arrays().policy
    np.testing.assert_allclose(held.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(held, policy / policy.sum(axis=1, keepdims=True), rtol=1e-6)
    assert (buf.sample(30).policy.sum(axis=1) == pytest.approx(1.0, rel=1e-6))


def test_a_value_column_of_shape_n_by_1_is_accepted():
    buf = ReplayBuffer(20, seed=0)
    x, policy, value = samples(4)
    buf.add(x, policy, value[:, None])
    assert ids_of(buf.arrays()) == [0, 1, 2, 3]


def test_a_value_only_buffer_holds_and_samples_no_policy():
    buf = ReplayBuffer(20, seed=0)
    x, _, value = samples(5)
    buf.add(x, None, value)
    assert buf.num_actions is None
    assert buf.arrays().policy is None
    batch = buf.sample(8)
    assert batch.policy is None and batch.x.shape == (8, *SHAPE)
    assert set(ids_of(batch)) <= set(range(5))


def test_a_value_only_buffer_can_be_declared_up_front():
    buf = ReplayBuffer(20, seed=0, state_shape=(9, 9))
    assert buf.state_shape == (9, 9) and buf.num_actions is None and len(buf) == 0
    with pytest.raises(ValueError, match="no policy"):
        buf.add(np.zeros((2, 9, 9)), np.ones((2, 4)), np.zeros(2))
    buf.add(np.zeros((2, 9, 9)), None, np.zeros(2))
    assert len(buf) == 2


# -- sampling ----------------------------------------------------------------------------


def test_sampling_is_uniform_over_every_sample_and_a_copy():
    buf = ReplayBuffer(50, seed=3)
    buf.add(*samples(20))
    batch = buf.sample(2000)
    counts = np.bincount(np.array(ids_of(batch)), minlength=20)
    assert (counts > 0).all()                         # every sample drawn
    assert counts.max() < 2.0 * counts.min()           # roughly uniform (expected 100)
    batch.x[:] = -1.0
    assert (buf.arrays().x >= 0).all()                 # the buffer is not a view


def test_the_same_seed_gives_the_same_minibatches():
    one, two, other = ReplayBuffer(50, seed=7), ReplayBuffer(50, seed=7), ReplayBuffer(50, 8)
    for buf in (one, two, other):
        buf.add(*samples(30, seed=1))
    draws = [(one.sample(16), two.sample(16), other.sample(16)) for _ in range(5)]
    for a, b, _ in draws:
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.policy, b.policy)
        np.testing.assert_array_equal(a.value, b.value)
    assert any(ids_of(a) != ids_of(c) for a, _, c in draws)


def test_sampling_an_empty_buffer_or_a_batch_of_zero_raises_value_error():
    buf = ReplayBuffer(10, seed=0)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(4)
    with pytest.raises(ValueError, match="empty"):
        buf.arrays()
    buf.add(*samples(2))
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(0)


def test_mirror_columns_flips_the_board_columns_and_the_policy():
    x, policy, _ = samples(3, seed=2)
    fx, fp = mirror_columns(x, policy)
    np.testing.assert_array_equal(fx[:, :, :, 0], x[:, :, :, 6])
    np.testing.assert_array_equal(fx[:, 1, 2, :], x[:, 1, 2, ::-1])
    np.testing.assert_array_equal(fp, policy[:, ::-1])
    assert mirror_columns(x, None)[1] is None


def test_augmentation_mirrors_some_sampled_rows_and_leaves_the_others_as_they_are():
    buf = ReplayBuffer(50, seed=5, augment=mirror_columns)
    x, policy, value = samples(12, seed=4)  # noise makes every row asymmetric
    buf.add(x, policy, value)
    held = buf.arrays()
    batch = buf.sample(200)
    flipped = 0
    for bx, bp, v in zip(batch.x, batch.policy, batch.value):
        ox, op = held.x[int(v)], held.policy[int(v)]
        if np.array_equal(bx, ox):
            np.testing.assert_array_equal(bp, op)
        else:
            np.testing.assert_array_equal(bx, ox[..., ::-1])
            np.testing.assert_array_equal(bp, op[::-1])
            flipped += 1
    assert 0 < flipped < 200
    assert 60 < flipped < 140  # about half
    np.testing.assert_array_equal(buf.arrays().x, held.x)  # the stored rows stay as added


def test_augmented_sampling_is_deterministic_for_a_seed():
    one = ReplayBuffer(50, seed=9, augment=mirror_columns)
    two = ReplayBuffer(50, seed=9, augment=mirror_columns)
    for buf in (one, two):
        buf.add(*samples(10, seed=3))
    for _ in range(3):
        a, b = one.sample(32), two.sample(32)
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.policy, b.policy)


# -- bad input loses nothing -------------------------------------------------------------


def full_buffer():
    buf = ReplayBuffer(8, seed=0)
    buf.add(*samples(6))
    buf.add(*samples(4, start=6))  # wrapped: next is mid-ring
    return buf


def bad_adds():
    x, policy, value = samples(3, start=100)
    nan_value = value.copy()
    nan_value[1] = np.nan
    nan_policy = policy.copy()
    nan_policy[0, 2] = np.nan
    negative = policy.copy()
    negative[2, 0] = -1.0
    zero_row = policy.copy()
    zero_row[1] = 0.0
    nan_state = x.copy()
    nan_state[0, 0, 0, 0] = np.nan
    return {
        "nan state": ((nan_state, policy, value), "states x must be finite"),
        "state shape": ((np.zeros((3, 6, 7), np.float32), policy, value), "states"),
        "policy width": ((x, policy[:, :5], value), "policy columns"),
        "policy rows": ((x, policy[:2], value), "policy must have shape"),
        "no policy": ((x, None, value), "no policy"),
        "value length": ((x, policy, value[:2]), "value must have shape"),
        "value 2-d": ((x, policy, np.zeros((3, 2))), "value must have shape"),
        "nan value": ((x, policy, nan_value), "finite"),
        "inf value": ((x, policy, np.full(3, np.inf)), "finite"),
        "nan policy": ((x, nan_policy, value), "finite"),
        "negative policy": ((x, negative, value), "non-negative"),
        "all-zero policy row": ((x, zero_row, value), "positive sum"),
        "scalar x": ((np.float32(1.0), None, np.zeros(1)), "x must be an array"),
        # states of no values: save wrote them, and load refused the file
        "empty state dimension": ((np.zeros((3, 0)), policy, value),
                                  "every state dimension >= 1"),
        # A float32 cast alone would drop the imaginary parts, or parse the text.
        "complex x": ((x + 1j, policy, value), "x must hold real numbers, got complex"),
        "complex policy": ((x, policy + 0j, value), "policy must hold real numbers"),
        "complex value": ((x, policy, value + 1j), "value must hold real numbers"),
        "text value": ((x, policy, value.astype(str)), "value must hold real numbers"),
        "object array of text": ((x, policy, value.astype(object).astype(str).astype(object)),
                                 "value must hold real numbers"),
    }


@pytest.mark.parametrize("case", list(bad_adds()))
def test_a_bad_add_raises_a_clear_value_error_and_loses_nothing(case):
    (x, policy, value), message = bad_adds()[case]
    buf = full_buffer()
    before = snapshot(buf)
    with pytest.raises(ValueError, match=message):
        buf.add(x, policy, value)
    assert_same(before, snapshot(buf))
    buf.add(*samples(1, start=50))  # and it still works
    assert ids_of(buf.arrays())[-1] == 50


def test_a_first_add_of_states_of_no_values_is_refused_as_the_constructor_refuses_them(
        tmp_path):
    """(3, 0) states were taken by an unshaped buffer, sampled and saved, and the
    saved file refused by load: a run would have found out at --resume."""
    with pytest.raises(ValueError, match="state_shape"):
        ReplayBuffer(8, state_shape=(0,))
    buf = ReplayBuffer(8, seed=0)
    for shape in ((3, 0), (3, 2, 0)):
        with pytest.raises(ValueError, match="every state dimension >= 1"):
            buf.add(np.ones(shape), None, np.zeros(3))
    assert len(buf) == 0 and buf.state_shape is None
    buf.add(np.ones((3, 2)), None, np.zeros(3))
    buf.save(tmp_path / "buffer.npz")
    assert ReplayBuffer.load(tmp_path / "buffer.npz").state_shape == (2,)


def test_a_bad_first_add_leaves_the_buffer_empty_and_unshaped():
    buf = ReplayBuffer(8, seed=0)
    x, policy, value = samples(3)
    policy[0] = 0.0
    with pytest.raises(ValueError):
        buf.add(x, policy, value)
    assert len(buf) == 0 and buf.state_shape is None
    buf.add(np.zeros((2, 9, 9)), None, np.zeros(2))  # any shape may come first still
    assert buf.state_shape == (9, 9)


def test_bad_capacity_or_seed_raise_value_error():
    # 2**63: ring positions past int64 made every add fail with a bare OverflowError.
    for kwargs in ({"capacity": 0}, {"capacity": 2.5}, {"capacity": 4, "seed": -1},
                   {"capacity": 2 ** 63}):
        with pytest.raises(ValueError):
            ReplayBuffer(**kwargs)
    big = ReplayBuffer(2 ** 63 - 1, seed=0)
    big.add(*samples(2))
    assert len(big) == 2


def test_an_object_array_of_plain_numbers_is_its_numbers():
    x, policy, value = samples(3)
    buf, plain = ReplayBuffer(8, seed=0), ReplayBuffer(8, seed=0)
    buf.add(x.astype(object), policy.astype(object), value.astype(object))
    plain.add(x, policy, value)
    assert_same(snapshot(plain), snapshot(buf))


@pytest.mark.parametrize("kwargs, match", [
    ({"state_shape": (2.5,)},
     r"state_shape must be a sequence of integers >= 1, got \(2.5,\)"),
    ({"state_shape": (-1,)}, r"state_shape must be .* got \(-1,\)"),
    ({"state_shape": (2, 0, 7)}, "state_shape must be"),
    ({"state_shape": (True, 2)}, "state_shape must be"),
    ({"state_shape": "ab"}, "state_shape must be .* got 'ab'"),
    ({"state_shape": 7}, "state_shape must be .* got 7"),
    ({"state_shape": (3,), "num_actions": 2.7},
     "num_actions must be an integer >= 1, got 2.7"),
    ({"state_shape": (3,), "num_actions": 0}, "num_actions must be an integer >= 1, got 0"),
    ({"state_shape": (3,), "num_actions": -3}, "num_actions must be an integer >= 1"),
    ({"state_shape": (3,), "num_actions": "7"}, "num_actions must be an integer >= 1"),
    ({"num_actions": 7}, "num_actions is declared with state_shape"),
])
def test_a_bad_state_shape_or_num_actions_raises_value_error_naming_it(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReplayBuffer(10, **kwargs)


def test_an_augment_that_is_not_callable_is_refused_where_it_is_given(tmp_path):
    with pytest.raises(TypeError, match="augment must be callable or None, got int 5"):
        ReplayBuffer(10, augment=5)
    path = saved(tmp_path)
    # Refused as an argument, not reported as a corrupt file.
    with pytest.raises(TypeError, match="augment must be callable or None"):
        ReplayBuffer.load(path, augment="mirror")


@pytest.mark.parametrize("declared", [False, True])
def test_a_fresh_buffer_allocates_as_samples_arrive_not_its_capacity(declared):
    import tracemalloc

    kwargs = {"state_shape": SHAPE, "num_actions": ACTIONS} if declared else {}
    tracemalloc.start()
    try:  # preallocated, 10**9 Connect Four samples would be 313 GiB of states
        buf = ReplayBuffer(10 ** 9, seed=0, **kwargs)
        for start in range(0, 40, 5):
            buf.add(*samples(5, start=start))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2 ** 20  # 40 samples' arrays, doubled: well under a MiB
    assert len(buf) == 40 and ids_of(buf.arrays()) == list(range(40))
    assert set(ids_of(buf.sample(1000))) == set(range(40))


def test_a_fresh_buffer_grown_one_add_at_a_time_rings_and_samples_as_its_capacity_says():
    buf = ReplayBuffer(12, seed=3)
    for i in range(30):
        buf.add(*samples(1, start=i))
        held = list(range(max(0, i - 11), i + 1))  # the newest 12, oldest first
        assert ids_of(buf.arrays()) == held
    # Slot j of the full ring holds the newest id = j mod 12; sampling draws slots.
    ring = [max(k for k in range(30) if k % 12 == j) for j in range(12)]
    slots = np.random.default_rng(3).integers(0, 12, 50)
    assert ids_of(buf.sample(50)) == [ring[j] for j in slots]


# -- saving ------------------------------------------------------------------------------


def test_save_and_load_round_trip_the_samples_and_continue_the_same_sampling(tmp_path):
    buf = ReplayBuffer(10, seed=4, augment=mirror_columns)
    buf.add(*samples(7, seed=0))
    buf.add(*samples(6, start=7, seed=1))  # wrapped
    buf.sample(5)                          # advance the sampling state
    path = tmp_path / "replay.npz"
    buf.save(path)
    loaded = ReplayBuffer.load(path, augment=mirror_columns)
    assert (len(loaded), loaded.added, loaded.capacity, loaded.seed) == (10, 13, 10, 4)
    assert_same(snapshot(buf), snapshot(loaded))
    for _ in range(4):
        a, b = buf.sample(16), loaded.sample(16)
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.policy, b.policy)
        np.testing.assert_array_equal(a.value, b.value)
    buf.add(*samples(3, start=13))       # and the ring goes on in the same place
    loaded.add(*samples(3, start=13))
    assert_same(snapshot(buf), snapshot(loaded))


def test_a_value_only_buffer_round_trips(tmp_path):
    buf = ReplayBuffer(6, seed=1)
    x, _, value = samples(4)
    buf.add(x, None, value)
    buf.save(tmp_path / "v.npz")
    loaded = ReplayBuffer.load(tmp_path / "v.npz")
    assert loaded.num_actions is None and loaded.arrays().policy is None
    assert_same(snapshot(buf), snapshot(loaded))
    np.testing.assert_array_equal(buf.sample(9).value, loaded.sample(9).value)


def test_an_empty_buffer_round_trips(tmp_path):
    ReplayBuffer(6, seed=2).save(tmp_path / "e.npz")
    loaded = ReplayBuffer.load(tmp_path / "e.npz")
    assert len(loaded) == 0 and loaded.capacity == 6 and loaded.state_shape is None
    loaded.add(*samples(2))
    assert len(loaded) == 2


@pytest.mark.parametrize("shaped", [False, True])
def test_a_loaded_buffer_grows_as_adds_need_and_rings_as_the_one_saved(tmp_path, shaped):
    kwargs = {"state_shape": SHAPE, "num_actions": ACTIONS} if shaped else {}
    for first in (0, 3, 12):  # loaded empty, part full, full
        buf = ReplayBuffer(12, seed=5, **kwargs)
        if first:
            buf.add(*samples(first))
        buf.save(tmp_path / "r.npz")
        loaded = ReplayBuffer.load(tmp_path / "r.npz")
        for start, n in ((first, 2), (first + 2, 4), (first + 6, 9), (first + 15, 30)):
            buf.add(*samples(n, start=start))
            loaded.add(*samples(n, start=start))
            assert_same(snapshot(buf), snapshot(loaded))
            np.testing.assert_array_equal(buf.sample(8).value, loaded.sample(8).value)


@pytest.mark.parametrize("capacity", [10 ** 6, 10 ** 13])
def test_a_header_capacity_far_above_the_samples_held_allocates_only_what_the_file_holds(
        tmp_path, capacity):
    import tracemalloc

    path = saved(tmp_path)
    rewrite(path, lambda meta: meta.update(capacity=capacity))
    tracemalloc.start()
    try:
        loaded = ReplayBuffer.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2 ** 20  # the 40 samples' arrays: a few hundred KiB
    assert (len(loaded), loaded.capacity) == (40, capacity)
    before = snapshot(loaded)
    loaded.add(*samples(5, start=40))  # and it grows as adds need
    assert len(loaded) == 45 and ids_of(loaded.arrays()) == list(range(45))
    np.testing.assert_array_equal(loaded.arrays().x[:40], before[2])


def test_saving_over_a_file_replaces_it_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "replay.npz"
    buf = ReplayBuffer(6, seed=0)
    buf.add(*samples(2))
    buf.save(path)
    buf.add(*samples(3, start=2))
    buf.save(path)
    assert len(ReplayBuffer.load(path)) == 5
    assert [p.name for p in tmp_path.iterdir()] == ["replay.npz"]


def saved(tmp_path, policy=True):
    buf = ReplayBuffer(50, seed=0)
    x, pi, z = samples(40, seed=0)
    buf.add(x, pi if policy else None, z)
    path = tmp_path / "replay.npz"
    buf.save(path)
    return path


def assert_refused(path, match):
    with pytest.raises(CheckpointError, match=match) as info:
        ReplayBuffer.load(path)
    assert isinstance(info.value, ValueError)  # what callers caught before
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_missing_buffer_file_is_refused_naming_it(tmp_path):
    assert_refused(tmp_path / "nowhere.npz", "missing")
    os.mkfifo(tmp_path / "fifo.npz")  # there, but no file: said so, not "missing"
    assert_refused(tmp_path / "fifo.npz", "is not a regular file")


@pytest.mark.parametrize("how", ["truncated", "empty", "random bytes", "flipped bytes",
                                 "not a zip"])
def test_a_damaged_buffer_file_is_refused_naming_it(tmp_path, how):
    path = saved(tmp_path)
    data = path.read_bytes()
    middle = len(data) // 2
    damaged = {
        "truncated": data[:middle], "empty": b"",
        "random bytes": np.random.default_rng(0).bytes(len(data)),
        "flipped bytes": data[:middle] + bytes(255 - b for b in data[middle:middle + 64])
        + data[middle + 64:],
        "not a zip": b"\xff\xfe not utf-8 and not a zip",
    }[how]
    path.write_bytes(damaged)
    assert_refused(path, "corrupt, truncated")


@pytest.mark.parametrize("field, value", [(10, 99), (8, 1)])  # a method, "encrypted"
def test_a_damaged_zip_directory_entry_is_refused_naming_the_file(tmp_path, field, value):
    # zipfile says so with NotImplementedError ("That compression method is not
    # supported") or RuntimeError ("... is encrypted, password required"), which went
    # through as they were.
    path = saved(tmp_path)
    data = bytearray(path.read_bytes())
    entry = data.index(b"PK\x01\x02")  # the central directory's first entry
    data[entry + field:entry + field + 2] = value.to_bytes(2, "little")
    path.write_bytes(bytes(data))
    assert_refused(path, "corrupt, truncated")


def test_ragged_states_are_refused_naming_x():
    buf = ReplayBuffer(10)
    with pytest.raises(ValueError, match="x must be an array of one shape"):
        buf.add([[1.0, 2.0], [3.0]], None, [0.0, 0.0])
    assert len(buf) == 0


@pytest.mark.parametrize("returned, message", [
    (lambda x, p: (x[:1], p), "returned x of shape"),
    (lambda x, p: (x, p[:, :1]), "must return a policy of shape"),
    (lambda x, p: (x, None), "must return a policy of shape"),
    (lambda x, p: None, r"must return \(x, policy\), got NoneType"),
])
def test_an_augment_whose_rows_do_not_fit_is_refused(returned, message):
    # Written back by broadcasting: one row copied over every flipped row, or a policy
    # column spread over every action, without a word.
    buf = ReplayBuffer(50, seed=5, augment=returned)
    buf.add(*samples(12, seed=4))
    with pytest.raises(ValueError, match=message):
        buf.sample(64)


def test_a_buffer_file_truncated_anywhere_is_refused_naming_it(tmp_path):
    path = saved(tmp_path)
    data = path.read_bytes()
    for keep in (len(data) // 2, len(data) - 30, 10, 0):
        path.write_bytes(data[:keep])
        assert_refused(path, "corrupt, truncated")


def test_an_npz_that_is_not_a_replay_buffer_is_refused_naming_it(tmp_path):
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    assert_refused(other, "not a replay buffer")
    wrong_format = tmp_path / "format.npz"
    np.savez(wrong_format, meta=np.frombuffer(b'{"format": "something/9"}', np.uint8))
    assert_refused(wrong_format, "format 'something/9'")


def rewrite(path, meta_change=None, arrays_change=None, raw_meta=None):
    """Rewrites the buffer file at ``path`` with its header or arrays changed."""
    arrays = dict(np.load(path))
    meta = json.loads(bytes(arrays["meta"]).decode())
    if meta_change is not None:
        meta_change(meta)
    arrays["meta"] = (np.frombuffer(raw_meta, np.uint8) if raw_meta is not None
                      else np.frombuffer(json.dumps(meta).encode(), np.uint8))
    if arrays_change is not None:
        arrays_change(arrays)
    np.savez(path, **arrays)


@pytest.mark.parametrize("raw, match", [(b"\xff\xfe\x00", "not JSON text"),
                                        (b'{"format": "async', "not JSON text"),
                                        (b"{}", "'header.format' is missing"),
                                        (b"[]", "'header' must be a JSON object")])
def test_a_buffer_header_that_is_not_a_json_object_is_refused(tmp_path, raw, match):
    path = saved(tmp_path)
    rewrite(path, raw_meta=raw)
    assert_refused(path, match)


@pytest.mark.parametrize("edit, match", [
    (lambda text: text[:-1] + ', "seed": 99}', "the key 'seed' is written twice"),
    (lambda text: text.replace('"seed": 0', '"seed": NaN'), "NaN is not a JSON number")])
def test_a_buffer_header_holding_json_no_writer_makes_is_refused(tmp_path, edit, match):
    """A key written twice: one of its values was taken without a word (the seed)."""
    path = saved(tmp_path)
    text = bytes(np.load(path)["meta"]).decode()
    assert '"seed": 0' in text
    rewrite(path, raw_meta=edit(text).encode())
    assert_refused(path, f"header holds JSON that this project never writes: {match}")


HEADER = ["capacity", "seed", "size", "next", "added", "state_shape", "num_actions", "rng"]


@pytest.mark.parametrize("field", HEADER)
def test_a_buffer_header_missing_a_field_is_refused_naming_it(tmp_path, field):
    path = saved(tmp_path)
    rewrite(path, lambda meta: meta.pop(field))
    assert_refused(path, rf"'header.{field}' is missing")


@pytest.mark.parametrize("field, value", [
    ("capacity", "50"), ("seed", 1.5), ("size", True), ("next", None), ("added", [40]),
    ("state_shape", "2x6x7"), ("num_actions", "7"), ("rng", 3)])
def test_a_buffer_header_field_of_the_wrong_type_is_refused_naming_it(tmp_path, field,
                                                                      value):
    path = saved(tmp_path)
    rewrite(path, lambda meta: meta.update({field: value}))
    assert_refused(path, rf"'header.{field}' must be")


@pytest.mark.parametrize("change, match", [
    ({"capacity": 0}, r"'header.capacity' must be an integer in \[1, "),
    ({"seed": -1}, "'header.seed' must be an integer >= 0"),
    ({"size": 51}, "'header.size' must be an integer in"),
    ({"size": -2}, "'header.size' must be an integer in"),
    ({"next": 99}, "'header.next' must be an integer in"),
    ({"next": 1}, "ring position"),
    ({"added": 3}, "'header.added' must be an integer >= 40"),
    ({"state_shape": [2, 0, 7]}, "'header.state_shape' must be"),
    ({"num_actions": 0}, "'header.num_actions' must be"),
    ({"rng": {"bit_generator": "PCG64", "state": "x"}}, "'rng' is not a PCG64 state"),
    ({"extra": 1}, "unknown fields"),
])
def test_a_buffer_header_out_of_range_is_refused_naming_the_field(tmp_path, change,
                                                                  match):
    path = saved(tmp_path)
    rewrite(path, lambda meta: meta.update(change))
    assert_refused(path, match)


@pytest.mark.parametrize("name, change, match", [
    ("x", lambda a: a.update(x=a["x"][:-1]), "'x' must be float32"),
    ("x", lambda a: a.update(x=a["x"].astype(np.float64)), "'x' must be float32"),
    ("pi", lambda a: a.pop("pi"), "'pi' must be float32 .* got nothing"),
    ("z", lambda a: a.update(z=np.full_like(a["z"], np.nan)), "not all finite"),
    ("pi", lambda a: a.update(pi=a["pi"] * 2), "summing to 1"),
    ("pi", lambda a: a.update(pi=-a["pi"]), "non-negative"),
    ("extra", lambda a: a.update(extra=np.zeros(2)), "holds arrays"),
])
def test_buffer_arrays_of_the_wrong_shape_type_or_values_are_refused(tmp_path, name,
                                                                     change, match):
    path = saved(tmp_path)
    rewrite(path, arrays_change=change)
    assert_refused(path, match)


@pytest.mark.parametrize("path, value", [
    (("state", "state"), -1), (("state", "state"), 2 ** 200), (("state", "inc"), 2 ** 128),
    (("uinteger",), -1), (("has_uint32",), 2 ** 64)])
def test_a_buffer_header_rng_number_out_of_range_is_refused_naming_it(tmp_path, path,
                                                                      value):
    # numpy raises OverflowError for these, not the ValueError of other bad states.
    def change(meta):
        *parents, key = path
        node = meta["rng"]
        for p in parents:
            node = node[p]
        node[key] = value

    saved_path = saved(tmp_path)
    rewrite(saved_path, change)
    assert_refused(saved_path, "'rng' is not a PCG64 state")


@pytest.mark.parametrize("shape", [[2, 6, 2 ** 40], [2 ** 62]])
def test_a_header_state_shape_past_memory_is_refused_naming_the_array(tmp_path, shape):
    path = saved(tmp_path)
    rewrite(path, lambda meta: meta.update(state_shape=shape))
    assert_refused(path, "the array 'x' must be float32")


def test_an_array_whose_own_header_is_sized_past_memory_is_refused_naming_the_file(
        tmp_path):
    path = saved(tmp_path)
    arrays = dict(np.load(path))
    with zipfile.ZipFile(path, "w") as npz:  # x.npy says [40, 2**48] and holds 40 rows
        for name, array in arrays.items():
            with npz.open(f"{name}.npy", "w") as f:
                if name == "x":
                    np.lib.format.write_array_header_1_0(
                        f, {"descr": "<f4", "fortran_order": False,
                            "shape": (40, 2 ** 48)})
                    f.write(array.tobytes())
                else:
                    np.lib.format.write_array(f, array)
    assert_refused(path, "the array .x. must be float32 .* declares \\[40, 281474976710656\\]")


def test_a_full_disk_during_a_save_names_the_file_and_keeps_the_previous_buffer(tmp_path):
    path = saved(tmp_path)
    before = ReplayBuffer.load(path)
    script = f"""
import resource, signal
import numpy as np
from async_search.training.replay import ReplayBuffer
buffer = ReplayBuffer.load({str(path)!r})
buffer.add(np.ones((5, 2, 6, 7), np.float32), np.ones((5, 7)), np.zeros(5))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    buffer.save({str(path)!r})
except OSError as e:
    print(type(e).__name__, e.errno, e)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("FileWriteError 27 cannot write"), out.stdout
    assert str(path) in out.stdout and "File too large" in out.stdout
    assert_same(snapshot(before), snapshot(ReplayBuffer.load(path)))
    assert [p.name for p in tmp_path.iterdir()] == ["replay.npz"]


def _rewritten(path, replace):
    """The buffer file with some members' bytes replaced: ``replace`` maps a member's
    name to a function writing it to an open zip member (deflated)."""
    arrays = dict(np.load(path))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as npz:
        for name, array in arrays.items():
            with npz.open(f"{name}.npy", "w") as f:
                replace.get(name, lambda f, a=array: np.lib.format.write_array(f, a))(f)
    return path


@pytest.mark.parametrize("header", [b"[" * 100_000 + b"]" * 100_000, b"9" * 5000])
def test_a_header_past_pythons_json_limits_is_refused_naming_the_file(tmp_path, header):
    # Nesting raised RecursionError (a traceback through main.py --resume); an integer
    # of over 4,300 digits a ValueError naming no file.
    path = _rewritten(saved(tmp_path), {"meta": lambda f: np.lib.format.write_array(
        f, np.frombuffer(header, np.uint8))})
    assert_refused(path, "its header is not JSON")


def test_a_zip_bomb_is_refused_before_it_inflates(tmp_path):
    # x inflated to 400 MB (from under a megabyte) before its shape was compared.
    path = _rewritten(saved(tmp_path), {"x": lambda f: np.lib.format.write_array(
        f, np.zeros((100_000, 1_000), np.float32))})
    assert os.path.getsize(path) < 1 << 20
    assert_refused(path, "the array 'x' must be float32 .* takes 400,000,128 bytes")
