"""What crosses a process boundary on the way back: results and failures that always load.

A search's result, a search's exception or a model's exception travels from the process
that made it to the one that waits for it. Not every object can: an exception may not
pickle (it holds a lock, a generator, a lambda), or its pickle may not load (a custom
exception whose ``__init__`` takes arguments it does not pass to ``Exception``). An
object that fails on the way would leave its waiter hanging or fail the wrong request, so
everything is checked where it is made, by dumping *and* loading it:

- ``pack(value)`` pickles one value for the trip, or says why it cannot make it;
- ``pack_error(error)`` wraps an exception with its formatted traceback (text), as itself
  when it round-trips, else as a ``RemoteError`` built from its type name, message and
  traceback (always transportable);
- ``unpack_error(failure, where)`` is the receiving side: the exception, with the remote
  traceback as ``remote_traceback`` and as its ``__cause__`` (printed with it), and a
  note saying where it was raised (which start).

Example:
    >>> failure = pack_error(ValueError("bad"))
    >>> error = unpack_error(pickle.loads(pickle.dumps(failure)), "start 3")
    >>> type(error).__name__, error.__notes__, "ValueError: bad" in error.remote_traceback
    ('ValueError', ['start 3'], True)
"""

from __future__ import annotations

import pickle
import traceback
from typing import Any, Callable, Tuple

import numpy as np

from async_search.errors import RemoteError, SearchError

__all__ = ["Failure", "RemoteTraceback", "pack", "unpack", "pack_error", "unpack_error",
           "round_trips", "remote_error", "plain_outputs", "arrived", "Dumps", "Loads"]

Dumps = Callable[[Any], bytes]
Loads = Callable[[bytes], Any]


class RemoteTraceback(Exception):
    """The traceback of an exception where it was raised (the ``__cause__`` it shows)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n" + self.text


class Failure:
    """An exception on its way to another process: the exception (itself, or a
    ``RemoteError`` standing for it) and its traceback where it was raised, as text."""

    __slots__ = ("error", "traceback")

    def __init__(self, error: BaseException, traceback_text: str):
        self.error = error
        self.traceback = traceback_text

    def __reduce__(self):
        return (Failure, (self.error, self.traceback))

    def __repr__(self) -> str:
        return f"Failure({self.error!r})"


def round_trips(obj: Any, dumps: Dumps = pickle.dumps, loads: Loads = pickle.loads,
                ) -> Tuple[bool, BaseException | None]:
    """Whether ``obj`` pickles and its pickle loads again; and the error if not."""
    try:
        loads(dumps(obj))
    except Exception as e:
        return False, e
    return True, None


def _format(error: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(error))
    except Exception:  # a broken __str__ or __repr__ must not stop the report
        return f"{type(error).__qualname__} (its traceback could not be formatted)\n"


def _describe(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:
        return "(its message could not be formatted)"


def remote_error(error: BaseException, traceback_text: str | None = None) -> RemoteError:
    """A ``RemoteError`` standing for ``error``: its type name, message, traceback."""
    cls = type(error)
    return RemoteError(f"{cls.__module__}.{cls.__qualname__}", _describe(error),
                       _format(error) if traceback_text is None else traceback_text,
                       tuple(f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__))


def pack_error(error: BaseException, dumps: Dumps = pickle.dumps,
               loads: Loads = pickle.loads) -> Failure:
    """``error`` ready to travel: itself if it round-trips, else a RemoteError; with its
    traceback as text either way."""
    text = _format(error)
    ok, _ = round_trips(error, dumps, loads)
    return Failure(error if ok else remote_error(error, text), text)


def unpack_error(failure: Any, where: str | None = None) -> BaseException:
    """The exception a ``Failure`` carried, with ``remote_traceback`` (text) set, the
    remote traceback as ``__cause__`` (when it has none) and a note ``where``; anything
    else that is an exception is returned with the note only."""
    if isinstance(failure, Failure):
        error, text = failure.error, failure.traceback
        try:
            error.remote_traceback = text
        except Exception:  # an exception type that refuses attributes
            error = remote_error(error, text)
            error.remote_traceback = text
        if error.__cause__ is None:
            error.__cause__ = RemoteTraceback(text)
    else:
        error = failure
    if where is not None:
        error.add_note(where)
    return error


def pack(value: Any, dumps: Dumps = pickle.dumps, loads: Loads = pickle.loads,
         ) -> Tuple[bool, bytes]:
    """``(True, pickle)`` of ``value`` checked to load again; else ``(False, pickle of a
    Failure)`` saying why it cannot travel (a RemoteError standing for the pickling or
    loading error, naming the value's type)."""
    try:
        data = dumps(value)
        loads(data)
        return True, data
    except Exception as e:
        text = _format(e)
        error = RemoteError(
            "TypeError", f"a {type(value).__module__}.{type(value).__qualname__} cannot "
            f"be sent to another process: {type(e).__name__}: {_describe(e)}", text,
            ("builtins.TypeError", "builtins.Exception", "builtins.BaseException",
             "builtins.object"))
        return False, dumps(Failure(error, text))


def unpack(data: bytes, loads: Loads = pickle.loads) -> Any:
    """The value ``pack`` pickled (a Failure when it could not travel)."""
    return loads(data)


def plain_outputs(outputs: Any, version: Any) -> bool:
    """Whether model outputs are arrays without Python objects (or a tuple or dict of
    them) and ``version`` a simple label: such answers always travel, unchecked."""
    if not isinstance(version, (int, float, str, bytes, type(None))):
        return False
    leaves = (outputs.values() if isinstance(outputs, dict) else
              outputs if isinstance(outputs, tuple) else (outputs,))
    return all(type(a) is np.ndarray and not a.dtype.hasobject for a in leaves)


def arrived(index: int, is_result: bool, payload: bytes, where: str,
            loads: Loads = pickle.loads) -> Tuple[int, bool, Any]:
    """One start's outcome as a client reported it (``pack`` or ``pack_error``):
    ``(index, ok, result or error)``; a failure names its start and carries the
    client's traceback."""
    try:
        value = loads(payload)
    except Exception as e:  # checked by the client, so not expected: still, say so
        return index, False, SearchError(
            f"the outcome of start {index} from {where} could not be read: {e!r}")
    if is_result:
        return index, True, value
    return index, False, unpack_error(value, f"in the search of start {index}, in {where}")
