"""Per-request overhead of serve, against a hand-written batcher and the ceiling.

Workload: 64 coroutines, each making 200 sequential requests of one element, through
a trivial NumPy model. Measured in one run, on the default asyncio loop and on uvloop:

- ceiling: the same coroutines awaiting bare futures that one task resolves in bulk,
  with no arrays at all (the limit for any design with one future per request);
- handwritten: a minimal asyncio batcher (a list of futures, one serving coroutine that
  concatenates the requests, calls the model inline and slices the outputs);
- served: async_search.serve on its defaults (``model_thread="auto"``: the first batch
  in the device thread, then on the loop while a batch takes under 200 us);
- served_thread: async_search.serve with model_thread=True, every batch in the device
  thread (the default before the adaptive placement);
- served_inline: async_search.serve with model_thread=False, the model on the loop as in
  the hand-written batcher.

Peer (asyncio loop, same machine and run): Ray Serve, a deployment whose method is
``@serve.batch(max_batch_size=1024, batch_wait_timeout_s=0)`` over the same model,
called through its DeploymentHandle by the same 64 coroutines (``pip install -e
".[bench]"`` installs ray[serve]; nothing in it is patched). Its rate is taken after a
warm-up round, over ``--ray_serve_requests`` requests per coroutine.

Prints one JSON object and writes it to ``--out`` (results/benchmarks/overhead.json).
Usage: python benchmarks/overhead.py [--coroutines 64] [--requests 200] [--repeats 7]
[--ray_serve_requests 30] [--no_ray_serve] [--out PATH]

With ``--compare TREE`` (a checkout from before a change, e.g. ``git worktree add``)
it measures instead this tree and TREE in turn, each in a fresh process running its own
copy of this script, for ``--rounds`` rounds (the order alternating), and reports for
each serving variant and loop the ratio of requests/s, this tree over TREE, per round:
its range and median (``--out`` then defaults to results/benchmarks/overhead_compare.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import async_search as asr
from async_search.files import write_file
from async_search.models import with_spec


def trivial_model(x: np.ndarray) -> np.ndarray:
    return x * 2.0


async def ceiling(num_coroutines: int, num_requests: int) -> None:
    loop = asyncio.get_running_loop()
    waiting = []
    wake = None

    def request():
        fut = loop.create_future()
        waiting.append(fut)
        if wake is not None and not wake.done():
            wake.set_result(None)
        return fut

    async def client():
        for _ in range(num_requests):
            await request()

    async def server():
        nonlocal wake, waiting
        while True:
            if not waiting:
                wake = loop.create_future()
                await wake
            await asyncio.sleep(0)
            batch, waiting = waiting, []
            for fut in batch:
                fut.set_result(None)

    serving = asyncio.ensure_future(server())
    await asyncio.gather(*(client() for _ in range(num_coroutines)))
    serving.cancel()


async def handwritten(num_coroutines: int, num_requests: int) -> None:
    loop = asyncio.get_running_loop()
    inputs, futures = [], []
    wake = None

    def evaluate(x):
        fut = loop.create_future()
        inputs.append(x)
        futures.append(fut)
        if wake is not None and not wake.done():
            wake.set_result(None)
        return fut

    async def client():
        x = np.ones((1, 4), np.float32)
        for _ in range(num_requests):
            await evaluate(x)

    async def server():
        nonlocal wake, inputs, futures
        while True:
            if not futures:
                wake = loop.create_future()
                await wake
            await asyncio.sleep(0)
            xs, futs, inputs, futures = inputs, futures, [], []
            y = trivial_model(np.concatenate(xs))
            start = 0
            for fut, x in zip(futs, xs):
                stop = start + len(x)
                fut.set_result(y[start:stop])
                start = stop

    serving = asyncio.ensure_future(server())
    await asyncio.gather(*(client() for _ in range(num_coroutines)))
    serving.cancel()


async def served(num_coroutines: int, num_requests: int,
                 model_thread: bool | str = "auto") -> dict:
    model = with_spec(trivial_model, (4,), np.float32)
    async with asr.serve(model, max_batch_size=1024, model_thread=model_thread) as evaluate:
        async def client():
            x = np.ones((1, 4), np.float32)
            for _ in range(num_requests):
                await evaluate(x)

        await asyncio.gather(*(client() for _ in range(num_coroutines)))
        return evaluate.stats


async def served_thread(num_coroutines: int, num_requests: int) -> dict:
    return await served(num_coroutines, num_requests, model_thread=True)


async def served_inline(num_coroutines: int, num_requests: int) -> dict:
    return await served(num_coroutines, num_requests, model_thread=False)


def ray_serve_peer(num_coroutines: int, num_requests: int) -> dict:
    """Requests/s through a Ray Serve ``@serve.batch`` deployment of the same model."""
    try:
        from ray import serve
    except ImportError as e:
        return {"skipped": f"ray[serve] is not installed ({e}): pip install -e '.[bench]'"}
    from async_search.ray_init import ensure_ray

    ensure_ray()
    serve.start(http_options={"location": "NoServer"})

    @serve.deployment(max_ongoing_requests=100_000)
    class Batched:
        @serve.batch(max_batch_size=1024, batch_wait_timeout_s=0.0)
        async def __call__(self, xs):
            y = trivial_model(np.concatenate(xs))
            return [y[i:i + 1] for i in range(len(xs))]

    handle = serve.run(Batched.bind(), name="overhead", route_prefix=None)

    async def run(count):
        x = np.ones((1, 4), np.float32)

        async def client():
            for _ in range(count):
                await handle.remote(x)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(num_coroutines)))
        return time.perf_counter() - start

    try:
        asyncio.run(run(3))  # warm-up: replicas, routers, first batches
        seconds = asyncio.run(run(num_requests))
    finally:
        serve.shutdown()
        import ray

        ray.shutdown()  # before the report: Ray's shutdown messages come out on stdout
    total = num_coroutines * num_requests
    return {"requests_per_s": round(total / seconds),
            "us_per_request": round(1e6 * seconds / total, 3)}


def measure(make_loop, workloads, num_coroutines, num_requests, repeats):
    """Best time of each workload over ``repeats`` rounds; each round runs every workload
    once, in turn, so that the machine's slow spells fall on all of them alike."""
    best = {w.__name__: float("inf") for w in workloads}
    for _ in range(repeats):
        for workload in workloads:
            loop = make_loop()
            try:
                start = time.perf_counter()
                loop.run_until_complete(workload(num_coroutines, num_requests))
                seconds = time.perf_counter() - start
            finally:
                loop.close()
            best[workload.__name__] = min(best[workload.__name__], seconds)
    total = num_coroutines * num_requests
    return {name: {"requests_per_s": round(total / seconds),
                   "us_per_request": round(1e6 * seconds / total, 3)}
            for name, seconds in best.items()}


def run_tree(tree: str, args: argparse.Namespace) -> dict:
    """``benchmarks/overhead.py`` of ``tree`` run on ``tree``'s package, in a fresh
    process (Ray Serve left out): its report."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "overhead.json")
        env = dict(os.environ, PYTHONPATH=tree)  # tree's package before any installed
        subprocess.run([sys.executable, os.path.join(tree, "benchmarks", "overhead.py"),
                        "--coroutines", str(args.coroutines),
                        "--requests", str(args.requests), "--repeats", str(args.repeats),
                        "--no_ray_serve", "--out", out], cwd=tree, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def revision(tree: str) -> str:
    """The commit ``tree`` is checked out at ("unknown" outside git), "+" if modified."""
    try:
        head = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def compare(other_tree: str, args: argparse.Namespace) -> dict:
    """Requests/s of this tree over ``other_tree``'s, per round, alternating."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    other = os.path.abspath(other_tree)
    ratios: dict = {}
    for round_ in range(args.rounds):
        trees = (here, other) if round_ % 2 == 0 else (other, here)
        reports = dict(zip(trees, (run_tree(tree, args) for tree in trees)))
        for loop, figures in reports[here]["loops"].items():
            before = reports[other]["loops"].get(loop, {})
            for variant in ("served", "served_thread", "served_inline", "handwritten"):
                if variant in figures and variant in before:
                    ratios.setdefault(f"{loop}/{variant}", []).append(
                        figures[variant]["requests_per_s"]
                        / before[variant]["requests_per_s"])
    return {name: {"min": round(min(r), 3), "median": round(statistics.median(r), 3),
                   "max": round(max(r), 3), "rounds": [round(x, 3) for x in r]}
            for name, r in ratios.items()}


def main() -> None:
    # SIGTERM (timeout, kill) ends the run as Ctrl-C does, so that the servers and
    # children it started end with it (they outlived it, re-parented to init).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coroutines", type=int, default=64)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7,
                        help="rounds; each figure is its best round")
    parser.add_argument("--ray_serve_requests", type=int, default=30)
    parser.add_argument("--no_ray_serve", action="store_true")
    parser.add_argument("--out", default=None,
                        help="default: results/benchmarks/overhead.json, or "
                             "overhead_compare.json with --compare")
    parser.add_argument("--compare", metavar="TREE",
                        help="a checkout to measure against, alternating")
    parser.add_argument("--rounds", type=int, default=6,
                        help="with --compare: rounds, each tree once a round")
    args = parser.parse_args()
    for name in ("coroutines", "requests", "repeats", "ray_serve_requests", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if args.compare and not os.path.isdir(os.path.join(args.compare, "benchmarks")):
        parser.error(f"--compare {args.compare}: not a checkout (no benchmarks folder)")
    if args.compare:
        report = {"workload": {"coroutines": args.coroutines,
                               "requests_each": args.requests, "repeats": args.repeats},
                  "this_tree": revision(os.path.dirname(os.path.dirname(
                      os.path.abspath(__file__)))),
                  "compared_with": revision(args.compare),
                  "after_over_before_requests_per_s": compare(args.compare, args)}
        text = json.dumps(report, indent=2)
        print(text)
        write_file(args.out or "results/benchmarks/overhead_compare.json", text + "\n")
        return

    loops = {"asyncio": asyncio.new_event_loop}
    try:
        import uvloop
        loops["uvloop"] = uvloop.new_event_loop
    except ImportError:
        pass
    report = {"workload": {"coroutines": args.coroutines, "requests_each": args.requests,
                           "elements_per_request": 1},
              "python": platform.python_version(), "loops": {}}
    for name, make_loop in loops.items():
        figures = measure(make_loop, (ceiling, handwritten, served, served_thread,
                                      served_inline),
                          args.coroutines, args.requests, args.repeats)
        for variant in ("served", "served_thread", "served_inline"):
            rate = figures[variant]["requests_per_s"]
            figures[f"{variant}_vs_handwritten"] = round(
                rate / figures["handwritten"]["requests_per_s"], 3)
            figures[f"{variant}_vs_ceiling"] = round(
                rate / figures["ceiling"]["requests_per_s"], 3)
        report["loops"][name] = figures
    if not args.no_ray_serve:
        peer = ray_serve_peer(args.coroutines, args.ray_serve_requests)
        report["ray_serve"] = peer
        if "requests_per_s" in peer:
            report["served_vs_ray_serve"] = round(
                report["loops"]["asyncio"]["served"]["requests_per_s"]
                / peer["requests_per_s"], 1)
    text = json.dumps(report, indent=2)
    print(text)
    write_file(args.out or "results/benchmarks/overhead.json", text + "\n")


if __name__ == "__main__":
    main()
