"""Result delivery: each batch's outputs sliced into its requests' futures."""

from __future__ import annotations

import asyncio
from typing import Dict, Hashable, List

import numpy as np

from async_search import rows
from async_search.base import BatchParts, Outputs
from async_search.errors import ModelOutputError, deliverable
from async_search.rows import OutputStructure
from async_search.wire import RowsFailed


_UNSET, _MIXED, _MISSING = object(), object(), object()


class ResultDelivery:
    """Delivers a batch's outputs into its requests' futures.

    Batches may complete in any order (several workers), and a split request's pieces
    may sit anywhere in a batch (``BatchParts.parts``): a request split across batches is
    reassembled by the offsets of its pieces. Futures registered with
    ``want_version`` also learn the model version that computed them.

    Every batch's outputs must have the structure of ``empty_output`` (a declared output
    spec) or, without it, of the first batch delivered: the same kind (array, tuple of
    as many, dict of the same keys), trailing shapes and dtypes. A dtype of the same
    kind (float64 for float32) is cast; any other difference fails that batch with
    ModelOutputError, so that no output is sliced into the wrong callers. Nothing is
    kept of a request once its future is done: when one batch of a split request
    fails, the pieces from its other batches are dropped, unless the request is
    rowwise (``want_rowwise``).
    """

    def __init__(self, empty_output: Outputs | None = None):
        if empty_output is not None:  # a declared '>f4' output is answered natively too
            empty_output = rows.plain(empty_output)
        #: The output of a zero-element request; known once a spec or a batch shows it.
        self.empty_output = empty_output
        self._structure: OutputStructure | None = None
        self._expected_from = "the first batch's"
        if empty_output is not None:
            self._structure = OutputStructure.of(empty_output)
            self._expected_from = "the declared output spec"
        self._partial: Dict[asyncio.Future, list] = {}  # -> [size, received, pieces]
        self._versions: Dict[asyncio.Future, Hashable] = {}
        self._rowwise: set = set()
        # rowwise requests with failed rows -> [first error, [(offset, count), ...]]
        self._failed_rows: Dict[asyncio.Future, list] = {}

    def empty_result(self) -> Outputs:
        """A zero-element request's outputs, its own (a new dict, tuple or view of the
        empty arrays: one caller's changes to its container never reach another's)."""
        return rows.take(self.empty_output, slice(0, 0))

    @property
    def held(self) -> int:
        """Requests split across batches whose pieces are kept, waiting for the rest."""
        return len(self._partial)

    @property
    def structure(self) -> OutputStructure | None:
        """The structure every batch's outputs must have; None until it is known."""
        return self._structure

    def want_version(self, fut: asyncio.Future) -> None:
        """Record the version that computes ``fut`` (read it with ``pop_version``)."""
        self._versions[fut] = _UNSET

    def want_rowwise(self, fut: asyncio.Future) -> None:
        """``fut``'s request holds the rows of several callers (a client's message of
        one loop iteration), so a batch that fails must fail its rows only: when the
        request is split across batches and some fail while others are computed,
        ``fut`` fails with ``RowsFailed``, which carries the computed rows (a request
        whose every batch failed fails with the first error, as any request)."""
        self._rowwise.add(fut)
        fut.add_done_callback(self._rowwise.discard)

    def pop_version(self, fut: asyncio.Future) -> Hashable:
        """The version that computed ``fut``; None if its pieces (a request split across
        batches while the model was swapped) came from different versions."""
        version = self._versions.pop(fut, None)
        return None if version is _UNSET or version is _MIXED else version

    def conformed(self, outputs: Outputs, size: int) -> Outputs:
        """A batch of ``size`` elements' ``outputs`` as callers get them (plain arrays,
        the expected structure, a dtype of the same kind cast); the first batch with
        rows sets the structure when none was declared.

        Raises:
            ModelOutputError: outputs of another structure, or not ``size`` rows.
        """
        expected = self._structure
        if type(outputs) is not np.ndarray or not outputs.dtype.isnative:  # no subclass
            outputs = rows.plain(outputs)  # (or byte order) reaches a caller, or the
            # structure learnt from the first batch
        try:
            # One structure check per batch (never per request): a batch whose outputs
            # changed kind, shape or dtype is never sliced as if it had not.
            got = OutputStructure.of(outputs)
            if expected is not None and got != expected:
                # A batch of zero-element requests only gets the expected empty
                # output: what a model makes of no rows at all is moot.
                outputs = self.empty_result() if not size else (
                    expected.conform(outputs, got, self._expected_from))
            rows.check_count(outputs, size)
        except TypeError as e:
            raise ModelOutputError(
                f"the model's outputs have no batch dimension: {e}") from None
        if expected is None and size:  # the first batch with rows sets the structure
            self._structure = got
            if self.empty_output is None:  # copied: a view would keep this batch's
                empty = rows.take(outputs, slice(0, 0))  # outputs alive for good
                self.empty_output = rows.map_leaves(np.copy, empty) if isinstance(
                    empty, (np.ndarray, tuple, dict)) else empty
        return outputs

    def deliver(self, popped: BatchParts, outputs: Outputs, version: Hashable,
                ) -> Exception | None:
        """Slices ``outputs`` into the futures of ``popped``; an error if it cannot."""
        size = len(popped.batch)
        try:
            outputs = self.conformed(outputs, size)
        except ModelOutputError as e:
            return e
        tags, pieces = popped.tags, popped.pieces
        if self._versions:
            versions = self._versions
            for fut in tags:
                known = versions.get(fut, _MISSING)
                if known is not _MISSING:
                    versions[fut] = version if known is _UNSET or known == version else _MIXED
        parts = popped.parts
        if not parts and size == len(tags) and type(outputs) is np.ndarray and (
                min(map(len, pieces)) == 1):
            # Every request is one element: hand out row views made in C.
            row_views = zip(tags, outputs[:, None])
            while True:
                try:
                    for fut, row in row_views:
                        fut.set_result(row)
                    return None
                except asyncio.InvalidStateError:  # a caller cancelled after batching
                    continue
        for i, (fut, out) in enumerate(zip(tags, rows.split(outputs, map(len, pieces)))):
            part = parts.get(i) if parts else None
            if part is not None:  # a piece of a request split across batches
                self._add_piece(fut, part[1], part[0], out)
            elif not fut.done():
                fut.set_result(out)
        return None

    def fail(self, popped: BatchParts, error: BaseException) -> None:
        """Fails every request of ``popped`` with ``error`` and drops what is kept of
        them (pieces from other batches). An error a future cannot carry as it is
        (StopIteration, CancelledError...) is wrapped (``errors.deliverable``)."""
        error = deliverable(error)
        partial, rowwise, parts = self._partial, self._rowwise, popped.parts
        for i, fut in enumerate(popped.tags):
            if rowwise and parts and fut in rowwise and i in parts and not fut.done():
                offset, total = parts[i]
                self._fail_rows(fut, total, offset, len(popped.pieces[i]), error)
                continue
            if partial:
                partial.pop(fut, None)
            if not fut.done():
                fut.set_exception(error)

    def forget(self, futures: List[asyncio.Future]) -> None:
        """Drops what is kept of requests that failed before reaching a batch."""
        for fut in futures:
            self._forget_one(fut)

    def _forget_one(self, fut: asyncio.Future) -> None:
        self._partial.pop(fut, None)
        if self._failed_rows:
            self._failed_rows.pop(fut, None)

    def _state(self, fut: asyncio.Future, total: int) -> list:
        """What is kept of split request ``fut``: ``[total, received, pieces]``."""
        state = self._partial.get(fut)
        if state is None:
            state = self._partial[fut] = [total, 0, []]
            # A request cancelled before its last piece comes (whose rest the batcher
            # then drops) keeps nothing here either.
            fut.add_done_callback(self._forget_one)
        return state

    def _fail_rows(self, fut: asyncio.Future, total: int, offset: int, count: int,
                   error: BaseException) -> None:
        """Rows ``offset:offset+count`` of rowwise request ``fut`` failed with
        ``error``; the rest of it is still delivered."""
        state = self._state(fut, total)
        failed = self._failed_rows.get(fut)
        if failed is None:
            failed = self._failed_rows[fut] = [error, []]
        failed[1].append((offset, count))
        state[1] += count
        if state[1] == state[0]:
            self._complete(fut, state)

    def _complete(self, fut: asyncio.Future, state: list) -> None:
        """Every row of split request ``fut`` is in: its outputs, or what failed."""
        del self._partial[fut]
        failed = self._failed_rows.pop(fut, None) if self._failed_rows else None
        if fut.done():
            return
        computed = sorted(state[2], key=lambda item: item[0])
        if failed is None:
            fut.set_result(rows.concatenate([piece for _, piece in computed]))
        elif not computed:  # every batch of it failed: as any request
            fut.set_exception(failed[0])
        else:
            fut.set_exception(RowsFailed(failed[0], sorted(failed[1]), computed))

    def _add_piece(self, fut: asyncio.Future, total: int, offset: int,
                   piece: Outputs) -> None:
        if fut.done():  # failed (another batch of it did) or cancelled: keep nothing
            self._partial.pop(fut, None)
            return
        state = self._state(fut, total)
        state[1] += rows.count(piece)
        state[2].append((offset, piece))
        if state[1] == state[0]:
            self._complete(fut, state)

