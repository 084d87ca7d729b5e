"""Row-wise views of requests and outputs: element keys, taking and assembling rows.

A model's outputs are an array, or a tuple or dict of arrays, whose first dimension is
the batch (``base.Outputs``). The cache and the router split requests by element and put
the outputs back together; these functions do that for every kind of output, with array
operations (one fancy-index per leaf, never a Python loop over rows where avoidable).
"""

from __future__ import annotations

from typing import Hashable, List, Sequence

import numpy as np

from async_search.base import Outputs

__all__ = ["row_keys", "num_rows", "take", "rows_of", "stack", "assemble", "frozen_copy",
           "same_version"]


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


def num_rows(outputs: Outputs) -> int:
    """The number of elements in ``outputs`` (an array, or a tuple or dict of arrays)."""
    if isinstance(outputs, np.ndarray):
        return len(outputs)
    leaves = list(outputs.values()) if isinstance(outputs, dict) else list(outputs)
    return len(leaves[0]) if leaves else 0


def take(outputs: Outputs, index) -> Outputs:
    """Rows ``index`` (a slice, or an integer array) of ``outputs``, leaf by leaf."""
    if isinstance(outputs, np.ndarray):
        return outputs[index]
    if isinstance(outputs, dict):
        return {k: v[index] for k, v in outputs.items()}
    return tuple(v[index] for v in outputs)


def rows_of(outputs: Outputs) -> list:
    """One value per element: a row of the array, or a tuple or dict of rows."""
    if isinstance(outputs, np.ndarray):
        return list(outputs)
    if isinstance(outputs, dict):
        keys = list(outputs)
        return [dict(zip(keys, leaves)) for leaves in zip(*outputs.values())]
    return list(zip(*outputs))


def stack(rows: Sequence) -> Outputs:
    """The inverse of ``rows_of``: per-element values back into batch outputs."""
    first = rows[0]
    if isinstance(first, np.ndarray):
        return np.stack(rows)
    if isinstance(first, dict):
        return {k: np.stack([r[k] for r in rows]) for k in first}
    return tuple(np.stack([r[i] for r in rows]) for i in range(len(first)))


def assemble(parts: Sequence[Outputs], indices: Sequence[np.ndarray], n: int) -> Outputs:
    """Outputs of ``n`` elements from parts: row ``j`` of ``parts[k]`` goes to
    position ``indices[k][j]``. Every position must be covered once.

    Example:
        >>> assemble([np.array([10, 30]), np.array([20])],
        ...          [np.array([0, 2]), np.array([1])], 3).tolist()
        [10, 20, 30]
    """
    first = parts[0]
    if isinstance(first, np.ndarray):
        out = np.empty((n, *first.shape[1:]), first.dtype)
        for part, index in zip(parts, indices):
            out[index] = part
        return out
    keys = list(first) if isinstance(first, dict) else range(len(first))
    leaves = {k: assemble([p[k] for p in parts], indices, n) for k in keys}
    return leaves if isinstance(first, dict) else tuple(leaves[k] for k in keys)


def frozen_copy(outputs: Outputs) -> Outputs:
    """A read-only copy: what a cache may hand out as views without being changed."""
    def freeze(a: np.ndarray) -> np.ndarray:
        a = np.array(a)
        a.flags.writeable = False
        return a

    if isinstance(outputs, np.ndarray):
        return freeze(outputs)
    if isinstance(outputs, dict):
        return {k: freeze(v) for k, v in outputs.items()}
    return tuple(freeze(v) for v in outputs)


def same_version(versions: Sequence[Hashable]) -> Hashable:
    """The common version of several parts, or None when a swap split them."""
    first = versions[0]
    return first if all(v == first for v in versions[1:]) else None
