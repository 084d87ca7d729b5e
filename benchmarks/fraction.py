"""Fraction of wall time in the model, with a 2 ms model and searches that keep it fed.

The model sleeps about 2 ms per batch (releasing the GIL, as a GPU kernel would) and
returns its input. Each of --coroutines searches loops: some CPU work (--cpu_us of busy
arithmetic), then one request of --elements elements. The server runs the model in its
device thread with pipeline_depth batches in flight. A search waits for its own result
before it can ask again, so the model is kept fed when the searches form at least two
batches (coroutines = 2 x batch_size by default): one group expands its nodes while the
other group's batch is in the model. Prints one JSON object.

Usage: python benchmarks/fraction.py [--coroutines 256] [--batch_size 128] [--steps 100]
[--cpu_us 5] [--pipeline_depth 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time

import numpy as np

import async_search as asr
from async_search.models import with_spec


def two_ms_model(x: np.ndarray) -> np.ndarray:
    time.sleep(0.002)
    return x


def busy(microseconds: float) -> None:
    end = time.perf_counter() + microseconds * 1e-6
    while time.perf_counter() < end:
        pass


async def run(args) -> dict:
    model = with_spec(two_ms_model, (8,), np.float32)
    x = np.ones((args.elements, 8), np.float32)
    async with asr.serve(model, max_batch_size=args.batch_size,
                         pipeline_depth=args.pipeline_depth) as evaluate:
        async def search():
            for _ in range(args.steps):
                busy(args.cpu_us)
                await evaluate(x)

        await asyncio.gather(*(search() for _ in range(args.coroutines)))
        return evaluate.stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coroutines", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--elements", type=int, default=1)
    parser.add_argument("--cpu_us", type=float, default=5.0)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--pipeline_depth", type=int, default=2)
    args = parser.parse_args()
    for name in ("coroutines", "steps", "elements", "batch_size", "pipeline_depth"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if not 0 <= args.cpu_us < math.inf:  # NaN too (it was printed, as no JSON)
        parser.error(f"--cpu_us must be >= 0, got {args.cpu_us}")
    stats = asyncio.run(run(args))
    print(json.dumps({
        "workload": vars(args),
        "fraction_in_model": round(stats["fraction_in_model"], 4),
        "batches": stats["batches"],
        "mean_batch_size": round(stats["mean_batch_size"], 1),
        "model_time_s": round(stats["model_time_s"], 3),
        "wall_time_s": round(stats["wall_time_s"], 3),
        "reasons": stats["reasons"],
    }, indent=2))


if __name__ == "__main__":
    main()
