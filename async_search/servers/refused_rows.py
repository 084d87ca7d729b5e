"""A message of several callers' rows (``rowwise``) of which the model's ``check_values``
refuses some: the other rows are served, and the answer is a ``wire.RowsFailed`` that
fails the refused rows with their ``InputSpecError``, as a failed batch fails only its
own rows (with the model's error).

    >>> answer = rows_failed(np.array([-1, 0, -1]), [ValueError("no")],
    ...                      np.array([[1.0], [3.0]]), version=2)
    >>> answer.failed, [(offset, piece.tolist()) for offset, piece in answer.computed]
    ([(1, 1)], [(0, [[1.0]]), (2, [[3.0]])])
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Hashable, List, Sequence, Tuple

import numpy as np

from async_search import rows
from async_search.base import Outputs
from async_search.errors import InputSpecError
from async_search.wire import RowsFailed

Serve = Callable[[np.ndarray], "asyncio.Future[Tuple[Outputs, Hashable]]"]


def refused_rows(x: np.ndarray, check: Callable[[np.ndarray], None]) -> np.ndarray | None:
    """Which rows of ``x`` ``check`` refuses (halves checked while they fail, down to
    single rows: a few refused rows among many cost a few checks each); None when it
    refuses none (it judges more than rows) or every one (the request is wrong as a
    whole)."""
    if not isinstance(x, np.ndarray) or not x.ndim:
        return None
    refused = np.zeros(len(x), bool)
    spans = [(0, len(x))]
    while spans:
        start, end = spans.pop()
        try:
            check(x[start:end])
        except InputSpecError:
            if end - start == 1:
                refused[start] = True
            else:
                middle = (start + end) // 2
                spans += [(middle, end), (start, middle)]
    return refused if 0 < refused.sum() < len(x) else None


def serve_the_rest(x: np.ndarray, refused: np.ndarray, error: InputSpecError,
                   serve: Serve, loop: asyncio.AbstractEventLoop,
                   ) -> "asyncio.Future[Tuple[Outputs, Hashable]]":
    """Serves the rows of ``x`` not ``refused`` (``serve``: a rowwise call with version);
    the returned future fails with a RowsFailed that fails the refused rows with
    ``error`` and whatever of the served rows failed in the model with the model's
    error. Cancelling it cancels the rows served."""
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
    # Each row's error, as an index into ``errors``: -1 computed, 0 refused.
    errors: List[BaseException] = [error]
    codes = np.where(refused, 0, -1)
    failure = served.exception()
    outputs: Outputs = None
    version = None
    if failure is None:
        outputs, version = served.result()
    elif isinstance(failure, RowsFailed):  # some batches of the served rows failed
        for k, (offset, count) in enumerate(failure.failed):
            codes[kept[offset:offset + count]] = len(errors)
            errors.append(failure.error_of(k))
        if failure.computed:
            outputs = rows.concatenate([piece for _, piece in failure.computed])
        version = failure.version
    else:  # every served row failed
        codes[kept] = len(errors)
        errors.append(failure)
    answer.set_exception(rows_failed(codes, errors, outputs, version))


def rows_failed(codes: np.ndarray, errors: Sequence[BaseException], outputs: Outputs,
                version: Hashable) -> RowsFailed:
    """A RowsFailed from each row's code: -1 computed, else the index of its error in
    ``errors`` (at least one row failed), with ``outputs`` the rows computed, in row
    order (None when none is): one range per run of rows of one error, one piece per
    run of computed rows."""
    starts = np.flatnonzero(np.concatenate([[True], codes[1:] != codes[:-1]]))
    ends = np.append(starts[1:], len(codes))
    ranges: List[Tuple[int, int]] = []
    range_errors: List[BaseException] = []
    computed: List[Tuple[int, Any]] = []
    taken = 0
    for start, end in zip(starts.tolist(), ends.tolist()):
        code = int(codes[start])
        if code < 0:
            computed.append((start, rows.take(outputs, slice(taken, taken + end - start))))
            taken += end - start
        else:
            ranges.append((start, end - start))
            range_errors.append(errors[code])
    return RowsFailed(range_errors[0], ranges, computed, version, range_errors)
