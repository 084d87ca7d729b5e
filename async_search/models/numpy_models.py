"""NumPy models: a spec wrapper for plain functions, and a seeded MLP whose rows are
exact whatever the batch.

A model is any callable from a batch ``[n, ...]`` to outputs with first dimension ``n``
(``base.Model``). The classes here add the input spec that servers check requests
against.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence, Tuple

import numpy as np

from async_search.base import Outputs, TensorSpec
from async_search.checks import check_int
from async_search.errors import InputSpecError


@dataclasses.dataclass(frozen=True)
class SpecModel:
    """A plain function with the specs that servers check requests against."""

    fn: Callable[[np.ndarray], Outputs]
    input_spec: TensorSpec
    output_spec: TensorSpec | None = None

    def __post_init__(self):
        if not callable(self.fn):
            raise TypeError(f"SpecModel wraps a function, got {type(self.fn).__name__}")
        if not isinstance(self.input_spec, TensorSpec):
            raise TypeError(f"input_spec must be a TensorSpec (TensorSpec((4,), "
                            f"np.float32), say), got {self.input_spec!r}")
        if self.output_spec is not None and not isinstance(self.output_spec, TensorSpec):
            raise TypeError(f"output_spec must be a TensorSpec or None (TensorSpec((1,), "
                            f"np.float32), say), got {self.output_spec!r}")

    def __call__(self, batch: np.ndarray) -> Outputs:
        return self.fn(batch)


def with_spec(fn: Callable[[np.ndarray], Outputs], shape: Sequence[int], dtype: Any,
              output_spec: TensorSpec | None = None) -> SpecModel:
    """Declare the per-element input shape and dtype of a plain function.

    Example:
        >>> model = with_spec(lambda x: x.sum(axis=1), (3,), np.float32)
        >>> model.input_spec.describe()
        '[n, 3] float32'
    """
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise ValueError(f"with_spec's shape is a sequence of integers >= 0 (one "
                         f"element's, the batch left out), got {shape!r}")
    return SpecModel(fn, TensorSpec(tuple(shape), dtype), output_spec)


# The MLP keeps activations on a grid of multiples of 1/GRID_SCALE within
# [-GRID_BOUND, GRID_BOUND], and weights on multiples of WEIGHT_QUANTUM, so every product
# and partial sum is exact in float64: any summation order (BLAS kernel, batch size)
# gives the same bits for a row. Other implementations of this forward pass (the
# TensorFlow nets of problems.tf_nets) use these constants.
GRID_SCALE = 256.0
GRID_BOUND = 256.0
WEIGHT_QUANTUM = 2.0 ** -10


def float64_rows(batch: Any, shape: Sequence[int], flat: bool = False) -> np.ndarray:
    """``batch`` as float64 rows of the element shape ``shape`` (each row flattened
    when ``flat``): what a model called directly, outside ``serve`` (which checks
    requests against the input spec first), makes of its input.

    Raises:
        InputSpecError: rows that do not hold ``shape``'s number of values, naming the
            expected and the given shape.

    Example:
        >>> float64_rows(np.zeros((2, 6), np.float32), (2, 3)).shape
        (2, 2, 3)
        >>> float64_rows(np.zeros((2, 2, 3), np.float32), (2, 3), flat=True).shape
        (2, 6)
    """
    x = np.asarray(batch, np.float64)
    size = math.prod(shape)
    if x.ndim and x.size == len(x) * size:
        return x.reshape(len(x), size) if flat else x.reshape(len(x), *shape)
    raise InputSpecError(f"expected a batch of shape [n, {', '.join(map(str, shape))}], "
                         f"got {x.shape}")


def on_grid(x: np.ndarray) -> np.ndarray:
    """Activations (float64) rounded onto the grid and clipped to its bound."""
    return np.clip(np.round(x * GRID_SCALE), -GRID_BOUND * GRID_SCALE,
                   GRID_BOUND * GRID_SCALE) / GRID_SCALE


def on_weight_grid(w: np.ndarray) -> np.ndarray:
    """Weights as float64 multiples of ``WEIGHT_QUANTUM``."""
    return np.round(np.asarray(w, np.float64) / WEIGHT_QUANTUM) * WEIGHT_QUANTUM


class MLP:
    """A seeded NumPy multilayer perceptron whose rows are computed independently.

    The output for an element is bitwise the same whatever its batch-mates, because
    weights and activations live on a dyadic grid where float64 arithmetic is exact (the
    input is rounded to multiples of 1/256 and clipped to [-256, 256]). That makes it
    the reference model for checking that batched and unbatched searches agree.
    (The grid: ``GRID_SCALE``, ``GRID_BOUND`` and ``WEIGHT_QUANTUM`` of this module.)

    Args:
        input_shape: per-element input shape; inputs are flattened.
        hidden_sizes: widths of the ReLU hidden layers.
        output_size: width of the output; outputs have shape ``[n, output_size]``.
        seed: seeds the weights.
        dtype: input and output dtype, a float dtype.

    Example:
        >>> model = MLP((4,), hidden_sizes=(8,), output_size=2, seed=0)
        >>> model(np.ones((3, 4), np.float32)).shape
        (3, 2)
    """

    def __init__(self, input_shape: Sequence[int], hidden_sizes: Sequence[int] = (64,),
                 output_size: int = 1, seed: int = 0, dtype: Any = np.float32):
        if isinstance(input_shape, (str, bytes)) or not hasattr(input_shape, "__iter__"):
            raise ValueError(f"MLP's input_shape is a sequence of integers (one element's "
                             f"shape, the batch left out), got {input_shape!r}")
        if isinstance(hidden_sizes, (str, bytes)) or not hasattr(hidden_sizes, "__iter__"):
            raise ValueError(f"MLP's hidden_sizes is a sequence of layer widths ((64,) for "
                             f"one layer), got {hidden_sizes!r}")
        hidden_sizes = [check_int("an MLP hidden size", h, minimum=1) for h in hidden_sizes]
        output_size = check_int("output_size", output_size, minimum=1)
        self.input_spec = TensorSpec(tuple(input_shape), dtype)
        if self.input_spec.dtype.kind != "f":
            raise ValueError(f"MLP's dtype (its inputs' and outputs') must be a float "
                             f"dtype, got {self.input_spec.dtype}")
        self.output_spec = TensorSpec((output_size,), dtype)
        # None would draw new weights at each call: "seeded" nets of two processes differ
        rng = np.random.default_rng(check_int("seed", seed, minimum=0))
        sizes = [int(np.prod(input_shape, dtype=np.int64)), *hidden_sizes, output_size]
        self._in_features = sizes[0]
        self.weights = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            limit = np.sqrt(6.0 / (fan_in + fan_out))
            w = rng.uniform(-limit, limit, (fan_in, fan_out))
            b = rng.uniform(-0.1, 0.1, fan_out)
            self.weights.append((np.round(w / WEIGHT_QUANTUM) * WEIGHT_QUANTUM,
                                 np.round(b / WEIGHT_QUANTUM) * WEIGHT_QUANTUM))

    def with_weights(self, weights: Sequence[Tuple[np.ndarray, np.ndarray]]) -> "MLP":
        """A copy of this MLP with other ``(w, b)`` layers of the same shapes (a model
        update pushed by a trainer); weights are rounded onto the exact grid."""
        if not isinstance(weights, (list, tuple)) or not all(
                isinstance(layer, (list, tuple)) and len(layer) == 2 for layer in weights):
            raise TypeError(f"MLP.with_weights takes a list of (w, b) layers, got "
                            f"{type(weights).__name__}")
        if len(weights) != len(self.weights) or any(
                np.shape(w) != w0.shape or np.shape(b) != b0.shape
                for (w, b), (w0, b0) in zip(weights, self.weights)):
            raise ValueError("with_weights needs (w, b) layers shaped like the model's: "
                             f"{[(w.shape, b.shape) for w, b in self.weights]}")
        for i, layer in enumerate(weights):
            for name, value in zip(("w", "b"), layer):
                kind = np.asarray(value).dtype.kind
                if kind not in "fiub" or not (
                        np.isfinite(np.asarray(value, np.float64)).all()):
                    raise ValueError(f"MLP.with_weights: layer {i}'s {name} must be finite "
                                     f"real numbers, got an array of "
                                     f"{np.asarray(value).dtype}"
                                     + ("" if kind not in "fiub" else " with inf or NaN"))
        copy = object.__new__(MLP)
        copy.__dict__.update(self.__dict__)
        copy.weights = [(on_weight_grid(w), on_weight_grid(b)) for w, b in weights]
        return copy

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        h = on_grid(float64_rows(batch, self.input_spec.shape, flat=True))
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(self.weights):
            h = h @ w + b
            if i < last:
                h = on_grid(np.maximum(h, 0.0))
        return h.astype(self.output_spec.dtype)
