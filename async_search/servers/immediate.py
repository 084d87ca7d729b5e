"""The synchronous baseline: every request is its own batch, run on the spot."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from async_search.base import Outputs, input_spec_of
from async_search.servers.requests import RequestChecker

__all__ = ["Immediate", "immediate"]


class Immediate:
    """Calls the model directly with each request as its batch, on the event loop.

    It has the call shape of ``serve``'s evaluate and checks requests the same way, so a
    search runs unchanged against it; it is what batched serving is measured against.
    """

    def __init__(self, model: Any):
        self.model = model
        self._check = RequestChecker(input_spec_of(model))
        self._batches = 0
        self._elements = 0
        self._model_time = 0.0
        self._start = time.perf_counter()

    async def __call__(self, x: np.ndarray) -> Outputs:
        x = self._check(x)
        start = time.perf_counter()
        y = self.model(x)
        self._model_time += time.perf_counter() - start
        self._batches += 1
        self._elements += len(x)
        return y

    @property
    def stats(self) -> dict:
        """batches, elements, mean_batch_size, model_time_s, wall_time_s, fraction_in_model."""
        wall = time.perf_counter() - self._start
        return {
            "batches": self._batches,
            "elements": self._elements,
            "mean_batch_size": self._elements / self._batches if self._batches else 0.0,
            "model_time_s": self._model_time,
            "wall_time_s": wall,
            "fraction_in_model": self._model_time / wall if wall > 0 else 0.0,
        }


def immediate(model: Any) -> Immediate:
    """An evaluate function with no batching: ``await ev(x)`` is ``model(x)``.

    Example:
        >>> from async_search.models import MLP
        >>> ev = immediate(MLP((4,), output_size=1))
        >>> # inside a coroutine: y = await ev(np.zeros((2, 4), np.float32))
    """
    return Immediate(model)
