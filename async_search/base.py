"""Interfaces shared by every module: tensor specs, the Model and Evaluate protocols.

Algorithm modules (batchers, servers, searches) depend on this module, not on each other.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Awaitable, Mapping, Protocol, Tuple, Union, runtime_checkable

import numpy as np

#: What a model returns for a batch: one array, or a tuple or dict of arrays whose first
#: dimension is the batch (a policy and a value, say).
Outputs = Union[np.ndarray, Tuple[np.ndarray, ...], Mapping[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one element of a batch (the batch dimension left out).

    Example:
        >>> spec = TensorSpec((16, 16), np.float32)
        >>> spec.batch_shape(4)
        (4, 16, 16)
    """

    shape: Tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    def batch_shape(self, n: int) -> Tuple[int, ...]:
        """The shape of a batch of ``n`` elements."""
        return (n, *self.shape)

    def empty(self, n: int = 0) -> np.ndarray:
        """An uninitialised batch of ``n`` elements."""
        return np.empty(self.batch_shape(n), self.dtype)

    def describe(self) -> str:
        """``[n, 16, 16] float32``: how error messages name a spec."""
        return f"[n, {', '.join(map(str, self.shape))}] {self.dtype}" if self.shape else (
            f"[n] {self.dtype}")

    @classmethod
    def of_batch(cls, x: np.ndarray) -> "TensorSpec":
        """The element spec of a batch array ``x`` of shape ``[n, ...]``."""
        return cls(x.shape[1:], x.dtype)


@runtime_checkable
class Model(Protocol):
    """A callable from a batch ``[n, ...]`` to outputs whose first dimension is ``n``.

    Any plain function ``ndarray -> ndarray`` is a model. A model may also declare
    ``input_spec`` (and ``output_spec``) so that servers check requests when they are made
    and answer requests of zero elements without running it; see ``models.with_spec``.
    """

    def __call__(self, batch: np.ndarray) -> Outputs: ...


class Evaluate(Protocol):
    """What a search awaits: ``y = await evaluate(x)`` with ``x[n, ...] -> y[n, ...]``."""

    def __call__(self, x: np.ndarray) -> Awaitable[Outputs]: ...


def input_spec_of(model: Any) -> TensorSpec | None:
    """The model's declared input spec, or None when it declares none."""
    return getattr(model, "input_spec", None)


def output_spec_of(model: Any) -> TensorSpec | None:
    """The model's declared output spec (single-array models only), or None."""
    return getattr(model, "output_spec", None)
