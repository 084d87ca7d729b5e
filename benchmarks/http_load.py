"""Throughput and latency of the HTTP front under bounded load; prints JSON.

    python benchmarks/http_load.py [--clients 50] [--duration 5] [--tensors json]

(Named http_load.py rather than http.py: a script named http.py in this folder would
shadow the standard library's http package for every benchmark run from here.)

For each configuration (batching on: max_batch_size 256; off: max_batch_size 1) it
starts ``python -m async_search.http`` (the built-in MLP) on 127.0.0.1 in a process of
its own, then a load generator in another process: ``--clients`` coroutines on one
aiohttp session with keep-alive connections, each sending one single-element inference
request after another (a closed loop: at most ``--clients`` requests outstanding). After
``--warmup`` seconds it counts completed requests and their latencies for
``--duration`` seconds and reports requests/s and p50/p90/p99 latency.

Reference: a C++ gateway with three ONNX workers published 522 requests/s and p99
164 ms at 50 concurrent clients; the goal here is >= 4x that (2088 requests/s) with p99
under 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import numpy as np

_SERVING = re.compile(rb"serving '.*' on (http://[\d.]+:\d+)")


def _request_body(tensors: str) -> tuple[bytes, dict]:
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    if tensors == "json":
        body = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}
        return json.dumps(body).encode(), {"Content-Type": "application/json"}
    header = json.dumps({"inputs": [{"name": "input", "shape": [1, 16],
                                     "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "output",
                                      "parameters": {"binary_data": True}}]}).encode()
    return header + x.tobytes(), {"Content-Type": "application/octet-stream",
                                  "Inference-Header-Content-Length": str(len(header))}


async def _load(url: str, clients: int, warmup: float, duration: float,
                tensors: str) -> dict:
    import aiohttp

    body, headers = _request_body(tensors)
    target = f"{url}/v2/models/mlp/infer"
    latencies: list[float] = []
    errors = 0
    total = 0
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        begin, end = start + warmup, start + warmup + duration

        async def client():
            nonlocal errors, total
            clock = time.perf_counter
            while True:
                t0 = clock()
                if t0 >= end:
                    return
                async with session.post(target, data=body, headers=headers) as resp:
                    await resp.read()
                    ok = resp.status == 200
                t1 = clock()
                total += 1
                if t0 >= begin and t1 <= end:
                    if ok:
                        latencies.append(t1 - t0)
                    else:
                        errors += 1

        await asyncio.gather(*(client() for _ in range(clients)))
    lat = np.array(latencies) * 1e3
    return {
        "requests_per_s": round(len(lat) / duration, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2) if len(lat) else None,
        "p90_ms": round(float(np.percentile(lat, 90)), 2) if len(lat) else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 2) if len(lat) else None,
        "completed": int(len(lat)),
        "errors": errors,
        "total_completed": total,
    }


def _run_loop(coro):
    try:
        import uvloop
        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def _serve(max_batch_size: int) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "async_search.http", "--port", "0",
         "--max-batch-size", str(max_batch_size)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    line = b""
    while time.monotonic() < deadline:
        line = server.stderr.readline()
        match = _SERVING.search(line)
        if match:
            return server, match.group(1).decode()
        if not line and server.poll() is not None:
            break
    server.kill()
    raise RuntimeError(f"the server did not start: {line!r}")


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux), to read figures on a shared host."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _measure(max_batch_size: int, args) -> dict:
    server, url = _serve(max_batch_size)
    try:
        cpu_before = _cpu_seconds(server.pid)
        out = subprocess.run(
            [sys.executable, __file__, "--load", url, "--clients", str(args.clients),
             "--warmup", str(args.warmup), "--duration", str(args.duration),
             "--tensors", args.tensors],
            capture_output=True, check=True, timeout=args.warmup + args.duration + 60)
        result = json.loads(out.stdout)
        cpu_after = _cpu_seconds(server.pid)
        total = result.pop("total_completed")
        if cpu_before is not None and cpu_after is not None and total:
            # Over warmup and measurement alike: server CPU per answered request.
            result["server_cpu_us_per_request"] = round(
                (cpu_after - cpu_before) / total * 1e6, 1)
        with urllib.request.urlopen(f"{url}/metrics") as resp:
            text = resp.read().decode()
        batches = _metric(text, "async_search_batches_total")
        elements = _metric(text, "async_search_elements_total")
        result["mean_batch_size"] = round(elements / batches, 2) if batches else None
        return result
    finally:
        server.terminate()
        server.wait(10)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--tensors", choices=["json", "binary"], default="json")
    p.add_argument("--load", help=argparse.SUPPRESS)  # run as the load generator
    args = p.parse_args()
    if args.load:
        print(json.dumps(_run_loop(_load(args.load, args.clients, args.warmup,
                                         args.duration, args.tensors))))
        return
    results = {
        "clients": args.clients, "duration_s": args.duration, "tensors": args.tensors,
        "cpus": os.cpu_count(),
        "batching_on": _measure(256, args),
        "batching_off": _measure(1, args),
        "reference": {"requests_per_s": 522, "p99_ms": 164},
        "goal": {"requests_per_s": 2088, "p99_ms": 50},
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
