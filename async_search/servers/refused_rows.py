"""A message of several callers' rows (``rowwise``) of which the model's ``check_values``
refuses some: the other rows are served, and the answer is a ``wire.RowsFailed`` that
fails only the refused rows, as a failed batch fails only its own.

    >>> answer = rows_failed(ValueError("no"), np.array([False, True, False]),
    ...                      np.array([[1.0], [3.0]]), version=2)
    >>> answer.failed, [(offset, piece.tolist()) for offset, piece in answer.computed]
    ([(1, 1)], [(0, [[1.0]]), (2, [[3.0]])])
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Hashable, List, Tuple

import numpy as np

from async_search import rows
from async_search.base import Outputs
from async_search.errors import InputSpecError
from async_search.wire import RowsFailed

Serve = Callable[[np.ndarray], "asyncio.Future[Tuple[Outputs, Hashable]]"]


def refused_rows(x: np.ndarray, check: Callable[[np.ndarray], None]) -> np.ndarray | None:
    """Which rows of ``x`` ``check`` refuses, one row at a time; None when it refuses
    none (it judges more than rows) or every one (the request is wrong as a whole)."""
    if not isinstance(x, np.ndarray) or not x.ndim:
        return None
    refused = np.zeros(len(x), bool)
    for i in range(len(x)):
        try:
            check(x[i:i + 1])
        except InputSpecError:
            refused[i] = True
    return refused if 0 < refused.sum() < len(x) else None


def serve_the_rest(x: np.ndarray, refused: np.ndarray, error: InputSpecError,
                   serve: Serve, loop: asyncio.AbstractEventLoop,
                   ) -> "asyncio.Future[Tuple[Outputs, Hashable]]":
    """Serves the rows of ``x`` not ``refused`` (``serve``: a rowwise call with version);
    the returned future fails with a RowsFailed that fails the refused rows with
    ``error``, and whatever of the served rows failed in the model with the model's
    error (a RowsFailed carries one error). Cancelling it cancels the rows served."""
    kept = np.flatnonzero(~refused)
    served = serve(x[kept])
    answer = loop.create_future()
    served.add_done_callback(lambda done: _answer(answer, done, refused, kept, error))
    answer.add_done_callback(lambda done: served.cancel() if done.cancelled() else None)
    return answer


def _answer(answer: asyncio.Future, served: asyncio.Future, refused: np.ndarray,
            kept: np.ndarray, error: InputSpecError) -> None:
    if answer.done():
        return
    if served.cancelled():
        answer.cancel()
        return
    failure = served.exception()
    failed = refused.copy()
    if failure is None:
        outputs, version = served.result()
    elif isinstance(failure, RowsFailed):  # some batches of the served rows failed
        for offset, count in failure.failed:
            failed[kept[offset:offset + count]] = True
        outputs = rows.concatenate([piece for _, piece in failure.computed])
        error, version = failure.error, failure.version
    else:  # every served row failed too
        answer.set_exception(failure)
        return
    answer.set_exception(rows_failed(error, failed, outputs, version))


def rows_failed(error: BaseException, failed: np.ndarray, outputs: Outputs,
                version: Hashable) -> RowsFailed:
    """A RowsFailed for the rows ``failed`` marks, with ``outputs`` the rows of the
    others in row order, cut into one piece per run of them."""
    ranges: List[Tuple[int, int]] = []
    computed: List[Tuple[int, Any]] = []
    # The runs of equal marks: where each starts, and its length.
    starts = np.flatnonzero(np.concatenate([[True], failed[1:] != failed[:-1]]))
    lengths = np.diff(np.concatenate([starts, [len(failed)]]))
    taken = 0
    for start, length in zip(starts.tolist(), lengths.tolist()):
        if failed[start]:
            ranges.append((start, length))
        else:
            computed.append((start, rows.take(outputs, slice(taken, taken + length))))
            taken += length
    return RowsFailed(error, ranges, computed, version)
