"""Models: a spec wrapper for plain functions, a seeded NumPy MLP, a TensorFlow adapter.

A model is any callable from a batch ``[n, ...]`` to outputs with first dimension ``n``
(``base.Model``). The classes here add the input spec that servers check requests
against, and the TensorFlow adapter pads batches to a few fixed sizes so that it traces
once per size.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Sequence, Tuple

import numpy as np

from async_search import rows
from async_search.base import Outputs, TensorSpec
from async_search.checks import check_int

__all__ = [
    "SpecModel", "with_spec", "MLP", "TensorFlowModel", "power_of_two_sizes", "GRID_SCALE",
    "GRID_BOUND", "WEIGHT_QUANTUM",
]


@dataclasses.dataclass(frozen=True)
class SpecModel:
    """A plain function with the specs that servers check requests against."""

    fn: Callable[[np.ndarray], Outputs]
    input_spec: TensorSpec
    output_spec: TensorSpec | None = None

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
    return SpecModel(fn, TensorSpec(tuple(shape), dtype), output_spec)


# The MLP keeps activations on a grid of multiples of 1/GRID_SCALE within
# [-GRID_BOUND, GRID_BOUND], and weights on multiples of WEIGHT_QUANTUM, so every product
# and partial sum is exact in float64: any summation order (BLAS kernel, batch size)
# gives the same bits for a row. Other implementations of this forward pass (the
# TensorFlow nets of problems.tf_nets) use these constants.
GRID_SCALE = 256.0
GRID_BOUND = 256.0
WEIGHT_QUANTUM = 2.0 ** -10


def _on_grid(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x * GRID_SCALE), -GRID_BOUND * GRID_SCALE,
                   GRID_BOUND * GRID_SCALE) / GRID_SCALE


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
        dtype: input and output dtype.

    Example:
        >>> model = MLP((4,), hidden_sizes=(8,), output_size=2, seed=0)
        >>> model(np.ones((3, 4), np.float32)).shape
        (3, 2)
    """

    def __init__(self, input_shape: Sequence[int], hidden_sizes: Sequence[int] = (64,),
                 output_size: int = 1, seed: int = 0, dtype: Any = np.float32):
        self.input_spec = TensorSpec(tuple(input_shape), dtype)
        self.output_spec = TensorSpec((output_size,), dtype)
        rng = np.random.default_rng(seed)
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
        if len(weights) != len(self.weights) or any(
                np.shape(w) != w0.shape or np.shape(b) != b0.shape
                for (w, b), (w0, b0) in zip(weights, self.weights)):
            raise ValueError("with_weights needs (w, b) layers shaped like the model's: "
                             f"{[(w.shape, b.shape) for w, b in self.weights]}")
        quantum = WEIGHT_QUANTUM
        copy = object.__new__(MLP)
        copy.__dict__.update(self.__dict__)
        copy.weights = [(np.round(np.asarray(w, np.float64) / quantum) * quantum,
                         np.round(np.asarray(b, np.float64) / quantum) * quantum)
                        for w, b in weights]
        return copy

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        h = _on_grid(np.asarray(batch, np.float64).reshape(len(batch), self._in_features))
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(self.weights):
            h = h @ w + b
            if i < last:
                h = _on_grid(np.maximum(h, 0.0))
        return h.astype(self.output_spec.dtype)


def power_of_two_sizes(max_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to and including ``max_batch_size`` (which need not be a power)."""
    max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1)
    sizes = []
    size = 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    sizes.append(max_batch_size)
    return tuple(sizes)


class TensorFlowModel:
    """Adapts a Keras model or a TensorFlow function into a NumPy-in, NumPy-out model.

    Each batch is padded up to the nearest allowed batch size (by default the powers of
    two up to ``max_batch_size``), so the function is traced once per allowed size and
    never again; the padding rows are sliced off the outputs. Larger batches run in
    chunks of the largest size. It runs on the first visible GPU, else on the CPU.
    TensorFlow is imported when an adapter is made, never by importing this module.

    Args:
        fn: a Keras model or a callable on tensors returning a tensor, or a tuple or dict
            of tensors.
        input_spec: per-element input shape and dtype.
        max_batch_size: the largest batch passed to ``fn`` at once.
        batch_sizes: the allowed batch sizes (sorted ascending); overrides the powers of
            two.
        jit_compile: compile with XLA.
        device: a TensorFlow device string; default the first GPU, else ``/CPU:0``.

    Example:
        >>> import tensorflow as tf
        >>> net = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        >>> model = TensorFlowModel(net, TensorSpec((4,), np.float32), max_batch_size=64)
        >>> model(np.zeros((5, 4), np.float32)).shape
        (5, 1)
    """

    def __init__(self, fn: Callable[..., Any], input_spec: TensorSpec, *,
                 max_batch_size: int = 1024, batch_sizes: Sequence[int] | None = None,
                 jit_compile: bool = False, device: str | None = None):
        import tensorflow as tf  # imported here so that the core needs numpy alone

        self._tf = tf
        self.input_spec = input_spec
        if batch_sizes:
            self.batch_sizes = tuple(sorted(check_int(f"batch_sizes[{i}]", size, minimum=1)
                                            for i, size in enumerate(batch_sizes)))
        else:
            self.batch_sizes = power_of_two_sizes(max_batch_size)
        if device is None:
            device = "/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0"
        self.device = device
        self.trace_count = 0
        self._trace_lock = threading.Lock()

        def traced(x):
            # Runs once per trace, never per call: counts how often tracing happened.
            with self._trace_lock:
                self.trace_count += 1
            return fn(x, training=False) if _is_keras(fn) else fn(x)

        self._fn = tf.function(traced, jit_compile=jit_compile, reduce_retracing=False)
        self._concrete = {}  # allowed size -> the function traced for that batch shape
        self._padded = {}  # allowed size -> reused input buffer with zero padding rows
        self._call_lock = threading.Lock()  # the buffers are shared: one call at a time

    def _bucket(self, n: int) -> int:
        for size in self.batch_sizes:
            if size >= n:
                return size
        return self.batch_sizes[-1]

    def __call__(self, batch: np.ndarray) -> Outputs:
        n = len(batch)
        largest = self.batch_sizes[-1]
        if n > largest:
            parts = [self(batch[i:i + largest]) for i in range(0, n, largest)]
            return rows.concatenate(parts)
        size = self._bucket(max(n, 1))
        with self._call_lock:
            buffer = self._padded.get(size)
            if buffer is None:
                buffer = self._padded[size] = np.zeros(
                    self.input_spec.batch_shape(size), self.input_spec.dtype)
            buffer[:n] = batch
            buffer[n:] = 0
            with self._tf.device(self.device):
                fn = self._concrete.get(size)
                if fn is None:  # traced once per allowed size, then called directly
                    fn = self._concrete[size] = self._fn.get_concrete_function(
                        self._tf.TensorSpec(buffer.shape, buffer.dtype))
                out = fn(self._tf.constant(buffer))
        return rows.map_leaves(lambda t: t.numpy()[:n], out)


def _is_keras(fn: Any) -> bool:
    return hasattr(fn, "layers") and hasattr(fn, "predict")
