"""Row operations on model outputs: count, take, concatenate, split, check.

A model's outputs are an array, or a tuple or dict of arrays, whose first dimension is
the batch (``base.Outputs``); a list or a named tuple is delivered as a tuple
(``plain``). This module is the one place that walks those structures;
batching, unbatching, delivering results, caching and routing call into it. Every
function puts the plain-ndarray case first (``type(y) is np.ndarray``): they run once
per batch or per request on the serving hot path.

    >>> y = (np.arange(6).reshape(3, 2), np.arange(3))
    >>> count(y)
    3
    >>> [count(p) for p in split(y, [1, 2])]
    [1, 2]
    >>> concatenate(split(y, [1, 2]))[1].tolist()
    [0, 1, 2]
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any, Callable, List, NamedTuple, Sequence, Tuple

import numpy as np

from async_search.base import Outputs
from async_search.errors import ModelOutputError

__all__ = [
    "count", "check_count", "take", "concatenate", "split", "leaves", "labelled_leaves", "holds_no_objects",
    "map_leaves", "plain", "owned", "check", "OutputStructure", "rows_of", "stack",
    "assemble", "frozen_copy", "row_keys"]

_ndarray = np.ndarray


def count(outputs: Outputs) -> int:
    """The number of rows (elements) of ``outputs``.

    Raises:
        ModelOutputError: for an empty tuple or dict, or leaves that disagree on rows.
        TypeError: for a leaf without a length.
    """
    if type(outputs) is _ndarray:
        return len(outputs)
    leaves_ = leaves(outputs)
    if type(leaves_) is not list:
        return len(outputs)
    if not leaves_:
        raise ModelOutputError("the model returned an empty tuple or dict")
    first = len(leaves_[0])
    for leaf in leaves_[1:]:
        if len(leaf) != first:
            rows = sorted({len(leaf) for leaf in leaves_})
            raise ModelOutputError(
                f"the model's outputs disagree on the number of rows: {rows}")
    return first


def check_count(outputs: Outputs, size: int) -> None:
    """Raises unless ``outputs`` have one row per element of a batch of ``size``.

    Raises:
        ModelOutputError: another number of rows, leaves that disagree, or a leaf
            without a batch dimension.

    Example:
        >>> check_count(np.zeros((2, 1)), 2)
    """
    try:
        num_rows = count(outputs)
    except TypeError as e:
        raise ModelOutputError(f"the model's outputs have no batch dimension: {e}") from None
    if num_rows != size:
        raise ModelOutputError(
            f"the model returned {num_rows} rows for a batch of {size} elements: it "
            f"must return one output row per input element")


def take(outputs: Outputs, index: Any) -> Outputs:
    """Rows ``index`` (a slice: views; or an integer array) of ``outputs``, leaf by leaf.

    Example:
        >>> take({"v": np.arange(4)}, slice(1, 3))["v"].tolist()
        [1, 2]
    """
    if type(outputs) is _ndarray:
        return outputs[index]
    if isinstance(outputs, dict):
        return {k: v[index] for k, v in outputs.items()}
    if isinstance(outputs, (tuple, list)):  # a list: a tuple (as count reads it)
        return tuple(v[index] for v in outputs)
    return outputs[index]


def concatenate(pieces: Sequence[Outputs]) -> Outputs:
    """Pieces of outputs (of one structure) joined row-wise, in order.

    Example:
        >>> concatenate([(np.zeros(1), np.ones(1)), (np.zeros(2), np.ones(2))])[1].tolist()
        [1.0, 1.0, 1.0]
    """
    first = pieces[0]
    if type(first) is _ndarray:
        return np.concatenate(pieces)
    if isinstance(first, dict):
        return {k: np.concatenate([p[k] for p in pieces]) for k in first}
    if isinstance(first, (tuple, list)):
        return tuple(np.concatenate([p[i] for p in pieces]) for i in range(len(first)))
    return np.concatenate(pieces)


def split(outputs: Outputs, sizes: Sequence[int]) -> List[Outputs]:
    """``outputs`` cut into consecutive pieces of ``sizes`` rows: views, not copies.

    Rows past ``sum(sizes)`` are left out.

    Example:
        >>> [p.tolist() for p in split(np.arange(5), [2, 0, 3])]
        [[0, 1], [], [2, 3, 4]]
    """
    stops = list(itertools.accumulate(sizes))
    starts = [0, *stops[:-1]]
    if type(outputs) is _ndarray:
        return [outputs[a:b] for a, b in zip(starts, stops)]
    if isinstance(outputs, dict):
        items = list(outputs.items())
        return [{k: v[a:b] for k, v in items} for a, b in zip(starts, stops)]
    if isinstance(outputs, (tuple, list)):
        return [tuple(v[a:b] for v in outputs) for a, b in zip(starts, stops)]
    return [outputs[a:b] for a, b in zip(starts, stops)]


def leaves(outputs: Outputs) -> Any:
    """The arrays of ``outputs``: a list for a tuple or dict (in order), else the
    outputs themselves (one array)."""
    if type(outputs) is _ndarray:
        return outputs
    if isinstance(outputs, dict):
        return list(outputs.values())
    if isinstance(outputs, (tuple, list)):
        return list(outputs)
    return outputs


def labelled_leaves(outputs: Outputs) -> List[Tuple[Any, Any]]:
    """The arrays of ``outputs`` with their places: ``(key, array)`` for a dict,
    ``(index, array)`` for a tuple, ``[(None, outputs)]`` for one array."""
    if isinstance(outputs, dict):
        return list(outputs.items())
    if isinstance(outputs, tuple):
        return list(enumerate(outputs))
    return [(None, outputs)]


def holds_no_objects(outputs: Outputs) -> bool:
    """Whether ``outputs`` are plain ndarrays without Python objects (or a tuple or dict
    of them): such outputs pickle and load again, unchecked."""
    arrays = (outputs.values() if isinstance(outputs, dict) else
              outputs if isinstance(outputs, tuple) else (outputs,))
    return all(type(a) is _ndarray and not a.dtype.hasobject for a in arrays)


def map_leaves(fn: Callable[[Any], Any], outputs: Outputs) -> Outputs:
    """``fn`` applied to each array of ``outputs``, the structure kept (a list of
    arrays, as some frameworks return, becomes a tuple)."""
    if type(outputs) is _ndarray:
        return fn(outputs)
    if isinstance(outputs, dict):
        return {k: fn(v) for k, v in outputs.items()}
    if isinstance(outputs, (tuple, list)):
        return tuple(fn(v) for v in outputs)
    return fn(outputs)


def plain(outputs: Outputs) -> Outputs:
    """``outputs`` with every ndarray subclass (a masked array, ``np.matrix``) as a plain
    view of its data (``np.asarray``), an array in the other byte order as a copy in
    this machine's, and a list, a named tuple or another tuple or dict subclass as a
    plain tuple or dict: what a server delivers and learns its output structure from
    (``immediate`` too), so that no subclass's arithmetic or dtype reaches a caller, and
    every backend hands out the same kinds (joining the rows of split requests, a cache
    and the wire give the machine's byte order: so does every answer).

    Example:
        >>> type(plain((np.matrix([[1.0]]), np.zeros(1)))[0]).__name__
        'ndarray'
        >>> type(plain([np.zeros(1), np.ones(1)])).__name__
        'tuple'
        >>> plain(np.zeros(2, ">f4")).dtype.isnative
        True
    """
    if type(outputs) is _ndarray and outputs.dtype.isnative:
        return outputs
    if isinstance(outputs, np.ndarray):
        return _plain_leaf(outputs)
    kind = type(outputs)
    if kind is not tuple and kind is not dict:
        if isinstance(outputs, (tuple, list)):
            outputs = tuple(outputs)
        elif isinstance(outputs, dict):
            outputs = dict(outputs)
    if isinstance(outputs, (tuple, dict)) and any(
            isinstance(v, np.ndarray) and (type(v) is not _ndarray or not v.dtype.isnative)
            for v in leaves(outputs)):
        return map_leaves(_plain_leaf, outputs)
    return outputs


def owned(outputs: Outputs) -> Outputs:
    """``outputs`` with every read-only array copied: what arrived from another process
    is the caller's to write, on every transport (Ray's actor calls hand arrays over
    read-only, from its object store; a pickle gives writable ones).

    Example:
        >>> y = np.zeros(2); y.flags.writeable = False
        >>> owned(y).flags.writeable, owned((y, y))[1].flags.writeable
        (True, True)
    """
    if type(outputs) is _ndarray:
        return outputs if outputs.flags.writeable else outputs.copy()
    if isinstance(outputs, (tuple, dict)) and any(
            isinstance(v, np.ndarray) and not v.flags.writeable for v in leaves(outputs)):
        return map_leaves(lambda v: v.copy() if isinstance(v, np.ndarray)
                          and not v.flags.writeable else v, outputs)
    return outputs


def _plain_leaf(v: Any) -> Any:
    if not isinstance(v, np.ndarray):
        return v
    v = np.asarray(v)
    return v if v.dtype.isnative else v.astype(v.dtype.newbyteorder("="))


# -- structure ---------------------------------------------------------------------------

class OutputStructure(NamedTuple):
    """What outputs are, batch size aside: their kind and each output's trailing shape
    and dtype. Outputs of equal structure split and join alike, so a batch whose
    structure differs from the first batch's (or the declared one) must not be sliced
    into callers' results as if it were the same.

    Example:
        >>> s = OutputStructure.of((np.zeros((3, 4), np.float32), np.zeros(3)))
        >>> s.describe()
        'a tuple of 2 outputs ([n, 4] float32, [n] float64)'
        >>> s == OutputStructure.of((np.ones((5, 4), np.float32), np.ones(5)))
        True
    """

    kind: str
    """``"array"``, ``"tuple"`` or ``"dict"``."""
    leaves: Any
    """``(key, trailing shape, dtype)`` per output: key None for an array, the position
    in a tuple (a tuple of them), the key in a dict (a frozenset: order is free)."""

    @classmethod
    def of(cls, outputs: Outputs) -> "OutputStructure":
        """The structure of ``outputs``.

        Raises:
            ModelOutputError: when ``outputs`` is not an array with a batch dimension,
                or a tuple or dict of them.
        """
        if type(outputs) is _ndarray and outputs.ndim:
            return cls("array", ((None, outputs.shape[1:], outputs.dtype),))
        if isinstance(outputs, np.ndarray):
            return cls("array", ((None,) + _leaf(outputs, "the output"),))
        if isinstance(outputs, tuple):
            return cls("tuple", tuple((i,) + _leaf(v, f"output {i}")
                                      for i, v in enumerate(outputs)))
        if isinstance(outputs, dict):
            return cls("dict", frozenset((k,) + _leaf(v, f"output {k!r}")
                                         for k, v in outputs.items()))
        if inspect.iscoroutine(outputs):
            outputs.close()  # never to be awaited: no "never awaited" warning later
        raise ModelOutputError(
            f"a model must return an ndarray, or a tuple, list or dict of them, got "
            f"{type(outputs).__name__}" + (
                ": a model is a plain function, not an async one (the server calls it "
                "in a device thread or on the loop, and awaits nothing)"
                if inspect.isawaitable(outputs) else ""))

    def describe(self) -> str:
        """How error messages name a structure: ``an array [n, 4] float32``."""
        if self.kind == "array":
            return f"an array {_describe_leaf(self.leaves[0])}"
        if self.kind == "tuple":
            return (f"a tuple of {len(self.leaves)} outputs "
                    f"({', '.join(map(_describe_leaf, self.leaves))})")
        leaves_ = sorted(self.leaves, key=lambda leaf: repr(leaf[0]))
        return "a dict {" + ", ".join(f"{leaf[0]!r}: {_describe_leaf(leaf)}"
                                      for leaf in leaves_) + "}"

    def conform(self, outputs: Outputs, got: "OutputStructure | None" = None,
                expected_from: str = "the first batch's") -> Outputs:
        """``outputs`` (of structure ``got``) made to fit this structure.

        Outputs that differ only in dtypes of the same kind (float64 for float32, int32
        for int64) are cast to this structure's dtypes when the cast keeps their values:
        floats at this structure's precision (a finite value must stay finite),
        integers and times when every value fits, strings when none is cut. Any other
        difference (another kind, int for float; a shape; a kind of outputs), or a
        value the cast would change (3e9 into int32), raises.

        Raises:
            ModelOutputError: naming the expected and the given structure.
        """
        got = got if got is not None else OutputStructure.of(outputs)
        if got == self:
            return outputs
        if got.kind == self.kind and len(got.leaves) == len(self.leaves):
            want = {leaf[0]: leaf for leaf in self.leaves}
            if all(leaf[0] in want and leaf[1] == want[leaf[0]][1] and (
                    leaf[2] == want[leaf[0]][2] or (
                    isinstance(leaf[2], np.dtype) and isinstance(want[leaf[0]][2], np.dtype)
                    and leaf[2].kind == want[leaf[0]][2].kind))
                   for leaf in got.leaves):
                dtypes = {k: leaf[2] for k, leaf in want.items()}
                lost = _values_lost(outputs, dtypes)
                if lost is None:
                    return _cast(outputs, dtypes)
                raise ModelOutputError(
                    f"the model's outputs do not match {expected_from}: expected "
                    f"{self.describe()}, got {got.describe()}, and {lost}")
        raise ModelOutputError(
            f"the model's outputs do not match {expected_from}: expected "
            f"{self.describe()}, got {got.describe()}")


def check(outputs: Outputs, expected: OutputStructure | None = None, *,
          expected_from: str = "the first batch's") -> Tuple[Outputs, OutputStructure]:
    """``(outputs, structure)``: the structure of ``outputs`` when nothing is expected,
    else ``outputs`` made to fit ``expected`` (a dtype of the same kind is cast).

    Example:
        >>> first = check(np.zeros((2, 3), np.float32))[1]
        >>> check(np.zeros((5, 3)), first)[0].dtype
        dtype('float32')

    Raises:
        ModelOutputError: when ``outputs`` are not an array, tuple or dict of arrays with
            a batch dimension, or differ from ``expected`` in kind, keys, arity, trailing
            shape or dtype kind; the message names both structures.
    """
    got = OutputStructure.of(outputs)
    if expected is None or got == expected:
        return outputs, got
    return expected.conform(outputs, got, expected_from), expected


def _leaf(v: Any, where: str) -> Tuple[Any, Any]:
    if isinstance(v, np.ndarray):
        if not v.ndim:
            raise ModelOutputError(
                f"the model's outputs have no batch dimension: {where} is a 0-d array")
        return v.shape[1:], v.dtype
    if isinstance(v, (tuple, dict)) or not hasattr(v, "__len__"):
        raise ModelOutputError(
            f"the model's outputs have no batch dimension: {where} is a "
            f"{type(v).__name__}, not an array [n, ...]")
    # Only an ndarray: a list of rows read as outputs would be sliced along another
    # axis (every caller got values of all), and a tensor viewing the server's reused
    # input buffer would change under its caller.
    raise ModelOutputError(
        f"the model's outputs must be NumPy arrays [n, ...] (or a tuple, list or dict "
        f"of them): {where} is a {type(v).__name__}" + (
            "; a list of rows is not an output: return np.asarray(rows)"
            if isinstance(v, list) else
            "; convert it with .numpy() or np.asarray" if hasattr(v, "__array__") else ""))


def _describe_leaf(leaf: tuple) -> str:
    _, shape, dtype = leaf
    if dtype is None:
        return shape.__name__
    return f"[{', '.join(['n', *map(str, shape)])}] {dtype}"


def _values_lost(outputs: Outputs, dtypes: dict) -> str | None:
    """What casting ``outputs`` to ``dtypes`` (same kinds) would change, or None."""
    if isinstance(outputs, np.ndarray):
        items: Any = ((None, outputs),)
    else:
        items = enumerate(outputs) if isinstance(outputs, tuple) else outputs.items()
    for key, v in items:
        want = dtypes[key]
        if want is None or v.dtype == want or (v.dtype.kind not in "mM" and np.can_cast(
                v.dtype, want, "safe")):
            continue  # (numpy calls seconds into nanoseconds safe: past 2262 it wraps)
        where = "the output" if key is None else f"output {key!r}"
        if v.dtype.kind in "fc":  # precision may go; a finite number must stay finite
            with np.errstate(all="ignore"):
                cast = v.astype(want)
            # (a complex number's parts each: nan+1e300j must not become nan+infj)
            if not any((~np.isfinite(part(cast)) & np.isfinite(part(v))).any()
                       for part in ((np.real, np.imag) if v.dtype.kind == "c" else
                                    (np.asarray,))):
                continue
            return f"{where} holds values past {want}'s range"
        if v.dtype.kind in "iu":
            info = np.iinfo(want)
            if not v.size or (v.min() >= info.min and v.max() <= info.max):
                continue  # a narrower integer that holds every value given
            return f"{where} holds values that {want} cannot ({v.min()} to {v.max()})"
        if v.dtype.kind in "US" and want.kind == v.dtype.kind:
            chars = want.itemsize // (4 if want.kind == "U" else 1)
            if not v.size or int(np.char.str_len(v).max()) <= chars:
                continue  # a wider string type whose strings all fit
            return f"{where} holds strings longer than {want} can hold ({chars})"
        if v.dtype.kind in "mM":  # times: the same instants back, NaT for NaT
            try:
                back, nat = v.astype(want).astype(v.dtype), np.isnat(v)
            except OverflowError:  # NumPy 2.5 and later raise where earlier ones wrap
                return f"{where} holds times that {want} cannot"
            if (np.isnat(back) == nat).all() and (back[~nat] == v[~nat]).all():
                continue
            return f"{where} holds times that {want} cannot"
        return f"{where} would lose what {want} cannot hold"
    return None


def _cast(outputs: Outputs, dtypes: dict) -> Outputs:
    if isinstance(outputs, np.ndarray):
        return outputs.astype(dtypes[None], copy=False)
    if isinstance(outputs, tuple):
        return tuple(v if dtypes[i] is None else v.astype(dtypes[i], copy=False)
                     for i, v in enumerate(outputs))
    return {k: v if dtypes[k] is None else v.astype(dtypes[k], copy=False)
            for k, v in outputs.items()}


# -- per element -------------------------------------------------------------------------

def rows_of(outputs: Outputs) -> list:
    """One value per element: a row of the array, or a tuple or dict of rows."""
    if type(outputs) is _ndarray:
        return list(outputs)
    if isinstance(outputs, dict):
        keys = list(outputs)
        return [dict(zip(keys, row)) for row in zip(*outputs.values())]
    if isinstance(outputs, tuple):
        return list(zip(*outputs))
    return list(outputs)


def stack(rows: Sequence) -> Outputs:
    """The inverse of ``rows_of``: per-element values back into batch outputs."""
    first = rows[0]
    if isinstance(first, (np.ndarray, np.generic)):  # rows of [n, ...] or [n] outputs
        return np.stack(rows)
    if isinstance(first, dict):
        return {k: np.stack([r[k] for r in rows]) for k in first}
    return tuple(np.stack([r[i] for r in rows]) for i in range(len(first)))


def assemble(parts: Sequence[Outputs], indices: Sequence[np.ndarray], n: int) -> Outputs:
    """Outputs of ``n`` elements from parts: row ``j`` of ``parts[k]`` goes to
    position ``indices[k][j]``. Every position must be covered once. The parts must
    have one structure (``check`` makes them fit); values take the first part's dtype.

    Example:
        >>> assemble([np.array([10, 30]), np.array([20])],
        ...          [np.array([0, 2]), np.array([1])], 3).tolist()
        [10, 20, 30]

    Raises:
        ModelOutputError: a part whose rows are not one per index, or whose trailing
            shape is not the first part's (numpy would broadcast it into every place).
    """
    first = parts[0]
    if isinstance(first, np.ndarray):
        out = np.empty((n, *first.shape[1:]), first.dtype)
        for part, index in zip(parts, indices):
            if np.shape(part) != (len(index), *first.shape[1:]):
                raise ModelOutputError(
                    f"a part of {len(index)} elements has outputs of shape "
                    f"{list(np.shape(part))}; expected {[len(index), *first.shape[1:]]}")
            out[index] = part
        return out
    keys = list(first) if isinstance(first, dict) else range(len(first))
    assembled = {k: assemble([p[k] for p in parts], indices, n) for k in keys}
    return assembled if isinstance(first, dict) else tuple(assembled[k] for k in keys)


def frozen_copy(outputs: Outputs) -> Outputs:
    """A read-only copy: what a cache may hand out as views without being changed."""
    def freeze(a: np.ndarray) -> np.ndarray:
        a = np.array(a)
        a.flags.writeable = False
        return a

    return map_leaves(freeze, outputs)


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
