"""JaxModel: a JAX function and its parameters as a NumPy-in, NumPy-out model.

JAX is imported when an adapter is made, never by importing this module.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

from async_search.base import Outputs, TensorSpec
from async_search.checks import check_float
from async_search.errors import DeviceNotFoundError, InputSpecError
from async_search.extras import import_extra
from async_search.models.buckets import (BucketedModel, PaddedBatches, adapter_spec,
                                         bucket_sizes, check_output_keys, host_rows,
                                         net_outputs, refuse_copying, widened)
from async_search.models.weight_casts import host_copy, values_lost


class JaxModel(BucketedModel):
    """Adapts ``apply_fn(params, x)`` into a NumPy-in, NumPy-out model on one device.

    Each batch is padded up to the smallest allowed batch size (by default the powers
    of two up to ``max_batch_size``) and the jitted function is compiled once per
    allowed size (at that size's first batch), so it never compiles again; the padding
    rows are zeros and are sliced off the outputs, and larger batches run in chunks of
    the largest size. The parameters live on the device (``jax.device_put``);
    ``with_weights`` (what ``update_model`` calls) replaces them without compiling
    again, as long as their shapes and dtypes stay. Outputs come back read-only, as JAX
    gives them. A batch that fills a bucket already compiled, of the spec's dtype, goes
    to the jitted function as it is, in one call frame and without the adapter's lock
    (jit copies it): the usual batch of a busy server costs little more than calling
    JAX directly (``benchmarks/adapters.py``).

    ``batch_tolerance`` says how much a row's outputs may depend on its batch-mates
    (relative and absolute, as in ``np.allclose(a, b, rtol=t, atol=t)``): XLA orders
    float sums differently for different batch sizes. Default 1e-4 on the CPU (measured:
    up to about 1e-6 of the outputs' scale on an MLP); 1e-2 on a GPU (float32 matrix
    products use TF32 there by default; measured on an H200 with the residual nets of
    ``benchmarks/gpu.py``: rows moved by at most 1.0e-3 and 2.2e-3 of the outputs'
    largest magnitude) and 5e-2 on a TPU (bfloat16 passes: an estimate, not measured).
    Give your own when you have measured.

    On a CPU with few cores, JAX's asynchronous dispatch costs tens of microseconds a
    call; ``jax.config.update("jax_cpu_enable_async_dispatch", False)``, before JAX
    runs, made a one-row call 3x faster here (``benchmarks/adapters.py``).

    Without ``jax_enable_x64`` JAX computes 64-bit inputs in 32 bits: an int64 (or
    uint64) value past the 32-bit range fails with ``InputSpecError`` instead of
    wrapping into a wrong answer. Servers check each request when it is made
    (``check_values``), so only the request that holds it fails, not its batch-mates;
    a batch called directly is checked whole. Float64 and complex128 inputs lose
    precision, as JAX's do, and a finite value past float32's range (a part of a
    complex128's) fails the same way rather than become inf.

    Args:
        apply_fn: ``apply_fn(params, x)`` from a batch ``[n, ...]`` to an array, or a
            tuple, list or dict of arrays, each with first dimension ``n``
            (a Flax ``module.apply``, a Haiku ``transformed.apply`` without rng...).
        params: a pytree of arrays.
        input_spec: per-element input shape and dtype.
        device: a ``jax.Device`` or a name (``"cpu"``, ``"gpu:1"``, ``"cuda:0"``);
            default JAX's first device (a GPU when JAX has one, else the CPU).
        max_batch_size: the largest batch passed to ``apply_fn`` at once (1024 unless
            ``batch_sizes`` says; none of them may be larger).
        batch_sizes: the allowed batch sizes; overrides the powers of two.
        batch_tolerance: overrides the default above.

    Raises:
        DeviceNotFoundError: ``device`` does not exist on this machine.

    Example:
        >>> import jax.numpy as jnp
        >>> params = {"w": np.ones((4, 2), np.float32)}
        >>> model = JaxModel(lambda p, x: jnp.tanh(x @ p["w"]), params,
        ...                  input_spec=TensorSpec((4,), np.float32))
        >>> model(np.zeros((3, 4), np.float32)).shape
        (3, 2)
    """

    def __init__(self, apply_fn: Callable[[Any, Any], Any], params: Any,
                 input_spec: TensorSpec, *, device: Any = None,
                 max_batch_size: int | None = None, batch_sizes: Sequence[int] | None = None,
                 batch_tolerance: float | None = None):
        jax = import_extra("jax", "JaxModel")

        self.input_spec = adapter_spec(input_spec)
        self.device = jax_device(device)
        self.batch_sizes = bucket_sizes(max_batch_size, batch_sizes)
        self._given_tolerance = batch_tolerance
        self.batch_tolerance = (
            _default_tolerance(self.device.platform, _float_kinds(
                jax, params, self.input_spec.dtype)) if batch_tolerance is None
            else check_float("batch_tolerance", batch_tolerance, minimum=0.0))
        if not callable(apply_fn):
            raise TypeError(f"JaxModel takes apply_fn(params, x), a callable, got "
                            f"{type(apply_fn).__name__}")
        self.apply_fn = apply_fn
        self._shared = _Compiled(jax, apply_fn, self, bool(jax.tree.leaves(params)))
        #: Servers call it on each request (``base.values_check_of``), so that a value
        #: JAX would wrap fails its own request, not the batch it would have joined;
        #: None when nothing narrows.
        self.check_values: Callable[[np.ndarray], None] | None = (
            self._shared.check_values if self._shared.narrowed is not None else None)
        # A copy of host arrays: on the CPU, device_put may share their memory, and the
        # caller may go on changing them. A weakly typed array of one or more dimensions
        # (jnp.full((4,), 3)) is placed strong: updates place it so (only Python
        # numbers stay weak), and a trace of the weak one would be compiled anew then,
        # its outputs' dtypes changed by promotion.
        try:
            self._params = jax.device_put(jax.tree.map(_host_or_strong, params),
                                          self.device)
        except OverflowError as e:  # a Python int past int32: as with_weights says it
            hint = "" if jax.config.jax_enable_x64 else ", or turn jax_enable_x64 on"
            raise ValueError(f"JaxModel: a parameter is a Python int that JAX cannot "
                             f"hold: {e}; cast it{hint}") from None
        jax.tree_util.tree_map_with_path(_kept_by_placing, params, self._params)
        # Which parameters are weakly typed (Python numbers): placed again as Python
        # numbers, or jit would compile anew and outputs' dtypes could change.
        self._weak = jax.tree.map(lambda a: bool(getattr(a, "weak_type", False)),
                                  self._params)
        self._staged = None  # with_weights: host values, placed at the first batch

    def __reduce__(self) -> Any:
        refuse_copying(self)

    @property
    def trace_count(self) -> int:
        """How often ``apply_fn`` was traced (once per bucket size used)."""
        return self._shared.trace_count

    @property
    def params(self) -> Any:
        """The parameters this model computes with."""
        # No lock (it may be held through a whole batch, and update_model runs on the
        # event loop): the device thread sets _params before it clears _staged.
        staged = self._staged
        return self._params if staged is None else staged

    def __call__(self, batch: np.ndarray) -> Outputs:
        # The usual batch, in one frame and without the lock: an ndarray of the spec's
        # dtype whose shape fills a bucket already compiled, on a model whose parameters
        # are placed, goes to the jitted function as it is (jit copies it; no host
        # buffer is written). The device thread sets _params before it clears _staged.
        # Anything else takes the padded path.
        shared = self._shared
        if (type(batch) is np.ndarray and batch.shape in shared.compiled
                and batch.dtype is shared.dtype and self._staged is None
                and shared.narrowed is None):
            out = shared.jitted(self._params, batch)
            n = len(batch)
            if type(out) is shared.array_type and not shared.aliases_inputs:
                array = np.asarray(out)
                if array.shape[:1] == (n,):
                    return widened(array)
            source = batch if shared.aliases_inputs else None  # _host_rows guards it
            return net_outputs(out, shared.is_array, lambda a: _host_rows(a, n, n, source))
        return BucketedModel.__call__(self, batch)

    def _run(self, batch: np.ndarray) -> Outputs:
        shared = self._shared
        with shared.lock:
            if self._staged is not None:  # in the device thread, at this model's start
                jax = shared.jax
                values = jax.tree.map(_weak_as_number, self._staged, self._weak)
                self._params = jax.device_put(values, self.device)
                self._staged = None
            return shared.run(self._params, batch)

    def with_weights(self, params: Any) -> "JaxModel":
        """This model with other parameters: what ``update_model(params, version)``
        calls. They are checked and copied to the host now and placed on the device at
        the new model's first batch; nothing compiles again.

        Raises:
            ValueError: a tree structure or a shape that differs from the parameters',
                or a value that the cast to its parameter's dtype would change: one of
                another kind (floats into an integer parameter would be truncated), an
                integer outside the parameter's range (it would wrap), a finite float
                past it (it would become infinite). Nothing is staged then: the model
                keeps its parameters.
        """
        jax = self._shared.jax
        old = self.params
        if jax.tree.structure(params) != jax.tree.structure(old):
            raise ValueError(f"JaxModel.with_weights: the parameters' tree differs from "
                             f"the model's: {_tree_difference(jax, params, old)}")

        def staged(path: Any, new: Any, ref: Any) -> Any:
            name = f"parameter {jax.tree_util.keystr(path)}" if path else "the parameter"
            if jax.dtypes.issubdtype(getattr(ref, "dtype", None), jax.dtypes.prng_key):
                # A typed PRNG key (jax.random.key) has no NumPy dtype: taken as it is
                # (immutable), when it is a key of the same kind and shape.
                if getattr(new, "dtype", None) != ref.dtype or new.shape != ref.shape:
                    raise ValueError(f"JaxModel.with_weights: {name} is a "
                                     f"{ref.dtype} key of shape {ref.shape}; got "
                                     f"{getattr(new, 'dtype', type(new).__name__)} of "
                                     f"shape {np.shape(new)}")
                return new
            if np.shape(new) != np.shape(ref):
                raise ValueError(f"JaxModel.with_weights: {name} has shape "
                                 f"{np.shape(new)} where the model has {np.shape(ref)}")
            # A host copy in the model's dtype (the caller may change its arrays later),
            # its values kept: a Python int past int32 (a weak parameter) too.
            return host_copy(new, np.dtype(ref.dtype), lambda given: (
                f"JaxModel.with_weights: {name} has dtype {given} where the model has "
                f"{ref.dtype}"))

        new = object.__new__(JaxModel)
        new.__dict__.update(self.__dict__)
        # Every parameter is checked before the new model exists: a refused update
        # leaves this one as it was.
        new._staged = jax.tree_util.tree_map_with_path(staged, params, old)
        new._params = None
        return new

    def takes_as_weights(self, weights: Any) -> bool:
        """Whether ``update_model(weights, ...)`` passes ``weights`` to ``with_weights``
        though it is callable: a pytree of this model's parameters' structure (an
        Equinox module, a ``jax.tree_util.Partial``), not a new model
        (``base.replaces_model``)."""
        jax = self._shared.jax
        structure = jax.tree.structure(weights)
        return (not jax.tree_util.treedef_is_leaf(structure)
                and structure == jax.tree.structure(self.params))

    def on_device(self, device: Any) -> "JaxModel":
        """An independent copy, with this model's parameters, on ``device``.

        Raises:
            DeviceNotFoundError: ``device`` does not exist on this machine.
        """
        params = self._shared.jax.tree.map(_weak_as_number, self.params, self._weak)
        return JaxModel(self.apply_fn, params, self.input_spec, device=device,
                        batch_sizes=self.batch_sizes, batch_tolerance=self._given_tolerance)

    def __repr__(self) -> str:
        return (f"JaxModel({getattr(self.apply_fn, '__name__', 'apply_fn')}, "
                f"{self.input_spec.describe()}, device={self.device}, "
                f"batch_sizes={self.batch_sizes})")


def _kept_by_placing(path: Any, given: Any, placed: Any) -> None:
    """Refuses a parameter whose values ``device_put`` changed: without
    ``jax_enable_x64`` an int64 past int32 wraps (2**40 + 5 becomes 5) and a float64 past
    float32 becomes infinite, silently, which ``with_weights`` refuses for the same
    values."""
    if type(given) in (float, complex):  # a Python float past float32 too (JAX refuses
        given = np.asarray(given)          # a Python int past int32 itself)
    if not isinstance(given, (np.ndarray, np.generic)) or given.dtype == placed.dtype \
            or given.dtype.kind not in "iufc":
        return
    lost = values_lost(np.asarray(given), np.asarray(placed))
    if lost is not None:
        import jax

        name = f"parameter {jax.tree_util.keystr(path)}" if path else "the parameter"
        raise ValueError(f"JaxModel: {name} is {given.dtype}, which JAX placed as "
                         f"{placed.dtype} (jax_enable_x64 is off): {lost}; cast it, or "
                         f"turn x64 on")


def _host_or_strong(value: Any) -> Any:
    """A parameter as the adapter places it: a host array copied; a weakly typed array
    of one or more dimensions as a strong one (on the host); anything else as it is."""
    if isinstance(value, np.ndarray) or (getattr(value, "weak_type", False)
                                         and getattr(value, "ndim", 0) > 0):
        return np.array(value)
    return value


def _weak_as_number(value: np.ndarray, weak: bool) -> Any:
    """A staged parameter as ``device_put`` should take it: a weakly typed scalar as the
    Python number it was made from, anything else as it is."""
    return value.item() if weak and value.ndim == 0 else value


def jax_device(device: Any = None) -> Any:
    """``device`` as a ``jax.Device`` that exists here; None: JAX's first device.

    Raises:
        DeviceNotFoundError: naming the device and the devices this machine has.

    Example:
        >>> jax_device("cpu").platform
        'cpu'
    """
    import jax

    if device is None:
        return jax.devices()[0]
    if not isinstance(device, str):
        if any(device == d for d in jax.devices(getattr(device, "platform", None))):
            return device
        raise DeviceNotFoundError(f"no device {device!r} for JAX: this machine has "
                                  f"{jax.devices()}")
    platform, _, index = device.strip().lower().partition(":")
    if not platform:  # "" is not JAX's default device: None is
        raise DeviceNotFoundError(f"no device {device!r} for JAX (None picks JAX's first "
                                  f"device); this machine has {jax.devices()}")
    try:
        number = int(index) if index else 0
        devices = _platform_devices(jax, platform)
    except (RuntimeError, ValueError) as e:
        raise DeviceNotFoundError(f"no device {device!r} for JAX ({e}); this machine has "
                                  f"{jax.devices()}") from None
    if not 0 <= number < len(devices):
        raise DeviceNotFoundError(f"no device {device!r}: this machine has {jax.devices()}")
    return devices[number]


def _platform_devices(jax: Any, platform: str) -> list:
    try:
        return jax.devices(platform)
    except RuntimeError:
        if platform in ("cuda", "rocm"):  # JAX names both "gpu" in older releases
            return jax.devices("gpu")
        raise


def _default_tolerance(platform: str, dtypes: set = frozenset()) -> float:
    """The platform's tolerance, or a reduced precision's among ``dtypes`` (names),
    whichever is wider (as TorchModel's with ``precision``)."""
    reduced = 5e-2 if "bfloat16" in dtypes else 1e-2 if "float16" in dtypes else 0.0
    return max({"cpu": 1e-4, "tpu": 5e-2}.get(platform, 1e-2), reduced)


def _float_kinds(jax: Any, params: Any, input_dtype: np.dtype) -> set:
    """The names of the dtypes of the parameters' leaves and of the input."""
    names = {np.dtype(input_dtype).name}
    for leaf in jax.tree.leaves(params):
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None:
            names.add(str(dtype))
    return names


class _Compiled:
    """What a JaxModel shares with the models ``with_weights`` makes from it: the jitted
    function compiled per bucket, the padded host buffers, the lock around them."""

    def __init__(self, jax: Any, apply_fn: Callable[[Any, Any], Any], model: JaxModel,
                 has_params: bool):
        self.jax = jax
        self.has_params = has_params  # with_weights keeps the tree, so this holds
        self.device = model.device
        self.lock = threading.Lock()
        self.trace_count = 0
        #: The batch shapes of the buckets compiled, whose exact batches may skip the
        #: lock (``JaxModel.__call__``); none without parameters (their device is a
        #: context).
        self.compiled: set = set()
        self.dtype = dtype = model.input_spec.dtype
        try:  # as TorchModel: a spec the framework cannot take is refused when made
            jax.device_put(np.zeros(1, dtype), model.device)
        except TypeError as e:
            raise ValueError(f"JAX has no dtype for the input spec "
                             f"{model.input_spec.describe()}: {e}") from None
        #: Without jax_enable_x64 JAX computes 64-bit numbers in 32 bits: integers past
        #: that range would wrap into wrong answers, and finite floats past float32's
        #: become inf, so such batches are checked (the 32-bit type's bounds; None when
        #: nothing narrows).
        wide = not jax.config.jax_enable_x64 and (
            dtype.itemsize == 8 and dtype.kind in "iuf" or dtype == np.complex128)
        self.narrowed = (np.iinfo(np.int32 if dtype.kind == "i" else np.uint32)
                         if wide and dtype.kind in "iu" else
                         np.finfo(np.float32) if wide else None)
        self.array_type = type(jax.device_put(np.zeros(1, np.float32), model.device))
        array = jax.Array
        self.is_array: Callable[[Any], bool] = lambda a: isinstance(a, array)
        self.aliases_inputs = _jit_aliases_host_inputs(jax, model.device)

        def traced(params: Any, x: Any) -> Any:
            self.trace_count += 1  # runs once per trace, never per call
            out = apply_fn(params, x)
            check_output_keys(out)
            return out

        self.jitted = jax.jit(traced)  # compiled once per bucket shape, then cached
        self.padded = PaddedBatches(model.input_spec, model.batch_sizes)

    def check_values(self, x: np.ndarray) -> None:
        """Raises InputSpecError when a value of ``x`` is outside the narrowed range."""
        narrowed = self.narrowed
        if narrowed is None or not x.size:
            return
        if isinstance(narrowed, np.finfo):  # inf and NaN stay what they are
            parts = (x.real, x.imag) if x.dtype.kind == "c" else (x,)
            with np.errstate(over="ignore"):
                outside = any(np.isinf(p.astype(np.float32)).sum() > np.isinf(p).sum()
                              for p in parts)
        else:
            outside = x.min() < narrowed.min or x.max() > narrowed.max
        if outside:
            complex_ = self.dtype.kind == "c"
            as_ = "complex64" if complex_ else narrowed.dtype
            would = ("its real or imaginary part would become inf" if complex_ else
                     "it would become inf" if narrowed.dtype.kind == "f" else "it would wrap")
            raise InputSpecError(
                f"JaxModel: a value of this {self.dtype} input is outside "
                f"{narrowed.dtype}'s range, and without jax_enable_x64 JAX computes it as "
                f"{as_} ({would}): keep inputs in range, or enable 64-bit JAX "
                f"(jax.config.update('jax_enable_x64', True))")

    def run(self, params: Any, batch: np.ndarray) -> Outputs:
        n = len(batch)
        self.check_values(batch)  # also here: a caller may skip the server
        buffer, size = self.padded.pad(batch, copy=False)  # jit copies it to the device
        # The host buffer goes in as it is: jit's C++ path copies it to the device of
        # the parameters (committed there by device_put), faster than a device_put of
        # its own (on the CPU: about 33 us against 70 us a call for a batch of one).
        if self.has_params:
            out = self.jitted(params, buffer)
            self.compiled.add(buffer.shape)
        else:  # nothing commits the computation to the device: say which (about 1 us)
            with self.jax.default_device(self.device):
                out = self.jitted(params, buffer)
        source = buffer if self.aliases_inputs else None
        return net_outputs(out, self.is_array, lambda a: _host_rows(a, n, size, source))


def _jit_aliases_host_inputs(jax: Any, device: Any) -> bool:
    """Whether a jitted function that returns its input, given a host array, hands back
    the array's own memory on ``device``: then outputs must be checked for sharing the
    caller's batch. JAX 0.10 copies host arguments of jit, on the CPU too (where
    ``device_put`` of an aligned array shares it), so this is False there: the probe,
    one array aligned to a page, keeps the check for a JAX that would not copy."""
    raw = np.zeros(2048, np.float32)
    start = (-raw.ctypes.data % 4096) // raw.itemsize
    probe = raw[start:start + 1024]
    with jax.default_device(device):
        out = np.asarray(jax.jit(lambda x: x)(probe))
    return bool(np.may_share_memory(out, probe))


def _host_rows(array: Any, n: int, size: int, source: np.ndarray | None) -> np.ndarray:
    """The first ``n`` rows of an output of a batch padded to ``size`` rows (read-only,
    as JAX gives them, like the result cache's), waiting for them; copied where they
    share ``source``'s memory (None: this JAX never hands input memory back,
    ``_jit_aliases_host_inputs``).

    Raises:
        ModelOutputError: the output has no batch dimension or not ``size`` rows.
    """
    out = host_rows(np.asarray(array), n, size)
    # A JAX that hands an input back as an output could give the reused buffer or the
    # batch the server reuses: then the rows are copied out (JAX 0.10 copies host
    # inputs of jit, so the probe turns this off: 2-3 us a call on a fresh output).
    if source is not None and np.may_share_memory(out, source):
        return out.copy()
    return out


def _tree_difference(jax: Any, given: Any, expected: Any) -> str:
    """How two parameter trees differ, by the paths of their leaves (a whole tree's
    description runs to thousands of characters for a small net)."""
    def paths(tree: Any) -> set:
        return {jax.tree_util.keystr(path) for path, _ in
                jax.tree_util.tree_flatten_with_path(tree)[0]}

    got, want = paths(given), paths(expected)
    missing, unexpected = sorted(want - got), sorted(got - want)
    if missing or unexpected:
        return (f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
                f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    text = f"{jax.tree.structure(given)} where the model has {jax.tree.structure(expected)}"
    return text if len(text) <= 600 else text[:600] + " ..."  # the same paths: its kinds
