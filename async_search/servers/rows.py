"""Element keys and versions for the cache and the router.

The row operations on outputs themselves (count, take, split, concatenate, rows_of,
stack, assemble, frozen_copy) live in ``async_search.rows``; the ones the cache and the
router use are re-exported here, so that their ``rows.assemble(...)`` calls read as
before. (This module can go once those two import ``async_search.rows`` directly and
``row_keys`` and ``same_version`` find a home beside them.)
"""

from __future__ import annotations

from typing import Hashable, List, Sequence

import numpy as np

# Re-exported for servers/cache.py and servers/router.py.
from async_search.rows import assemble, frozen_copy, rows_of, stack

__all__ = ["row_keys", "same_version", "rows_of", "stack", "assemble", "frozen_copy"]


def row_keys(x: np.ndarray) -> List[bytes]:
    """The bytes of each element of ``x[n, ...]``: equal elements have equal keys.

    Example:
        >>> row_keys(np.array([[1, 2], [1, 2]], np.int8))
        [b'\\x01\\x02', b'\\x01\\x02']
    """
    n = len(x)
    if not n:
        return []
    data = x.tobytes()  # C order: one copy, then slices of bytes
    size = len(data) // n
    return [data[i:i + size] for i in range(0, len(data), size)] if size else [b""] * n


def same_version(versions: Sequence[Hashable]) -> Hashable:
    """The common version of several parts, or None when a swap split them."""
    first = versions[0]
    return first if all(v == first for v in versions[1:]) else None
