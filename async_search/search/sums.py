"""Sums of floats that every supported Python computes alike.

Python 3.12's built-in ``sum`` adds floats with compensation (Neumaier's), where 3.11
rounded after each addition: the same search then gave results that differ in their
last bits (a path's cost no longer its goal's ``g``, a root value one unit in the last
place apart), and golden results held on one Python failed on the other. The searches
add with ``left_sum``, one rounding per addition, on every Python.

Example:
    >>> left_sum([1.0, 1e-16, 1e-16])   # 3.12's sum gives 1.0000000000000002
    1.0
    >>> left_sum([1, 2, 3])             # integers stay integers
    6
"""

from __future__ import annotations

from typing import Iterable, TypeVar

Number = TypeVar("Number", int, float)


def left_sum(values: Iterable[Number]) -> Number:
    """``values`` added left to right from ``0``, rounding after each addition: what
    ``sum(values)`` gave before Python 3.12."""
    total = 0
    for value in values:
        total = total + value
    return total
