"""A pool of batch input buffers, reused instead of allocated for every batch."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import numpy as np

from async_search import rows


#: The largest buffer the pool allocates: a batch of elements whose ``capacity`` rows
#: would take more is concatenated instead, into an array of its own size (a
#: ``max_batch_size`` of millions must not ask for gigabytes for a batch of a few rows).
MAX_BUFFER_BYTES = 64 * 1024 * 1024


class BufferPool:
    """Buffers of ``capacity`` rows, one free list per element shape and dtype.

    ``take`` hands out a free buffer (or a new one); ``give_back`` returns it once the
    model is done with the batch, unless the model's outputs may share its memory (a
    model that returns a view of its input), since those outputs are still in use.

    Example:
        >>> pool = BufferPool(capacity=8)
        >>> buffer = pool.take(5, like=np.zeros((2, 3), np.float32))
        >>> buffer.shape
        (8, 3)
        >>> pool.give_back(buffer, outputs=np.zeros(5)); pool.allocated, pool.reused
        (1, 0)
    """

    def __init__(self, capacity: int, max_free: int = 4):
        self.capacity = capacity
        self.max_free = max_free
        self.allocated = 0
        self.reused = 0
        self._free: Dict[Tuple[Tuple[int, ...], np.dtype], List[np.ndarray]] = {}

    def take(self, rows: int, like: np.ndarray) -> np.ndarray | None:
        """A buffer of at least ``rows`` rows shaped like ``like``'s elements, or None
        when ``rows`` is over capacity, or ``capacity`` rows would take more than
        ``MAX_BUFFER_BYTES`` (or than the memory there is)."""
        if rows > self.capacity:
            return None
        free = self._free.get((like.shape[1:], like.dtype))
        if free:
            self.reused += 1
            return free.pop()
        shape = (self.capacity, *like.shape[1:])
        if math.prod(shape) * like.itemsize > MAX_BUFFER_BYTES:
            return None
        try:
            buffer = np.empty(shape, like.dtype)
        except MemoryError:
            return None
        self.allocated += 1
        return buffer

    def resize(self, capacity: int) -> None:
        """Buffers of ``capacity`` rows from now on; the free ones of the old size go."""
        if capacity != self.capacity:
            self.capacity = capacity
            self._free = {}

    def give_back(self, buffer: np.ndarray, outputs: Any) -> None:
        """Returns ``buffer`` to the pool unless ``outputs`` may share its memory (or
        it is of a capacity the pool no longer hands out)."""
        if len(buffer) != self.capacity or _may_share(outputs, buffer):
            return
        free = self._free.setdefault((buffer.shape[1:], buffer.dtype), [])
        if len(free) < self.max_free:
            free.append(buffer)


def _may_share(outputs: Any, buffer: np.ndarray) -> bool:
    if type(outputs) is np.ndarray:
        return np.may_share_memory(outputs, buffer)
    leaves = rows.leaves(outputs)
    if isinstance(leaves, list):  # a tuple, dict or list: nested ones too (to be safe)
        return any(_may_share(leaf, buffer) for leaf in leaves)
    return isinstance(leaves, np.ndarray) and np.may_share_memory(leaves, buffer)
