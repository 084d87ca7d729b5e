"""The rule the adapters' with_weights share: a weight is cast into its net's dtype only
where the cast keeps its values (NumPy alone; the adapters' own tests run it through
each framework)."""

import numpy as np
import pytest

from async_search.models.weight_casts import (host_copy, kind_refused, values_lost,
                                              weight_array)


def head(given):
    return f"weight k is {given}, the model's is int32"


@pytest.mark.parametrize("given, dtype, refused", [
    (np.float64, np.int32, True),      # truncated
    (np.complex128, np.float32, True),  # its imaginary part dropped
    (np.int64, np.bool_, True),
    (np.dtype(object), np.int32, True),
    (np.float64, np.float32, False),   # rounded: the same kind
    (np.int64, np.float32, False),
    (np.int64, np.uint8, False),       # either sign: values_lost checks the range
    (np.uint64, np.int8, False),
    (np.bool_, np.int32, False),
])
def test_values_of_another_kind_are_refused(given, dtype, refused):
    assert kind_refused(np.dtype(given), np.dtype(dtype)) is refused


def test_integers_outside_the_weights_range_are_lost_and_those_inside_kept():
    def lost(values, dtype):
        given = np.array(values)
        return values_lost(given, given.astype(dtype))

    assert lost([2 ** 40 + 5], np.int32) == (
        "it holds 1099511627781, outside int32's range (-2147483648 to 2147483647)")
    assert "values from -1 to 3" in lost([-1, 3], np.uint8)
    assert "values from 0 to 18446744073709551615" in lost(
        np.array([0, 2 ** 64 - 1], np.uint64), np.int64)  # compared exactly
    for values, dtype in (([-2 ** 31, 2 ** 31 - 1], np.int32), ([0, 255], np.uint8),
                          ([True, False], np.int8), (np.zeros(0, np.int64), np.int8)):
        assert lost(values, dtype) is None


def test_finite_floats_that_the_cast_makes_infinite_are_lost():
    def lost(values, dtype):
        given = np.array(values)
        with np.errstate(over="ignore"):
            return values_lost(given, given.astype(dtype))

    assert "past float32's range (up to 1e+300 in magnitude)" in lost(
        [0.5, -1e300], np.float32)
    assert "past float16's range (up to 70000" in lost(np.array([70000]), np.float16)
    assert "past complex64's range" in lost([1e300j], np.complex64)
    assert "past complex64's range" in lost([np.nan + 1e300j], np.complex64)  # a part
    assert lost([0.1, 3e38, np.inf, -np.inf, np.nan], np.float32) is None  # rounded, or
    # an infinity or a NaN given, which stays one: no change


def test_host_copy_copies_values_kept_and_refuses_the_rest_naming_the_weight():
    given = np.array([1, 2], np.int64)
    copy = host_copy(given, np.dtype(np.int32), head)
    assert copy.dtype == np.int32 and copy.tolist() == [1, 2]
    same = np.array([1, 2], np.int32)
    assert not np.may_share_memory(host_copy(same, np.dtype(np.int32), head), same)
    with pytest.raises(ValueError, match=r"^weight k is int64, the model's is int32: it "
                                         r"holds values from 1 to 4294967296, outside "
                                         r"int32's range \(-2147483648 to 2147483647\); "
                                         r"a cast would change its values$"):
        host_copy([1, 2 ** 32], np.dtype(np.int32), head)
    with pytest.raises(ValueError, match="is float64, the model's is int32: a cast"):
        host_copy([2.5], np.dtype(np.int32), head)
    with pytest.raises(ValueError, match="is object"):
        host_copy([2 ** 70], np.dtype(np.int32), head)  # past every NumPy integer


def test_a_value_numpy_cannot_hold_gets_value_error_not_overflow_error():
    class Huge:
        def __array__(self, dtype=None, copy=None):
            raise OverflowError("Python int too large to convert to C long")

    with pytest.raises(ValueError, match="a number NumPy cannot hold.*too large"):
        weight_array(Huge(), head)
    with pytest.raises(ValueError, match="would change its values"):
        host_copy(Huge(), np.dtype(np.int32), head)


def test_finite_floats_that_a_type_without_infinities_makes_nan_are_lost():
    ml_dtypes = pytest.importorskip("ml_dtypes")  # JAX's float8 types
    given = np.array([1e5, 1.0, 2.0], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        cast = given.astype(ml_dtypes.float8_e4m3fn)  # no inf: 1e5 becomes NaN
    assert "past float8_e4m3fn's range (up to 100000" in values_lost(given, cast)


def test_the_message_names_the_largest_finite_part_lost_for_any_float_type():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    given = np.array([3e38, 1.0], ml_dtypes.bfloat16)
    with np.errstate(all="ignore"):
        cast = given.astype(ml_dtypes.float8_e4m3fn)
    assert "up to 3.00406e+38 in magnitude" in values_lost(given, cast)
    given = np.array([np.nan + 1e300j, np.inf + 1e300j])
    with np.errstate(all="ignore"):
        assert "up to 1e+300 in magnitude" in values_lost(given, given.astype(np.complex64))
