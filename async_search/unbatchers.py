"""Unbatching: the stream of batch outputs back into one output per request, in order.

The counterpart of ``batchers``: a ``Batcher`` cuts requests into batches (a request may
straddle two), an ``Unbatcher`` cuts each batch's outputs back at the request bounds and
joins the pieces of a request that straddled batches. The row arithmetic itself (count,
slice, join) is ``async_search.rows``.

    >>> u = NumpyUnbatcher()
    >>> for n in (3, 2):
    ...     u.register(n)
    >>> [y.tolist() for y in u.unbatch(np.arange(4))]
    [[0, 1, 2]]
    >>> [y.tolist() for y in u.unbatch(np.arange(4, 5))]
    [[3, 4]]
"""

from __future__ import annotations

import collections
from typing import Deque, List

import numpy as np

from async_search import rows
from async_search.base import Outputs
from async_search.checks import check_int
from async_search.errors import ModelOutputError


class Unbatcher:
    """Turns batch outputs back into one output per request, in request order.

    ``register(n)`` announces the next request's size; ``unbatch(outputs)`` takes the
    outputs of the next batch and returns the outputs of every request it completes.
    Outputs are measured, sliced and joined with ``async_search.rows`` (an array, or a
    tuple or dict of arrays); a subclass may say otherwise by overriding ``num_rows``,
    ``slice`` and ``concat``.
    """

    def __init__(self) -> None:
        self._sizes: Deque[int] = collections.deque()
        self._pieces: List[Outputs] = []  # outputs so far of the request at the front
        self._done = 0  # elements of the front request received so far
        self._awaited = 0  # rows still to come: registered elements not yet received

    def register(self, n: int) -> None:
        """The next request has ``n`` elements (an integer >= 0)."""
        n = check_int("a request's number of elements", n, minimum=0)
        self._sizes.append(n)
        self._awaited += n

    def empty(self) -> bool:
        """True when every registered request has been returned."""
        return not self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def unbatch(self, outputs: Outputs) -> List[Outputs]:
        """The outputs of the requests completed by this batch's outputs, in order.

        Raises:
            ModelOutputError: when there are more output rows than registered elements
                still awaited; nothing is taken then (every request stays registered).
        """
        total = self.num_rows(outputs)
        # Checked before any request is taken: rows that cannot all be placed must not
        # complete some requests and then fail the rest.
        if total > self._awaited:
            raise ModelOutputError(
                f"{total - self._awaited} more output rows than registered request "
                f"elements: {total} given, {self._awaited} awaited")
        sizes = self._sizes
        completed = []
        start = 0
        while sizes:
            need = sizes[0] - self._done
            if need > total - start:
                break
            piece = self.slice(outputs, start, start + need)
            start += need
            if self._pieces:
                self._pieces.append(piece)
                piece = self.concat(self._pieces)
                self._pieces = []
            completed.append(piece)
            self._done = 0
            sizes.popleft()
        if start < total:  # the front request goes on in the next batch
            self._pieces.append(self.slice(outputs, start, total))
            self._done += total - start
        self._awaited -= total
        return completed

    def num_rows(self, outputs: Outputs) -> int:
        """The number of elements (rows) in ``outputs``."""
        return rows.count(outputs)

    def slice(self, outputs: Outputs, start: int, stop: int) -> Outputs:
        """Rows ``start:stop`` of ``outputs``, as views."""
        return rows.take(outputs, slice(start, stop))

    def concat(self, pieces: List[Outputs]) -> Outputs:
        """Pieces of one request's outputs, joined in order."""
        return rows.concatenate(pieces)


class NumpyUnbatcher(Unbatcher):
    """For models whose output is one array with a row per element."""


class TreeUnbatcher(Unbatcher):
    """For models that return a tuple or dict of arrays (a policy and a value, say)."""


def unbatcher_for(outputs: Outputs) -> Unbatcher:
    """A fresh unbatcher for outputs shaped like ``outputs`` (array, tuple or dict).

    Raises:
        ModelOutputError: when ``outputs`` is none of those.
    """
    if isinstance(outputs, np.ndarray):
        return NumpyUnbatcher()
    if isinstance(outputs, (tuple, dict)):
        return TreeUnbatcher()
    raise ModelOutputError(
        f"a model must return an ndarray, or a tuple or dict of them, got "
        f"{type(outputs).__name__}")
