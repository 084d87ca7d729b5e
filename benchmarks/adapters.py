"""Per-batch overhead of the framework adapters over calling the framework directly.

For each framework that imports (PyTorch, JAX, TensorFlow), one net (an MLP,
``--input`` -> ``--hidden`` x 2 -> 1, ReLU, float32) is called on NumPy batches of
several bucket sizes in two ways:

- direct: the framework alone, as a user would call it without this toolkit:
  PyTorch ``module(torch.from_numpy(x)).numpy()`` under ``torch.inference_mode()``;
  JAX ``np.asarray(jax.jit(apply_fn)(params, x))``; TensorFlow a ``tf.function``
  traced for the shape, ``fn(tf.constant(x)).numpy()``; ``torch-script`` the module
  compiled by TorchScript, called as PyTorch's;
- adapter: ``TorchModel``, ``JaxModel``, ``TensorFlowModel`` on the CPU with default
  options (``torch-script``: ``TorchModel(script=True)``), called with the same batch
  (its size is a bucket: no padding rows).

Both are warmed up (traced, compiled) first. ``--jax_sync_dispatch`` turns JAX's
asynchronous dispatch on the CPU off (a process-wide setting, before JAX runs), which
makes both JAX sides several times faster for small batches here. Rounds alternate the order of the two, and
each takes the mean over ``--calls`` calls (at least ``--min_s`` seconds); the report
gives, per framework and size, the range over rounds of the time per batch and of the
overhead ``adapter / direct - 1`` (goal: at most 5 %). Prints one JSON object and
writes it to ``results/benchmarks/adapters.json``.

Usage: python benchmarks/adapters.py [--sizes 1 16 256 1024] [--rounds 7]
[--frameworks torch torch-script jax tensorflow] [--out results/benchmarks/adapters.json]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import platform
import statistics
import time
from typing import Callable, Dict, List

import numpy as np

from async_search.base import TensorSpec
from async_search.files import write_file

Call = Callable[[np.ndarray], np.ndarray]


def weights(args: argparse.Namespace) -> List[np.ndarray]:
    rng = np.random.default_rng(0)
    sizes = [args.input, args.hidden, args.hidden, 1]
    out = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        out += [rng.standard_normal((fan_in, fan_out)).astype(np.float32) / np.sqrt(fan_in),
                np.zeros(fan_out, np.float32)]
    return out


def torch_pair(w: List[np.ndarray], spec: TensorSpec, sizes: List[int],
               script: bool = False):
    import torch
    from async_search.models import TorchModel

    layers = []
    for i in range(0, len(w), 2):
        linear = torch.nn.Linear(*w[i].shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(w[i].T.copy()))
            linear.bias.copy_(torch.from_numpy(w[i + 1]))
        layers += [linear, torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers[:-1]).eval()
    adapter = TorchModel(net, input_spec=spec, device="cpu", batch_sizes=sizes,
                         script=script)
    # torch-script: the compiled module the adapter runs, called directly
    compiled = getattr(adapter._runner.forward, "compiled", net)

    def direct(x):
        with torch.inference_mode():
            return compiled(torch.from_numpy(x)).numpy()

    return direct, adapter


def torch_script_pair(w: List[np.ndarray], spec: TensorSpec, sizes: List[int]):
    """TorchModel(script=True) against calling its TorchScript module directly."""
    return torch_pair(w, spec, sizes, script=True)


def jax_pair(w: List[np.ndarray], spec: TensorSpec, sizes: List[int]):
    import jax
    import jax.numpy as jnp
    from async_search.models import JaxModel

    def apply(params, x):
        h = x
        for i in range(0, len(params), 2):
            h = h @ params[i] + params[i + 1]
            if i + 2 < len(params):
                h = jnp.maximum(h, 0)
        return h

    params = [jnp.asarray(a) for a in w]
    jitted = jax.jit(apply)

    def direct(x):
        return np.asarray(jitted(params, x))

    return direct, JaxModel(apply, w, input_spec=spec, device="cpu", batch_sizes=sizes)


def tensorflow_pair(w: List[np.ndarray], spec: TensorSpec, sizes: List[int]):
    import tensorflow as tf
    from async_search.models import TensorFlowModel

    net = tf.keras.Sequential(
        [tf.keras.Input(spec.shape)]
        + [tf.keras.layers.Dense(w[i].shape[1], "relu" if i + 2 < len(w) else None)
           for i in range(0, len(w), 2)])
    net.set_weights(w)
    function = tf.function(lambda x: net(x, training=False))
    traced = {n: function.get_concrete_function(tf.TensorSpec((n, *spec.shape), tf.float32))
              for n in sizes}

    def direct(x):
        with tf.device("/CPU:0"):
            return traced[len(x)](tf.constant(x)).numpy()

    return direct, TensorFlowModel(net, spec, device="/CPU:0", batch_sizes=sizes)


PAIRS = {"torch": ("torch", torch_pair), "torch-script": ("torch", torch_script_pair),
         "jax": ("jax", jax_pair),
         "tensorflow": ("tensorflow", tensorflow_pair)}


def time_per_call(call: Call, x: np.ndarray, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call(x)
    return (time.perf_counter() - start) / calls


def calibrate(call: Call, x: np.ndarray, min_s: float, least: int) -> int:
    """Calls enough for ``min_s`` seconds of the slower side (at least ``least``)."""
    once = time_per_call(call, x, 3)
    return max(least, int(min_s / max(once, 1e-7)))


def measure(direct: Call, adapter: Call, spec: TensorSpec, sizes: List[int],
            args: argparse.Namespace) -> Dict[str, dict]:
    rng = np.random.default_rng(1)
    out = {}
    inputs = {n: rng.standard_normal(spec.batch_shape(n)).astype(np.float32) for n in sizes}
    for n, x in inputs.items():  # warm up and check that the two agree
        np.testing.assert_allclose(adapter(x), direct(x), rtol=1e-4, atol=1e-4)
    calls = {n: calibrate(direct, x, args.min_s, args.calls) for n, x in inputs.items()}
    samples = {n: {"direct": [], "adapter": []} for n in sizes}
    for round_ in range(args.rounds):
        for n, x in inputs.items():
            order = [("direct", direct), ("adapter", adapter)]
            if round_ % 2:
                order.reverse()
            for side, call in order:
                samples[n][side].append(time_per_call(call, x, calls[n]))
    for n in sizes:
        direct_s, adapter_s = samples[n]["direct"], samples[n]["adapter"]
        overheads = [a / d - 1 for a, d in zip(adapter_s, direct_s)]
        out[str(n)] = {
            "calls_per_round": calls[n],
            "direct_us": [round(min(direct_s) * 1e6, 1), round(max(direct_s) * 1e6, 1)],
            "adapter_us": [round(min(adapter_s) * 1e6, 1), round(max(adapter_s) * 1e6, 1)],
            "overhead": {"min": round(min(overheads), 4),
                         "median": round(statistics.median(overheads), 4),
                         "max": round(max(overheads), 4)},
            "overhead_of_medians_us": round(
                (statistics.median(adapter_s) - statistics.median(direct_s)) * 1e6, 1),
        }
    return out



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 16, 256, 1024])
    parser.add_argument("--input", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20, help="the fewest calls a round")
    parser.add_argument("--min_s", type=float, default=0.3,
                        help="seconds of calls per side, round and size")
    parser.add_argument("--jax_sync_dispatch", action="store_true",
                        help="jax_cpu_enable_async_dispatch=False, set before JAX runs")
    parser.add_argument("--out", default="results/benchmarks/adapters.json")
    args = parser.parse_args()
    for name in ("input", "hidden", "rounds", "calls"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if min(args.sizes) < 1:
        parser.error(f"--sizes must be integers >= 1, got {args.sizes}")
    if not 0 <= args.min_s < math.inf:
        parser.error(f"--min_s must be >= 0 seconds, got {args.min_s}")
    if args.jax_sync_dispatch:
        import jax
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    spec = TensorSpec((args.input,), np.float32)
    sizes = sorted(set(args.sizes))
    w = weights(args)
    report = {
        "workload": {**vars(args),
                     "net": f"MLP {args.input}-{args.hidden}-{args.hidden}-1"},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "goal": "overhead (adapter / direct - 1) at most 0.05 per batch",
        "frameworks": {},
    }
    for name in args.frameworks:
        module, make = PAIRS[name]
        if importlib.util.find_spec(module) is None:
            report["frameworks"][name] = {"skipped": f"{module} is not installed"}
            continue
        direct, adapter = make(w, spec, sizes)
        version = importlib.import_module(module).__version__
        report["frameworks"][name] = {"version": version,
                                      "sizes": measure(direct, adapter, spec, sizes, args)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        write_file(args.out, text + "\n")


if __name__ == "__main__":
    main()
