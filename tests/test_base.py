import numpy as np
import pytest

import async_search as asr
from async_search.base import (FIRST_VERSION, UNKNOWN_VERSION, TensorSpec, Versioned,
                               VersionedEvaluate, evaluate_with_version, first_version,
                               version_of)
from async_search.models import MLP

pytestmark = pytest.mark.timeout(60)

X = np.ones((2, 3), np.float32)


async def plain(x):
    return x * 2


class Labelled:
    """An evaluate function with a version and no with_version."""

    version = "v1"

    async def __call__(self, x):
        return x * 3


class Paired:
    """An evaluate function that says which version computed each answer."""

    version = 5

    async def __call__(self, x):
        return x * 4

    async def with_version(self, x):
        return x * 4, "computed-by-7"


def test_an_object_that_reports_no_version_has_the_unknown_version_none():
    assert UNKNOWN_VERSION is None and FIRST_VERSION == 0
    assert version_of(plain) is None and version_of(object()) is None
    assert version_of(Labelled()) == "v1" and version_of(Paired()) == 5


def test_a_server_numbers_an_unversioned_first_model_zero():
    assert first_version(MLP((3,))) == 0
    assert first_version(Labelled()) == "v1"


def test_the_protocols_recognise_what_they_describe():
    assert not isinstance(plain, Versioned)
    assert isinstance(Labelled(), Versioned) and not isinstance(Labelled(),
                                                                VersionedEvaluate)
    assert isinstance(Paired(), VersionedEvaluate)
    assert isinstance(asr.immediate(MLP((3,))), VersionedEvaluate)


async def test_evaluate_with_version_works_on_every_kind_of_evaluate():
    y, version = await evaluate_with_version(plain, X)
    assert version is None and np.array_equal(y, X * 2)
    y, version = await evaluate_with_version(Labelled(), X)
    assert version == "v1" and np.array_equal(y, X * 3)
    y, version = await evaluate_with_version(Paired(), X)  # with_version wins
    assert version == "computed-by-7" and np.array_equal(y, X * 4)


async def test_a_batching_server_is_versioned_and_reports_its_first_version():
    async with asr.serve(MLP((3,))) as evaluate:
        assert isinstance(evaluate, VersionedEvaluate)
        _, version = await evaluate_with_version(evaluate, X)
        assert version == version_of(evaluate) == FIRST_VERSION


@pytest.mark.parametrize("shape", [(-1,), (2.5,), (True,), (4, "4"), "ab", 5, None])
def test_a_tensor_spec_refuses_a_shape_that_is_not_integers_at_least_zero(shape):
    # int() would make 2.5 a 2 and True a 1; a negative size would fail at a first batch.
    with pytest.raises(ValueError, match="TensorSpec"):
        TensorSpec(shape, np.float32)


def test_a_tensor_spec_takes_any_sequence_of_integers():
    assert TensorSpec([np.int64(3), 0], np.float32).shape == (3, 0)
    assert TensorSpec(np.array([2, 2]), "float32").shape == (2, 2)


@pytest.mark.parametrize("dtype, message", [
    (None, "dtype must be given"),          # NumPy's default, float64, silently
    (str, "<U0 holds nothing"),             # no request could match it
    (bytes, "|S0 holds nothing"),
])
def test_a_tensor_spec_refuses_a_dtype_that_is_a_slip(dtype, message):
    with pytest.raises(ValueError, match=message):
        TensorSpec((2,), dtype)


def test_a_tensor_spec_takes_sized_strings():
    assert TensorSpec((2,), "U3").dtype == np.dtype("<U3")
