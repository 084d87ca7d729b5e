"""What every search shares: the Status of a result and reading outputs."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from async_search.errors import ModelOutputError

__all__ = ["Status", "values_of"]


class Status(str, enum.Enum):
    """How a search ended."""

    GOAL_FOUND = "goal_found"
    """A goal was reached; the result holds the path to it."""
    BUDGET_EXHAUSTED = "budget_exhausted"
    """The search spent its budget (evaluations, depth) without reaching a goal."""
    SPACE_EXHAUSTED = "space_exhausted"
    """Nothing was left to expand (the reachable space, or a rollout's dead end)."""


def values_of(y: Any, n: int, what: str) -> list:
    """The ``n`` scalar outputs of a model (shape ``[n]`` or ``[n, 1]``) as Python floats.

    Raises:
        ModelOutputError: if ``y`` does not hold exactly one finite value per element.
    """
    if type(y) is np.ndarray and y.dtype.kind == "f" and y.shape in ((n,), (n, 1)):
        # The common case, in a few C calls: a float array of the right shape. A sum
        # is finite when every value is (one inf or nan makes it inf or nan); a finite
        # sum can still overflow, and then the full check below decides.
        values = y.reshape(n).tolist()
        total = sum(values)
        if total - total == 0:
            return values
    if isinstance(y, (tuple, list, dict)):
        raise ModelOutputError(f"{what} must be one array of shape [{n}] or [{n}, 1], got "
                               f"a {type(y).__name__} of outputs; is it a policy-value "
                               f"model?")
    values = np.asarray(y)
    try:
        if values.dtype.kind in "cSUV":  # a complex part would be dropped, not refused
            raise TypeError
        values = values.astype(np.float64, copy=False)
    except (TypeError, ValueError):
        raise ModelOutputError(f"{what} must be real numbers, got an array of "
                               f"{values.dtype}") from None
    if values.size != n or (values.ndim and values.shape[0] != n):
        raise ModelOutputError(f"{what} must have one value per element, shape [{n}] or "
                               f"[{n}, 1]; got shape {values.shape}")
    values = values.reshape(n)
    if not np.isfinite(values).all():
        bad = values[~np.isfinite(values)][:3]
        raise ModelOutputError(f"{what} must be finite, got {bad}")
    return values.tolist()
