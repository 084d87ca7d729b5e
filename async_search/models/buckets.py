"""Bucket sizes: the few batch shapes a framework adapter runs its net on.

A traced or compiled net (TensorFlow, PyTorch with CUDA graphs or ``torch.compile``,
JAX) pays for each new input shape once. The adapters therefore pad every batch up to
the smallest of a few allowed sizes (by default the powers of two up to
``max_batch_size``), run larger batches in chunks of the largest size, and slice the
padding rows off the outputs. This module is that logic, once, for every adapter: the
sizes, the choice of a size, the reused host buffers a batch is padded in, the chunking,
and the adapters' call (``BucketedModel``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Sequence, Tuple

import numpy as np

from async_search import rows
from async_search.base import Outputs, TensorSpec
from async_search.checks import check_int
from async_search.errors import ModelOutputError
from async_search.requests import RequestChecker


#: Makes a zero-filled host buffer of a shape and dtype (``np.zeros``, or a view of a
#: pinned framework tensor).
Allocate = Callable[[Tuple[int, ...], np.dtype], np.ndarray]


def power_of_two_sizes(max_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to and including ``max_batch_size`` (which need not be a power).

    Example:
        >>> power_of_two_sizes(12)
        (1, 2, 4, 8, 12)
    """
    max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1)
    sizes = []
    size = 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    sizes.append(max_batch_size)
    return tuple(sizes)


#: An adapter's largest batch when neither max_batch_size nor batch_sizes says.
DEFAULT_MAX_BATCH_SIZE = 1024


def bucket_sizes(max_batch_size: int | None = None,
                 batch_sizes: Sequence[int] | None = None) -> tuple[int, ...]:
    """The allowed batch sizes of an adapter: ``batch_sizes`` sorted (duplicates
    dropped) when given, else the powers of two up to ``max_batch_size`` (None:
    ``DEFAULT_MAX_BATCH_SIZE``). Given both, no size may pass ``max_batch_size``.

    Raises:
        ValueError: a size that is not an integer >= 1, or no size at all (a number or
            a string where a sequence was meant); a batch size over ``max_batch_size``.

    Example:
        >>> bucket_sizes(batch_sizes=(64, 8, 8))
        (8, 64)
        >>> bucket_sizes(100)[-3:]
        (32, 64, 100)
    """
    if max_batch_size is not None:  # checked even where batch_sizes are what counts
        max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1)
    if batch_sizes is not None:
        sizes: tuple = ()
        if not isinstance(batch_sizes, (str, bytes, dict)):
            try:
                sizes = tuple(batch_sizes)
            except TypeError:  # a number (or a 0-d array) where a sequence was meant
                pass
        if not sizes:
            raise ValueError(f"batch_sizes must be a sequence of at least one integer "
                             f">= 1 (or None for the powers of two), got {batch_sizes!r}")
        allowed = tuple(sorted({check_int(f"batch_sizes[{i}]", size, minimum=1)
                                for i, size in enumerate(sizes)}))
        if max_batch_size is not None and allowed[-1] > max_batch_size:
            raise ValueError(f"batch_sizes go up to {allowed[-1]}, over max_batch_size="
                             f"{max_batch_size}, the largest batch passed at once: give "
                             f"one or the other, or sizes within it")
        return allowed
    return power_of_two_sizes(DEFAULT_MAX_BATCH_SIZE if max_batch_size is None
                              else max_batch_size)


def adapter_spec(input_spec: TensorSpec) -> TensorSpec:
    """``input_spec`` as an adapter takes it: a ``TensorSpec``, else TypeError (a
    framework's net has no spec to learn from a first request, as a server does); its
    dtype in this machine's byte order (frameworks take no other; a request in the
    other order is converted when checked, its values the same).

    Example:
        >>> adapter_spec(TensorSpec((4,), np.float32)).describe()
        '[n, 4] float32'
        >>> adapter_spec(TensorSpec((4,), ">f4")).dtype == np.float32
        True
    """
    if not isinstance(input_spec, TensorSpec):
        raise TypeError(f"input_spec must be a TensorSpec (per-element shape and dtype), "
                        f"got {input_spec!r}")
    if not input_spec.dtype.isnative:
        return TensorSpec(input_spec.shape, input_spec.dtype.newbyteorder("="))
    return input_spec


class PaddedBatches:
    """Pads batches into one reused host buffer per bucket size.

    A batch of ``n`` rows goes into the buffer of the smallest bucket that holds it;
    the rows after ``n`` are zeros (only the rows the last batch wrote are cleared, so a
    small batch in a large bucket costs its own rows, not the bucket's). The buffers are
    shared state: callers serialise ``pad`` and the use of its result (the adapters hold
    their lock across both).

    Args:
        input_spec: the per-element shape and dtype of a batch.
        sizes: the allowed batch sizes, ascending (``bucket_sizes``).
        allocate: makes a zero-filled buffer (default ``np.zeros``; the PyTorch adapter
            gives views of pinned memory on CUDA).

    Example:
        >>> padded = PaddedBatches(TensorSpec((2,), np.float32), (1, 4))
        >>> buffer, size = padded.pad(np.ones((3, 2), np.float32))
        >>> size, buffer[:, 0].tolist()
        (4, [1.0, 1.0, 1.0, 0.0])
    """

    def __init__(self, input_spec: TensorSpec, sizes: Sequence[int],
                 allocate: Allocate | None = None):
        self.input_spec = input_spec
        self.sizes = tuple(sizes)
        self.largest = self.sizes[-1]
        # The shapes of the batches that may go as they are (``fills_bucket``).
        self._exact_shapes = frozenset(input_spec.batch_shape(size) for size in self.sizes)
        self._dtype = input_spec.dtype
        self._allocate = allocate or (lambda shape, dtype: np.zeros(shape, dtype))
        self._buffers: Dict[int, np.ndarray] = {}
        self._written: Dict[int, int] = {}  # size -> rows the last batch wrote

    def bucket(self, n: int) -> int:
        """The smallest allowed size that holds ``n`` rows (at least one row: an empty
        batch runs as one padding row), or the largest size when none does."""
        for size in self.sizes:
            if size >= n:
                return size
        return self.largest

    def buffer(self, size: int) -> np.ndarray:
        """The host buffer of bucket ``size``, made on first use."""
        buffer = self._buffers.get(size)
        if buffer is None:
            buffer = self._buffers[size] = self._allocate(
                self.input_spec.batch_shape(size), self.input_spec.dtype)
            self._written[size] = 0
        return buffer

    def fills_bucket(self, batch: Any) -> bool:
        """Whether ``batch`` may go to the net as it is: an ndarray of the spec's dtype,
        writable and C-contiguous, whose length is an allowed size.

        Example:
            >>> padded = PaddedBatches(TensorSpec((2,), np.float32), (1, 4))
            >>> padded.fills_bucket(np.ones((4, 2), np.float32))
            True
            >>> padded.fills_bucket(np.ones((3, 2), np.float32))
            False
        """
        if type(batch) is not np.ndarray or batch.shape not in self._exact_shapes:
            return False
        dtype, flags = batch.dtype, batch.flags
        return ((dtype is self._dtype or dtype == self._dtype)
                and flags.c_contiguous and flags.writeable)

    def pad(self, batch: np.ndarray, *, copy: bool = True) -> Tuple[np.ndarray, int]:
        """``(buffer, size)``: ``batch`` (at most ``largest`` rows) copied into the first
        rows of its bucket's buffer, the other rows zero.

        With ``copy=False``, a batch that ``fills_bucket`` comes back as it is (no
        copy); the caller must then not hand out outputs that share its memory.
        """
        n = len(batch)
        if not copy and self.fills_bucket(batch):
            return batch, n
        size = self.bucket(max(n, 1))
        buffer = self.buffer(size)
        buffer[:n] = batch
        written = self._written[size]
        if written > n:
            buffer[n:written] = 0
        self._written[size] = n
        return buffer, size


    def dirtied(self, size: int) -> None:
        """The net wrote into bucket ``size``'s buffer (a module that writes its
        input): its pad rows are zeroed again at the next ``pad``."""
        if size in self._written:
            self._written[size] = size


def net_outputs(out: Any, is_tensor: Callable[[Any], bool],
                convert: Callable[[Any], np.ndarray]) -> Outputs:
    """A net's outputs with ``convert`` applied to each tensor, the structure kept: a
    tensor, or a tuple, list (which becomes a tuple) or dict of tensors, as the output
    contract of every adapter says.

    Raises:
        ModelOutputError: anything else (None, a number, a string, an empty or nested
            structure), named, rather than a framework's error from deep inside.

    Example:
        >>> net_outputs({"v": [1.0]}, lambda t: isinstance(t, list), np.asarray)
        {'v': array([1.])}
    """
    if is_tensor(out):
        return convert(out)
    if isinstance(out, dict) and out:
        if all(map(is_tensor, out.values())):
            return {k: convert(t) for k, t in out.items()}
    elif isinstance(out, (tuple, list)) and out:
        if all(map(is_tensor, out)):
            return tuple(convert(t) for t in out)
    raise ModelOutputError(
        f"the net returned {_describe_structure(out, is_tensor)}: an adapter's net must "
        f"return a tensor [n, ...], or a tuple, list or dict of such tensors")


def _describe_structure(out: Any, is_tensor: Callable[[Any], bool]) -> str:
    if isinstance(out, (dict, tuple, list)):
        kind = type(out).__name__
        if not out:
            return f"an empty {kind}"
        items = out.items() if isinstance(out, dict) else enumerate(out)
        for key, value in items:
            if not is_tensor(value):
                return f"a {kind} whose item {key!r} is a {type(value).__name__}"
    return f"a {type(out).__name__}"


def widened(out: np.ndarray) -> np.ndarray:
    """``out`` with a reduced float (float16, bfloat16) as float32, as every adapter
    hands its outputs out: NumPy has no bfloat16 of its own, and the caller of a
    float32 net in reduced precision expects float32.

    Example:
        >>> widened(np.ones(2, np.float16)).dtype, widened(np.ones(2, np.int16)).dtype
        (dtype('float32'), dtype('int16'))
    """
    dtype = out.dtype
    if dtype.itemsize == 2 and (dtype.kind == "f" or dtype.name == "bfloat16"):
        return out.astype(np.float32)
    return out


def host_rows(out: np.ndarray, n: int, size: int) -> np.ndarray:
    """``widened(padded_rows(out, n, size))`` in one call: what an adapter hands out for
    one output array of a batch of ``n`` rows padded to ``size``.

    Raises:
        ModelOutputError: the array has no batch dimension, or not ``size`` rows.

    Example:
        >>> out = host_rows(np.ones((4, 2), np.float16), 3, 4)
        >>> out.shape, out.dtype
        ((3, 2), dtype('float32'))
    """
    try:
        shape = out.shape
    except AttributeError:  # a 0-d string tensor's value is bytes, not an array
        check_padded_shape((), n, size)  # raises
    if n != size or not shape or shape[0] != size:  # (usually neither: no call)
        out = padded_rows(out, n, size)
    return widened(out) if out.dtype.itemsize == 2 else out


def padded_rows(out: np.ndarray, n: int, size: int) -> np.ndarray:
    """The first ``n`` rows of one output array of a net that ran on a batch padded to
    ``size`` rows.

    Raises:
        ModelOutputError: the array has no batch dimension, or not ``size`` rows
            (``check_padded_shape``).

    Example:
        >>> padded_rows(np.arange(4), 3, 4).tolist()
        [0, 1, 2]
    """
    check_padded_shape(out.shape, n, size)
    return out if n == size else out[:n]


def check_padded_shape(shape: Sequence[int], n: int, size: int) -> None:
    """Raises unless an output of this ``shape`` has one row per row of a batch of ``n``
    rows padded to ``size``: a net that returns more or fewer rows than it was given
    would have its first ``n`` rows taken for the batch's outputs, a wrong answer.

    Raises:
        ModelOutputError: no batch dimension, or another number of rows than ``size``.

    Example:
        >>> check_padded_shape((8, 2), 5, 8)
    """
    if len(shape) and shape[0] == size:
        return
    rows_given = f"{shape[0]} rows" if len(shape) else "a 0-d array (no batch dimension)"
    raise ModelOutputError(
        f"the net returned {rows_given} for a batch of {size} rows ({n} padded to "
        f"{size}): it must return one output row per input row")


def run_in_chunks(batch: np.ndarray, largest: int,
                  run: Callable[[np.ndarray], Outputs]) -> Outputs:
    """``run(batch)``, or, for a batch of more than ``largest`` rows, ``run`` on each
    chunk of at most ``largest`` rows and their outputs joined in order.

    Example:
        >>> run_in_chunks(np.arange(5), 2, lambda x: x * 10).tolist()
        [0, 10, 20, 30, 40]
    """
    n = len(batch)
    if n <= largest:
        return run(batch)
    return rows.concatenate([run(batch[i:i + largest]) for i in range(0, n, largest)])


def refuse_copying(adapter: Any) -> None:
    """What pickling or copying a framework adapter raises: it holds a framework's
    module and a device, neither of which can travel; a factory can."""
    raise TypeError(f"a {type(adapter).__name__} holds a net on its device and cannot be "
                    f"pickled or copied: pass a function that makes it (a model factory, "
                    f"as run_searches takes), or place a copy with "
                    f"async_search.base.on_device(model, device)")


class BucketedModel:
    """The call of every framework adapter: a batch is checked against ``input_spec``,
    then one that fits the largest bucket runs at once, a larger one in chunks of the
    largest size, each through the adapter's ``_run`` (which runs at most
    ``batch_sizes[-1]`` rows).

    A batch that is not an ndarray ``[n, *input_spec.shape]`` of the spec's dtype raises
    ``InputSpecError``, as a request to a server does: padded into the bucket's buffer,
    a ``[4]`` array would broadcast into four equal rows, a float64 batch be cast.

    Example:
        >>> class Doubling(BucketedModel):
        ...     batch_sizes = (1, 2)
        ...     input_spec = TensorSpec((), np.int64)
        ...     def _run(self, batch):
        ...         return batch * 2
        >>> Doubling()(np.arange(5, dtype=np.int64)).tolist()
        [0, 2, 4, 6, 8]
    """

    #: The allowed batch sizes, ascending (``bucket_sizes``).
    batch_sizes: Tuple[int, ...]
    #: What each batch's elements are.
    input_spec: TensorSpec

    def __call__(self, batch: np.ndarray) -> Outputs:
        if self._fits(batch):  # the usual batch: no checking or chunking call
            return self._run(batch)
        batch = RequestChecker(self.input_spec)(batch)
        if len(batch) <= self.batch_sizes[-1]:
            return self._run(batch)
        return run_in_chunks(batch, self.batch_sizes[-1], self._run)

    def _fits(self, batch: Any) -> bool:
        """Whether ``batch`` may go to ``_run`` as it is: an ndarray ``[n,
        *input_spec.shape]`` of the spec's dtype with at most ``batch_sizes[-1]`` rows.
        A server's batch always does (its requests were checked): a few comparisons."""
        spec = self.input_spec
        return (type(batch) is np.ndarray and batch.dtype == spec.dtype
                and batch.shape[1:] == spec.shape and batch.ndim > 0
                and len(batch) <= self.batch_sizes[-1])

    def _run(self, batch: np.ndarray) -> Outputs:
        """The outputs of one batch of at most ``batch_sizes[-1]`` rows."""
        raise NotImplementedError


def check_output_keys(out: Any) -> None:
    """Refuses a dict output, or one inside a tuple or list, whose keys do not sort:
    TensorFlow and JAX sort them to flatten it, and raised their own bare TypeError or
    ValueError from inside their tree utilities. Called where the net is traced.

    Example:
        >>> check_output_keys({"policy": 1, "value": 2})
        >>> check_output_keys(({"a": 1, 0: 2},))
        Traceback (most recent call last):
        ...
        async_search.errors.ModelOutputError: the net returned a dict whose keys do not sort (['int', 'str']): the framework orders a dict's outputs by key, so its keys must be of one kind (all strings, say)
    """
    if isinstance(out, (tuple, list)):
        for part in out:
            check_output_keys(part)
    elif isinstance(out, Mapping):
        try:
            sorted(out)
        except TypeError:
            raise ModelOutputError(
                f"the net returned a dict whose keys do not sort "
                f"({sorted({type(k).__name__ for k in out})}): the framework orders "
                f"a dict's outputs by key, so its keys must be of one kind (all strings, "
                f"say)") from None
        for part in out.values():
            check_output_keys(part)
