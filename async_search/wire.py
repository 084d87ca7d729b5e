"""What crosses a connection: the messages a client sends and the failures that come back.

Outbound, beside plain requests (an array ``[n, ...]``), a client may send:

- ``VersionedRequest(x)``: answered with ``(outputs, version)``; a ``rowwise`` one (the
  rows of several callers) that some failing batches held in part is answered with a
  ``RowsFailed`` (the rows computed, and the row ranges that failed);
- ``ModelUpdate(model, version)``: swaps the served model, answered with ``version``;
- ``VersionSubscription()``: answered with ``(version, swaps)``; from then on each swap
  sends the client a ``VersionNotice(version, swaps)``, which it acknowledges with
  ``VersionAck(swaps)``.

Messages to the server itself (not requests for the model) are ``Control`` messages.

Example (each message's answer, from a doubling model served over a connection):
    >>> import asyncio
    >>> import async_search as asr
    >>> from async_search.connections import get_connected_functions
    >>> from async_search.queues import local_queue
    >>> async def main():
    ...     (fn,), server_end = get_connected_functions(local_queue, 1, ordered=True)
    ...     serving = asyncio.ensure_future(
    ...         asr.serve_connection(lambda x: 2 * x, server_end))
    ...     outputs, version = await fn(VersionedRequest(np.ones((1, 2))))
    ...     swapped = await fn(ModelUpdate(lambda x: 3 * x, 3))  # once swapped
    ...     y = await fn(np.ones((1, 2)))
    ...     subscribed = await fn(VersionSubscription())     # (version, swaps)
    ...     fn.connection.close()               # serving ends with its last client
    ...     await serving
    ...     return outputs.tolist(), version, swapped, y.tolist(), subscribed
    >>> asyncio.run(main())
    ([[2.0, 2.0]], 0, 3, [[3.0, 3.0]], (3, 1))

On the way back, a result or an exception travels from the process that made it to the
one that waits for it. Not every object can: an exception may not pickle (it holds a
lock, a generator, a lambda), or its pickle may not load (a custom exception whose
``__init__`` takes arguments it does not pass to ``Exception``). An object that fails on
the way would leave its waiter hanging or fail the wrong request, so everything is
checked where it is made, by dumping *and* loading it:

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

import dataclasses
import pickle
import traceback
from typing import Any, Callable, Hashable, List, Tuple

import numpy as np

from async_search import rows
from async_search.notices import Notice
from async_search.errors import RemoteError, RemoteTraceback, SearchError, add_note

__all__ = ["Control", "ModelUpdate", "VersionedRequest", "VersionSubscription",
           "VersionNotice", "VersionAck", "Failure", "pack", "unpack", "pack_error",
           "unpack_error", "round_trips", "remote_error", "plain_outputs", "arrived",
           "Dumps", "Loads", "RowsFailed"]

Dumps = Callable[[Any], bytes]
Loads = Callable[[bytes], Any]


# -- outbound: what a client asks of a server ----------------------------------------
class Control:
    """A message to the server itself, not a request for the model."""

    __slots__ = ()


@dataclasses.dataclass(frozen=True)
class ModelUpdate(Control):
    """A message that swaps the served model (``BatchingServer.update_model``).

    Attributes:
        model: the new model (a callable), or weights for the current model's
            ``with_weights(weights)``.
        version: the new model's version, reported with every result it computes.

    Example: see the module's.
    """

    model: Any
    version: Hashable


@dataclasses.dataclass(frozen=True)
class VersionedRequest:
    """A request whose answer carries the model version: ``(outputs, version)``.

    Attributes:
        x: the request, an array ``[n, ...]`` as for a plain request.
        rowwise: ``x`` holds the rows of several callers, so a batch that fails must
            fail only its rows: when the server split ``x`` across batches and some of
            them failed, the answer is a ``wire.RowsFailed`` that carries the rows
            computed (see ``BatchingServer.call_with_version``).

    Example: see the module's.
    """

    x: np.ndarray
    rowwise: bool = False

    def __reduce__(self):  # one per message between processes: pickle it lean
        return VersionedRequest, ((self.x, True) if self.rowwise else (self.x,))


class RowsFailed(Exception):
    """The answer to a rowwise request (``VersionedRequest(x, rowwise=True)``) that the
    server split across batches, some of which failed. ``error`` is the first failure
    (a ``Failure`` when it crossed to another process), ``failed`` the ``(offset,
    count)`` row ranges of the batches that failed, ``computed`` the ``(offset,
    outputs)`` pieces that were computed, in row order, and ``version`` the model
    version that computed them (None when unknown or mixed). Every row is in exactly
    one range or piece. ``errors``, when given, holds each failed range's own error
    (rows the model's ``check_values`` refused beside rows whose batch failed);
    ``error_of(k)`` reads it.

    Example:
        >>> answer = RowsFailed(ValueError("bad row"), [(0, 2)], [(2, np.ones((1, 1)))])
        >>> copy = pickle.loads(pickle.dumps(answer))
        >>> copy.failed, copy.computed[0][0], type(copy.error_of(0)).__name__
        ([(0, 2)], 2, 'ValueError')
    """

    def __init__(self, error: BaseException | Failure, failed: List[Tuple[int, int]],
                 computed: List[Tuple[int, Any]], version: Hashable = None,
                 errors: List[BaseException | Failure] | None = None):
        super().__init__(f"{len(failed)} part(s) of this request failed: {error!r}")
        self.error = error
        self.failed = failed
        self.computed = computed
        self.version = version
        self.errors = errors

    def error_of(self, k: int) -> BaseException | Failure:
        """The error of failed range ``k``."""
        return self.error if self.errors is None else self.errors[k]

    def inconsistency(self, n: int) -> str | None:
        """What breaks this answer's promise for a request of ``n`` rows (each row in
        exactly one failed range or computed piece, the pieces in row order, an error
        for each range), or None when it keeps it: a client checks what a server it
        cannot vouch for sent before slicing rows out of it.

        Example:
            >>> RowsFailed(ValueError(), [(0, 2)], [(1, np.ones((2, 1)))]).inconsistency(3)
            'row 1 is in 2 ranges or pieces'
        """
        covered = np.zeros(n, np.int64)
        try:
            for offset, count in self.failed:
                if not (_is_index(offset) and _is_index(count) and offset + count <= n):
                    return f"failed range {(offset, count)!r:.80} is not within {n} rows"
                covered[offset:offset + count] += 1
            after = 0
            for offset, outputs in self.computed:
                count = rows.count(outputs)
                if not (_is_index(offset) and offset >= after and offset + count <= n):
                    return (f"computed piece of {count} rows at {offset!r:.40} is not "
                            f"within {n} rows, after the pieces before it")
                covered[offset:offset + count] += 1
                after = offset + count
            if self.errors is not None and len(self.errors) != len(self.failed):
                return (f"{len(self.errors)} errors for {len(self.failed)} failed "
                        f"ranges")
        except (TypeError, ValueError) as e:  # not pairs; outputs without rows
            return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        wrong = np.flatnonzero(covered != 1)
        if len(wrong):
            return f"row {wrong[0]} is in {covered[wrong[0]]} ranges or pieces"
        return None

    def __reduce__(self):  # the error may be a wire.Failure on its way to a client
        return RowsFailed, (self.error, self.failed, self.computed, self.version,
                            self.errors)


def _is_index(value: Any) -> bool:
    """An integer >= 0 (a NumPy one too), not a bool."""
    return (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
            and value >= 0)


@dataclasses.dataclass(frozen=True)
class VersionSubscription(Control):
    """A client asks to hear of every swap; answered with ``(version, swaps)``.

    Example: see the module's.
    """


@dataclasses.dataclass(frozen=True)
class VersionNotice(Notice):
    """Sent to every subscribed client at each swap, outside the order of answers.

    Attributes:
        version: the version that answers every request received from now on.
        swaps: how many swaps the server has made (this one included): a client keeps
            the notice with the most.
    """

    version: Hashable
    swaps: int


@dataclasses.dataclass(frozen=True)
class VersionAck(Control):
    """A client has learned the version of swap number ``swaps`` (answered with None).

    Attributes:
        swaps: the ``swaps`` of the notice acknowledged.
    """

    swaps: int


# -- the way back: results and failures that always load ------------------------------


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
        add_note(error, where)  # safe with __notes__ its raiser set to no list
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
    return rows.holds_no_objects(outputs)


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
    if not isinstance(value, (Failure, BaseException)):  # not what a client sends
        return index, False, SearchError(
            f"the failure of start {index} from {where} could not be read: it is "
            f"{type(value).__name__}, not an exception")
    return index, False, unpack_error(value, f"in the search of start {index}, in {where}")
