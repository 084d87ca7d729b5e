"""Checking a request against the model's input spec, at the moment it is made.

Every entry point that takes a request (``serve``, ``immediate``, the clients of every
backend, the Router, the cache) passes it through here, so that what is batched is a
plain ndarray of the spec's dtype: an ndarray subclass keeps its own arithmetic
(``np.matrix`` makes ``x * x`` a matrix product, a masked array masks), and joined with
batch-mates it would turn their answers into its kind too.

    >>> check = RequestChecker(None)
    >>> x = check(np.ma.masked_array(np.ones((2, 3), np.float32), mask=False))
    >>> type(x).__name__, x.dtype
    ('ndarray', dtype('float32'))
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from async_search.base import TensorSpec
from async_search.errors import InputSpecError


def plain_array(x: Any) -> Any:
    """``x`` as a plain ndarray when it is an ndarray subclass (a view of its data, as
    ``np.asarray`` gives); anything else unchanged (the checks that follow refuse it).

    Example:
        >>> type(plain_array(np.matrix([[1, 2]]))).__name__
        'ndarray'
    """
    if type(x) is np.ndarray or not isinstance(x, np.ndarray):
        return x
    return np.asarray(x)


def _native(dtype: np.dtype) -> np.dtype:
    """``dtype`` in this machine's byte order (itself when it already is)."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


class RequestChecker:
    """Checks requests against an input spec; without one, learns it from the first.

    Calling the checker returns the request as a plain ndarray of the spec's dtype when
    it fits: the request itself when it already is one; an ndarray subclass as a plain
    view of its data (``np.asarray``); an array of the spec's dtype in the other byte
    order as a copy in the spec's (the same values). Anything else raises InputSpecError
    (a ValueError) naming the expected and the given shape or dtype. A spec learnt from
    a first request has that request's dtype in this machine's byte order.

    With ``relearns``, a learnt spec is provisional until the owner reports a request of
    it answered (``settle_by``): the first request may be one the model refuses (a
    wrong shape, an empty ``np.array([])``), or one its caller gave up on, and must not
    fix the spec for every later caller. Until then the owner notes the future of each
    request it takes (``note``), and a request that does not fit the spec, made when
    none of them still waits, teaches the spec again instead of being refused.
    """

    def __init__(self, spec: TensorSpec | None,
                 learnable: Callable[[np.dtype], None] | None = None,
                 values: Callable[[np.ndarray], None] | None = None,
                 relearns: bool = False):
        #: Called with a first request's dtype before it is learnt: raises
        #: InputSpecError for one that cannot be sent (a client's protocol).
        self._learnable = learnable
        #: The model's ``check_values`` (``base.values_check_of``): called on every
        #: request of at least one row that fits the spec; what it raises fails the
        #: request as an InputSpecError.
        self.values = values
        self.spec = spec
        # Plain attributes so that a server can inline the common case.
        self.shape = spec.shape if spec is not None else None
        self.dtype = spec.dtype if spec is not None else None
        #: Whether the spec is final: declared, or learnt and settled.
        self.settled = spec is not None
        self._relearns = relearns
        #: The futures of the requests taken under the provisional spec.
        self._waiting: list = []

    def note(self, fut: Any) -> None:
        """``fut`` is a request's, taken under the provisional spec; the done ones are
        let go of at each power of two (a model that fails every batch never settles
        the spec, and its requests must not pile up here)."""
        waiting = self._waiting
        waiting.append(fut)
        if len(waiting) >= 64 and len(waiting) & (len(waiting) - 1) == 0:
            self.waits()

    def waits(self) -> bool:
        """Whether a request taken under the provisional spec still waits."""
        self._waiting = [fut for fut in self._waiting if not fut.done()]
        return bool(self._waiting)

    def settle_by(self, batch: Any) -> None:
        """Rows of ``batch`` were answered: a provisional spec it fits holds from now
        on (one of an earlier spec, its requests given up on, settles nothing)."""
        if not self.settled and isinstance(batch, np.ndarray) and batch.ndim \
                and self.fits(batch):
            self.settled = True
            self._waiting = []

    def fits(self, x: np.ndarray) -> bool:
        """Whether ``x`` (an array with a batch dimension) fits the spec as it is."""
        return x.shape[1:] == self.shape and _native(x.dtype) == _native(self.dtype)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        # The common case costs a type check and two comparisons.
        if type(x) is np.ndarray and x.shape[1:] == self.shape and x.dtype == self.dtype \
                and x.ndim and self.values is None:
            return x
        x = self._slow_check(x)
        if self.values is not None and len(x):
            self._check_values(x)
        return x

    def _check_values(self, x: np.ndarray) -> None:
        try:
            self.values(x)
        except InputSpecError:
            raise
        except (Exception, SystemExit) as e:  # another kind: still the input's (and a
            # SystemExit would end the serving process); a real Ctrl-C goes on
            raise InputSpecError(f"the model's check_values refused this request: "
                                 f"{type(e).__name__}: {e}") from e

    def _slow_check(self, x) -> np.ndarray:
        if not isinstance(x, np.ndarray):
            expected = self.spec.describe() if self.spec else "[n, ...]"
            raise InputSpecError(
                f"a request must be a NumPy array {expected}, got {type(x).__name__}")
        if x.ndim == 0:  # named like every other refusal: expected, then given
            expected = self.spec.describe() if self.spec else "[n, ...]"
            raise InputSpecError(f"a request must have a batch dimension: expected "
                                 f"{expected}, given a 0-d {x.dtype} array")
        x = plain_array(x)
        if self.spec is None or (self._relearns and not self.settled
                                 and not self.fits(x) and not self.waits()):
            if self._learnable is not None:
                self._learnable(x.dtype)
            self.spec = TensorSpec(x.shape[1:], _native(x.dtype))
            self.shape, self.dtype = self.spec.shape, self.spec.dtype
        given = f"[{', '.join(map(str, x.shape))}] {x.dtype}"
        if x.shape[1:] != self.shape:
            raise InputSpecError(
                f"request shape does not match the model's input: expected "
                f"{self.spec.describe()}, given {given}")
        if x.dtype != self.dtype:
            if _native(x.dtype) != _native(self.dtype):
                raise InputSpecError(
                    f"request dtype does not match the model's input: expected "
                    f"{self.spec.describe()}, given {given}")
            x = x.astype(self.dtype)  # the same values in the spec's byte order
        return x
