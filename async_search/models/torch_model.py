"""TorchModel: a PyTorch module as a NumPy-in, NumPy-out model on a device.

PyTorch is imported when an adapter is made, never by importing this module.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import itertools
import logging
import operator
import re
import sys
import threading
import warnings
from importlib.util import find_spec
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from async_search.base import Outputs, TensorSpec
from async_search.checks import check_float
from async_search.errors import DeviceNotFoundError, ModelOutputError
from async_search.extras import import_extra
from async_search.models.buckets import (BucketedModel, PaddedBatches, adapter_spec,
                                         bucket_sizes, check_padded_shape, net_outputs,
                                         padded_rows, refuse_copying)
from async_search.models.weight_casts import kind_refused, values_lost, weight_array
from async_search.models.weights import OwnWeightsModel, SharedWeights


_log = logging.getLogger("async_search.models")

#: The ``precision`` a TorchModel takes: None (the module's own dtypes), or a reduced
#: float that ``torch.autocast`` computes in.
PRECISIONS = (None, "bfloat16", "float16")


class TorchModel(OwnWeightsModel):
    """Adapts a PyTorch module into a NumPy-in, NumPy-out model on one device.

    Each batch is padded up to the smallest allowed batch size (by default the powers
    of two up to ``max_batch_size``), so the module always sees the same few shapes;
    the padding rows are zeros and are sliced off the outputs, and larger batches run
    in chunks of the largest size. The module runs under ``torch.inference_mode()``.
    On the CPU a batch that fills a bucket (what a busy server sends), contiguous,
    writable and of the spec's dtype, goes to the module as it is, in one call frame
    (by instructions, a one-row batch of a small MLP costs 3.8 % more than calling
    PyTorch directly: ``benchmarks/adapters.py``, docs/benchmarks.md).

    On CUDA a batch is padded straight into a pinned host buffer of its bucket, copied
    to the device without blocking on the adapter's own CUDA stream, computed on that
    stream, and copied back into pinned output buffers; the host waits once per batch
    (one stream synchronisation), then copies the rows out.

    The adapter owns the module: it moves it to ``device`` and puts it in eval mode.
    Train a copy and push its weights with ``update_model`` (``with_weights``).
    Adapters made on one module with the same options share it as ``with_weights``'
    copies do, each computing with the weights it was made with; one with other
    options (another device, ``script``, other buckets) is refused with ValueError
    while the first is in use: give it a copy of the module (``copy.deepcopy``, or the
    first adapter's ``on_device``).

    CUDA graphs are on by default on CUDA (``cuda_graphs=None``): the module is
    captured once per bucket, at the bucket's first batch, and replayed, so a batch costs
    one launch instead of one per layer. Measured on an H200 with the 10-block residual
    policy-value net (``benchmarks/gpu.py``, ``results/benchmarks/gpu.json``): a batch
    of one took 0.40 ms instead of 2.3 ms, and MCTS served 1.4-2.4x the simulations/s,
    because an eager forward pass launches each layer from Python and waits for the GIL
    between launches while the searches run. A module that cannot be captured (data-
    dependent control flow, host syncs such as ``.item()``) runs eagerly instead, with
    one warning; ``cuda_graphs=True`` makes that an error, ``False`` turns graphs off.
    Each bucket's graph keeps its own memory for the activations.

    Options off by default: ``precision`` (compute in bfloat16 or float16 under
    ``torch.autocast``; outputs come back as float32: on the H200 the 4096 batch took
    8.5 ms instead of 13.7 ms, but searches bound by Python gained nothing),
    ``compile`` (``torch.compile``, not measured on a GPU here) and ``script``.

    ``script=True`` compiles the module with TorchScript (``torch.jit.script``) and runs
    the compiled pass: it runs in C++ and lets go of the GIL once a pass, where an eager
    pass takes the GIL back after every operator and waits for it while the searches
    hold it (on the CPU, a CUDA graph's part). Measured on 2 CPU cores
    (``benchmarks/gpu.py --script``, docs/benchmarks.md): A* on the 15-puzzle's residual
    net served 1.3-2.1x the expansions/s from 256 searches, MCTS on a convolutional
    net whose passes dominate gained nothing; outputs were equal bit for bit. The
    compiled pass runs once on a row of zeros when the adapter is made (a module that
    compiles but cannot run compiled is refused then). A ``raise`` statement in the
    module raises what it names, and an ``assert`` ``AssertionError`` (TorchScript itself
    gives ``torch.jit.Error``), so a ``ValueError`` for a bad input stays the caller's
    error. It is off by default
    because a compiled module is not the Python object: attributes that its forward
    pass changes (a call counter) change in the compiled copy only, operators fail
    with ``RuntimeError`` (an index out of range too, an ``IndexError`` eagerly), and
    TorchScript needs the module's source file (not a class typed into a notebook cell
    or ``python -``) and its subset of Python. Weights stay shared: ``with_weights``
    reaches the compiled pass. PyTorch marks TorchScript deprecated; the adapter keeps
    that warning quiet for its own call (not the one of Python 3.14, where TorchScript
    may break).

    ``batch_tolerance`` says how much a row's outputs may depend on its batch-mates
    (relative and absolute, as in ``np.allclose(a, b, rtol=t, atol=t)``): floating-point
    sums are ordered differently for different batch sizes. Default: 1e-4 in float32
    (measured on the CPU: up to about 1e-6 of the outputs' scale on MLPs and
    convolutional nets); on CUDA with TF32 allowed (PyTorch's default for convolutions)
    1e-2, and 1e-2 (float16) or 5e-2 (bfloat16) with ``precision``: from the formats'
    precision; on an H200 (``benchmarks/gpu.py``) a residual net's rows moved by at most
    9e-4 of the outputs' largest magnitude in float32 with TF32 convolutions, and not at
    all in bfloat16. Give your own when you have measured.

    Args:
        module: a ``torch.nn.Module`` (or any module-like callable with
            ``state_dict``) from a tensor ``[n, ...]`` to a tensor, or a tuple, list or
            dict of tensors, each with first dimension ``n``.
        input_spec: per-element input shape and dtype (requests are checked against it).
        device: a torch device or its name (``"cuda:1"``, ``"cpu"``); default the first
            CUDA device, else the CPU.
        max_batch_size: the largest batch passed to the module at once (1024 unless
            ``batch_sizes`` says; none of them may be larger).
        batch_sizes: the allowed batch sizes; overrides the powers of two.
        precision: None, ``"bfloat16"`` or ``"float16"`` (``PRECISIONS``).
        cuda_graphs: capture and replay a CUDA graph per bucket: None (default) on CUDA
            without ``compile``, falling back to eager for a module that cannot be
            captured; True requires it (CUDA only); False never.
        compile: ``torch.compile`` the module: True, or a dict of its keyword arguments
            (``{"mode": "max-autotune"}``). Not together with ``cuda_graphs``. A build
            of PyTorch that ships Triton loads it to compile, and Triton loaded after
            TensorFlow in one process aborts it (their LLVMs clash): that case raises
            ``RuntimeError`` instead (import ``triton`` before ``tensorflow``, or compile
            in a process without TensorFlow).
        script: compile the module with TorchScript and run the compiled pass (see
            above). Not together with ``compile`` or ``precision`` (TorchScript's
            autocast computes in other dtypes than eager autocast).
        batch_tolerance: overrides the default above.

    Raises:
        DeviceNotFoundError: ``device`` does not exist on this machine.
        ValueError: an option out of range, ``cuda_graphs=True`` off CUDA, or
            ``script=True`` for a module that TorchScript cannot compile, or whose
            compiled pass fails on a row of zeros where the eager one runs (the
            message quotes TorchScript's reason).
        RuntimeError: ``compile`` where loading Triton would abort the process.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
        ...                           torch.nn.Linear(8, 1))
        >>> model = TorchModel(net, input_spec=TensorSpec((4,), np.float32), device="cpu")
        >>> model(np.zeros((5, 4), np.float32)).shape
        (5, 1)
        >>> model = model.with_weights(net.state_dict())    # what update_model calls
    """

    def __init__(self, module: Any, input_spec: TensorSpec, *, device: Any = None,
                 max_batch_size: int | None = None,
                 batch_sizes: Sequence[int] | None = None,
                 precision: str | None = None, cuda_graphs: bool | None = None,
                 compile: bool | Mapping[str, Any] = False,  # noqa: A002 - torch's name
                 batch_tolerance: float | None = None, script: bool = False):
        torch = import_extra("torch", "TorchModel")

        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.input_spec = adapter_spec(input_spec)
        self.device = torch_device(device)
        self.batch_sizes = bucket_sizes(max_batch_size, batch_sizes)
        self.precision = precision
        if not (isinstance(compile, (bool, np.bool_)) or isinstance(compile, Mapping)):
            raise TypeError(f"compile must be True, False or a dict of torch.compile's "
                            f"keyword arguments, got {compile!r}")
        # An empty dict is torch.compile with its defaults: True (a dict's truth would
        # read as no compile where the options are checked and the module compiled).
        self.compile = (bool(compile) if isinstance(compile, (bool, np.bool_))
                        else dict(compile) or True)
        if cuda_graphs is not None and not isinstance(cuda_graphs, (bool, np.bool_)):
            raise TypeError(f"cuda_graphs must be None, True or False, got {cuda_graphs!r}")
        cuda_graphs = None if cuda_graphs is None else bool(cuda_graphs)
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"cuda_graphs needs a CUDA device, got {self.device}")
        if cuda_graphs and self.compile:
            raise ValueError("cuda_graphs and compile are exclusive: torch.compile "
                             "captures graphs itself with mode='reduce-overhead'")
        if not isinstance(script, (bool, np.bool_)):
            raise TypeError(f"script must be True or False, got {script!r}")
        self.script = bool(script)
        if self.script and self.compile:
            raise ValueError("script and compile are exclusive: each compiles the module "
                             "its own way")
        if self.script and precision is not None:
            # TorchScript's own autocast picks other dtypes than eager autocast, and
            # fixes the first adapter's dtype into code that a module class shares.
            raise ValueError("script and precision are exclusive: a compiled pass under "
                             "autocast does not compute what the eager one does")
        #: Whether graphs are required (True), tried with an eager fallback (None) or off.
        self._graphs_option = cuda_graphs
        self._given_tolerance = batch_tolerance
        self.batch_tolerance = (
            _default_tolerance(torch, self.device, precision) if batch_tolerance is None
            else check_float("batch_tolerance", batch_tolerance, minimum=0.0))
        # Adapters made on one module with the same options share its runner (and its
        # lock), each computing with its own weights.
        self._start(module, {"input_spec": self.input_spec,
                             "device": (self.device.type, self.device.index or 0),
                             "batch_sizes": self.batch_sizes, "precision": self.precision,
                             "compile": self.compile, "cuda_graphs": self._graphs_option,
                             "script": self.script},
                    lambda: _Runner(torch, module, self),
                    rejoin=lambda runner: runner.rejoin())

    def __reduce__(self) -> Any:
        refuse_copying(self)

    def __call__(self, batch: np.ndarray) -> Outputs:
        # The usual CPU batch, in one frame: an ndarray of the spec's dtype that fills
        # a bucket exactly runs as it is (no padding, no copy), as ``run`` would run it
        # without the checks and calls of the padded path, which anything else takes.
        runner = self._runner
        if runner.writes_input is False and runner.padded.fills_bucket(batch):
            weights, own = runner.weights, self._own
            with weights.lock:
                if weights.holder is not own.ref:
                    weights.use(own)
                n = len(batch)
                x = runner.from_numpy(batch)
                version = x._version
                out = runner.forward_rows(x, n, n)
                if x._version != version:
                    runner.wrote_input(caller=True)
                return out
        return BucketedModel.__call__(self, batch)

    @property
    def cuda_graphs(self) -> bool:
        """Whether batches are captured and replayed as CUDA graphs: the default on
        CUDA unless compiled, and False after a module could not be captured."""
        return self._runner.cuda_graphs

    @property
    def module(self) -> Any:
        """The module the adapter runs (its weights are this adapter's after a call)."""
        return self._runner.module

    def with_weights(self, weights: Any) -> "TorchModel":
        """This model with other weights: what ``update_model(weights, version)`` calls.

        The weights are checked and staged on the host now; the new model copies them
        into the same parameters at its first batch (so captured graphs and compiled
        code stay valid), while a batch running on this model finishes on the old ones.

        Args:
            weights: a ``state_dict`` (names to tensors or arrays) with the module's
                names and shapes, or a module of the same architecture.

        Raises:
            ValueError: names or shapes that differ from the module's, or a value that
                the cast to its weight's dtype would change: one of another kind (a
                float for an integer weight), an integer outside the weight's range (it
                would wrap), a finite float past it (it would become infinite). Nothing
                is staged then: the model keeps its weights.
            TypeError: anything else.
        """
        return self._with_staged(weights)

    def takes_as_weights(self, weights: Any) -> bool:
        """Whether ``update_model(weights, ...)`` passes ``weights`` to ``with_weights``
        though it is callable: a ``torch.nn.Module`` (``base.replaces_model``)."""
        return isinstance(weights, self._runner.torch.nn.Module)

    def on_device(self, device: Any) -> "TorchModel":
        """An independent copy (a deep copy of the module, with this model's weights)
        on ``device``, with the same options.

        Raises:
            DeviceNotFoundError: ``device`` does not exist on this machine.
        """
        target = torch_device(device)
        runner = self._runner
        with runner.weights.lock:
            module = copy.deepcopy(runner.module)
            values = self._own.values  # None: they are the module's (and the copy's)
            reassigned = [(i, path) for i, path, _ in runner.compiled_own()]
        module.to(target)
        if values is not None:  # in the order of runner.names (extra state left out)
            _write_module(runner.torch, module, runner.names, reassigned, values)
        return TorchModel(module, self.input_spec, device=target,
                          batch_sizes=self.batch_sizes, precision=self.precision,
                          cuda_graphs=self._graphs_option, compile=self.compile,
                          batch_tolerance=self._given_tolerance, script=self.script)

    def __repr__(self) -> str:
        return (f"TorchModel({type(self._runner.module).__name__}, "
                f"{self.input_spec.describe()}, device={self.device}, "
                f"batch_sizes={self.batch_sizes})")


def torch_device(device: Any = None) -> Any:
    """``device`` as a ``torch.device`` that exists here; None: the first CUDA device,
    else the CPU.

    Raises:
        DeviceNotFoundError: naming the device and the devices this machine has.

    Example:
        >>> str(torch_device("cpu"))
        'cpu'
    """
    import torch

    if device is None:
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise DeviceNotFoundError(f"no device {device!r} for PyTorch ({e}); this machine "
                                  f"has {_torch_devices(torch)}") from None
    if found.type == "cpu":
        if found.index not in (None, 0):  # PyTorch ignores it; JAX and TF refuse it
            raise DeviceNotFoundError(f"no device {device!r}: PyTorch has one CPU "
                                      f"device, 'cpu'; this machine has "
                                      f"{_torch_devices(torch)}")
        return torch.device("cpu")
    if found.type == "meta":  # it places tensors, so the probe below would pass
        raise DeviceNotFoundError(f"device {device!r} holds shapes, not data: a net "
                                  f"there computes nothing; this machine has "
                                  f"{_torch_devices(torch)}")
    if found.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = found.index if found.index is not None else 0
        if index >= count:
            raise DeviceNotFoundError(f"no device {device!r}: this machine has "
                                      f"{_torch_devices(torch)}")
        return torch.device("cuda", index)
    try:
        torch.empty(1, device=found)
    except Exception as e:  # noqa: BLE001 - any failure to place a tensor there
        raise DeviceNotFoundError(
            f"no device {device!r} for PyTorch ({type(e).__name__}: {e}); this machine "
            f"has {_torch_devices(torch)}") from None
    return found


def _torch_devices(torch: Any) -> List[str]:
    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    return names


def _default_tolerance(torch: Any, device: Any, precision: str | None) -> float:
    if precision == "bfloat16":
        return 5e-2
    if precision == "float16":
        return 1e-2
    if device.type == "cuda" and (torch.backends.cuda.matmul.allow_tf32
                                  or torch.backends.cudnn.allow_tf32):
        return 1e-2
    return 1e-4


def _numpy_dtype(torch: Any, dtype: Any) -> np.dtype:
    """The NumPy dtype of a torch dtype (one NumPy lacks as the one it comes back in:
    bfloat16 and the float8 types as float32, complex32 as complex64; a cast between
    them keeps the kind)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        return torch.empty(0, dtype=_host_dtype(torch, dtype)).numpy().dtype


def _host_numpy(torch: Any, tensor: Any) -> np.ndarray:
    """The values of ``tensor`` as a NumPy array on the host (a float dtype NumPy lacks,
    bfloat16, as float32, which holds its values exactly)."""
    host = tensor.detach().cpu().resolve_conj().resolve_neg()
    try:
        return host.numpy()
    except TypeError:
        return host.to(torch.complex64 if host.is_complex() else torch.float32).numpy()


def _initialize_lazy(torch: Any, module: Any, spec: Any, dtype: Any, device: Any) -> None:
    """Gives a module with lazy layers (``nn.LazyLinear``...) its parameters: one batch
    of zeros of the input spec, as PyTorch asks (the adapter reads the parameters)."""
    try:
        with torch.no_grad():
            module(torch.zeros((1, *spec.shape), device=device, dtype=dtype))
    except Exception as e:
        raise ValueError(f"TorchModel: the module has lazy layers, and one batch of zeros "
                         f"of the input spec {spec.describe()} to give them their "
                         f"parameters raised {type(e).__name__}: {e}") from e


class _Runner:
    """What the adapters of one module share: the module, its weights, the buffers
    and captured graphs of each bucket, the CUDA stream. Used under ``weights.lock``."""

    def __init__(self, torch: Any, module: Any, model: TorchModel):
        self.torch = torch
        self.is_tensor = torch.is_tensor
        self.from_numpy = torch.from_numpy
        self.device = device = model.device
        self.cuda = device.type == "cuda"
        try:
            self.input_dtype = torch.from_numpy(np.zeros(0, model.input_spec.dtype)).dtype
        except TypeError as e:
            raise ValueError(f"PyTorch has no dtype for the input spec "
                             f"{model.input_spec.describe()}: {e}") from None
        if isinstance(module, type):  # the usual slip: the class has to, eval, ...
            raise TypeError(f"TorchModel takes a torch.nn.Module instance, got the class "
                            f"{module.__name__}: make one ({module.__name__}(...))")
        if not (callable(module) and all(hasattr(module, name)
                                         for name in ("to", "eval", "state_dict"))):
            raise TypeError(f"TorchModel takes a torch.nn.Module (a callable with to, "
                            f"eval and state_dict), got {type(module).__name__}")
        self.module = module.to(device).eval()
        # Whose mode each batch checks: the module's, and every submodule's that its
        # mode can change (net.head.train() alone makes rows batch-dependent too), so
        # not PyTorch's layers that compute the same in either mode (exactly Linear,
        # ReLU, Conv2d, ..., without hooks: spectral_norm's iterates in train mode; each
        # costs a tenth of a microsecond a batch); a module-like object without modes
        # (duck-typed) is not checked.
        modules = _modules_of(module)
        mode_free = _mode_free(torch)
        self._modes = tuple(m for i, m in enumerate(modules) if hasattr(m, "training")
                            and (i == 0 or type(m) not in mode_free or _hooked(m)))
        self._modules = modules  # the net as it was made: what rejoin() compares
        _refuse_batch_statistics(torch, modules)
        # (UninitializedBuffer is no UninitializedParameter: lazy running statistics
        # beside eager weights, LazyBatchNorm1d(affine=False), were left lazy.)
        # (A module-like object has a state_dict, not always parameters and buffers.)
        tensors = (itertools.chain(self.module.parameters(), self.module.buffers())
                   if isinstance(self.module, torch.nn.Module) else
                   (v for v in self.module.state_dict().values() if torch.is_tensor(v)))
        if any(isinstance(p, torch.nn.parameter.UninitializedTensorMixin)
               for p in tensors):
            _initialize_lazy(torch, self.module, model.input_spec, self.input_dtype, device)
        state = self.module.state_dict()
        # A module's extra state (get_extra_state: a step count, a config) is no tensor
        # to copy into: with_weights leaves it as it is.
        self.names = _tensor_names(torch, state)
        self.extra_state = frozenset(state).difference(self.names)
        # Buffers only counted, not read, in eval mode: an update may leave them out
        # (residual_nets' weights and torch_resnet_weights do).
        self.optional = frozenset(k for k in self.names
                                  if k.rsplit(".", 1)[-1] == "num_batches_tracked")
        self.weights = SharedWeights(self._read, self._write)
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        if self.cuda:
            torch.cuda.synchronize(device)  # the weights are in place before any stream
        self.padded = PaddedBatches(model.input_spec, model.batch_sizes,
                                    self._pinned if self.cuda else None)
        self._host: Dict[int, Any] = {}  # size -> input tensor on the host buffer
        self._device_in: Dict[int, Any] = {}  # CUDA: size -> input tensor on the device
        self._host_out: Dict[int, Tuple[list, list]] = {}  # CUDA: size -> pinned outputs
        self._graphs: Dict[int, Tuple[Any, Any]] = {}  # size -> (CUDA graph, its outputs)
        option = model._graphs_option
        self.cuda_graphs = (self.cuda and not model.compile) if option is None else option
        self.graphs_required = option is True
        self.forward = self.module
        if model.compile:
            if _triton_would_follow_tensorflow():
                raise RuntimeError(
                    "TorchModel(compile=...): torch.compile would load Triton after "
                    "TensorFlow, and their LLVMs abort the process together; import "
                    "triton before tensorflow, or compile in a process without TensorFlow")
            options = dict(model.compile) if isinstance(model.compile, Mapping) else {}
            self.forward = torch.compile(self.module, **options)
        elif model.script:
            self.forward = _scripted(torch, self.module, model.input_spec,
                                     self.input_dtype, device)
        #: Under TorchScript, the compiled copy: it shares the module's tensors until
        #: its forward assigns a buffer anew, in its own attributes only (TorchScript
        #: makes no Parameter in a forward). (index in names, buffer path) pairs.
        self._compiled = self.forward.compiled if model.script else None
        self._buffer_paths = (_buffer_paths(self.module, self.names)
                              if model.script else [])
        self.precision = (None if model.precision is None
                          else getattr(torch, model.precision))
        # One inference-mode guard, entered for each CPU batch: making a new one costs
        # about 1 us, a thirtieth of a one-row batch of a small MLP (batches run one at
        # a time, under the weights' lock, so it is never entered twice at once).
        self._inference = torch.inference_mode()
        #: Whether the module writes its input in place: None until its first CPU batch
        #: (which runs on a copy) tells; a batch then runs on the caller's array only
        #: while it does not (False). It stays None on CUDA, which always copies.
        self.writes_input: bool | None = None

    def rejoin(self) -> None:
        """Prepares the net again for another adapter made on it (in eval mode, on the
        device), after checking that it is the net this runner was made for.

        Raises:
            ValueError: a module of the net was added, removed or replaced since (the
                runner's checks, traces and compiled copy are of the net as it was),
                or its weights are named otherwise.
        """
        torch, module = self.torch, self.module
        modules = _modules_of(module)
        if len(modules) != len(self._modules) or any(
                a is not b for a, b in zip(modules, self._modules)) \
                or _tensor_names(torch, module.state_dict()) != self.names:
            raise ValueError(
                "TorchModel: the net changed since the adapter in use was made on it "
                "(a module added, removed or replaced, or its weights renamed): this "
                "adapter would run on what that one checked, traced or compiled. Drop "
                "the first adapter (and what serves it) first, or give this one a copy "
                "of the net (copy.deepcopy)")
        module.to(self.device).eval()

    def wrote_input(self, caller: bool) -> None:
        """The module wrote its input tensor in place: every CPU batch is copied from
        now on (``caller``: this one was the caller's own array, written once)."""
        if caller:
            warnings.warn("TorchModel: the module wrote its input in place, in the array "
                          "of this batch's caller; batches are copied from now on",
                          RuntimeWarning, stacklevel=3)
        self.writes_input = True

    # -- weights -----------------------------------------------------------------------
    def stage(self, weights: Any) -> list:
        """The values of ``weights`` in the order of ``slots``, checked and copied to
        host tensors (the caller may change its own afterwards)."""
        torch = self.torch
        if isinstance(weights, torch.nn.Module):
            weights = weights.state_dict()
        if not isinstance(weights, Mapping):
            raise TypeError(f"TorchModel.with_weights takes a state_dict or a module, got "
                            f"{type(weights).__name__}")
        missing = [n for n in self.names if n not in weights and n not in self.optional]
        known = set(self.names) | self.extra_state
        unexpected = [n for n in weights if n not in known]
        if missing or unexpected:
            raise ValueError(f"the weights do not match the module's state_dict: missing "
                             f"{missing[:5]}, unexpected {unexpected[:5]}")
        staged = []  # all checked before any is staged: a refused update changes nothing
        for name, slot in zip(self.names, self.slots()):
            if name not in weights:  # an optional buffer: kept as it is
                staged.append(slot.detach().to("cpu", copy=True))
                continue
            value = weights[name]

            def head(given: str, name: str = name, slot: Any = slot) -> str:
                return f"weight {name!r} is {given}, the module's is {slot.dtype}"

            if isinstance(value, torch.Tensor):
                value = value.detach()
                if value.is_meta:
                    raise ValueError(f"weight {name!r} is on the meta device: it has a "
                                     f"shape but no values to copy")
                given = _numpy_dtype(torch, value.dtype)
            else:  # an array, its kind checked before torch sees it (Python objects)
                value = weight_array(value, head)
                given = value.dtype
            if tuple(value.shape) != tuple(slot.shape):
                raise ValueError(f"weight {name!r} has shape {tuple(value.shape)}, the "
                                 f"module's has {tuple(slot.shape)}")
            if kind_refused(given, _numpy_dtype(torch, slot.dtype)):
                raise ValueError(f"{head(str(value.dtype))}: a cast would change its "
                                 f"values")
            tensor = torch.as_tensor(value)
            cast = tensor.to("cpu", dtype=slot.dtype, copy=True)
            if tensor.dtype != slot.dtype:  # wrapped integers, floats become infinite
                lost = values_lost(_host_numpy(torch, tensor), _host_numpy(torch, cast),
                                   str(slot.dtype))
                if lost is None and slot.dtype.is_floating_point:
                    lost = _clamped(torch, tensor, cast, slot.dtype)
                if lost is not None:
                    raise ValueError(f"{head(str(value.dtype))}: {lost}; a cast would "
                                     f"change its values")
            staged.append(cast)
        return staged

    def slots(self) -> list:
        """The tensors that hold the weights now, in the order of ``names``: looked up at
        each read and write, since a forward may assign a buffer a new tensor. Under
        TorchScript, a buffer that the compiled forward assigned anew is the compiled
        copy's (what the pass reads; the module's own is no longer it)."""
        state = self.module.state_dict()
        slots = [state[k] for k in self.names]
        for i, _, tensor in self.compiled_own():
            slots[i] = tensor
        return slots

    def compiled_own(self) -> List[Tuple[int, str, Any]]:
        """Under TorchScript: (index in ``names``, attribute path, the compiled copy's
        tensor) for each buffer its forward assigned anew."""
        return [(i, path, compiled) for i, path in self._buffer_paths
                if (compiled := _attribute(self._compiled, path))
                is not _attribute(self.module, path)]

    def _read(self) -> list:
        with self._on_stream(), self.torch.no_grad():
            values = [slot.detach().clone() for slot in self.slots()]
        if self.cuda:
            self.stream.synchronize()  # complete before another stream or device reads
        return values

    def _write(self, values: list) -> None:
        with self._on_stream():
            own = self.compiled_own()
            # The module's own tensors too (for ``module`` and ``on_device``).
            _write_module(self.torch, self.module, self.names,
                          [(i, path) for i, path, _ in own], values)
            if own:  # tensors a pass made under inference mode take writes only there
                with self.torch.inference_mode():
                    _write(self.torch, [tensor for _, _, tensor in own],
                           [values[i] for i, _, _ in own])

    def _on_stream(self) -> Any:
        if self.cuda:
            return self.torch.cuda.stream(self.stream)
        return contextlib.nullcontext()

    # -- batches -----------------------------------------------------------------------
    def _pinned(self, shape: Tuple[int, ...], dtype: Any) -> np.ndarray:
        tensor = self.torch.zeros(shape, dtype=self.input_dtype, pin_memory=True)
        self._host[shape[0]] = tensor
        return tensor.numpy()

    def _autocast(self) -> Any:
        if self.precision is None:
            return contextlib.nullcontext()
        # No weight-cast cache: it would keep casts of the old weights after an update,
        # and CUDA graph capture refuses it.
        return self.torch.autocast(self.device.type, self.precision, cache_enabled=False)

    def run(self, batch: np.ndarray) -> Outputs:
        n = len(batch)
        if self.cuda:
            _, size = self.padded.pad(batch)  # into the pinned buffer of the bucket
            return self._run_cuda(n, size)
        # On the CPU a batch that fills its bucket runs as it is (no copy), once the
        # module has shown that it does not write its input.
        source, size = self.padded.pad(batch, copy=self.writes_input is not False)
        if source is batch:
            x = self.torch.from_numpy(batch)
        else:
            x = self._host.get(size)
            if x is None:
                x = self._host[size] = self.torch.from_numpy(source)
        version = x._version
        out = self.forward_rows(x, n, size)
        if x._version != version or (self.writes_input is None and _written(
                source, batch, n)):
            # (a write through .data or NumPy leaves _version as it was: the first
            # batch, on a copy, is compared with the caller's too)
            if source is not batch:  # its pad rows too: zeros again next time
                self.padded.dirtied(size)
            self.wrote_input(caller=source is batch)
        elif self.writes_input is None:
            self.writes_input = False
        return out

    def forward_rows(self, x: Any, n: int, size: int) -> Outputs:
        """The first ``n`` rows of the module's outputs on the CPU tensor ``x`` of
        ``size`` rows, copied out (``_host_rows``)."""
        if any(map(_TRAINING, self._modes)):
            self._refuse_train_mode()
        with self._inference:
            if self.precision is None:
                out = self.forward(x)
            else:
                with self._autocast():
                    out = self.forward(x)
            if isinstance(out, self.torch.Tensor):  # the common case, without a closure
                return _host_rows(self.torch, out, n, size)
            return net_outputs(out, self.is_tensor,
                               lambda t: _host_rows(self.torch, t, n, size))

    def _refuse_train_mode(self) -> None:
        which = next(m for m in self._modes if m.training)
        what = type(self.module).__name__ + (
            "" if which is self.module else f", its {type(which).__name__} among others")
        raise RuntimeError(
            f"TorchModel: its module ({what}) was put back in train mode after the "
            f"adapter took it: there BatchNorm and Dropout make a row "
            f"depend on its batch-mates and on the pad rows, and serving would rewrite "
            f"the running statistics. The adapter owns its module: train a copy "
            f"(copy.deepcopy(net)) and pass its state_dict to update_model")

    def _run_cuda(self, n: int, size: int) -> Outputs:
        torch = self.torch
        if any(map(_TRAINING, self._modes)):
            self._refuse_train_mode()
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream), \
                torch.inference_mode(), self._autocast():
            x = self._device_in.get(size)
            if x is None:
                x = self._device_in[size] = torch.empty(
                    self._host[size].shape, dtype=self.input_dtype, device=self.device)
            x.copy_(self._host[size], non_blocking=True)
            captured = self._graph(size, x) if self.cuda_graphs else None
            if captured is not None:
                graph, out = captured
                graph.replay()
            else:
                out = self.forward(x)
            leaves, rebuild = _flatten(net_outputs(out, self.is_tensor, _same))
            for leaf in leaves:
                _check_dense(torch, leaf)
                check_padded_shape(leaf.shape, n, size)
            pinned = self._pinned_outputs(size, leaves)
            for host, leaf in zip(pinned, leaves):
                host.copy_(leaf, non_blocking=True)
        self.stream.synchronize()  # the one wait of a batch
        return rebuild([host[:n].numpy().copy() for host in pinned])

    def _graph(self, size: int, x: Any) -> Tuple[Any, Any] | None:
        """The bucket's captured graph and its output tensors, captured at its first
        batch; None once a capture failed and graphs were only the default (eager)."""
        captured = self._graphs.get(size)
        if captured is None:
            torch = self.torch
            # Warm-up before capture, as CUDA graphs require, on a copy of the batch: a
            # module that writes its input would otherwise run on its own writes.
            scratch = x.clone()
            for _ in range(3):
                scratch.copy_(x)
                self.forward(scratch)
            self.stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            try:
                # One capture at a time in the process, and only this thread's calls
                # checked: in the default "global" mode a batch synchronising in another
                # device thread (serve(devices=[...])) fails, and breaks this capture.
                with _CAPTURING, torch.cuda.graph(graph, stream=self.stream,
                                                  capture_error_mode="thread_local"):
                    out = self.forward(x)
            except Exception as e:  # noqa: BLE001 - whatever the module did in capture
                if self.graphs_required:
                    raise RuntimeError(
                        f"TorchModel(cuda_graphs=True): the module cannot be captured in "
                        f"a CUDA graph ({type(e).__name__}: {e}); pass cuda_graphs=None "
                        f"to run it eagerly") from e
                _log.warning("TorchModel: %s cannot be captured in a CUDA graph (%s: "
                             "%s); it runs eagerly", type(self.module).__name__,
                             type(e).__name__, e)
                self.cuda_graphs = False
                self._graphs.clear()
                self.stream.synchronize()
                return None
            captured = self._graphs[size] = (graph, out)
        return captured

    def _pinned_outputs(self, size: int, leaves: list) -> list:
        torch = self.torch
        layout = [(tuple(t.shape), _host_dtype(torch, t.dtype)) for t in leaves]
        known = self._host_out.get(size)
        if known is None or known[0] != layout:
            known = self._host_out[size] = (layout, [
                torch.empty(shape, dtype=dtype, pin_memory=True)
                for shape, dtype in layout])
        return known[1]


#: A CUDA graph's capture empties the allocator's cache and synchronises the device as
#: it starts: two device threads capturing at once would break each other's capture.
#: Reentrant: a module may call another TorchModel that captures a graph of its own.
_CAPTURING = threading.RLock()
#: ``torch.jit.script`` compiles into one process-wide unit: two threads compiling at
#: once clash ("Can't redefine method"), and its warning filter is process-wide too.
_SCRIPTING = threading.Lock()
#: The most lines of TorchScript's reason that a refusal quotes.
_REASON_LINES = 20


def _scripted(torch: Any, module: Any, spec: TensorSpec, dtype: Any, device: Any) -> Any:
    """The forward pass of ``module`` compiled by TorchScript (sharing its parameters
    and buffers), raising what the module's own ``raise`` statements raise, checked on
    one row of zeros.

    Raises:
        ValueError: TorchScript cannot compile it (no source, Python it lacks), or its
            compiled pass fails on a row of zeros where the eager pass does not.
    """
    name = type(module).__name__
    with _SCRIPTING, warnings.catch_warnings():
        # PyTorch's deprecation of the API this option names (a DeprecationWarning in
        # 2.13, a FutureWarning from 2.14); any other warning (the one of Python 3.14,
        # where TorchScript may break) is left as it is.
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated",
                                category=Warning)
        try:
            compiled = torch.jit.script(module)
        except Warning:  # warnings made errors: the caller's choice, not a refusal
            raise
        except Exception as e:  # noqa: BLE001 - the frontend raises many kinds
            raise ValueError(f"TorchModel(script=True): TorchScript cannot compile {name} "
                             f"({type(e).__name__}): {_reason(e)}\npass script=False to "
                             f"run it eagerly") from e
    # The modules the net's classes come from: where a bare ``raise Name`` is looked up.
    owners = tuple({id(m): m for m in (sys.modules.get(type(part).__module__)
                                       for part in module.modules()) if m}.values())
    forward = _raising_as_written(torch, compiled, owners)
    zeros = torch.zeros((1, *spec.shape), dtype=dtype, device=device)
    try:
        with torch.inference_mode():
            forward(zeros)
    except Exception as e:  # noqa: BLE001 - whatever the compiled pass raised
        try:
            with torch.inference_mode():
                module(zeros)
        except Exception:  # noqa: BLE001 - the module's own failure: not TorchScript's
            return forward
        raise ValueError(f"TorchModel(script=True): {name} compiles, but its compiled "
                         f"pass fails on a row of zeros where the eager one runs "
                         f"({type(e).__name__}): {_reason(e)}\npass script=False to run "
                         f"it eagerly") from e
    return forward


def _reason(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    if len(lines) > _REASON_LINES:
        lines = lines[:_REASON_LINES] + ["..."]
    return "\n".join(lines)


def _raising_as_written(torch: Any, compiled: Any, owners: Sequence[Any] = ()) -> Any:
    """``compiled``, callable as the module, whose ``raise`` statements raise what they
    name: TorchScript raises ``torch.jit.Error`` with the type's name in its message (a
    ``ValueError`` is a caller's error to the router, not a server's)."""
    jit_error = torch.jit.Error

    def forward(x: Any) -> Any:
        try:
            return compiled(x)
        except jit_error as e:
            written = _written_error(e, owners)
            if written is None:
                raise
            raise written from e

    forward.compiled = compiled  # type: ignore[attr-defined]
    return forward


#: The line of a TorchScript error that names the exception raised, after the source
#: it quotes: ``builtins.ValueError: message`` or ``package.module.MyError: message``.
_WRITTEN = re.compile(r"^([A-Za-z_][\w.]*)\.([A-Za-z_]\w*)(?:: ?(.*))?$")
#: How TorchScript names an ``assert`` that failed, or an ``AssertionError`` raised.
_ASSERTED = re.compile(r"^RuntimeError: AssertionError(?:: ?(.*))?$")


def _written_error(e: BaseException, owners: Sequence[Any] = ()) -> Exception | None:
    """The exception that a compiled ``raise`` statement raised, as its type (a
    built-in one, or one of a module this process has imported) with its message;
    None where the message names none."""
    lines = str(e).splitlines()
    quoted = [i for i, line in enumerate(lines) if line.rstrip().endswith("<--- HERE")]
    first = quoted[-1] + 1 if quoted else 0
    # The first such line after the quoted source: the message's own lines follow it,
    # and may look like another (a message may say "builtins.ValueError: ...").
    for i in range(first, len(lines)):
        asserted = _ASSERTED.match(lines[i])
        if asserted:  # TorchScript's words for an assert or an AssertionError raised
            kind, said = AssertionError, asserted.group(1)
        else:
            found = _WRITTEN.match(lines[i])
            if not found:
                continue
            module = (builtins if found.group(1) == "builtins"
                      else sys.modules.get(found.group(1)))
            kind, said = getattr(module, found.group(2), None), found.group(3)
            if not (isinstance(kind, type) and issubclass(kind, Exception)):
                continue
        message = "\n".join([said or ""] + lines[i + 1:]).strip()
        try:
            return kind(message) if message else kind()
        except Exception:  # noqa: BLE001 - a type that takes other arguments
            return None
    # A bare ``raise ValueError`` (no call): TorchScript says only "RuntimeError:", and
    # the type is named by the quoted source line above the marker.
    rest = [line.strip() for line in lines[first:] if line.strip()]
    if quoted and quoted[-1] and rest and rest[-1] == "RuntimeError:":
        bare = _BARE_RAISE.match(lines[quoted[-1] - 1])
        files = [found.group(1) for found in map(_QUOTED_FILE.match, lines[:quoted[-1]])
                 if found]
        kind = bare and _exception_named(bare.group(1), files[-1] if files else None,
                                         owners)
        if kind is not None:
            try:
                return kind()
            except Exception:  # noqa: BLE001 - a type that takes arguments
                return None
    return None


#: A quoted ``raise Name`` (or ``raise package.Name``) without a call, after an ``if``,
#: ``elif`` or ``else`` on its line or not, with ``from`` a cause or a comment after it
#: or not (a name in the comment is not the one raised).
_BARE_RAISE = re.compile(r"^\s*(?:(?:el)?if\b.*?:\s*|else\s*:\s*)?"
                         r"raise\s+([A-Za-z_][\w.]*)(?:\s+from\s+[\w.]+)?\s*(?:#.*)?$")
#: A quoted frame's file: ``File "/path/net.py", line 10, in forward``.
_QUOTED_FILE = re.compile(r'^\s*File "(.+)", line \d+')


def _exception_named(name: str, file: str | None,
                     owners: Sequence[Any] = ()) -> type | None:
    """The exception type ``name`` stands for where it was raised: a name of the module
    whose source is ``file`` (the net's own modules first: a class of its own may
    shadow a built-in's name), else a built-in, else ``module.Name`` of an imported
    module; None when none is an exception type."""
    head, _, rest = name.partition(".")
    homes = [m for m in owners if getattr(m, "__file__", None) == file] if file else []
    if file and not homes:
        homes = [m for m in list(sys.modules.values())
                 if getattr(m, "__file__", None) == file]
    for home in homes:
        found = getattr(home, head, None)
        for part in rest.split(".") if rest else ():
            found = getattr(found, part, None)
        if isinstance(found, type) and issubclass(found, Exception):
            return found
    owner, _, attr = name.rpartition(".")
    found = (getattr(sys.modules.get(owner), attr, None) if owner
             else getattr(builtins, name, None))
    return found if isinstance(found, type) and issubclass(found, Exception) else None


def _written(source: np.ndarray, batch: np.ndarray, n: int) -> bool:
    """Whether the module wrote ``source``, the padded copy of ``batch`` it ran on."""
    return source is not batch and (
        source[:n].tobytes() != np.ascontiguousarray(batch, source.dtype).tobytes()
        or source[n:].any())


def _buffer_paths(module: Any, names: Sequence[str]) -> List[Tuple[int, str]]:
    """(index in ``names``, attribute path) of each of the module's buffers among its
    state_dict's ``names``: the name itself where it is a buffer's path, else the paths
    of the tensor it names (a state_dict hook may rename it; one tensor may be held
    under several paths)."""
    buffers = list(module.named_buffers(remove_duplicate=False))
    try:
        kept = module.state_dict(keep_vars=True)
    except Exception:  # noqa: BLE001 - a state_dict of its own (no such keyword), a hook
        kept = {}      # that works on detached tensors only: matched by name then
    paths: Dict[int, List[str]] = {}
    for path, tensor in buffers:
        paths.setdefault(id(tensor), []).append(path)
    named = {path for path, _ in buffers}
    out = []
    for i, name in enumerate(names):
        if name in named:  # its own path: not the other paths of a tied tensor
            out.append((i, name))
            continue
        found = paths.get(id(kept[name]), []) if name in kept else []
        out += [(i, path) for path in found]  # a name a hook gave it
    return out


def _attribute(module: Any, path: str) -> Any:
    """``module``'s attribute at the dotted ``path`` (``"block.0.bn.running_mean"``)."""
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _write_module(torch: Any, module: Any, names: Sequence[str],
                  reassigned: Sequence[Tuple[int, str]], values: list) -> None:
    """Writes ``values`` into ``module``'s state_dict tensors of ``names``. A buffer
    that a compiled forward assigned anew with another shape (one of the paths of
    ``reassigned``) is assigned anew with the value, one copy for its paths; any other
    weight whose shape is not its value's raises ValueError (a copy would broadcast).
    """
    state = module.state_dict()
    slots = [state[k] for k in names]
    reshaped: Dict[int, List[str]] = {}
    for i, path in reassigned:
        if tuple(slots[i].shape) != tuple(values[i].shape):
            reshaped.setdefault(i, []).append(path)
    kept = [i for i in range(len(slots)) if i not in reshaped]
    for i in kept:  # all checked before any is written
        if tuple(slots[i].shape) != tuple(values[i].shape):
            raise ValueError(f"weight {names[i]!r} has shape {tuple(values[i].shape)}, "
                             f"the module's has {tuple(slots[i].shape)} now (its forward "
                             f"pass gave it another)")
    for i, paths in reshaped.items():
        value = values[i].detach().to(slots[i].device, copy=True)
        for path in paths:
            owner, _, leaf = path.rpartition(".")
            setattr(_attribute(module, owner) if owner else module, leaf, value)
    _write(torch, [slots[i] for i in kept], [values[i] for i in kept])


def _write(torch: Any, slots: list, values: list) -> None:
    with torch.no_grad():
        for slot, value in zip(slots, values):
            slot.copy_(value)


def _clamped(torch: Any, given: Any, cast: Any, dtype: Any) -> str | None:
    """What casting ``given`` into ``cast``, of a float ``dtype``, clamped where
    ``values_lost`` cannot see it, or None. PyTorch's one-byte floats saturate where
    NumPy's floats become infinite (float8_e4m3fn: 1e6 and inf both become 448), and
    float8_e8m0fnu holds neither a sign nor a zero (-2 becomes 2). A value within half
    a step of the largest rounds to it (a tie to the even largest)."""
    if not given.numel() or dtype.itemsize != 1:
        return None  # wider floats overflow to inf, which values_lost refuses
    values, out = given.to(torch.float64), cast.to(torch.float64)
    info = torch.finfo(dtype)
    top = torch.tensor([info.max], dtype=dtype)
    below = float((top.view(torch.uint8) - 1).view(dtype).to(torch.float64))
    bound = info.max + (info.max - below) / 2
    finite = torch.isfinite(values)
    past = (finite & (values.abs() > bound)) | (torch.isinf(values) & ~torch.isinf(out))
    if bool(past.any()):
        worst = float(values[past].abs().max())
        became = (f"clamp to {info.max:g}" if bool(torch.isfinite(out[past]).all())
                  else "turn into NaN")
        return (f"it holds values past {dtype}'s range (up to {worst:g} in magnitude), "
                f"which the cast would {became}")
    if info.min > 0 and bool((finite & (values <= 0)).any()):
        return f"it holds values <= 0, which {dtype} (no sign, no zero) cannot hold"
    return None


#: A module's mode (``any(map(_TRAINING, modules))``: the cheapest scan of them all;
#: reading each module's ``__dict__`` would be cheaper, and blind to one rebound).
_TRAINING = operator.attrgetter("training")


def _refuse_batch_statistics(torch: Any, modules: Sequence[Any]) -> None:
    """Refuses a BatchNorm without running statistics: it normalises each batch by its
    own mean and variance in eval mode too, so that a row would depend on its
    batch-mates and the pad rows (and one row alone fails in PyTorch)."""
    norm, script = torch.nn.modules.batchnorm._BatchNorm, torch.jit.ScriptModule
    found = [getattr(m, "original_name", None) or type(m).__name__ for m in modules
             if (isinstance(m, norm) or (isinstance(m, script) and "BatchNorm" in str(
                 getattr(m, "original_name", ""))))  # (TorchScript keeps the name)
             and getattr(m, "running_mean", 0) is None
             and getattr(m, "running_var", 0) is None]
    if found:
        raise ValueError(
            f"TorchModel: the module's {found[0]} has no running statistics "
            f"(track_running_stats=False: running_mean and running_var are None), so "
            f"it normalises every batch by the batch's "
            f"own mean and variance even in eval mode: a row would depend on its "
            f"batch-mates and on the pad rows. Give it running statistics, or use "
            f"GroupNorm or LayerNorm")


def _tensor_names(torch: Any, state: Dict[str, Any]) -> List[str]:
    """The names of a state dict's tensors, in its order (the weights an update writes;
    the rest is a module's extra state)."""
    return [k for k, v in state.items() if torch.is_tensor(v)]


def _modules_of(module: Any) -> tuple:
    """The module and its submodules (a module-like object without ``modules``: itself)."""
    return tuple(module.modules()) if callable(getattr(module, "modules", None)) \
        else (module,)


def _hooked(module: Any) -> bool:
    """Whether a module has forward hooks, which may read its mode."""
    return bool(getattr(module, "_forward_pre_hooks", None)
                or getattr(module, "_forward_hooks", None))


def _mode_free(torch: Any) -> frozenset:
    """PyTorch's module classes whose forward never reads ``training``: in train mode
    they compute what they compute in eval mode (their subclasses may not)."""
    names = ["Identity", "Flatten", "Unflatten", "Linear", "Bilinear", "Embedding",
             "LayerNorm", "GroupNorm", "RMSNorm", "Sequential", "ModuleList", "ModuleDict",
             "ReLU", "ReLU6", "LeakyReLU", "PReLU", "ELU", "SELU", "CELU", "GELU", "SiLU",
             "Mish", "Sigmoid", "Tanh", "Softplus", "Softsign", "Softmax", "LogSoftmax",
             "Hardtanh", "Hardswish", "Hardsigmoid", "Tanhshrink", "LogSigmoid"]
    for n in "123":
        names += [f"Conv{n}d", f"ConvTranspose{n}d", f"MaxPool{n}d", f"AvgPool{n}d",
                  f"AdaptiveAvgPool{n}d", f"AdaptiveMaxPool{n}d", f"ZeroPad{n}d",
                  f"ConstantPad{n}d", f"ReflectionPad{n}d", f"ReplicationPad{n}d"]
    return frozenset(filter(None, (getattr(torch.nn, name, None) for name in names)))


def _host_dtype(torch: Any, dtype: Any) -> Any:
    """The dtype a CUDA output comes back in, as ``_host_rows`` gives a CPU one: floats
    narrower than float32 as float32 (NumPy has no bfloat16 or float8, and a caller of
    a float32 net expects float32), complex32 (which NumPy lacks) as complex64."""
    if dtype == torch.complex32:
        return torch.complex64
    if dtype.is_floating_point and dtype.itemsize < 4:
        return torch.float32
    return dtype


def _triton_would_follow_tensorflow() -> bool:
    """Whether compiling now would load Triton (installed, not yet loaded) after
    TensorFlow: both register LLVM's command-line options, and LLVM aborts."""
    return ("tensorflow" in sys.modules and "triton" not in sys.modules
            and find_spec("triton") is not None)


#: NumPy's float16 (a singleton: an identity test is the cheapest check of a batch).
_FLOAT16 = np.dtype(np.float16)


def _host_rows(torch: Any, tensor: Any, n: int, size: int) -> np.ndarray:
    """The first ``n`` rows of a CPU output of a batch padded to ``size`` rows, as the
    caller's own array: always a copy, since a module may return memory it keeps (its
    input, a weight that an update rewrites, a buffer it writes each pass), which would
    change results already handed out. Reduced floats come back as float32, complex32
    as complex64.

    Raises:
        ModelOutputError: the output is not dense, has no batch dimension or not
            ``size`` rows.
    """
    try:
        out = tensor.numpy()  # the usual output: dense, of a dtype NumPy has
        fresh = False
    except (TypeError, RuntimeError):  # the rest, checked only here (it is rare)
        out = _converted(torch, tensor)
        fresh = True
    shape = out.shape
    if n != size or not shape or shape[0] != n:
        # A NumPy slice (a tenth of the cost of slicing the tensor) of outputs with a
        # row per row of the padded batch, or an error.
        out = padded_rows(out, n, size)
    if out.dtype is _FLOAT16:
        return out.astype(np.float32)  # a copy
    return out if fresh else out.copy()


def _converted(torch: Any, tensor: Any) -> np.ndarray:
    """A CPU output that ``numpy()`` refused, as a new array: a lazy conjugate or
    negation made real, the reduced floats NumPy lacks as float32, complex32 as
    complex64, a quantized tensor as its float32 values; an output that is no dense
    tensor is refused (``ModelOutputError``), and one that NumPy cannot take otherwise
    fails with PyTorch's own error."""
    _check_dense(torch, tensor)
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    try:
        return tensor.numpy().copy()
    except TypeError:  # bfloat16, the float8 types, complex32; quantized: their values
        if tensor.is_quantized:
            return tensor.dequantize().numpy()
        return tensor.to(torch.complex64 if tensor.is_complex() else torch.float32).numpy()


def _check_dense(torch: Any, tensor: Any) -> None:
    # A ragged (nested) tensor may have the strided layout: it failed later, in
    # PyTorch's words ("NestedTensorImpl doesn't support sizes. Please file an issue").
    if tensor.layout is not torch.strided or getattr(tensor, "is_nested", False):
        kind = "a nested (ragged) tensor" if getattr(tensor, "is_nested", False) else \
            f"a tensor of layout {tensor.layout}"
        raise ModelOutputError(f"the net returned {kind}: an adapter's net must return "
                               f"dense tensors (to_dense(), or to_padded_tensor())")


def _same(tensor: Any) -> Any:
    return tensor


def _flatten(out: Any) -> Tuple[list, Any]:
    """The tensors of an output (a tensor, or a tuple, list or dict of tensors) and a
    function that builds the same structure from arrays in their place."""
    if isinstance(out, dict):
        keys = list(out)
        return [out[k] for k in keys], lambda arrays: dict(zip(keys, arrays))
    if isinstance(out, (tuple, list)):
        return list(out), tuple
    return [out], lambda arrays: arrays[0]
