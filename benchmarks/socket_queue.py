"""The process backend's transport with large frames: the reading side's CPU per MB.

A client process of the process backend sends one frame a loop iteration, every
request of that iteration in one array: 256 A* searches of 4 nodes on the 15-puzzle
(1 KB a row, one-hot float32) make frames of about 1 MB, and one serving process reads
every client's. Here a writer process puts ``--frames`` frames, each one float32 array
of each ``--sizes`` (KB), on a ``SocketQueue`` as fast as it can; this process reads
them with ``get_async`` on its loop and times them:

- ``read_cpu_us_per_mb``: the reading thread's CPU time per MB received, from the first
  frame to the last (the serving loop's cost of taking requests in);
- ``mb_per_s``: the rate, over the same span (bounded by the writer too);
- ``checked``: every frame's values arrived as sent.

Each figure is the median of ``--repeats`` runs. Prints one JSON object.
Usage: python benchmarks/socket_queue.py [--sizes 8,256,1024,4096] [--frames 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from typing import List

import numpy as np

from async_search.event_loops import loop_factory
from async_search.queues import SocketQueue


def write_frames(queue: SocketQueue, floats: int, frames: int) -> None:
    """The writer process: ``frames`` arrays of ``floats`` float32 each, the i-th
    holding i, one frame each, then the end of the stream."""

    async def main() -> None:
        queue.writer_only()
        for i in range(frames):
            queue.put(np.full(floats, i, np.float32))
            await asyncio.sleep(0)  # one frame a loop iteration, as a client sends
        queue.put(None)
        await queue.drain()

    asyncio.run(main())


async def read_frames(queue: SocketQueue, frames: int) -> dict:
    queue.reader_only()
    first = await queue.get_async()
    began_wall, began_cpu = time.perf_counter(), time.thread_time()
    checked = bool(first[0] == 0)
    received = first.nbytes
    for i in range(1, frames):
        x = await queue.get_async()
        checked &= bool(x[0] == i and x[-1] == i)
        received += x.nbytes
    wall, cpu = time.perf_counter() - began_wall, time.thread_time() - began_cpu
    assert await queue.get_async() is None
    mb = (received - first.nbytes) / 1e6
    return {"read_cpu_us_per_mb": cpu / mb * 1e6, "mb_per_s": mb / wall, "checked": checked}


def one_run(kb: int, frames: int, use_uvloop: bool) -> dict:
    floats = kb * 1024 // 4
    queue = SocketQueue()
    writer = multiprocessing.get_context("spawn").Process(
        target=write_frames, args=(queue, floats, frames), daemon=True)
    writer.start()
    try:
        with asyncio.Runner(loop_factory=loop_factory(use_uvloop)) as runner:
            return runner.run(asyncio.wait_for(read_frames(queue, frames), 120))
    finally:
        writer.join(10)
        queue.close()


def main(argv: List[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8,256,1024,4096", help="frame sizes, KB")
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--asyncio", action="store_true", help="asyncio's loop, not uvloop's")
    args = p.parse_args(argv)
    try:
        sizes = [int(t) for t in args.sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        p.error(f"--sizes takes comma-separated integers >= 1 (KB), not {args.sizes!r}")
    if args.frames < 2 or args.repeats < 1:
        p.error("--frames takes an integer >= 2 (the first is not timed), --repeats >= 1")
    report = {"benchmark": "benchmarks/socket_queue.py", "frames": args.frames,
              "loop": "asyncio" if args.asyncio else "uvloop", "sizes_kb": {}}
    for kb in sizes:
        runs = [one_run(kb, args.frames, not args.asyncio) for _ in range(args.repeats)]
        report["sizes_kb"][str(kb)] = {
            "read_cpu_us_per_mb": round(statistics.median(
                r["read_cpu_us_per_mb"] for r in runs), 1),
            "mb_per_s": round(statistics.median(r["mb_per_s"] for r in runs), 1),
            "checked": all(r["checked"] for r in runs),
        }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    sys.exit(0 if all(v["checked"] for v in main()["sizes_kb"].values()) else 1)
