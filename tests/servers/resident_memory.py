"""Resident memory of a long serving run, measured in a fresh process: the script
``python tests/servers/resident_memory.py serve|http REQUESTS``, and what the tests call
to run it (``resident_memory_of``) and to judge it (``assert_flat``).

It serves ``REQUESTS`` requests in ten equal rounds, through ``serve`` alone or through
the HTTP front, and prints one JSON object: ``rss_mib`` (resident memory after each
round, after a garbage collection), ``requests``, ``batches``. The tests read the rounds
after the first two (the warm-up: caches, pools, the allocator's arenas) and ask that
memory stay flat. A fresh process keeps the figure free of whatever a test session
holds; the model is trivial, so that a few bytes kept per request or per batch show.

Besides plain requests, every tenth request of each caller exercises what keeps state
per request or per batch: a deadline that is met, one that passes (dropped before the
model), a priority, ``with_version``, a request split across batches and cancelled, a
request the model's spec refuses (HTTP: a number sent as a string, a 400).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys

import numpy as np

import async_search as asr
from async_search.models import with_spec

ROUNDS = 10
CALLERS = 8


def resident_mib() -> float:
    """Resident set size of this process, in MiB (Linux: /proc/self/statm)."""
    import resource

    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize() / 2 ** 20
    except OSError:  # not Linux: the peak is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10


def doubling(x: np.ndarray) -> np.ndarray:
    return x * 2.0


async def serve_rounds(total: int) -> dict:
    model = with_spec(doubling, (4,), np.float32)
    one = np.ones((1, 4), np.float32)
    large = np.ones((20, 4), np.float32)  # split across batches of 8
    samples = []
    async with asr.serve(model, max_batch_size=8) as evaluate:
        urgent = evaluate.at_priority(1)

        async def caller(count: int) -> None:
            for k in range(count):
                if k % 10:
                    await evaluate(one)
                    continue
                turn = k // 10 % 5
                if turn == 0:
                    await evaluate(one, timeout=10.0)
                elif turn == 1:
                    await urgent(one)
                elif turn == 2:
                    await evaluate.with_version(one)
                elif turn == 3:
                    fut = evaluate(large)
                    await asyncio.sleep(0)  # its first piece leaves
                    fut.cancel()
                else:
                    try:
                        await evaluate(large, timeout=1e-6)
                    except TimeoutError:
                        pass

        for _ in range(ROUNDS):
            await asyncio.gather(*(caller(total // ROUNDS // CALLERS)
                                   for _ in range(CALLERS)))
            gc.collect()
            samples.append(resident_mib())
        stats = evaluate.stats
    return {"rss_mib": samples, "requests": stats["requests"],
            "batches": stats["batches"], "timed_out": stats["timed_out"]}


async def http_rounds(total: int) -> dict:
    import aiohttp

    from async_search.http.front import HttpFront

    def body(data) -> bytes:
        return json.dumps({"inputs": [{"name": "input", "shape": [1, 4],
                                       "datatype": "FP32", "data": data}]}).encode()

    good, bad = body([1, 2, 3, 4]), body(["1", 2, 3, 4])
    binary_header = json.dumps({
        "inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32",
                    "parameters": {"binary_data_size": 16}}],
        "outputs": [{"name": "output", "parameters": {"binary_data": True}}]}).encode()
    binary = binary_header + np.ones(4, np.float32).tobytes()
    headers = {"Inference-Header-Content-Length": str(len(binary_header))}
    samples, statuses = [], {}
    model = with_spec(doubling, (4,), np.float32)
    async with asr.serve(model, max_batch_size=8) as evaluate:
        async with HttpFront({"m": evaluate}) as front:
            url = f"{front.url}/v2/models/m/infer"
            connector = aiohttp.TCPConnector(limit=CALLERS)
            async with aiohttp.ClientSession(connector=connector) as session:

                async def caller(count: int) -> None:
                    for k in range(count):
                        turn = k % 10
                        if turn == 1:
                            request = session.post(url, data=binary, headers=headers)
                        elif turn == 2:
                            request = session.post(url, data=bad)
                        elif turn == 3 and k % 1000 == 3:
                            request = session.get(f"{front.url}/metrics")
                        else:
                            request = session.post(url, data=good)
                        async with request as response:
                            await response.read()
                            statuses[response.status] = statuses.get(response.status,
                                                                     0) + 1

                for _ in range(ROUNDS):
                    await asyncio.gather(*(caller(total // ROUNDS // CALLERS)
                                           for _ in range(CALLERS)))
                    gc.collect()
                    samples.append(resident_mib())
        stats = evaluate.stats
    return {"rss_mib": samples, "requests": stats["requests"],
            "batches": stats["batches"], "statuses": statuses}


def resident_memory_of(kind: str, requests: int) -> dict:
    """This script's report for ``kind`` and ``requests``, run in a fresh process."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, os.path.abspath(__file__), kind,
                           str(requests)], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def assert_flat(samples, warm_up=2, tolerance=0.05):
    """Resident memory (MiB, one sample a round) after the warm-up rounds stays within
    ``tolerance`` of the first sample after them."""
    base = samples[warm_up - 1]
    assert max(samples[warm_up:]) <= base * (1 + tolerance), (
        f"resident memory grew from {base:.1f} MiB to {max(samples[warm_up:]):.1f} MiB "
        f"after warm-up: {[round(s, 1) for s in samples]}")


def main() -> None:
    kind, total = sys.argv[1], int(sys.argv[2])
    run = {"serve": serve_rounds, "http": http_rounds}[kind]
    print(json.dumps(asyncio.run(run(total))))


if __name__ == "__main__":
    main()
