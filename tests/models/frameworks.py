"""The same small net in NumPy, TensorFlow, PyTorch and JAX, for the one adapter suite.

Each ``Framework`` builds the net ``x[n, 6] -> relu(x w1 + b1) w2 + b2 -> [n, 3]`` from
the same NumPy weights, as its adapter (``make``) and as the framework called directly
on exactly the rows given (``direct``: the reference, no padding, no adapter). A net made
with ``raising=True`` raises for a batch that holds a row whose first value is
``SENTINEL``, at run time, in the framework's own way.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

from async_search.base import TensorSpec
from async_search.models import MLP, WEIGHT_QUANTUM, with_spec

SPEC = TensorSpec((6,), np.float32)
HIDDEN = 16
OUTPUTS = 3
#: A first value that makes a ``raising`` net raise.
SENTINEL = 1234.0

Weights = List[np.ndarray]  # [w1 [6, 16], b1 [16], w2 [16, 3], b2 [3]]


def weights(seed: int) -> Weights:
    """Weights on the NumPy MLP's exact grid (so that all four nets compute one thing)."""
    rng = np.random.default_rng(seed)
    shapes = [(6, HIDDEN), (HIDDEN,), (HIDDEN, OUTPUTS), (OUTPUTS,)]
    return [(np.round(rng.uniform(-0.5, 0.5, s) / WEIGHT_QUANTUM) * WEIGHT_QUANTUM)
            .astype(np.float32) for s in shapes]


def inputs(n: int, seed: int = 0) -> np.ndarray:
    """Rows on the MLP's 1/256 input grid, all distinct."""
    rng = np.random.default_rng(seed)
    return (np.round(rng.uniform(-4, 4, (n, 6)) * 256) / 256).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Framework:
    """One framework's way to build, reweight and call the suite's net."""

    name: str
    #: make(weights, raising=False, **adapter options) -> the adapter; the adapters'
    #: make also takes ``spec`` (their input_spec, SPEC by default)
    make: Callable[..., Any]
    #: update(weights) -> what update_model / with_weights take in this framework
    update: Callable[[Weights], Any]
    #: direct(weights, x) -> the net's outputs for exactly x, without the adapter
    direct: Callable[[Weights, np.ndarray], np.ndarray]
    #: A device name the framework understands that this machine has not.
    missing_device: str = ""
    #: Whether the model pads batches in reused buffers (the adapters do; NumPy not).
    pads: bool = True
    #: odd(kind, **adapter options) -> an adapter whose net returns an output of that
    #: kind (``ODD_OUTPUTS``) instead of its rows; None where no adapter runs the net.
    odd: Callable[..., Any] | None = None
    #: net(weights) -> the framework's own net object (a torch.nn.Module, a Keras
    #: model), callable, which update_model takes as weights; None where there is none.
    net: Callable[[Weights], Any] | None = None
    #: scaled(b, k) -> (an adapter of SPEC whose net computes ``x * k + b`` from a
    #: weight ``b`` [6] and a weight ``k`` [1], in their dtypes, ``b`` staged first;
    #: ``update(b, k)``, what its with_weights takes); None where no adapter runs it.
    scaled: Callable[[np.ndarray, np.ndarray], Tuple[Any, Callable[..., Any]]] | None = None


#: Outputs that do not match the batch a net was given: what each odd net returns,
#: from its correct outputs ``y`` and the framework's ``concatenate``.
ODD_OUTPUTS: Dict[str, Callable[[Any, Callable[[list], Any]], Any]] = {
    "no batch dimension": lambda y, cat: y[0, 0],
    "too few rows": lambda y, cat: y[:1],
    "too many rows": lambda y, cat: cat([y, y]),
    "None": lambda y, cat: None,
    "a nested structure": lambda y, cat: {"p": (y, y)},
    "an empty tuple": lambda y, cat: (),
}


# -- NumPy --------------------------------------------------------------------------------
def _numpy_make(w: Weights, raising: bool = False, **options: Any) -> Any:
    mlp = MLP(SPEC.shape, hidden_sizes=(HIDDEN,), output_size=OUTPUTS).with_weights(
        [(w[0], w[1]), (w[2], w[3])])
    if not raising:
        return mlp

    def fn(x):
        if (x[:, 0] == SENTINEL).any():
            raise ValueError("the sentinel row")
        return mlp(x)

    return with_spec(fn, SPEC.shape, SPEC.dtype)


def _numpy_direct(w: Weights, x: np.ndarray) -> np.ndarray:
    # The NumPy model is its own framework: its hidden layer lives on an exact grid.
    return _numpy_make(w)(x)


NUMPY = Framework("numpy", _numpy_make, lambda w: [(w[0], w[1]), (w[2], w[3])],
                  _numpy_direct, pads=False)


# -- PyTorch ------------------------------------------------------------------------------
def _torch_state(w: Weights) -> dict:
    import torch
    return {"0.weight": torch.from_numpy(w[0].T.copy()), "0.bias": torch.from_numpy(w[1]),
            "2.weight": torch.from_numpy(w[2].T.copy()), "2.bias": torch.from_numpy(w[3])}


def _torch_net(w: Weights, raising: bool = False) -> Any:
    import torch

    class Raising(torch.nn.Sequential):
        def forward(self, x):
            if bool((x[:, 0] == SENTINEL).any()):
                raise ValueError("the sentinel row")
            return super().forward(x)

    kind = Raising if raising else torch.nn.Sequential
    net = kind(torch.nn.Linear(6, HIDDEN), torch.nn.ReLU(),
               torch.nn.Linear(HIDDEN, OUTPUTS))
    net.load_state_dict(_torch_state(w))
    return net.eval()


def _torch_make(w: Weights, raising: bool = False, spec: Any = SPEC, **options: Any) -> Any:
    from async_search.models import TorchModel
    return TorchModel(_torch_net(w, raising), input_spec=spec, **options)


def _torch_direct(w: Weights, x: np.ndarray) -> np.ndarray:
    import torch
    with torch.inference_mode():
        return _torch_net(w)(torch.from_numpy(x)).numpy()


def _torch_odd(kind: str, **options: Any) -> Any:
    import torch
    from async_search.models import TorchModel

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _torch_net(weights(0))

        def forward(self, x):
            return ODD_OUTPUTS[kind](self.net(x), torch.cat)

    return TorchModel(Odd(), input_spec=SPEC, **options)


def _torch_scaled(b: np.ndarray, k: np.ndarray, script: bool = False
                  ) -> Tuple[Any, Callable[..., Any]]:
    import torch
    from async_search.models import TorchModel

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.b = torch.nn.Parameter(torch.from_numpy(b.copy()))  # state_dict: first
            self.register_buffer("k", torch.from_numpy(k.copy()))

        def forward(self, x):
            return x * self.k.to(x.dtype) + self.b

    def update(b: Any, k: Any) -> dict:
        return {"b": torch.as_tensor(b), "k": torch.as_tensor(k)}

    return TorchModel(Scaled(), input_spec=SPEC, device="cpu", script=script), update


TORCH = Framework("torch", _torch_make, _torch_state, _torch_direct,
                  missing_device="cuda:7", odd=_torch_odd, net=_torch_net,
                  scaled=_torch_scaled)


# -- PyTorch, compiled by TorchScript (TorchModel(script=True)) ---------------------------
def _torch_script_net(w: Weights, raising: bool = False) -> Any:
    import torch

    class Raising(torch.nn.Sequential):  # the sentinel's check in what TorchScript takes
        def __init__(self, *layers):
            super().__init__(*layers)
            self.sentinel = float(SENTINEL)  # TorchScript reads no global floats

        def forward(self, x):
            if bool((x[:, 0] == self.sentinel).any()):
                raise ValueError("the sentinel row")
            for layer in self:
                x = layer(x)
            return x

    kind = Raising if raising else torch.nn.Sequential
    net = kind(torch.nn.Linear(6, HIDDEN), torch.nn.ReLU(),
               torch.nn.Linear(HIDDEN, OUTPUTS))
    net.load_state_dict(_torch_state(w))
    return net.eval()


def _torch_script_make(w: Weights, raising: bool = False, spec: Any = SPEC,
                       **options: Any) -> Any:
    from async_search.models import TorchModel
    return TorchModel(_torch_script_net(w, raising), input_spec=spec, script=True,
                      **options)


TORCH_SCRIPT = Framework("torch-script", _torch_script_make, _torch_state, _torch_direct,
                         missing_device="cuda:7", net=_torch_net,
                         scaled=functools.partial(_torch_scaled, script=True))


# -- JAX ----------------------------------------------------------------------------------
def _jax_params(w: Weights) -> dict:
    return {"w1": w[0], "b1": w[1], "w2": w[2], "b2": w[3]}


def _jax_apply(raising: bool = False) -> Callable[[Any, Any], Any]:
    import jax
    import jax.numpy as jnp

    def check(x):
        if (np.asarray(x)[:, 0] == SENTINEL).any():
            raise ValueError("the sentinel row")
        return np.zeros((), np.float32)

    def apply(p, x):
        out = jnp.maximum(x @ p["w1"] + p["b1"], 0) @ p["w2"] + p["b2"]
        if raising:  # raises at run time, from the host, as jax.pure_callback lets it
            out = out + jax.pure_callback(check, jax.ShapeDtypeStruct((), jnp.float32), x)
        return out

    return apply


def _jax_make(w: Weights, raising: bool = False, spec: Any = SPEC, **options: Any) -> Any:
    from async_search.models import JaxModel
    return JaxModel(_jax_apply(raising), _jax_params(w), input_spec=spec, **options)


def _jax_direct(w: Weights, x: np.ndarray) -> np.ndarray:
    import jax
    return np.asarray(jax.jit(_jax_apply())(_jax_params(w), x))


def _jax_odd(kind: str, **options: Any) -> Any:
    import jax.numpy as jnp
    from async_search.models import JaxModel
    apply = _jax_apply()
    return JaxModel(lambda p, x: ODD_OUTPUTS[kind](apply(p, x), jnp.concatenate),
                    _jax_params(weights(0)), input_spec=SPEC, **options)


def _jax_scaled(b: np.ndarray, k: np.ndarray) -> Tuple[Any, Callable[..., Any]]:
    from async_search.models import JaxModel
    model = JaxModel(lambda p, x: x * p["k"].astype(x.dtype) + p["b"],
                     {"b": b, "k": k}, input_spec=SPEC, device="cpu")
    return model, lambda b, k: {"b": b, "k": k}  # "b" < "k": b is staged first


JAX = Framework("jax", _jax_make, _jax_params, _jax_direct, missing_device="cuda:7",
                odd=_jax_odd, scaled=_jax_scaled)


# -- TensorFlow ---------------------------------------------------------------------------
def _keras_net(w: Weights) -> Any:
    import tensorflow as tf
    net = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(HIDDEN, "relu"),
                               tf.keras.layers.Dense(OUTPUTS)])
    net.set_weights(w)
    return net


def _tf_make(w: Weights, raising: bool = False, spec: Any = SPEC, **options: Any) -> Any:
    from async_search.models import TensorFlowModel
    net = _keras_net(w)
    if raising:
        import tensorflow as tf

        keras_net = net

        def net(x):
            tf.debugging.assert_none_equal(x[:, 0], SENTINEL, message="the sentinel row")
            return keras_net(x, training=False)

    return TensorFlowModel(net, spec, **options)


def _tf_direct(w: Weights, x: np.ndarray) -> np.ndarray:
    return _keras_net(w)(x, training=False).numpy()


def _tf_odd(kind: str, **options: Any) -> Any:
    import tensorflow as tf
    from async_search.models import TensorFlowModel
    keras_net = _keras_net(weights(0))

    def net(x):
        return ODD_OUTPUTS[kind](keras_net(x, training=False), lambda ys: tf.concat(ys, 0))

    return TensorFlowModel(net, SPEC, **options)


def _tf_scaled(b: np.ndarray, k: np.ndarray) -> Tuple[Any, Callable[..., Any]]:
    import tensorflow as tf
    from async_search.models import TensorFlowModel

    class Scaled(tf.keras.layers.Layer):
        def build(self, shape):
            self.b = self.add_weight(shape=b.shape, dtype=str(b.dtype), trainable=False,
                                     initializer=tf.constant_initializer(b))
            self.k = self.add_weight(shape=k.shape, dtype=str(k.dtype), trainable=False,
                                     initializer=tf.constant_initializer(k))

        def call(self, x):
            return x * tf.cast(self.k, x.dtype) + self.b

    net = tf.keras.Sequential([tf.keras.Input(SPEC.shape), Scaled()])
    return TensorFlowModel(net, SPEC, max_batch_size=8), lambda b, k: [b, k]


TENSORFLOW = Framework("tensorflow", _tf_make, list, _tf_direct, missing_device="/GPU:7",
                       odd=_tf_odd, net=_keras_net, scaled=_tf_scaled)

#: The module each framework needs (None: NumPy alone), and the extra that installs it.
MODULES = {"numpy": None, "torch": "torch", "torch-script": "torch", "jax": "jax",
           "tensorflow": "tensorflow"}
EXTRAS = {"torch": "torch", "torch-script": "torch", "jax": "jax", "tensorflow": "tf"}
FRAMEWORKS = [NUMPY, TENSORFLOW, TORCH, TORCH_SCRIPT, JAX]


def params():
    """``pytest.param`` per framework, skipped with a reason where it does not import."""
    out = []
    for framework in FRAMEWORKS:
        module = MODULES[framework.name]
        missing = module is not None and importlib.util.find_spec(module) is None
        extra = EXTRAS.get(framework.name)
        reason = f"{module} is not installed (pip install -e '.[{extra}]')"
        marks = [pytest.mark.skip(reason=reason)] if missing else []
        out.append(pytest.param(framework, id=framework.name, marks=marks))
    return out


def tolerance(model: Any) -> float:
    """The model's documented batch tolerance (0.0 for a model that declares none)."""
    return float(getattr(model, "batch_tolerance", 0.0))


def assert_close(actual: Any, expected: Any, tol: float) -> None:
    """Equal within ``tol`` (relative and absolute), as ``batch_tolerance`` says."""
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


def pad_buffers(model: Any) -> Any:
    """The ``PaddedBatches`` an adapter pads its batches in (white-box: the suite
    poisons their padding rows to prove that no pad value reaches a result)."""
    for attribute in ("_runner", "_shared"):
        holder = getattr(model, attribute, None)
        if holder is not None:
            return holder.padded
    raise AssertionError(f"{type(model).__name__} has no padded buffers")
