"""RemoteEvaluate against the project's own front, beside the process backend.

Both run the same searches in a fresh child process and the model in another process,
on this machine: the process backend (``run_searches(backend="process", num_procs=1)``:
its client in a child, the server in this process) and ``RemoteEvaluate`` (the searches
in a child, the model behind ``python -m async_search.http`` in another). Every loop is
uvloop's when it is installed. Rates are evaluate calls per second from the first
search's start to the last one's end (process start-up and the client's metadata read
left out). Rounds alternate which goes first; the figure is each round's
remote/process ratio, reported as a range.

Workloads:
- ``transport_C``: C coroutines (--coroutines, a list) each making --requests
  sequential one-element requests to a trivial model (x * 2 on 4 floats): the cost of
  the way there and back, which a round trip of HTTP pays once for the C requests of
  an iteration.
- ``search``: --searches batched A* searches on the 15-puzzle with the shipped learned
  heuristic (``problems.pretrained("15-puzzle")``): node expansion and a real model
  beside the transport. The results of both must be equal (``equal_results``).

Prints one JSON object and writes it to results/benchmarks/remote_evaluate.json.
Usage: python benchmarks/remote_evaluate.py [--rounds 5] [--max_connections 4]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

import async_search as asr
from async_search import problems, search
from async_search.models import with_spec
from async_search.remote_evaluate import RemoteEvaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "results", "benchmarks", "remote_evaluate.json")
PUZZLE = problems.SlidingPuzzle(4)


def trivial_model():
    return with_spec(lambda x: x * 2.0, (4,), np.float32)


def heuristic():
    return problems.pretrained("15-puzzle")


async def sequential_requests(count, evaluate):
    x = np.ones((1, 4), np.float32)
    start = time.time()
    for _ in range(count):
        await evaluate(x)
    return count, start, time.time()


class Counting:
    """Counts the evaluate calls of one search."""

    def __init__(self, evaluate):
        self.evaluate, self.calls = evaluate, 0

    def __call__(self, x):
        self.calls += 1
        return self.evaluate(x)


async def astar(start_state, evaluate, budget=400):
    counting = Counting(evaluate)
    start = time.time()
    result = await search.batched_astar(PUZZLE, start_state, counting, budget=budget,
                                        buffer_size=4)
    return result, counting.calls, start, time.time()


def rate(outcomes) -> float:
    """Evaluate calls per second from the first start to the last end."""
    calls = sum(o[-3] for o in outcomes)
    return calls / (max(o[-1] for o in outcomes) - min(o[-2] for o in outcomes))


# -- the two ways ----------------------------------------------------------------------
def run_process(search_fn, starts, factory):
    out = asr.run_searches(search_fn, starts, factory, backend="process", num_procs=1,
                           max_batch_size=1024, use_uvloop=True)
    return list(out)


def run_remote(search_fn, starts, url, name, max_connections):
    """The searches in a fresh child process, as the process backend runs them."""
    with concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(remote_searches, search_fn, starts, url, name,
                           max_connections).result()


def remote_searches(search_fn, starts, url, name, max_connections):
    async def main():
        async with RemoteEvaluate(url, name, max_connections=max_connections) as ev:
            outcomes = await asyncio.gather(*(search_fn(s, ev) for s in starts))
            return list(outcomes), ev.stats

    try:
        import uvloop
        return uvloop.run(main())
    except ImportError:
        return asyncio.run(main())


class Front:
    """``python -m async_search.http`` serving this module's factory, in a child."""

    def __init__(self, factory: str, name: str):
        self.argv = [sys.executable, "-m", "async_search.http", "--model",
                     f"benchmarks.remote_evaluate:{factory}", "--name", name,
                     "--port", "0", "--max-batch-size", "1024"]
        self.name = name

    def __enter__(self):
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get(
            "PYTHONPATH", "")}
        self.process = subprocess.Popen(self.argv, cwd=ROOT, env=env,
                                        stderr=subprocess.PIPE)
        for _ in range(100):
            line = self.process.stderr.readline()
            match = re.search(rb"http://127\.0\.0\.1:(\d+)", line)
            if match or not line:
                break
        if not match:
            self.process.kill()
            raise RuntimeError(f"the front did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(match.group(1))}"
        return self

    def __exit__(self, *exc):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def measure(args, workload, search_fn, starts, factory, factory_name):
    rounds, equal = [], True
    with Front(factory_name, workload) as front:
        run_remote(search_fn, starts[:2], front.url, workload, 1)  # warm up
        for r in range(args.rounds):
            row = {}
            for way in (("process", "remote") if r % 2 == 0 else ("remote", "process")):
                if way == "process":
                    outcomes = run_process(search_fn, starts, factory)
                else:
                    outcomes, stats = run_remote(search_fn, starts, front.url, workload,
                                                 args.max_connections)
                    row["requests_per_http_request"] = round(
                        stats["mean_requests_per_http_request"], 1)
                row[way] = outcomes
            if workload == "search":
                equal &= [o[0] for o in row["process"]] == [o[0] for o in row["remote"]]
            p, q = rate(row.pop("process")), rate(row.pop("remote"))
            rounds.append({"process_per_s": round(p), "remote_per_s": round(q),
                           "ratio": round(q / p, 3), **row})
            print(workload, rounds[-1], file=sys.stderr)
    ratios = [r["ratio"] for r in rounds]
    result = {"rounds": rounds, "ratio_range": [min(ratios), max(ratios)],
              "ratio_median": float(np.median(ratios))}
    if workload == "search":
        result["equal_results"] = equal
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--coroutines", default="64,512",
                        help="coroutines of the transport workload, one run each")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--searches", type=int, default=64)
    parser.add_argument("--max_connections", type=int, default=4)
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    puzzle_starts = [PUZZLE.scramble(40, seed=s) for s in range(args.searches)]
    report = {
        "machine": {"cpus": os.cpu_count()},
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        **{f"transport_{c}": measure(args, "transport", sequential_requests,
                                     [args.requests] * c, trivial_model, "trivial_model")
           for c in map(int, args.coroutines.split(","))},
        "search": measure(args, "search", astar, puzzle_starts, heuristic, "heuristic"),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
