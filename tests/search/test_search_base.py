"""search/base.py: reading a heuristic model's outputs (values_of)."""

import numpy as np
import pytest

from async_search.errors import ModelOutputError
from async_search.search.base import values_of


@pytest.mark.parametrize("y", [
    np.array([[1 + 2j], [3 + 0j]]),  # the imaginary part would be dropped silently
    np.array([["a"], ["b"]]),
    np.array([[object()], [1.0]], dtype=object),
])
def test_values_of_refuses_outputs_that_are_not_real_numbers(y):
    with pytest.raises(ModelOutputError, match="must be real numbers"):
        values_of(y, 2, "the heuristic model's output")


def test_values_of_reads_numbers_held_as_objects_as_floats():
    assert values_of(np.array([[1.5], [2]], dtype=object), 2, "h") == [1.5, 2.0]


@pytest.mark.parametrize("y", [np.array([[1.0], [np.inf]], np.float32),
                               np.array([np.nan, 1.0], np.float16)])
def test_values_of_refuses_values_that_are_not_finite(y):
    with pytest.raises(ModelOutputError, match="must be finite"):
        values_of(y, 2, "h")


def test_values_of_takes_finite_values_whose_sum_overflows():
    assert values_of(np.array([1e308, 1e308]), 2, "h") == [1e308, 1e308]
