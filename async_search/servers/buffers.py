"""A pool of batch input buffers, reused instead of allocated for every batch."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import numpy as np

from async_search import rows


#: Past this, a buffer is not of ``capacity`` rows but of as many as fit here (or of the
#: batch's rows, if more): a ``max_batch_size`` of millions must not ask for gigabytes
#: for a batch of a few rows, and big batches of big elements are still pooled.
MAX_BUFFER_BYTES = 64 * 1024 * 1024


class BufferPool:
    """Buffers of ``capacity`` rows (fewer where those would take more than
    ``MAX_BUFFER_BYTES``: then as many rows as fit, or the batch's), one free list per
    element shape and dtype.

    ``take`` hands out a free buffer long enough (or a new one); ``give_back`` returns
    it once the model is done with the batch, unless the model's outputs may share its
    memory (a model that returns a view of its input), since those outputs are still
    in use.

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
        when ``rows`` is over capacity (or no memory is left for one)."""
        if rows > self.capacity:
            return None
        free = self._free.get((like.shape[1:], like.dtype))
        if free:
            for i in range(len(free) - 1, -1, -1):
                if len(free[i]) >= rows:
                    self.reused += 1
                    return free.pop(i)
        row_bytes = max(like.itemsize * math.prod(like.shape[1:]), 1)
        length = self.capacity
        if length * row_bytes > MAX_BUFFER_BYTES:
            length = max(rows, MAX_BUFFER_BYTES // row_bytes)
        try:
            buffer = np.empty((length, *like.shape[1:]), like.dtype)
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
        it is longer than the pool now hands out). A full free list keeps its longest
        buffers."""
        if len(buffer) > self.capacity or _may_share(outputs, buffer):
            return
        free = self._free.setdefault((buffer.shape[1:], buffer.dtype), [])
        if len(free) < self.max_free:
            free.append(buffer)
            return
        shortest = min(range(len(free)), key=lambda i: len(free[i]))
        if len(free[shortest]) < len(buffer):
            free[shortest] = buffer


def _may_share(outputs: Any, buffer: np.ndarray) -> bool:
    if type(outputs) is np.ndarray:
        return np.may_share_memory(outputs, buffer)
    leaves = rows.leaves(outputs)
    if isinstance(leaves, list):  # a tuple, dict or list: nested ones too (to be safe)
        return any(_may_share(leaf, buffer) for leaf in leaves)
    return isinstance(leaves, np.ndarray) and np.may_share_memory(leaves, buffer)
