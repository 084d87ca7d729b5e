"""Requests per second across backends, against the prototype's per-request messages.

Workload A (transport): every client runs --coroutines coroutines, each making
--requests sequential requests of one element to a trivial NumPy model, which the
servers run on their loops (model_thread=False: the model takes microseconds, as in the
baseline, whose server calls it inline). Runs: local;
process with 1 and 2 clients; ray with 1 and 2 clients; and the prototype's design, one
message per request over multiprocessing.Manager() queues and over plain multiprocessing
queues, with the client flushing by polling (2 clients x 32 coroutines, as measured
for the prototype), beside the process backend on that same shape. Every event loop,
the baseline's included, runs on uvloop when it is installed. Rates are taken from the
first to the last request served: process and actor start-up is left out (and given
apart as end_to_end_s).

Workload B (scaling): A* on SyntheticGraph with --node_cost_us of CPU per expansion, so
that the searches' CPU work dominates: the process backend with 1 and 2 clients.

Prints one JSON object. Usage: python benchmarks/backends.py [--requests 100] [--no_ray]

``--ray_ratio N`` runs only Ray against the process backend: N rounds, each measuring
process and Ray with 1 client in turn (and 2 clients with ``--clients 1,2``), and prints
each round's ray/process ratio, so that both are measured under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import multiprocessing
import queue
import signal
import sys
import time

import numpy as np

import async_search as asr
from async_search import problems, search
from async_search.connections import get_connected_functions
from async_search.models import with_spec


def trivial_model():
    return with_spec(lambda x: x * 2.0, (4,), np.float32)


async def sequential_requests(count, evaluate):
    x = np.ones((1, 4), np.float32)
    for _ in range(count):
        await evaluate(x)
    return count


def steady_rate(stats):
    """Elements per second between the first and the last batch: start-up excluded."""
    trace = stats["trace"]
    span = trace[-1].finished_s - trace[0].finished_s
    return sum(r.size for r in trace[1:]) / span


def run_backend(backend, num_procs, coroutines, requests, **kwargs):
    starts = [requests] * (coroutines * num_procs)
    start = time.perf_counter()
    out = asr.run_searches(sequential_requests, starts, trivial_model, backend=backend,
                           num_procs=num_procs, max_batch_size=1024, use_uvloop=True,
                           model_thread=False, **kwargs)
    seconds = time.perf_counter() - start  # start-up of processes and actors included
    rate = steady_rate(out.stats)
    row = {"clients": num_procs, "coroutines_per_client": coroutines,
           "requests_per_s": round(rate), "us_per_request": round(1e6 / rate, 2),
           "mean_batch_size": round(out.stats["mean_batch_size"], 1),
           "end_to_end_s": round(seconds, 3)}
    if "transports" in out.stats:  # Ray: direct sockets, or actor calls
        row["transports"] = sorted({t for ways in out.stats["transports"] for t in ways})
    return row


# -- the prototype's design: a message per request, clients flush by polling ----------
def _prototype_client(fn, coroutines, requests, done):
    async def one():
        x = np.ones((1, 4), np.float32)
        for _ in range(requests):
            await fn(x)

    async def main():
        searches = asyncio.gather(*(one() for _ in range(coroutines)))
        while not searches.done():
            fn.flush()
            await asyncio.sleep(0)
        await searches

    try:
        import uvloop
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
    done.put(True)


def run_prototype(queue_kind, num_clients, coroutines, requests):
    context = multiprocessing.get_context("spawn")
    manager = context.Manager() if queue_kind == "manager" else None
    factory = manager.Queue if manager else context.Queue
    fns, server = get_connected_functions(factory, num_clients, ordered=True)
    done = context.Queue()
    model = trivial_model()
    clients = [context.Process(target=_prototype_client, args=(fn, coroutines, requests, done))
               for fn in fns]
    try:
        for c in clients:
            c.start()
        finished, served, start = 0, 0, None
        while finished < num_clients:
            try:
                first = server.recv(timeout=0.01)
            except queue.Empty:
                while not done.empty():
                    done.get()
                    finished += 1
                continue
            if start is None:  # timed from the first request: start-up excluded
                start = time.perf_counter()
            items = [first]
            while server.poll():
                items.append(server.recv())
            y = model(np.concatenate(items))
            for i in range(len(items)):  # in the order received: the prototype's
                server.send(y[i:i + 1])  # forked pipe sends each back to its client
            served += len(items)
            if served == num_clients * coroutines * requests:
                end = time.perf_counter()
        seconds = end - start
        for c in clients:
            c.join()
    finally:  # a stop (Ctrl-C, SIGTERM) mid-run ends the clients it started
        for c in clients:
            if c.is_alive():
                c.terminate()
                c.join(5)
        if manager is not None:
            manager.shutdown()
    total = num_clients * coroutines * requests
    return {"clients": num_clients, "coroutines_per_client": coroutines,
            "requests_per_s": round(total / seconds),
            "us_per_request": round(1e6 * seconds / total, 2), "seconds": round(seconds, 3)}


# -- workload B: CPU-heavy searches ----------------------------------------------------
def graph(node_cost_us):
    return problems.SyntheticGraph(branching=4, depth=8, node_cost_us=node_cost_us, seed=3)


def graph_heuristic(node_cost_us):
    return problems.DepthHeuristic(graph(node_cost_us))


async def graph_astar(node_cost_us, start, evaluate):
    g = graph(node_cost_us)
    return await search.batched_astar(g, g.start(start), evaluate, budget=2000,
                                      buffer_size=2)


def run_scaling(num_procs, num_searches, node_cost_us):
    fn = functools.partial(graph_astar, node_cost_us)
    start = time.perf_counter()
    out = asr.run_searches(fn, list(range(num_searches)),
                           functools.partial(graph_heuristic, node_cost_us),
                           backend="process", num_procs=num_procs, max_batch_size=1024,
                           use_uvloop=True)
    seconds = time.perf_counter() - start
    return {"clients": num_procs, "searches": num_searches,
            "expansions": sum(r.nodes_expanded for r in out),
            "evaluations_per_s": round(steady_rate(out.stats)),
            "end_to_end_s": round(seconds, 3), "results": out}


def ray_ratio(args) -> dict:
    """Ray's requests/s over the process backend's, measured in turn, per round."""
    from async_search.ray_init import ensure_ray

    ensure_ray()
    run_backend("ray", 1, 4, 2)  # warm the workers up
    counts = [int(c) for c in args.clients.split(",")]
    rounds = []
    for _ in range(args.ray_ratio):
        row = {}
        for n in counts:
            p = run_backend("process", n, args.coroutines, args.requests)
            r = run_backend("ray", n, args.coroutines, args.requests)
            row[f"x{n}"] = {"process": p["requests_per_s"], "ray": r["requests_per_s"],
                            "ratio": round(r["requests_per_s"] / p["requests_per_s"], 3),
                            "ray_transports": r["transports"]}
        rounds.append(row)
    summary = {f"x{n}": [min(r[f"x{n}"]["ratio"] for r in rounds),
                         max(r[f"x{n}"]["ratio"] for r in rounds)] for n in counts}
    return {"coroutines": args.coroutines, "requests": args.requests, "rounds": rounds,
            "ratio_range": summary}


def main() -> None:
    # SIGTERM (timeout, kill) ends the run as Ctrl-C does, so that the processes it
    # started end with it.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coroutines", type=int, default=64)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--prototype_requests", type=int, default=20)
    parser.add_argument("--searches", type=int, default=128)
    parser.add_argument("--node_cost_us", type=float, default=1000.0)
    parser.add_argument("--no_ray", action="store_true")
    parser.add_argument("--ray_ratio", type=int, default=0,
                        help="only Ray against process: this many alternating rounds")
    parser.add_argument("--clients", default="1",
                        help="client counts for --ray_ratio (comma-separated)")
    args = parser.parse_args()
    for name in ("coroutines", "prototype_requests", "searches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if args.requests < 2:  # the rate is taken between the first batch and the last
        parser.error(f"--requests must be an integer >= 2, got {args.requests}")
    if args.ray_ratio < 0:
        parser.error(f"--ray_ratio must be an integer >= 0, got {args.ray_ratio}")
    if not 0 <= args.node_cost_us < math.inf:
        parser.error(f"--node_cost_us must be >= 0, got {args.node_cost_us}")
    try:
        clients = [int(c) for c in args.clients.split(",")]
    except ValueError:
        clients = []
    if not clients or min(clients) < 1:
        parser.error(f"--clients takes comma-separated integers >= 1, not {args.clients!r}")
    if args.ray_ratio:
        print(json.dumps(ray_ratio(args), indent=2))
        return

    report = {"workload_a": {}, "workload_b": {}}
    a = report["workload_a"]
    a["local"] = run_backend("local", 1, args.coroutines, args.requests)
    for n in (1, 2):
        a[f"process_{n}"] = run_backend("process", n, args.coroutines, args.requests)
    if not args.no_ray:
        from async_search.backends.ray_backend import ensure_ray
        ensure_ray()
        run_backend("ray", 1, 4, 2)  # warm the workers up
        for n in (1, 2):
            a[f"ray_{n}"] = run_backend("ray", n, args.coroutines, args.requests)
    a["process_2x32"] = run_backend("process", 2, 32, args.requests)
    a["prototype_manager_2x32"] = run_prototype("manager", 2, 32, args.prototype_requests)
    a["prototype_mp_queue_2x32"] = run_prototype("queue", 2, 32, args.prototype_requests)
    a["process_vs_manager_baseline"] = round(
        a["process_2x32"]["requests_per_s"] / a["prototype_manager_2x32"]["requests_per_s"], 1)

    b = report["workload_b"]
    one = run_scaling(1, args.searches, args.node_cost_us)
    two = run_scaling(2, args.searches, args.node_cost_us)
    assert one.pop("results") == two.pop("results"), "1 and 2 clients disagree"
    b.update({"node_cost_us": args.node_cost_us, "process_1": one, "process_2": two,
              "two_vs_one": round(two["evaluations_per_s"] / one["evaluations_per_s"], 2)})
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
