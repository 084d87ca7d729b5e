"""Checking a request against the model's input spec, at the moment it is made."""

from __future__ import annotations

import numpy as np

from async_search.base import TensorSpec
from async_search.errors import InputSpecError

__all__ = ["RequestChecker"]


class RequestChecker:
    """Checks requests against an input spec; without one, learns it from the first.

    Calling the checker returns the request unchanged when it fits and raises
    InputSpecError (a ValueError) naming the expected and the given shape or dtype.
    """

    def __init__(self, spec: TensorSpec | None):
        self.spec = spec
        # Plain attributes so that a server can inline the common case.
        self.shape = spec.shape if spec is not None else None
        self.dtype = spec.dtype if spec is not None else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        # The common case costs a type check and two comparisons.
        if type(x) is np.ndarray and x.shape[1:] == self.shape and x.dtype == self.dtype \
                and x.ndim:
            return x
        return self._slow_check(x)

    def _slow_check(self, x) -> np.ndarray:
        if not isinstance(x, np.ndarray):
            expected = self.spec.describe() if self.spec else "a NumPy array [n, ...]"
            raise InputSpecError(
                f"a request must be a NumPy array {expected}, got {type(x).__name__}")
        if x.ndim == 0:
            raise InputSpecError(
                "a request must have a batch dimension [n, ...], got a 0-d array")
        if self.spec is None:
            self.spec = TensorSpec.of_batch(x)
            self.shape, self.dtype = self.spec.shape, self.spec.dtype
            return x
        given = f"[{', '.join(map(str, x.shape))}] {x.dtype}"
        if x.shape[1:] != self.shape:
            raise InputSpecError(
                f"request shape does not match the model's input: expected "
                f"{self.spec.describe()}, given {given}")
        if x.dtype != self.dtype:
            raise InputSpecError(
                f"request dtype does not match the model's input: expected "
                f"{self.spec.describe()}, given {given}")
        return x  # an ndarray subclass that fits
