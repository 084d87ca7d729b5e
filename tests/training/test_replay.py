"""The replay buffer: a ring of samples, uniform seeded sampling, symmetry, save/load."""

import numpy as np
import pytest

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
    assert len(buf) == 4 and buf.added == 7  # 3, then the 4 newest of the 10
    assert ids_of(buf.arrays()) == [9, 10, 11, 12]
    buf.add(*samples(1, start=13))
    assert ids_of(buf.arrays()) == [10, 11, 12, 13]


def test_added_counts_the_samples_kept_from_an_oversized_add():
    buf = ReplayBuffer(4, seed=0)
    buf.add(*samples(10))
    assert buf.added == 4 and ids_of(buf.arrays()) == [6, 7, 8, 9]


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
    for kwargs in ({"capacity": 0}, {"capacity": 2.5}, {"capacity": 4, "seed": -1}):
        with pytest.raises(ValueError):
            ReplayBuffer(**kwargs)


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


def test_saving_over_a_file_replaces_it_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "replay.npz"
    buf = ReplayBuffer(6, seed=0)
    buf.add(*samples(2))
    buf.save(path)
    buf.add(*samples(3, start=2))
    buf.save(path)
    assert len(ReplayBuffer.load(path)) == 5
    assert [p.name for p in tmp_path.iterdir()] == ["replay.npz"]


def saved(tmp_path):
    buf = ReplayBuffer(50, seed=0)
    buf.add(*samples(40, seed=0))
    path = tmp_path / "replay.npz"
    buf.save(path)
    return path


def test_a_missing_buffer_file_raises_value_error_naming_it(tmp_path):
    path = tmp_path / "nowhere.npz"
    with pytest.raises(ValueError, match="does not exist") as info:
        ReplayBuffer.load(path)
    assert str(path) in str(info.value)


def test_a_truncated_buffer_file_raises_value_error_naming_it(tmp_path):
    path = saved(tmp_path)
    data = path.read_bytes()
    for keep in (len(data) // 2, len(data) - 30, 10, 0):
        path.write_bytes(data[:keep])
        with pytest.raises(ValueError, match="corrupt, truncated") as info:
            ReplayBuffer.load(path)
        assert str(path) in str(info.value)


def test_a_corrupt_buffer_file_raises_value_error_naming_it(tmp_path):
    path = saved(tmp_path)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(255 - b for b in data[middle:middle + 64])
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt, truncated") as info:
        ReplayBuffer.load(path)
    assert str(path) in str(info.value)


def test_an_npz_that_is_not_a_replay_buffer_raises_value_error_naming_it(tmp_path):
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    wrong_format = tmp_path / "format.npz"
    np.savez(wrong_format, meta=np.frombuffer(b'{"format": "something/9"}', np.uint8))
    for path in (other, wrong_format):
        with pytest.raises(ValueError, match="not a replay buffer") as info:
            ReplayBuffer.load(path)
        assert str(path) in str(info.value)


@pytest.mark.parametrize("change", [{"size": 50}, {"size": -2}, {"next": 99},
                                    {"next": 1}, {"capacity": 2}, {"size": "3"}])
def test_a_buffer_file_whose_ring_position_does_not_fit_is_refused(tmp_path, change):
    import json

    path = tmp_path / "b.npz"
    buf = ReplayBuffer(10)
    buf.add(np.zeros((3, 4), np.float32), None, np.zeros(3))
    buf.save(path)
    arrays = dict(np.load(path))
    meta = {**json.loads(bytes(arrays["meta"]).decode()), **change}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=str(path)):
        ReplayBuffer.load(path)
