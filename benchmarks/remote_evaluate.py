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

``--versus grpc`` compares the two protocols instead: the same front serves HTTP and
gRPC (``--grpc-port``), and each round runs the searches through ``RemoteEvaluate``
and through ``GrpcRemoteEvaluate``; the figure is grpc/http.

Prints one JSON object and writes it to results/benchmarks/remote_evaluate.json
(remote_evaluate_grpc.json with ``--versus grpc``).
Usage: python benchmarks/remote_evaluate.py [--rounds 5] [--max_connections 4]
       [--versus process|grpc]
"""

from __future__ import annotations

import argparse
import asyncio
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
from async_search.http.client import RemoteEvaluate

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


def run_remote(search_fn, starts, url, name, max_connections, protocol="http"):
    """The searches in a fresh child process, as the process backend runs them."""
    # A Pool ends its child when it is left, also when a stop (SIGTERM, Ctrl-C) leaves
    # it mid-round; a ProcessPoolExecutor would wait for the round (~20 s) first.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(remote_searches, (search_fn, starts, url, name,
                                            max_connections, protocol))


def remote_searches(search_fn, starts, url, name, max_connections, protocol="http"):
    if protocol == "grpc":
        from async_search.http.grpc_client import GrpcRemoteEvaluate as client
    else:
        client = RemoteEvaluate

    async def main():
        async with client(url, name, max_connections=max_connections) as ev:
            outcomes = await asyncio.gather(*(search_fn(s, ev) for s in starts))
            stats = ev.stats
            return list(outcomes), stats.get("mean_requests_per_http_request",
                                             stats.get("mean_requests_per_rpc"))

    try:
        import uvloop
        return uvloop.run(main())
    except ImportError:
        return asyncio.run(main())


class Front:
    """``python -m async_search.http`` serving this module's factory, in a child."""

    def __init__(self, factory: str, name: str, grpc: bool = False):
        self.argv = [sys.executable, "-m", "async_search.http", "--model",
                     f"benchmarks.remote_evaluate:{factory}", "--name", name,
                     "--port", "0", "--max-batch-size", "1024"]
        if grpc:
            self.argv += ["--grpc-port", "0"]
        self.name = name
        self.grpc = grpc
        self.grpc_address = None

    def __enter__(self):
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get(
            "PYTHONPATH", "")}
        self.process = subprocess.Popen(self.argv, cwd=ROOT, env=env,
                                        stderr=subprocess.PIPE)
        match = None
        lines = []  # what it said, for the error (at its end, readline gives b"")
        try:
            for _ in range(100):
                line = self.process.stderr.readline()
                lines.append(line)
                match = match or re.search(rb"http://127\.0\.0\.1:(\d+)", line)
                grpc = re.search(rb"grpc://(127\.0\.0\.1:\d+)", line)
                if grpc:
                    self.grpc_address = grpc.group(1).decode()
                if (match and (self.grpc_address or not self.grpc)) or not line:
                    break
        except BaseException:  # stopped while it starts (Ctrl-C, SIGTERM): it ends too
            self.process.kill()
            self.process.wait(10)
            raise
        if not match or (self.grpc and not self.grpc_address):
            self.process.kill()
            said = b"".join(lines[-5:]).decode(errors="replace").strip()
            raise RuntimeError(f"the front did not start; it said: {said or '(nothing)'}")
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
    """Rounds of the two ways (``base``, ``other``), alternating which goes first."""
    rounds, equal = [], True
    grpc = args.versus == "grpc"
    base, other = ("http", "grpc") if grpc else ("process", "remote")
    with Front(factory_name, workload, grpc=grpc) as front:
        where = {"remote": (front.url, "http"), "http": (front.url, "http"),
                 "grpc": (front.grpc_address, "grpc")}
        for way in (base, other):  # warm up
            if way != "process":
                run_remote(search_fn, starts[:2], where[way][0], workload, 1,
                           where[way][1])
        for r in range(args.rounds):
            row = {}
            for way in ((base, other) if r % 2 == 0 else (other, base)):
                if way == "process":
                    outcomes = run_process(search_fn, starts, factory)
                else:
                    url, protocol = where[way]
                    outcomes, coalesced = run_remote(search_fn, starts, url, workload,
                                                     args.max_connections, protocol)
                    row[f"{way}_requests_per_call"] = round(coalesced, 1)
                row[way] = outcomes
            if workload == "search":
                equal &= [o[0] for o in row[base]] == [o[0] for o in row[other]]
            p, q = rate(row.pop(base)), rate(row.pop(other))
            rounds.append({f"{base}_per_s": round(p), f"{other}_per_s": round(q),
                           "ratio": round(q / p, 3), **row})
            print(workload, rounds[-1], file=sys.stderr)
    ratios = [r["ratio"] for r in rounds]
    result = {"rounds": rounds, "ratio_range": [min(ratios), max(ratios)],
              "ratio_median": float(np.median(ratios))}
    if workload == "search":
        result["equal_results"] = equal
    return result


def main() -> None:
    # SIGTERM (timeout, kill) ends the run as Ctrl-C does, so that the servers and
    # children it started end with it (they outlived it, re-parented to init).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--coroutines", default="64,512",
                        help="coroutines of the transport workload, one run each")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--searches", type=int, default=64)
    parser.add_argument("--max_connections", type=int, default=4)
    parser.add_argument("--versus", choices=["process", "grpc"], default="process",
                        help="what RemoteEvaluate over HTTP is compared with")
    parser.add_argument("--out", default=None,
                        help="default: results/benchmarks/remote_evaluate[_grpc].json")
    args = parser.parse_args()
    for name in ("rounds", "requests", "searches", "max_connections"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    try:
        coroutines = [int(c) for c in args.coroutines.split(",")]
    except ValueError:
        coroutines = []
    if not coroutines or min(coroutines) < 1:
        parser.error(f"--coroutines takes comma-separated integers >= 1, "
                     f"not {args.coroutines!r}")
    if args.out is None:
        args.out = OUT if args.versus == "process" else OUT.replace(".json", "_grpc.json")
    puzzle_starts = [PUZZLE.scramble(40, seed=s) for s in range(args.searches)]
    report = {
        "machine": {"cpus": os.cpu_count()},
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "ratio": "grpc/http" if args.versus == "grpc" else "remote/process",
        **{f"transport_{c}": measure(args, "transport", sequential_requests,
                                     [args.requests] * c, trivial_model, "trivial_model")
           for c in coroutines},
        "search": measure(args, "search", astar, puzzle_starts, heuristic, "heuristic"),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:  # (a bare file name has no folder to make)
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
