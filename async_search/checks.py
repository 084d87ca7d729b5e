"""Argument checks, one rule everywhere: a bool is never a number.

Every public constructor checks its numbers with these, so that ``True`` (an ``int`` to
Python) is refused as a batch size as clearly as ``0`` or ``"8"``, and every message
names the argument, the rule and the value given.

    >>> check_int("max_batch_size", 8, minimum=1)
    8
    >>> check_int("max_batch_size", True, minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: max_batch_size must be an integer >= 1, got True
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import reprlib
from typing import Any

import numpy as np


def is_int(value: Any) -> bool:
    """True for a Python or NumPy integer, False for a bool (and everything else)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: Any, *, minimum: int | None = None,
              maximum: int | None = None) -> int:
    """``value`` as an int; ValueError naming ``name`` unless it is an integer (not a
    bool) within ``[minimum, maximum]`` (either bound may be None: unbounded)."""
    if not is_int(value) or (minimum is not None and value < minimum) or (
            maximum is not None and value > maximum):
        if minimum is not None and maximum is not None:
            rule = f"an integer in [{minimum}, {maximum}]"
        elif minimum is not None:
            rule = f"an integer >= {minimum}"
        elif maximum is not None:
            rule = f"an integer <= {maximum}"
        else:
            rule = "an integer"
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return int(value)


def plain_fields(obj: Any) -> None:
    """Each NumPy scalar in the fields of the (frozen) dataclass ``obj`` as the Python
    number it holds: a config made in a sweep over ``np.arange(...)`` must compare,
    print and be written to JSON as one made of Python numbers (JSON refuses int64).
    Call it first in ``__post_init__``."""
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if isinstance(value, np.generic) and value.dtype.kind in "biuf":
            object.__setattr__(obj, field.name, value.item())


def check_instance(name: str, value: Any, kind: type, example: str) -> None:
    """TypeError naming ``name`` unless ``value`` is an instance of ``kind``; the
    message shows ``example``, a call that makes one (a class passed for an instance is
    the usual slip)."""
    if isinstance(value, kind):
        return
    given = (f"the class {value.__name__}" if isinstance(value, type)
             else f"{type(value).__name__} {value!r}"[:120])
    article = "an" if kind.__name__[:1].lower() in "aeiou" else "a"
    raise TypeError(f"{name} must be {article} {kind.__name__} instance, such as "
                    f"{example}; got {given}")


def check_float(name: str, value: Any, *, minimum: float | None = None,
                strict: bool = False, maximum: float | None = None) -> float:
    """``value`` as a finite float; ValueError naming ``name`` unless it is a number
    (not a bool, nor a string) that is >= ``minimum`` (> when ``strict``) and <= ``maximum``."""
    number = math.nan
    if not isinstance(value, (bool, np.bool_, str, bytes)):  # float('1') is no number
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):  # (10**400: too large a float)
            pass
    low_ok = minimum is None or number > minimum or (not strict and number == minimum)
    if not math.isfinite(number) or not low_ok or (maximum is not None and number > maximum):
        parts = []
        if minimum is not None:
            parts.append(f"{'>' if strict else '>='} {minimum}")
        if maximum is not None:
            parts.append(f"<= {maximum}")
        rule = " and ".join(parts)
        raise ValueError(f"{name} must be a finite number{' ' + rule if rule else ''}, "
                         f"got {reprlib.repr(value)}")
    return number


def check_callable(name: str, value: Any, *, optional: bool = False) -> Any:
    """``value``; TypeError naming ``name`` unless it is callable (or None, when
    ``optional``): refused where it is given, not at its first call inside a batch."""
    if not callable(value) and not (optional and value is None):
        rule = "callable or None" if optional else "callable"
        # reprlib: bounded for a huge container, and a repr that raises is replaced.
        raise TypeError(f"{name} must be {rule}, got {type(value).__name__} "
                        f"{reprlib.repr(value)}")
    return value


def is_async(fn: Any) -> bool:
    """Whether calling ``fn`` makes a coroutine: an ``async def`` function, or an object
    whose ``__call__`` is one.

    Example:
        >>> async def hook(record): pass
        >>> is_async(hook), is_async(print)
        (True, False)
    """
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(type(fn), "__call__", None))


class AsyncWithOnly:
    """Mixin for async context managers: a plain ``with`` says to use ``async with``
    (Python's own error names the class and no remedy).

    Example:
        >>> class Server(AsyncWithOnly):
        ...     async def __aenter__(self): return self
        ...     async def __aexit__(self, *exc): return None
        >>> try:
        ...     with Server():
        ...         pass
        ... except TypeError as e:
        ...     print(str(e)[:56])
        Server(...) is an async context manager: use `async with
    """

    #: The name the message gives (default: the class's).
    _with_name: str = ""

    def __enter__(self) -> Any:
        name = self._with_name or type(self).__name__
        raise TypeError(f"{name}(...) is an async context manager: use `async with "
                        f"{name}(...) as x:` inside a coroutine (asyncio.run, or a "
                        f"notebook cell's top-level await)")

    def __exit__(self, *exc: Any) -> None:  # pragma: no cover - __enter__ always raises
        return None
