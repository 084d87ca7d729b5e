"""Interfaces shared by every module: tensor specs, the Model, Evaluate and Versioned
protocols, and how to read a model version from anything.

Algorithm modules (batchers, servers, searches) depend on this module, not on each other.
"""

from __future__ import annotations

import dataclasses
import inspect
import reprlib
from typing import (TYPE_CHECKING, Any, Awaitable, Callable, Dict, Hashable, List, Optional,
                    Protocol, Sequence, Tuple, runtime_checkable)

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

from async_search.checks import check_int

__all__ = ["Outputs", "TensorSpec", "Model", "Evaluate", "TimedEvaluate", "Versioned",
           "VersionedEvaluate",
           "UNKNOWN_VERSION", "FIRST_VERSION", "version_of", "first_version",
           "evaluate_with_version", "input_spec_of", "output_spec_of", "same_version",
           "values_check_of", "evaluated", "check_awaitable",
           "DeviceModel", "on_device", "made_from", "replaces_model", "batch_tolerance_of",
           "BatchParts"]

#: What a model returns for a batch: one array, or a tuple or dict of arrays whose first
#: dimension is the batch (a policy and a value, say). Callers get a list or a named
#: tuple as a plain tuple, from ``serve`` and ``immediate`` alike. Typed as Any: a
#: caller knows its model's kind, and a union would make it narrow every answer
#: (``y.shape`` of an array, ``logits, value = y`` of a pair) before its first use.
Outputs = Any


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

    if TYPE_CHECKING:  # what it takes (made into the fields' types when made)
        def __init__(self, shape: Sequence[int], dtype: DTypeLike) -> None: ...

    def __post_init__(self):
        # Each dimension an integer >= 0: int() would make 2.7 a 2 and True a 1, and a
        # negative one would only fail at the first batch.
        if isinstance(self.shape, (str, bytes)) or not hasattr(self.shape, "__iter__"):
            raise ValueError(f"a TensorSpec's shape is a sequence of integers >= 0, got "
                             f"{self.shape!r}")
        object.__setattr__(self, "shape", tuple(
            check_int(f"TensorSpec shape[{i}]", d, minimum=0)
            for i, d in enumerate(self.shape)))
        # None would be NumPy's float64, and a bare str an empty string no request can
        # match: both are slips, refused here instead of failing every request.
        if self.dtype is None:
            raise ValueError("a TensorSpec's dtype must be given (np.float32, say), got "
                             "None")
        dtype = np.dtype(self.dtype)
        if dtype.itemsize == 0 and dtype.kind in "SUV":
            raise ValueError(f"a TensorSpec's dtype must have a size: {dtype} holds "
                             f"nothing (give its length, as in 'U8')")
        object.__setattr__(self, "dtype", dtype)

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


class TimedEvaluate(Evaluate, Protocol):
    """An evaluate that takes a deadline per request (``serve``'s, ``immediate``, the
    clients of every backend, ``Router``, ``CachedEvaluate``): what a search that asks
    ``await evaluate(x, timeout=0.5)`` is typed with.

    Example:
        >>> async def search(start, evaluate: TimedEvaluate):
        ...     return await evaluate(np.zeros((1, 4), np.float32), timeout=0.5)
    """

    def __call__(self, x: np.ndarray, timeout: float | None = None
                 ) -> Awaitable[Outputs]: ...


@runtime_checkable
class DeviceModel(Protocol):
    """A model that can make a copy of itself on another device (the framework adapters
    do): ``serve(model, devices=[...])`` runs one device worker per device, each on its
    own copy, and ``update_model`` reaches every copy.

    ``batch_tolerance`` says how much a row's outputs may depend on its batch-mates
    (0.0: not at all, bit for bit; on a GPU, floating-point sums may change with the
    batch size): ``immediate`` and ``serve`` agree within it (relative and absolute).
    """

    batch_tolerance: float

    def __call__(self, batch: np.ndarray) -> Outputs: ...

    def on_device(self, device: Any) -> "DeviceModel":
        """A copy of this model on ``device`` (its own weights and buffers there)."""
        ...


def on_device(model: Any, device: Any) -> Any:
    """``model.on_device(device)``: the model's copy on ``device``.

    Raises:
        TypeError: when the model cannot place itself (it has no ``on_device``).
    """
    place = getattr(model, "on_device", None)
    if place is None:
        raise TypeError(
            f"the model {type(model).__name__} has no on_device(device) method, so it "
            f"cannot be copied to other devices: wrap the net in a framework adapter "
            f"(async_search.models.TorchModel, JaxModel, TensorFlowModel), or give the "
            f"model an on_device(device) method that returns its copy on that device")
    return made_from(model, place(device), f"on_device({device!r})")


def made_from(model: Any, made: Any, how: str) -> Any:
    """``made``, a model that ``model``'s ``how`` returned (its copy on a device, its
    ``with_weights``), checked where it is made rather than at its first batch, where
    it would fail some of the requests beside others that another worker serves.

    Raises:
        TypeError: when ``made`` is not callable.
        ValueError: when both declare an ``input_spec`` and they differ (requests are
            checked against the one the server serves).
    """
    if not callable(made):
        raise TypeError(f"the model {type(model).__name__}'s {how} must return a model "
                        f"(a callable), got {type(made).__name__} {reprlib.repr(made)}")
    given, takes = input_spec_of(made), input_spec_of(model)
    if isinstance(given, TensorSpec) and isinstance(takes, TensorSpec) and given != takes:
        raise ValueError(f"the model {type(model).__name__}'s {how} returned a model "
                         f"that takes {given.describe()}, where the model takes "
                         f"{takes.describe()}: its requests would fail in it")
    return made


def replaces_model(model: Any, model_or_weights: Any) -> bool:
    """Whether ``update_model(model_or_weights, ...)`` replaces ``model`` (the one
    served now) rather than passing weights to its ``with_weights``: a callable does,
    unless ``model.takes_as_weights(model_or_weights)`` says it is weights for it (a
    framework adapter takes its framework's net, a ``torch.nn.Module`` or a Keras
    model, which is callable but not a model of NumPy batches).

    Example:
        >>> replaces_model(lambda x: x, lambda x: 2 * x), replaces_model(None, [1.0])
        (True, False)
    """
    if not callable(model_or_weights):
        return False
    takes = getattr(model, "takes_as_weights", None)
    return takes is None or not takes(model_or_weights)


def batch_tolerance_of(model: Any) -> float:
    """How much a row's outputs may depend on its batch-mates (``DeviceModel``): the
    model's ``batch_tolerance``, or 0.0 (exact) when it declares none."""
    return float(getattr(model, "batch_tolerance", 0.0))


class BatchParts(Protocol):
    """A batch and the requests it holds: what ``delivery.ResultDelivery`` slices a
    batch's outputs into. A server's batches (``batchers.Popped``) and a client's
    messages (``backends.client.Message``) are both.

    ``pieces[i]`` is request ``tags[i]``'s part of ``batch`` (``tags`` are the requests'
    futures); ``parts`` maps the index of each piece that is not a whole request to
    ``(offset, size)``: it starts at element ``offset`` of a request of ``size`` elements
    (None when every piece is a whole request).
    """

    batch: np.ndarray
    tags: List[Any]
    pieces: List[np.ndarray]
    parts: Optional[Dict[int, Tuple[int, int]]]


@runtime_checkable
class Versioned(Protocol):
    """Something that knows which model version computes its results now (a server, a
    cache or router in front of servers, a client of a server elsewhere, a model).

    ``version`` is a hashable label (an int, a string...): the one given with the model
    to ``update_model``, or the model's own ``version`` attribute.
    """

    @property
    def version(self) -> Hashable: ...


@runtime_checkable
class VersionedEvaluate(Versioned, Protocol):
    """An evaluate function that also says which version computed each answer:
    ``outputs, version = await evaluate.with_version(x)``. The version is None when
    parts of the request were computed by different versions (a swap happened while it
    was served)."""

    def __call__(self, x: np.ndarray) -> Awaitable[Outputs]: ...

    def with_version(self, x: np.ndarray) -> Awaitable[Tuple[Outputs, Hashable]]: ...


#: The version of something that reports none: unknown. None rather than a number, so
#: that an unversioned function is never taken for version 0 of a versioned one (a
#: cache, say, must not mix their results). Text formats (HTTP, Prometheus labels)
#: spell it at their edge: see ``http.kserve.version_label``.
UNKNOWN_VERSION: Hashable = None

#: The version a server gives the model it starts with when that model declares none:
#: a server always knows what it runs, and numbers the first model 0 until
#: ``update_model`` names the next one.
FIRST_VERSION: Hashable = 0


def version_of(obj: Any) -> Hashable:
    """The model version ``obj`` computes with now: its ``version`` (see ``Versioned``),
    or ``UNKNOWN_VERSION`` (None) when it reports none.

    Example:
        >>> version_of(lambda x: x) is None
        True
    """
    # getattr rather than isinstance(obj, Versioned): the same test (a runtime protocol
    # checks hasattr), a hundred times cheaper, and this runs once per cache lookup.
    return getattr(obj, "version", UNKNOWN_VERSION)


def first_version(model: Any) -> Hashable:
    """The version a server reports for the model it starts with: the model's own
    ``version``, or ``FIRST_VERSION`` (0) when it declares none."""
    version = version_of(model)
    return FIRST_VERSION if version is UNKNOWN_VERSION else version


async def evaluate_with_version(evaluate: Any, x: np.ndarray) -> Tuple[Outputs, Hashable]:
    """``(outputs, version)`` from any evaluate function: its ``with_version(x)`` when it
    has one (``VersionedEvaluate``), else ``await evaluate(x)`` with ``version_of``
    read when the outputs came (None for a function that reports no version).

    Example:
        >>> import asyncio
        >>> async def double(x):              # reports no version
        ...     return 2 * x
        >>> asyncio.run(evaluate_with_version(double, np.ones(2)))
        (array([2., 2.]), None)
    """
    with_version = getattr(evaluate, "with_version", None)
    if with_version is not None:
        return await with_version(x)
    outputs = await evaluated(evaluate, x)
    return outputs, version_of(evaluate)


def check_awaitable(evaluate: Any, returned: Any) -> None:
    """Refuses what ``evaluate(x)`` returned when it cannot be awaited: a model passed
    where ``asr.immediate(model)`` was meant (it ran, and gave its outputs).

    Every search calls this only when awaiting a request raised TypeError, so that
    the check costs nothing per request: ``returned`` not awaitable means the await
    itself failed (with Python's bare "can't be used in 'await' expression"), at the
    first request, before any output is used; an awaitable one means the TypeError
    came from inside it, and the caller re-raises that one unchanged.

    Example:
        >>> check_awaitable(len, 3)
        Traceback (most recent call last):
        ...
        TypeError: evaluate must return an awaitable, but evaluate(x) returned an int
        (evaluate is the function len: a model?); wrap a model with asr.immediate(model)
        or serve it with asr.serve(model)

    Raises:
        TypeError: if ``returned`` is not awaitable.
    """
    if inspect.isawaitable(returned):
        return
    kind = type(returned)
    name = kind.__qualname__ if kind.__module__ == "builtins" else \
        f"{kind.__module__}.{kind.__qualname__}"
    what = (f"the function {getattr(evaluate, '__qualname__', evaluate)}"
            if inspect.isroutine(evaluate)
            else f"a {type(evaluate).__qualname__}")
    # Raised while the await's TypeError is handled: that one would say nothing more.
    raise TypeError(f"evaluate must return an awaitable, but evaluate(x) returned "
                    f"{'an' if name[0] in 'aeiou' else 'a'} {name} (evaluate is {what}: "
                    f"a model?); wrap a model with asr.immediate(model) or serve it with "
                    f"asr.serve(model)") from None


async def evaluated(evaluate: Any, x: Any) -> Any:
    """``await evaluate(x)``, where ``evaluate(x)`` returning what cannot be awaited
    (a model passed for ``evaluate``) raises ``check_awaitable``'s TypeError, not
    Python's bare one; a TypeError from inside an awaitable passes unchanged."""
    request = evaluate(x)
    try:
        return await request
    except TypeError:  # free unless raised: is evaluate a model?
        check_awaitable(evaluate, request)
        raise


def input_spec_of(model: Any) -> TensorSpec | None:
    """The model's declared input spec, or None when it declares none."""
    return getattr(model, "input_spec", None)


def values_check_of(model: Any) -> Callable[[np.ndarray], None] | None:
    """The model's ``check_values``, or None when it declares none.

    A model whose answers would be wrong for some values of a well-shaped request (a
    JAX net without 64-bit integers, fed an int64 past int32) declares
    ``check_values(x)``, raising InputSpecError: servers call it on each request of
    at least one row when it is made, so that such a request fails alone, not with its
    batch-mates (another exception it raises, SystemExit too, becomes an
    InputSpecError). It must judge
    each row on its own values: a client's message joins several callers' requests,
    and the server finds the rows it refuses by checking parts of the message.
    """
    return getattr(model, "check_values", None)


def output_spec_of(model: Any) -> TensorSpec | None:
    """The model's declared output spec (single-array models only), or None."""
    return getattr(model, "output_spec", None)


def same_version(versions: Sequence[Hashable]) -> Hashable:
    """The common version of several parts, or None when a swap split them."""
    first = versions[0]
    return first if all(v == first for v in versions[1:]) else None
