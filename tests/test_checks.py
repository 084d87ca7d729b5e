import fractions
import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from async_search.checks import check_callable, check_float, check_int, is_int


@pytest.mark.parametrize("value, expected", [
    (0, True), (-3, True), (np.int64(8), True), (np.uint8(1), True),
    (True, False), (False, False), (np.bool_(True), False), (1.0, False), ("1", False),
    (None, False),
])
def test_is_int_accepts_integers_and_never_a_bool(value, expected):
    assert is_int(value) is expected


@given(st.integers(1, 10 ** 6))
def test_check_int_returns_a_python_int(value):
    for given_ in (value, np.int64(value)):
        got = check_int("n", given_, minimum=1)
        assert got == value and type(got) is int


@pytest.mark.parametrize("value, bounds, message", [
    (True, dict(minimum=1), "max_batch_size must be an integer >= 1, got True"),
    (0, dict(minimum=1), "max_batch_size must be an integer >= 1, got 0"),
    (2.5, dict(), "max_batch_size must be an integer, got 2.5"),
    (9, dict(maximum=8), "max_batch_size must be an integer <= 8, got 9"),
    (9, dict(minimum=2, maximum=8), r"max_batch_size must be an integer in \[2, 8\], got 9"),
    ("8", dict(minimum=1), "max_batch_size must be an integer >= 1, got '8'"),
])
def test_check_int_names_the_argument_the_rule_and_the_value(value, bounds, message):
    with pytest.raises(ValueError, match=message):
        check_int("max_batch_size", value, **bounds)


def test_check_int_bounds_are_inclusive():
    assert check_int("n", 2, minimum=2, maximum=2) == 2


@pytest.mark.parametrize("value", [0, 1, 0.5, np.float32(0.25), np.int64(3)])
def test_check_float_returns_a_python_float(value):
    got = check_float("delay", value, minimum=0)
    assert got == float(value) and type(got) is float


@pytest.mark.parametrize("value, bounds, message", [
    (True, dict(minimum=0), "delay must be a finite number >= 0, got True"),
    (-1, dict(minimum=0), "delay must be a finite number >= 0, got -1"),
    (0, dict(minimum=0, strict=True), "delay must be a finite number > 0, got 0"),
    (2, dict(minimum=0, maximum=1), "delay must be a finite number >= 0 and <= 1, got 2"),
    (math.inf, dict(), "delay must be a finite number, got inf"),
    (math.nan, dict(minimum=0), "delay must be a finite number >= 0, got nan"),
    (None, dict(), "delay must be a finite number, got None"),
    ("fast", dict(), "delay must be a finite number, got 'fast'"),
    ("1.5", dict(), "delay must be a finite number, got '1.5'"),  # float() would read it
    (b"2", dict(), "delay must be a finite number, got b'2'"),
    # Too large for a float: float() raised OverflowError, which named nothing; the
    # value is shown briefly.
    (10 ** 400, dict(minimum=0), r"delay must be a finite number >= 0, got 1000.*\.\.\..*0$"),
    (fractions.Fraction(10 ** 400, 3), dict(), "delay must be a finite number, got Fraction"),
])
def test_check_float_names_the_argument_the_rule_and_the_value(value, bounds, message):
    with pytest.raises(ValueError, match=message):
        check_float("delay", value, **bounds)


def test_check_callable_names_the_argument_and_lets_none_through_only_when_optional():
    assert check_callable("fn", len) is len
    assert check_callable("fn", None, optional=True) is None
    with pytest.raises(TypeError, match="fn must be callable, got NoneType None"):
        check_callable("fn", None)
    with pytest.raises(TypeError, match="fn must be callable or None, got str 'x'"):
        check_callable("fn", "x", optional=True)


def test_check_callable_names_a_huge_or_unprintable_value_briefly():
    class Unprintable:
        def __repr__(self):
            raise RuntimeError("no repr")

    with pytest.raises(TypeError, match="fn must be callable, got Unprintable <"):
        check_callable("fn", Unprintable())
    with pytest.raises(TypeError) as info:
        check_callable("fn", list(range(1_000_000)))
    assert len(str(info.value)) < 200


def test_check_instance_names_the_argument_an_example_and_a_class_given_for_an_instance():
    from async_search.checks import check_instance
    check_instance("x", 3, int, "3")
    with pytest.raises(TypeError, match=r"^x must be an int instance, such as 3; got "
                                        r"the class int$"):
        check_instance("x", int, int, "3")
    with pytest.raises(TypeError, match=r"^x must be a float instance, such as 1.0; "
                                        r"got str 'a'$"):
        check_instance("x", "a", float, "1.0")


def test_a_plain_with_on_each_async_context_manager_says_to_use_async_with():
    pytest.importorskip("aiohttp")  # the http extra: RemoteEvaluate, HttpFront
    import async_search as asr
    from async_search.http import HttpFront, ModelRepository, RemoteEvaluate
    from async_search.servers.batching import BatchingServer

    made = [(asr.serve(len), "asr.serve"), (BatchingServer(len), "BatchingServer"),
            (RemoteEvaluate("http://127.0.0.1:1", "m"), "RemoteEvaluate"),
            (ModelRepository({}), "ModelRepository"), (HttpFront({}), "HttpFront")]
    for manager, name in made:
        with pytest.raises(TypeError, match=rf"^{re.escape(name)}\(\.\.\.\) is an async "
                                            rf"context manager: use `async with "):
            with manager:
                pass
