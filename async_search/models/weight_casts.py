"""Weights cast into a net's dtypes only where the cast keeps their values.

The adapters' ``with_weights`` (TensorFlow, PyTorch, JAX) stage new weights on the host
in the dtypes of the net's own: a value of another kind (a float for an integer weight,
a complex for a float) is refused, and so is a value of the same kind that the cast
would change beyond rounding: an integer outside the weight's range (NumPy and the
frameworks wrap it: int64 ``2**40 + 5`` into int32 is 5) or a finite float past its
range (it would become infinite). Rounding a float64 into float32 is not a change, and
integers of either sign are one kind (an int64 array fits a uint8 weight when each value
does). The three adapters use this module, nothing else.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


def weight_array(value: Any, head: Callable[[str], str]) -> np.ndarray:
    """``value`` as an array (no copy where it is one already).

    Args:
        head: the start of an error message, from the dtype given (``lambda given:
            f"weight 0 (k) is {given}, the model's is int32"``).

    Raises:
        ValueError: NumPy cannot hold it (an ``OverflowError``).
    """
    try:
        return np.asarray(value)
    except OverflowError as e:
        raise ValueError(f"{head('a number NumPy cannot hold')} ({e}): a cast would "
                         f"change its values") from None


def kind_refused(given: np.dtype, dtype: np.dtype) -> bool:
    """Whether values of dtype ``given`` are of another kind than a weight of ``dtype``:
    a float for an integer, a complex for a float, anything for a bool. Integers of
    either sign are one kind here: ``values_lost`` checks that they fit."""
    if given.kind in "iu" and dtype.kind in "iu":
        return False
    return not np.can_cast(given, dtype, "same_kind")


def values_lost(given: np.ndarray, cast: np.ndarray, dtype_name: str | None = None
                ) -> str | None:
    """What casting ``given`` into ``cast`` (the same values in the weight's dtype, of
    a kind ``kind_refused`` let through) changed beyond rounding, or None.

    Args:
        given: the values as given.
        cast: ``given`` cast to the weight's dtype (as a framework cast it: a dtype that
            NumPy lacks, such as PyTorch's bfloat16, seen as float32).
        dtype_name: the weight's dtype in the message; default ``cast.dtype``.

    Example:
        >>> given = np.array([5, 2**40 + 5])
        >>> values_lost(given, given.astype(np.int32))
        "it holds values from 5 to 1099511627781, outside int32's range (-2147483648
        to 2147483647)"
        >>> given = np.array([0.1, 1e300])
        >>> with np.errstate(over="ignore"):
        ...     print(values_lost(given, given.astype(np.float32)))
        it holds finite values past float32's range (up to 1e+300 in magnitude), which
        would become infinite or NaN
    """
    name = str(cast.dtype) if dtype_name is None else dtype_name
    if not given.size or given.dtype.kind == "b":
        return None  # nothing, or bools: 0 and 1 fit every numeric dtype
    kind = cast.dtype.kind
    if kind in "iu":  # only integers get here (kind_refused)
        info = np.iinfo(cast.dtype)
        low, high = int(given.min()), int(given.max())  # Python ints: exact compares
        if low < info.min or high > info.max:
            held = str(low) if low == high else f"values from {low} to {high}"
            return f"it holds {held}, outside {name}'s range ({info.min} to {info.max})"
        return None
    if kind == "b":
        return None  # bools only from bools (kind_refused)
    # A float weight (NumPy's, or ml_dtypes' bfloat16, float8): a finite value must stay
    # finite (past the range, a type without infinities, ml_dtypes' float8_e4m3fn, gives
    # NaN; PyTorch's saturates instead, which torch_model checks on its own).
    # An infinity or NaN given stays one: no change; a complex number's parts each.
    parts = (np.real, np.imag) if cast.dtype.kind == "c" else (np.asarray,)
    lost = [~np.isfinite(part(cast)) & np.isfinite(part(given)) for part in parts]
    if not any(broken.any() for broken in lost):
        return None
    largest = max(float(np.abs(part(given)[broken].astype(np.float64)).max())
                  for part, broken in zip(parts, lost) if broken.any())
    return (f"it holds finite values past {name}'s range (up to {largest:g} in "
            f"magnitude), which would become infinite or NaN")


def host_copy(value: Any, dtype: np.dtype, head: Callable[[str], str]) -> np.ndarray:
    """A new host array of ``value`` in a weight's ``dtype`` (the caller may change its
    own arrays later), its values kept.

    Args:
        value: an array, or anything ``np.asarray`` takes.
        dtype: the weight's dtype.
        head: the start of an error message, from the dtype given (``lambda given:
            f"weight 0 (k) is {given}, the model's is int32"``).

    Raises:
        ValueError: a value of another kind, or one the cast would change.

    Example:
        >>> host_copy([1, 2], np.dtype(np.int8), "weight k is {}".format)
        array([1, 2], dtype=int8)
        >>> host_copy([300], np.dtype(np.int8), "weight k is {}".format)
        Traceback (most recent call last):
        ...
        ValueError: weight k is int64: it holds 300, outside int8's range (-128 to 127);
        a cast would change its values
    """
    given = weight_array(value, head)
    if kind_refused(given.dtype, dtype):
        raise ValueError(f"{head(str(given.dtype))}: a cast would change its values")
    with np.errstate(over="ignore", invalid="ignore"):  # checked just below
        cast = given.astype(dtype)  # always a copy
    if given.dtype != dtype and not np.can_cast(given.dtype, dtype, "safe"):
        lost = values_lost(given, cast)
        if lost is not None:
            raise ValueError(f"{head(str(given.dtype))}: {lost}; a cast would change "
                             f"its values")
    return cast
