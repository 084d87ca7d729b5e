"""TensorFlowModel: a Keras model or a TensorFlow function as a NumPy-in, NumPy-out model.

TensorFlow is imported when an adapter is made, never by importing this module.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Sequence

import numpy as np

from async_search.base import Outputs, TensorSpec
from async_search.checks import check_float
from async_search.errors import DeviceNotFoundError
from async_search.extras import import_extra
from async_search.models.buckets import (BucketedModel, PaddedBatches, adapter_spec,
                                         bucket_sizes, check_output_keys, host_rows,
                                         net_outputs, refuse_copying)
from async_search.models.weight_casts import host_copy
from async_search.models.weights import OwnWeightsModel, SharedWeights, values_equal


class TensorFlowModel(OwnWeightsModel):
    """Adapts a Keras model or a TensorFlow function into a NumPy-in, NumPy-out model.

    Each batch is padded up to the nearest allowed batch size (by default the powers of
    two up to ``max_batch_size``), so the function is traced once per allowed size and
    never again; the padding rows are zeros and are sliced off the outputs. Larger
    batches run in chunks of the largest size. It runs on the first visible GPU, else
    on the CPU.

    Adapters made on one Keras model with the same options share its variables as
    ``with_weights``' copies do, each computing with the weights it was made with; one
    with other options is refused with ValueError while the first is in use: give it
    a copy (``tf.keras.models.clone_model``, or the first adapter's ``on_device``).

    ``batch_tolerance`` says how much a row's outputs may depend on its batch-mates
    (relative and absolute, as in ``np.allclose``): 1e-4 on the CPU by default, 1e-2 on
    a GPU (TensorFlow allows TF32 there; an estimate, not measured here). The nets of
    ``problems.tf_nets`` compute on an exact grid and are bitwise batch-independent.

    Args:
        fn: a Keras model or a callable on tensors returning a tensor, or a tuple or dict
            of tensors.
        input_spec: per-element input shape and dtype.
        max_batch_size: the largest batch passed to ``fn`` at once (1024 unless
            ``batch_sizes`` says; none of them may be larger).
        batch_sizes: the allowed batch sizes (sorted ascending); overrides the powers of
            two.
        jit_compile: compile with XLA.
        device: a TensorFlow device string (``/GPU:1``, or in full with this process's
            job, replica and task, ``/job:localhost/replica:0/task:0/device:GPU:1``);
            default the first GPU, else ``/CPU:0``.
        batch_tolerance: overrides the default above.

    Raises:
        DeviceNotFoundError: ``device`` does not exist on this machine.

    Example:
        >>> import tensorflow as tf
        >>> net = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        >>> model = TensorFlowModel(net, TensorSpec((4,), np.float32), max_batch_size=64)
        >>> model(np.zeros((5, 4), np.float32)).shape
        (5, 1)
    """

    def __init__(self, fn: Callable[..., Any], input_spec: TensorSpec, *,
                 max_batch_size: int | None = None,
                 batch_sizes: Sequence[int] | None = None,
                 jit_compile: bool = False, device: str | None = None,
                 batch_tolerance: float | None = None):
        tf = import_extra("tensorflow", "TensorFlowModel")

        self.input_spec = adapter_spec(input_spec)
        self.batch_sizes = bucket_sizes(max_batch_size, batch_sizes)
        self.device = tensorflow_device(device)
        if not isinstance(jit_compile, (bool, np.bool_)):
            raise TypeError(f"jit_compile must be True or False, got {jit_compile!r}")
        self.jit_compile = bool(jit_compile)
        self._given_tolerance = batch_tolerance
        self.batch_tolerance = (
            (1e-2 if "GPU" in self.device.upper() else 1e-4) if batch_tolerance is None
            else check_float("batch_tolerance", batch_tolerance, minimum=0.0))
        if isinstance(fn, type):  # the usual slip: a Keras class has layers, predict
            raise TypeError(f"TensorFlowModel takes a Keras model or a function, got the "
                            f"class {fn.__name__}: make one ({fn.__name__}(...))")
        if not callable(fn):
            raise TypeError(f"TensorFlowModel takes a Keras model or a function, got "
                            f"{type(fn).__name__}")
        self.fn = fn
        # A Keras model's adapters share its variables: made with the same options they
        # share its runner (and its lock), each computing with its own weights.
        self._start(fn if _is_keras(fn) else object(),
                    {"input_spec": self.input_spec, "batch_sizes": self.batch_sizes,
                     "jit_compile": self.jit_compile,
                     "device": _device_key(tf, self.device)},
                    lambda: _Traced(tf, fn, self))

    def __reduce__(self) -> Any:
        refuse_copying(self)

    def __call__(self, batch: np.ndarray) -> Outputs:
        # The usual batch in one frame (as TorchModel's), its call of the traced
        # function early in it: TensorFlow captures the Python stack at each such call,
        # looking up each frame's line, which costs more the further into its code.
        if self._fits(batch):
            runner = self._runner
            weights, own = runner.weights, self._own
            with weights.lock:
                if weights.holder is not own.ref:  # (usually: nothing to put back)
                    weights.use(own)
                buffer, size = runner.padded.pad(batch, copy=False)  # tf.constant copies
                fn = runner.concrete.get(size)
                if fn is None:  # traced once per allowed size, then called directly
                    fn = runner.trace(size, buffer)
                tf = runner.tf
                with tf.device(runner.device):
                    out = fn(tf.constant(buffer))
                if type(out) is runner.eager_type:  # the usual output: one tensor
                    return host_rows(out.numpy(), len(batch), size)
                return runner.outputs(out, len(batch), size)
        # Checked, and chunked, first: each chunk comes back to the call above.
        return BucketedModel.__call__(self, batch)

    def _run(self, batch: np.ndarray) -> Outputs:
        return self(batch)  # a checked chunk: the call above runs it

    @property
    def trace_count(self) -> int:
        """How often ``fn`` was traced (once per allowed size used)."""
        return self._runner.trace_count

    def with_weights(self, weights: Any) -> "TensorFlowModel":
        """This model with other weights (a Keras model only): what
        ``update_model(weights, version)`` calls. The weights are checked now and
        assigned to the same variables at the new model's first batch, so nothing is
        traced again; a batch running on this model finishes on the old ones. (A model
        with a layer that derives tensors from its weights, such as ``Normalization``'s
        mean and variance, has them derived again and each bucket traced again then:
        a trace holds them as constants.)

        Args:
            weights: a list of arrays as ``get_weights()`` returns, or a Keras model of
                the same architecture.

        Raises:
            TypeError: ``fn`` is not a Keras model (pass a new model to update_model).
            ValueError: a count or shape that differs from the model's weights, or a
                value that the cast to its weight's dtype would change: one of another
                kind (a float for an integer weight), an integer outside the weight's
                range, a finite float past it (it would become infinite); a Keras
                model with layers whose state is not among its weights
                (``Discretization``'s bins, a lookup's vocabulary), which an update
                would drop. Nothing is staged then: the model keeps its weights.
        """
        return self._with_staged(weights)

    def takes_as_weights(self, weights: Any) -> bool:
        """Whether ``update_model(weights, ...)`` passes ``weights`` to ``with_weights``
        though it is callable: a Keras model, when this adapter wraps one
        (``base.replaces_model``)."""
        return self._runner._keras and _is_keras(weights)

    def on_device(self, device: str) -> "TensorFlowModel":
        """A copy on ``device``: a Keras model is cloned there with this model's
        weights; a plain function is wrapped again, its ops placed on ``device`` (the
        variables it captures stay where they are).

        Raises:
            DeviceNotFoundError: ``device`` does not exist on this machine.
            TypeError: a Keras model that Keras cannot clone (a subclassed model
                without ``get_config``/``from_config``).
        """
        tf = self._runner.tf
        target = tensorflow_device(device)
        fn = self.fn
        if _is_keras(fn):
            runner = self._runner
            with runner.weights.lock:
                values = self._own.values
                if values is None:
                    values = fn.get_weights()
            with tf.device(target):
                try:
                    fn = tf.keras.models.clone_model(self.fn)
                except Exception as e:  # noqa: BLE001 - Keras raises several kinds
                    said = str(e).split("\n", 1)[0][:200]  # Keras says pages
                    raise TypeError(
                        f"TensorFlowModel.on_device: Keras cannot copy "
                        f"{type(self.fn).__name__}: a subclassed model needs get_config "
                        f"and from_config to be copied; give each device a model of its "
                        f"own instead (add_worker(model=...)). Keras said: "
                        f"{type(e).__name__}: {said}") from e
                fn.set_weights(values)
                for layer in _deriving_layers(fn):  # set_weights leaves their state
                    layer.finalize_state()
        return TensorFlowModel(fn, self.input_spec, batch_sizes=self.batch_sizes,
                               jit_compile=self.jit_compile, device=target,
                               batch_tolerance=self._given_tolerance)

    def __repr__(self) -> str:
        return (f"TensorFlowModel({getattr(self.fn, 'name', type(self.fn).__name__)}, "
                f"{self.input_spec.describe()}, device={self.device}, "
                f"batch_sizes={self.batch_sizes})")


def tensorflow_device(device: str | None = None) -> str:
    """``device`` checked against this machine's TensorFlow devices; None: ``/GPU:0``
    when TensorFlow sees a GPU, else ``/CPU:0``. A name may give the job, replica and
    task (this process's are ``/job:localhost/replica:0/task:0``, as TensorFlow names
    where it places tensors); another's device is not on this machine.

    Raises:
        DeviceNotFoundError: naming the device and the devices this machine has.

    Example:
        >>> tensorflow_device("/CPU:0")
        '/CPU:0'
        >>> tensorflow_device("/job:localhost/replica:0/task:0/device:CPU:0")
        '/job:localhost/replica:0/task:0/device:CPU:0'
    """
    import tensorflow as tf

    if device is None:
        return "/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0"
    names = [d.name for d in tf.config.list_logical_devices()]
    if not isinstance(device, str):
        raise DeviceNotFoundError(f"a TensorFlow device is a name such as '/GPU:0', got "
                                  f"{device!r}; this machine has {names}")
    if not device.strip():  # names every device: not one to place the model on
        raise DeviceNotFoundError(f"no device {device!r} for TensorFlow (None picks "
                                  f"/GPU:0 or /CPU:0); this machine has {names}")
    try:
        spec = tf.DeviceSpec.from_string(device)
    except (ValueError, TypeError) as e:
        raise DeviceNotFoundError(f"no device {device!r} for TensorFlow ({e}); this "
                                  f"machine has {names}") from None
    if not any(_names_it(spec, tf.DeviceSpec.from_string(name)) for name in names):
        raise DeviceNotFoundError(f"no device {device!r}: this machine has {names}")
    return device


#: The job, replica and task of this process's own devices when TensorFlow's names of
#: them leave these out (``/device:CPU:0``): where it places tensors is named in full,
#: ``/job:localhost/replica:0/task:0/device:CPU:0``.
_LOCAL_TASK = {"job": "localhost", "replica": 0, "task": 0}


def _device_key(tf: Any, device: str) -> str:
    """``device`` spelled one way ("/cpu:0", "/CPU:0", the local task's full name):
    two adapters on one net share it only when they name the same device."""
    spec = tf.DeviceSpec.from_string(device)
    return tf.DeviceSpec(
        job=spec.job or _LOCAL_TASK["job"],
        replica=_LOCAL_TASK["replica"] if spec.replica is None else spec.replica,
        task=_LOCAL_TASK["task"] if spec.task is None else spec.task,
        device_type=(spec.device_type or "").upper() or None,
        device_index=spec.device_index or 0).to_string()


def _names_it(spec: Any, device: Any) -> bool:
    """Whether the device ``spec`` (its fields that are set) names ``device``: its job,
    replica and task too (another task's device is not here; a device named without
    them is the local task's, ``_LOCAL_TASK``)."""
    for field, local in _LOCAL_TASK.items():
        wanted = getattr(spec, field)
        have = getattr(device, field)
        if wanted is not None and wanted != (local if have is None else have):
            return False
    if spec.device_type is None:
        return True
    return (spec.device_type.upper() == (device.device_type or "").upper()
            and (spec.device_index or 0) == (device.device_index or 0))


class _Traced:
    """What a TensorFlowModel shares with the models ``with_weights`` makes from it: the
    function traced per bucket, the padded host buffers, the weights (Keras models)."""

    def __init__(self, tf: Any, fn: Callable[..., Any], model: TensorFlowModel):
        self.tf = tf
        self.device = model.device
        self.trace_count = 0
        #: The type of an eager tensor: what a traced function returns, always dense.
        self.eager_type = type(tf.constant(0))
        try:  # as TorchModel: a spec the framework cannot take is refused when made
            tf.dtypes.as_dtype(model.input_spec.dtype)
        except TypeError as e:
            raise ValueError(f"TensorFlow has no dtype for the input spec "
                             f"{model.input_spec.describe()}: {e}") from None
        if model.input_spec.dtype.kind == "O":
            # TensorFlow reads object arrays of strings, but a padding row of an object
            # buffer is the int 0, which fails the batch it pads (and only that one).
            raise ValueError(f"TensorFlowModel cannot pad object arrays (input spec "
                             f"{model.input_spec.describe()}): for strings, give a spec "
                             f"of a fixed-width dtype ('U' or 'S'), padded with empty "
                             f"strings")
        self._keras = _is_keras(fn)
        if self._keras and not fn.built:  # no weights yet (a subclassed model, a
            # Sequential without an Input): built on one batch, so that updates find them
            with tf.device(model.device):
                fn(np.zeros(model.input_spec.batch_shape(1), model.input_spec.dtype),
                   training=False)
        self._variables = list(fn.weights) if self._keras else []
        self._deriving = _deriving_layers(fn) if self._keras else []
        self.weights = SharedWeights(self._read, self._write)

        def traced(x):
            self.trace_count += 1  # runs once per trace, never per call (under the lock)
            out = fn(x, training=False) if self._keras else fn(x)
            check_output_keys(out)
            return out

        self._traced = traced
        self._jit_compile = model.jit_compile
        #: size -> the function traced for it (``trace``).
        self.concrete: Dict[int, Any] = {}
        self._retrace()
        self.padded = PaddedBatches(model.input_spec, model.batch_sizes)

    def _retrace(self) -> None:
        """Drops the traced functions: each bucket is traced again at its next batch."""
        # AutoGraph converts a plain function's Python control flow, writing each
        # conversion to a temporary file that TensorFlow deletes only at a clean exit
        # (a killed Ray actor leaves them). Keras layers are never converted: a Keras
        # model's trace needs none, and writes none.
        self._fn = self.tf.function(self._traced, jit_compile=self._jit_compile,
                                    reduce_retracing=False, autograph=not self._keras)
        self.concrete.clear()

    def stage(self, weights: Any) -> list:
        if not self._keras:
            raise TypeError("TensorFlowModel.with_weights needs a Keras model; this one "
                            "wraps a function: pass a new model to update_model instead")
        if _is_keras(weights):
            # Their state (a Discretization's bins, a lookup's vocabulary) is not among
            # get_weights(): a new model's other state would be dropped without a word.
            mine = [layer for layer in self._deriving if not layer.weights]
            theirs = [layer for layer in _deriving_layers(weights) if not layer.weights]
            differ = [a.name for a, b in zip(mine, theirs)
                      if not values_equal(_hidden_state(a), _hidden_state(b))]
            if differ or len(mine) != len(theirs):
                raise ValueError(f"TensorFlowModel.with_weights: layers "
                                 f"{differ or [a.name for a in mine]} keep their state "
                                 f"(bins, a vocabulary) outside get_weights(), and the "
                                 f"new model's differs, which an update cannot carry: "
                                 f"pass a new TensorFlowModel to update_model instead")
            weights = weights.get_weights()
        if not isinstance(weights, (list, tuple)) or len(weights) != len(self._variables):
            given = (f"a {type(weights).__name__} of {len(weights)}"
                     if isinstance(weights, (list, tuple)) else type(weights).__name__)
            raise ValueError(f"TensorFlowModel.with_weights takes the "
                             f"{len(self._variables)} arrays of get_weights(), got "
                             f"{given}")
        staged = []
        for i, (value, variable) in enumerate(zip(weights, self._variables)):
            shape = tuple(variable.shape)
            if np.shape(value) != shape:
                raise ValueError(f"weight {i} ({variable.name}) has shape "
                                 f"{np.shape(value)}, the model's has {shape}")
            # A host copy (the caller may change its arrays later), all checked before
            # any is staged: a refused update leaves the model's weights as they were.
            dtype = np.dtype(getattr(variable.dtype, "as_numpy_dtype", variable.dtype))
            staged.append(host_copy(
                value, dtype, lambda given, i=i, name=variable.name, dtype=dtype:
                f"weight {i} ({name}) is {given}, the model's is {dtype}"))
        return staged

    def _read(self) -> list:
        return [v.numpy() for v in self._variables]

    def _write(self, values: list) -> None:
        for variable, value in zip(self._variables, values):
            variable.assign(value)
        if self._deriving:
            # A layer such as Normalization computes tensors from its weights in
            # finalize_state (its mean and variance), which assign does not call, and a
            # trace holds those tensors as constants: both are made again.
            for layer in self._deriving:
                layer.finalize_state()
            self._retrace()

    def trace(self, size: int, buffer: np.ndarray) -> Any:
        """The function traced for bucket ``size`` (on a batch such as ``buffer``),
        traced now: once per allowed size (and again after ``_retrace``); call under
        the weights' lock."""
        tf = self.tf
        with tf.device(self.device):
            try:
                fn = self._fn.get_concrete_function(tf.TensorSpec(buffer.shape,
                                                                  buffer.dtype))
            except Exception as e:  # noqa: BLE001 - whatever the net raised
                raise _as_raised(e) from None
        self.concrete[size] = fn
        return fn

    def outputs(self, out: Any, n: int, size: int) -> Outputs:
        """The first ``n`` rows of each tensor of ``out`` (a tensor, or a tuple, list or
        dict of tensors), as arrays."""
        return net_outputs(out, self._is_dense, lambda t: host_rows(t.numpy(), n, size))

    def _is_dense(self, value: Any) -> bool:
        """A tensor with ``numpy()``: not a SparseTensor or a RaggedTensor, which the net
        must make dense (their refusal then names them)."""
        if type(value) is self.eager_type:  # the usual output: no ABC checks
            return True
        tf = self.tf
        return tf.is_tensor(value) and not isinstance(value, (tf.SparseTensor,
                                                              tf.RaggedTensor))


def _as_raised(e: BaseException) -> BaseException:
    """What the net raised while it was traced: AutoGraph wraps it in a
    ``StagingError`` (not a ValueError: a net's ValueError for a bad input would count
    as the server's failure), whose context is the net's own exception."""
    raised = e.__context__
    if type(e).__name__ == "StagingError" and isinstance(raised, Exception):
        return raised
    return e


def _hidden_state(layer: Any) -> Any:
    """What a layer keeps outside its weights: a lookup's vocabulary, else its config
    (a Discretization's bins), its name left out."""
    vocabulary = getattr(layer, "get_vocabulary", None)
    if callable(vocabulary):
        return vocabulary()
    return {k: v for k, v in layer.get_config().items() if k != "name"}


def _deriving_layers(model: Any) -> list:
    """The layers of a Keras model (nested ones too) that derive state in
    ``finalize_state`` (the base layer's is a no-op): ``Normalization`` from its
    weights; ``Discretization`` and the lookup layers keep theirs (bins, a
    vocabulary) outside ``get_weights()``."""
    flatten = getattr(model, "_flatten_layers", None)
    layers = (list(flatten(include_self=True, recursive=True)) if flatten is not None
              else list(getattr(model, "layers", ())))
    found = []
    for layer in layers:
        for kind in type(layer).__mro__:
            if "finalize_state" in vars(kind):
                if kind.__name__ != "Layer":
                    found.append(layer)
                break
    return found


def _is_keras(fn: Any) -> bool:
    return hasattr(fn, "layers") and hasattr(fn, "predict")
