"""One side of ``adapters.py``'s pairs, called in a loop: to count its instructions.

Timings of a one-row call swing by more than the few microseconds an adapter adds on
this host, so the adapter overhead goal (issue 18: at most 5 % over calling the
framework directly) is also read by instructions. Run this under callgrind twice, with
two numbers of calls, and take the difference over the difference in calls: start-up
and warm-up cancel.

    OMP_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file=/tmp/a1 \\
        python benchmarks/adapter_calls.py --framework torch --side adapter --calls 1000
    (... --calls 3000; then (I(3000) - I(1000)) / 2000 instructions a call)

Two things move the count from run to run and are best taken out: string hashing
(dict lookups move by 1.5k-13k instructions a call: set ``PYTHONHASHSEED=0`` on both
sides), and for TensorFlow its Eigen thread pool's idle threads spinning for work
(``ThreadPoolTempl::MaybeGetTask``, 86k-92k instructions a call, which callgrind
counts with the rest): subtract the functions of ``Eigen::ThreadPoolTempl`` and
``EventCount`` from each total before taking the difference.

The net, the weights and the two sides are ``adapters.py``'s (the MLP 256-256-256-1, the
framework called directly on exactly the rows given, and its adapter); frameworks run on
one thread. Results: docs/benchmarks.md, "Framework adapters".

Usage: python benchmarks/adapter_calls.py --framework {torch,jax,tensorflow}
--side {direct,adapter} [--calls 1000] [--warmup 300] [--rows 1]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from async_search.base import TensorSpec  # noqa: E402

import adapters  # noqa: E402 - the pairs


def one_thread(framework: str) -> None:
    """The framework on one thread, so that callgrind counts one thread's work."""
    if framework == "torch":
        import torch
        torch.set_num_threads(1)
    elif framework == "tensorflow":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--framework", choices=sorted(adapters.PAIRS), required=True)
    p.add_argument("--side", choices=("direct", "adapter"), required=True)
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--input", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    args = p.parse_args(argv)
    if min(args.calls, args.rows) < 1 or args.warmup < 0:
        p.error("--calls and --rows >= 1, --warmup >= 0")
    if min(args.input, args.hidden) < 1:
        p.error(f"--input and --hidden must be integers >= 1, got {args.input} and "
                f"{args.hidden}")
    one_thread(args.framework)
    _, make = adapters.PAIRS[args.framework]
    spec = TensorSpec((args.input,), np.float32)
    direct, model = make(adapters.weights(args), spec, sorted({1, 16, args.rows}))
    x = np.random.default_rng(0).standard_normal((args.rows, args.input)).astype(
        np.float32)
    np.testing.assert_allclose(model(x), direct(x), rtol=1e-4, atol=1e-4)
    call = direct if args.side == "direct" else model
    for _ in range(args.warmup):
        call(x)
    for _ in range(args.calls):
        call(x)
    return args.calls


if __name__ == "__main__":
    main()
