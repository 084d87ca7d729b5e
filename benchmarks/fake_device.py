"""The serving core against a fake accelerator: does it keep a device busy, and what do
the device thread's trips for the GIL cost?

The GPU goal (issue 18) asks that the device compute at least 90 % of the time. On a
machine without one, this stands in for it: a model that takes ``--ms`` milliseconds a
batch whatever its size, in ``--trips`` sleeps that let go of the GIL (as a CUDA
synchronize does): 1 trip is a device that runs a whole batch as one call (a CUDA
graph, a jitted JAX function), 60 one that needs the GIL between its layers (an eager
PyTorch pass launches each layer from Python). Searches run in one process around
``asr.serve`` on uvloop: MCTS on Connect Four (8 leaves a round) and batched A* on the
15-puzzle (4 nodes a step), their outputs constant.

Per run: ``nodes_per_s``, ``mean_batch``, ``device_busy_fraction`` (the batches'
device time, ``--ms`` each plus ``--us-per-row`` a row, over the wall time: the fake
device's own work, without the waits for the GIL inside it), ``batch_wall_ms`` (the
device thread's time a batch, waits included) and ``loop_cpu`` (the fraction of a core
the searches' loop used). A device slower than the searches should be kept busy (the
goal); one faster than them leaves the loop busy instead. Prints one JSON object.

``--max-batch-size 4096,1024,auto`` runs each cap in turn (``auto``: the run records
what ``max_batch_size="auto"`` chose and measured); ``--ms 0.7 --us-per-row 0.65`` is
about the H200's cost-to-go net (0.75 ms a batch of one, 3.4 ms one of 4096).

``--clients N`` runs the searches through the process backend instead: ``--searches``
in each of N client processes, served here (``serving_loop_cpu``, ``clients_cpu``,
``clients_busy``):
how many searches a client needs to cover its round trip (a client's searches answer
together and ask again together, so it has one message in flight).

``--client-waves 1,2`` (with ``--clients``) runs each with the clients' requests in
that many messages in flight (``run_searches(client_waves=...)``).

Usage: python benchmarks/fake_device.py [--ms 2,10,30] [--trips 1,60] [--searches 1024]
[--us-per-row 0] [--max-batch-size 4096] [--rounds 1] [--clients N] [--client-waves 1]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import math
import os
import sys
import time
from typing import Any, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import async_search as asr  # noqa: E402
from async_search.event_loops import loop_factory  # noqa: E402

import gpu  # noqa: E402 - the searches and their starts


class FakeDevice:
    """A model of ``ms`` milliseconds a batch plus ``us_per_row`` microseconds a row,
    in ``trips`` sleeps, with constant outputs; counts its batches, their device time
    and the device thread's wall time in them."""

    def __init__(self, kind: str, ms: float, trips: int, us_per_row: float = 0.0):
        self.kind, self.seconds, self.trips = kind, ms / 1e3, trips
        self.per_row = us_per_row / 1e6
        self.batches = 0
        self.busy = 0.0
        self.wall = 0.0

    def __call__(self, x: np.ndarray) -> Any:
        began = time.perf_counter()
        n = len(x)
        seconds = self.seconds + self.per_row * n
        for _ in range(self.trips):
            time.sleep(seconds / self.trips)
        self.batches += 1
        self.busy += seconds
        out = ((np.zeros((n, 7), np.float32), np.zeros((n, 1), np.float32))
               if self.kind == "mcts" else np.zeros((n, 1), np.float32))
        self.wall += time.perf_counter() - began
        return out


async def one_run(kind: str, searches: int, budget: int, ms: float, trips: int,
                  max_batch_size: Any, us_per_row: float = 0.0,
                  clients: int | None = None, client_waves: int = 1) -> dict:
    """One run: ``searches`` searches around ``asr.serve`` in this process or, with
    ``clients``, that many searches in each of ``clients`` client processes of the
    process backend, served here."""
    device = FakeDevice(kind, ms, trips, us_per_row)
    if kind == "mcts":
        starts = gpu.game_starts(searches * (clients or 1))
        search = functools.partial(gpu.mcts, budget, 8)
    else:
        starts = gpu.puzzle_starts(searches * (clients or 1), 100)
        search = functools.partial(gpu.astar, budget, 4)
    clock = gpu.CpuClock()
    auto = None
    if clients is None:
        async with asr.serve(device, max_batch_size=max_batch_size,
                             model_thread=True) as evaluate:
            nodes = sum(await asyncio.gather(*(search(s, evaluate) for s in starts)))
            sizes = [r.size for r in evaluate.trace]
            auto = evaluate.stats.get("auto_batch_size")
        wall = time.perf_counter() - clock.wall
    else:
        out = await asr.run_searches_async(
            search, starts, lambda: device, backend="process", num_procs=clients,
            max_batch_size=max_batch_size, model_thread=True, use_uvloop=True,
            **gpu.waves_option(client_waves))
        nodes, trace = sum(out), out.stats["trace"]
        sizes = [r.size for r in trace]
        wall = gpu.served_seconds(trace)
    record = {"search": kind, "searches": searches, "ms_per_batch": ms,
              "us_per_row": us_per_row, "trips": trips, "max_batch_size": max_batch_size,
              "nodes": nodes, "nodes_per_s": round(nodes / wall),
              "wall_s": round(wall, 2),
              "mean_batch": round(np.mean(sizes), 1),
              "device_busy_fraction": round(device.busy / wall, 3),
              "batch_wall_ms": round(device.wall / max(device.batches, 1) * 1e3, 2)}
    if clients is None:
        record["loop_cpu"] = clock.read()["loop_cpu"]
    else:  # the serving loop here, and each client process's fraction of a core
        cpu = clock.read(clients)
        record.update(clients=clients, client_waves=client_waves,
                      serving_loop_cpu=cpu["loop_cpu"],
                      clients_cpu=cpu["clients_cpu"],
                      clients_busy=gpu.clients_busy(out.stats))
    if auto is not None:  # what max_batch_size="auto" chose, and the rates it measured
        record["auto_batch_size"] = auto
    return record


def numbers(text: str, kind: type) -> List[Any]:
    return [kind(t) for t in text.split(",") if t]


def main(argv: List[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ms", default="2,10,30", help="the device's milliseconds a batch")
    p.add_argument("--trips", default="1,60", help="its trips for the GIL a batch")
    p.add_argument("--searches", default="1024", help="concurrent searches")
    p.add_argument("--searches-kinds", default="mcts,astar")
    p.add_argument("--mcts-simulations", type=int, default=64, help="each search's")
    p.add_argument("--astar-evaluations", type=int, default=60, help="each search's")
    p.add_argument("--us-per-row", type=float, default=0.0,
                   help="the device's microseconds a row, besides --ms a batch")
    p.add_argument("--max-batch-size", default="4096",
                   help="comma-separated sizes, or auto, each run in turn")
    p.add_argument("--rounds", type=int, default=1, help="the whole grid, this many times")
    p.add_argument("--clients", type=int, default=None,
                   help="run through the process backend: this many client processes, "
                        "each running --searches searches (default: one process)")
    p.add_argument("--client-waves", default="1",
                   help="with --clients: the clients' client_waves, comma-separated, "
                        "each run in turn")
    args = p.parse_args(argv)
    try:
        ms, trips = numbers(args.ms, float), numbers(args.trips, int)
        searches = numbers(args.searches, int)
        caps = [c if c == "auto" else int(c) for c in args.max_batch_size.split(",") if c]
        waves = numbers(args.client_waves, int)
    except ValueError:
        p.error("--ms, --trips, --searches and --client-waves take comma-separated "
                "numbers, --max-batch-size integers or auto")
    kinds = args.searches_kinds.split(",")
    if (not ms or not all(0 < m < math.inf for m in ms) or not trips or min(trips) < 1 or not searches
            or min(searches) < 1 or not caps
            or any(c != "auto" and c < 1 for c in caps)
            or not 0 <= args.us_per_row < math.inf
            or args.rounds < 1 or min(args.mcts_simulations, args.astar_evaluations) < 1
            or (args.clients is not None and args.clients < 1)
            or not waves or min(waves) < 1 or (args.clients is None and waves != [1])
            or not set(kinds) <= {"mcts", "astar"}):
        p.error("--ms > 0, --us-per-row >= 0 (finite), --trips >= 1, --searches >= 1, "
                "--max-batch-size >= 1 or auto, --rounds >= 1, budgets >= 1, --clients >= 1, "
                "--searches-kinds of mcts,astar, --client-waves >= 1 (with --clients)")
    runs = []
    with asyncio.Runner(loop_factory=loop_factory(True)) as runner:
        for _ in range(args.rounds):
            for kind in kinds:
                budget = (args.mcts_simulations if kind == "mcts"
                          else args.astar_evaluations)
                for n, t, m, cap, w in itertools.product(searches, trips, ms, caps, waves):
                    runs.append(runner.run(one_run(kind, n, budget, m, t, cap,
                                                   args.us_per_row, args.clients, w)))
                    print(json.dumps(runs[-1]), file=sys.stderr)
    report = {"benchmark": "benchmarks/fake_device.py", "cpu_count": os.cpu_count(),
              "runs": runs}
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
