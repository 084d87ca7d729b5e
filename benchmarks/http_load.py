"""Throughput and latency of the HTTP front under bounded load; prints JSON.

    python benchmarks/http_load.py [--clients 50] [--duration 5] [--tensors json]
    python benchmarks/http_load.py --large 3 [--clients 20] [--duration 5]

(Named http_load.py rather than http.py: a script named http.py in this folder would
shadow the standard library's http package for every benchmark run from here.)

For each configuration (batching on: max_batch_size 256; off: max_batch_size 1) it
starts ``python -m async_search.http`` (the built-in MLP) on 127.0.0.1 in a process of
its own, then a load generator in another process: ``--clients`` coroutines on one
aiohttp session with keep-alive connections, each sending one single-element inference
request after another (a closed loop: at most ``--clients`` requests outstanding). After
``--warmup`` seconds it counts completed requests and their latencies for
``--duration`` seconds and reports requests/s and p50/p90/p99 latency.

With ``--compare TREE`` (a checkout from before a change) it runs TREE's server and
this tree's at once and alternates bursts of requests between them, 10 rounds, with
batching on and off: the range of after/before server CPU per request, which a busy
host disturbs less than a before run and an after run one after the other.

With ``--slow-readers N`` it measures instead what N clients that each send a 1 KB
request for a 4 MiB answer and never read it cost the server: its RSS over
``--duration`` seconds (at least 8), how many of them it closed (``--write-timeout``,
2 s here), and small requests answered meanwhile.

With ``--large N`` it measures instead whether large JSON bodies stall small requests:
the small-request load runs once alone and once beside ``N`` clients that each send
near-limit JSON bodies (just under the front's 1 MiB ``max_json_bytes``; ``--large-bytes``) back to back;
it reports small-request p50/p99 in both runs and the large requests' count and p50.
Goal: small-request p99 under 100 ms while large bodies arrive.

``hostile_counts(requests, seconds)`` (no flag: benchmarks/chaos.py's ``http_hostile``
scenario calls it) sends hostile traffic mixed with normal requests and counts what each
got: sent, answered exactly, failed clearly, hung, wrong.

Reference: a C++ gateway with three ONNX workers published 522 requests/s and p99
164 ms at 50 concurrent clients; the goal here is >= 4x that (2088 requests/s) with p99
under 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import statistics
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


def _large_body(limit: int = 2 ** 20) -> bytes:
    """A JSON inference body of whole rows just under ``limit`` bytes."""
    rng = np.random.default_rng(1)

    def body(rows):
        x = rng.standard_normal((rows, 16)).astype(np.float32)
        return json.dumps({"inputs": [{"name": "input", "shape": [rows, 16],
                                       "datatype": "FP32",
                                       "data": x.ravel().tolist()}]}).encode()

    per_row = len(body(100)) / 100
    return body(int(limit * 0.97 / per_row))


async def _load(url: str, clients: int, warmup: float, duration: float,
                tensors: str, large: int = 0, large_bytes: int = 2 ** 20) -> dict:
    import aiohttp

    body, headers = _request_body(tensors)
    big = _large_body(large_bytes) if large else b""
    large_latencies: list[float] = []
    target = f"{url}/v2/models/mlp/infer"
    latencies: list[float] = []
    errors = 0
    total = 0
    connector = aiohttp.TCPConnector(limit=clients + large)
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

        async def large_client():
            nonlocal errors
            clock = time.perf_counter
            while True:
                t0 = clock()
                if t0 >= end:
                    return
                async with session.post(target, data=big) as resp:
                    await resp.read()
                    ok = resp.status == 200
                t1 = clock()
                if ok:
                    large_latencies.append(t1 - t0)
                else:
                    errors += 1

        await asyncio.gather(*(client() for _ in range(clients)),
                             *(large_client() for _ in range(large)))
    lat = np.array(latencies) * 1e3
    extra = {}
    if large:
        extra = {"large_clients": large, "large_body_bytes": len(big),
                 "large_completed": len(large_latencies),
                 "large_p50_ms": round(float(np.median(large_latencies)) * 1e3, 1)
                 if large_latencies else None}
    return {**extra,
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


def _serve(max_batch_size: int, extra: str = "") -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "async_search.http", "--port", "0",
         "--max-batch-size", str(max_batch_size), *extra.split()],
        stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    lines = []  # what it said, for the error (at its end, readline gives b"")
    try:
        while time.monotonic() < deadline:
            line = server.stderr.readline()
            lines.append(line)
            match = _SERVING.search(line)
            if match:
                return server, match.group(1).decode()
            if not line and server.poll() is not None:
                break
    except BaseException:  # stopped while it starts (Ctrl-C, SIGTERM): it ends too
        server.kill()
        server.wait(10)
        raise
    server.kill()
    said = b"".join(lines[-5:]).decode(errors="replace").strip()
    raise RuntimeError(f"the server did not start; it said: {said or '(nothing)'}")


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux), to read figures on a shared host."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _measure(max_batch_size: int, args, large: int = 0) -> dict:
    server, url = _serve(max_batch_size, args.server_args)
    try:
        cpu_before = _cpu_seconds(server.pid)
        out = subprocess.run(
            [sys.executable, __file__, "--load", url, "--clients", str(args.clients),
             "--warmup", str(args.warmup), "--duration", str(args.duration),
             "--tensors", args.tensors, "--large", str(large),
             "--large-bytes", str(args.large_bytes)],
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


# -- hostile traffic: benchmarks/chaos.py's http_hostile scenario -----------------------
#: Flags for the front under hostile traffic: short timeouts and small bounds, so that
#: idle and slow clients are closed within a second and oversized bodies stay cheap.
HOSTILE_FLAGS = ("--keepalive-timeout 1 --read-timeout 1 --shutdown-timeout 2 "
                 "--max-json-bytes 65536 --max-body-bytes 1048576 --offload-bytes 32768")
_INFER = "/v2/models/mlp/infer"
_HEADER = "Inference-Header-Content-Length"
#: Request kinds and their shares of the traffic. ``normal_*`` have exact expected
#: outputs; the others must each fail clearly.
_HOSTILE_MIX = {
    "normal_json": 0.40, "normal_binary": 0.15, "normal_large_json": 0.02,
    "malformed_body": 0.33, "bad_route": 0.03, "oversized_json": 0.03,
    "oversized_body": 0.01, "idle": 0.01, "slow_headers": 0.01, "slow_body": 0.01,
}
_RAW_KINDS = ("idle", "slow_headers", "slow_body")


def _strict_json(data: bytes):
    """``json.loads`` refusing NaN and Infinity, as strict parsers do."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(data, parse_constant=refuse)


def _json_infer(x: np.ndarray, **extra) -> bytes:
    return json.dumps({"inputs": [{"name": "input", "shape": list(x.shape),
                                   "datatype": "FP32", "data": x.ravel().tolist()}],
                       **extra}).encode()


def _binary_infer(x: np.ndarray, request_id: str) -> tuple[bytes, dict]:
    header = json.dumps({"id": request_id, "inputs": [{
        "name": "input", "shape": list(x.shape), "datatype": "FP32",
        "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "output", "parameters": {"binary_data": True}}]}).encode()
    return header + x.astype("<f4").tobytes(), {_HEADER: str(len(header))}


def malformed_bodies() -> list[tuple[bytes, dict | None]]:
    """(body, headers) for POST .../infer that must each get a 4xx with a message:
    malformed JSON, absurd shapes, wrong datatypes, data that does not fit its shape,
    truncated or lying binary-extension headers, seeded JSON garbage. Used here at
    scale and, once each, by tests/faults/test_http_faults.py."""
    import random

    x = np.ones((1, 16), np.float32)
    good = json.loads(_json_infer(x))
    t = good["inputs"][0]
    cases: list[tuple[bytes, dict | None]] = [(b, None) for b in [
        b"", b"null", b"[]", b"3", b'"inputs"', b"{", b"{not json", b"\xff\xfe\xfd",
        "{\"inputs\": [\"\u00e9\"]}".encode("latin-1"), b"{}" * 1000,
        b"[" * 20_000 + b"]" * 20_000, b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", '
        b'"data": [1,',
    ]]
    for shape in ([2 ** 63, 0], [10 ** 30, 0], [0, 2 ** 63], [2 ** 63], [1, 2 ** 40],
                  [2 ** 31, 2 ** 31, 0], [-1, 16], [2, -3], [0] * 33, [1.0, 16],
                  ["1", 16], [True, 16], [None], [[1], 16], {"n": 1}, "1x16", None):
        cases.append((json.dumps({"inputs": [{**t, "shape": shape, "data": []}]}
                                 ).encode(), None))
    variants = [
        {"inputs": None}, {"inputs": {}}, {"inputs": []}, {"inputs": [None]},
        {"inputs": [[t]]}, {"inputs": [t, t]}, {"inputs": [{**t, "name": 5}]},
        {"inputs": [{**t, "name": "x"}]},
        # wrong datatypes
        {"inputs": [{**t, "datatype": "FP8"}]}, {"inputs": [{**t, "datatype": None}]},
        {"inputs": [{**t, "datatype": "BYTES"}]}, {"inputs": [{**t, "datatype": "FP64"}]},
        {"inputs": [{**t, "datatype": "INT8"}]}, {"inputs": [{**t, "datatype": "fp32"}]},
        # data that does not match its shape, or is not numbers
        {"inputs": [{**t, "shape": [1, 8]}]}, {"inputs": [{**t, "shape": [16]}]},
        {"inputs": [{**t, "shape": []}]}, {"inputs": [{**t, "shape": [2, 16]}]},
        {"inputs": [{**t, "data": t["data"][:5]}]},
        {"inputs": [{**t, "data": t["data"] + [1.0]}]},
        {"inputs": [{**t, "data": "x" * 16}]}, {"inputs": [{**t, "data": [None] * 16}]},
        {"inputs": [{**t, "data": [[1, 2], [3]]}]}, {"inputs": [{**t, "data": {"a": 1}}]},
        {"inputs": [{**t, "data": [1.0] * 15 + [10 ** 400]}]},
        {"inputs": [{k: v for k, v in t.items() if k != "data"}]},
        {"inputs": [{**t, "parameters": "binary"}]},
        {"inputs": [{**t, "parameters": {"binary_data_size": 64}}]},
        {**good, "id": 7}, {**good, "outputs": "output"}, {**good, "outputs": [3]},
        {**good, "outputs": [{"name": "nope"}]},
        {**good, "parameters": {"binary_data_output": "yes"}},
    ]
    cases += [(json.dumps(v).encode(), None) for v in variants]
    header = json.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                     "shape": [1, 16],
                                     "parameters": {"binary_data_size": 64}}]}).encode()
    raw = x.tobytes()
    for length, tail in [(len(header), raw[:30]), (len(header), raw + b"xx"),
                         (len(header) + 100, raw), (-1, raw), ("12abc", raw),
                         ("9" * 5000, raw), (len(header) - 3, raw), (len(header), b""),
                         ("", raw), (0, raw)]:
        cases.append((header + tail, {_HEADER: str(length)}))
    rng = random.Random(0)
    keys = ["inputs", "name", "shape", "datatype", "data", "parameters", "outputs",
            "binary_data_size", "id"]

    def garbage(depth=0):
        kind = rng.randrange(7 if depth < 4 else 4)
        if kind == 0:
            return rng.choice([None, True, False, 0, -1, 2 ** 64, 1.5, "", "FP32"])
        if kind == 1:
            return rng.randrange(-10, 10 ** 6)
        if kind == 2:
            return rng.choice(["input", "NaN", "\u0000", "\ud7ff" * 3])
        if kind == 3:
            return rng.random() * 10 ** rng.randrange(-5, 300)
        if kind in (4, 5):
            return {rng.choice(keys): garbage(depth + 1) for _ in range(rng.randrange(4))}
        return [garbage(depth + 1) for _ in range(rng.randrange(4))]

    for _ in range(30):
        cases.append((json.dumps({"inputs": [garbage()] if rng.random() < 0.7 else
                                  garbage()}).encode(), None))
    return cases


#: (method, path, body, headers) that must get 403, 404 or 405 with a message. Load and
#: unload are off by default: 403.
_BAD_ROUTES = [
    ("GET", _INFER, b"", None), ("PUT", _INFER, b"{}", None),
    ("POST", "/v2/models/%ff/infer", b"{}", None),
    ("POST", "/v2/models/nope/infer", b"{}", None),
    ("POST", "/v2/models/mlp/versions/x/infer", b"{}", None),
    ("GET", "/v2/" + "a" * 2000, b"", None), ("DELETE", "/v2", b"", None),
    ("POST", "/v2/models/mlp/infer/more", b"{}", None),
    ("POST", "/v2/repository/models/mlp/load",
     b'{"parameters": {"num_workers": 100000}}', None),
    ("POST", "/v2/repository/models/mlp/unload", b"", None),
]


def _clear_error(status: int, body: bytes, statuses=None) -> bool:
    """A 4xx or 503 (``statuses``, if given) whose body is strict JSON ``{"error":
    message}`` with a message."""
    if statuses is not None and status not in statuses:
        return False
    if not (400 <= status < 500 or status == 503):
        return False
    try:
        payload = _strict_json(body)
    except ValueError:
        return False
    return isinstance(payload, dict) and isinstance(payload.get("error"), str) and bool(
        payload["error"].strip())


def _exact_answer(kind: str, status: int, headers, body: bytes, want: np.ndarray,
                  request_id: str) -> bool:
    """200, this request's id, and the model's outputs bit for bit."""
    if status != 200:
        return False
    try:
        if kind == "normal_binary":
            length = int(headers.get(_HEADER, -1))
            if not 0 < length <= len(body):
                return False
            payload, blob = _strict_json(body[:length]), body[length:]
            out = payload["outputs"][0]
            if out["parameters"]["binary_data_size"] != len(blob) or len(blob) % 4:
                return False
            y = np.frombuffer(blob, "<f4")
        else:
            payload = _strict_json(body)
            out = payload["outputs"][0]
            y = np.array(out["data"], np.float32)
        return (payload.get("id") == request_id and out["datatype"] == "FP32"
                and out["shape"] == list(want.shape)
                and np.array_equal(y.reshape(want.shape), want))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return False


async def read_until_closed(reader: asyncio.StreamReader, timeout: float) -> bytes | None:
    """What the server sends until it closes the connection; None if it keeps it open
    past ``timeout``."""
    chunks = []

    async def drain():
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            chunks.append(chunk)

    try:
        await asyncio.wait_for(drain(), timeout)
    except asyncio.TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def _raw_answer(answer: bytes) -> tuple[int | None, bytes]:
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    _, _, body = answer.partition(b"\r\n\r\n")
    return (int(match.group(1)) if match else None), body


async def _hostile(url: str, port: int, requests: int, seconds: float, seed: int,
                   concurrency: int, wait_s: float) -> dict:
    import aiohttp

    from async_search.http.__main__ import builtin_models

    model = builtin_models()["mlp"]()
    kinds = list(_HOSTILE_MIX)
    plan_rng = np.random.default_rng(seed)
    shares = np.array([_HOSTILE_MIX[k] for k in kinds])
    malformed = malformed_bodies()
    big_rows = np.random.default_rng(seed + 1).standard_normal((400, 16)).astype(
        np.float32)
    oversized_json = _json_infer(big_rows)                        # ~130 KB > 64 KiB
    oversized_body, oversized_headers = _binary_infer(
        np.ones((17_000, 16), np.float32), "big")                 # ~1.09 MB > 1 MiB
    counts = {"sent": 0, "answered_exactly": 0, "failed_clearly": 0, "hung": 0,
              "wrong": 0}
    by_kind = {k: {"sent": 0, "exact": 0, "clear": 0, "hung": 0, "wrong": 0}
               for k in kinds}
    statuses: dict = {}
    wrong_examples: list[str] = []
    closed_after: list[float] = []

    def count(kind: str, outcome: str, note: str = "") -> None:
        key = {"exact": "answered_exactly", "clear": "failed_clearly"}.get(outcome,
                                                                          outcome)
        counts[key] += 1
        by_kind[kind][outcome] += 1
        if outcome == "wrong" and len(wrong_examples) < 8:
            wrong_examples.append(f"{kind}: {note}"[:300])

    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=0.25)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def over_http(i: int, kind: str) -> None:
            method, path, data, headers = "POST", _INFER, b"", None
            want, rid = None, f"r{i}"
            if kind.startswith("normal_"):
                rows = 150 if kind == "normal_large_json" else 1 + i % 8
                x = np.random.default_rng((seed, i)).standard_normal((rows, 16)).astype(
                    np.float32)
                want = model(x)
                if kind == "normal_binary":
                    data, headers = _binary_infer(x, rid)
                else:
                    data = _json_infer(x, id=rid)
            elif kind == "malformed_body":
                data, headers = malformed[i % len(malformed)]
            elif kind == "bad_route":
                method, path, data, headers = _BAD_ROUTES[i % len(_BAD_ROUTES)]
            elif kind == "oversized_json":
                data = oversized_json
            else:  # oversized_body
                data, headers = oversized_body, oversized_headers

            async def go():
                async with session.request(method, url + path, data=data,
                                           headers=headers) as resp:
                    return resp.status, resp.headers, await resp.read()

            try:
                status, got_headers, body = await asyncio.wait_for(go(), wait_s)
            except asyncio.TimeoutError:
                count(kind, "hung")
                return
            except (aiohttp.ClientError, OSError) as e:  # no answer: not a clear one
                count(kind, "wrong", f"connection error {type(e).__name__}: {e}")
                return
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if want is not None:
                if _exact_answer(kind, status, got_headers, body, want, rid):
                    count(kind, "exact")
                elif _clear_error(status, body, {503}):  # overloaded or closing: clear
                    count(kind, "clear")
                else:
                    count(kind, "wrong", f"{status} {body[:200]!r}")
                return
            allowed = {"oversized_json": {413}, "oversized_body": {413}}.get(kind)
            if _clear_error(status, body, allowed):
                count(kind, "clear")
            else:
                count(kind, "wrong", f"{status} {body[:200]!r}")

        async def over_socket(i: int, kind: str) -> None:
            """Idle (nothing sent), slowloris headers, slowloris body."""
            payload = {
                "idle": b"",
                "slow_headers": b"POST " + _INFER.encode() + b" HTTP/1.1\r\nHost: x\r\n",
                "slow_body": (b"POST " + _INFER.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Type: application/json\r\n"
                              b"Content-Length: 1000\r\n\r\n" + b'{"inputs": [{"na'),
            }[kind]
            start = time.monotonic()
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), wait_s)
            except (asyncio.TimeoutError, OSError) as e:
                count(kind, "wrong", f"could not connect: {e!r}")
                return
            try:
                if payload:
                    writer.write(payload)
                    await writer.drain()
                answer = await read_until_closed(reader, wait_s)
            except OSError as e:
                answer = b"" if isinstance(e, ConnectionResetError) else None
            finally:
                writer.close()
            if answer is None:
                count(kind, "hung")
                return
            closed_after.append(time.monotonic() - start)
            status, body = _raw_answer(answer)
            if status is not None:
                statuses[str(status)] = statuses.get(str(status), 0) + 1
            if kind == "slow_body":
                ok = _clear_error(status or 0, body, {408}) and b"read_timeout" in body
            else:  # closed by the keep-alive timeout, or refused at the connection cap
                ok = answer == b"" or _clear_error(status or 0, body, {503})
            count(kind, "clear" if ok else "wrong", repr(answer[:200]))

        deadline = time.monotonic() + seconds
        issued = 0
        raw_slots = asyncio.Semaphore(48)
        raw_tasks: set = set()

        async def worker() -> None:
            nonlocal issued
            while issued < requests and time.monotonic() < deadline:
                i = issued
                issued += 1
                kind = kinds[int(plan_rng.choice(len(kinds), p=shares))]
                counts["sent"] += 1
                by_kind[kind]["sent"] += 1
                if kind in _RAW_KINDS:  # held open ~1 s: off the workers, bounded
                    await raw_slots.acquire()
                    task = asyncio.ensure_future(over_socket(i, kind))
                    task.add_done_callback(lambda _: raw_slots.release())
                    raw_tasks.add(task)
                else:
                    await over_http(i, kind)

        began = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        if raw_tasks:
            await asyncio.wait(raw_tasks)
        elapsed = time.monotonic() - began

        # Afterwards the front still answers a normal request exactly.
        x = np.full((2, 16), 0.5, np.float32)
        try:
            async with session.post(url + _INFER, data=_json_infer(x, id="after"),
                                    timeout=aiohttp.ClientTimeout(total=wait_s)) as resp:
                serves_after = _exact_answer("normal_json", resp.status, resp.headers,
                                             await resp.read(), model(x), "after")
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError):
            serves_after = False
        counts["wrong"] += not serves_after
    return {**counts, "serves_after": serves_after,
            "requests_per_s": round(counts["sent"] / elapsed, 1),
            "idle_and_slow_closed_after_s_max": round(max(closed_after), 2)
            if closed_after else None,
            "statuses": dict(sorted(statuses.items())),
            "by_kind": by_kind, "wrong_examples": wrong_examples,
            "malformed_bodies": len(malformed), "bad_routes": len(_BAD_ROUTES)}


def hostile_counts(requests: int = 1000, seconds: float = 10.0, *, seed: int = 0,
                   concurrency: int = 16, wait_s: float = 10.0) -> dict:
    """Hostile HTTP traffic mixed with normal requests, counted like benchmarks/chaos.py.

    Starts ``python -m async_search.http`` (the built-in MLP, whose outputs are exact
    whatever the batch) on 127.0.0.1 with ``HOSTILE_FLAGS``, then sends at most
    ``requests`` requests for at most ``seconds`` seconds from ``concurrency``
    coroutines: normal inference requests (JSON, binary tensors, 150-row JSON parsed in
    a codec process) mixed with malformed JSON, absurd shapes, wrong datatypes, data
    that does not fit its shape, truncated binary-extension headers, JSON over the JSON
    bound, bodies over the body bound, bad routes and load/unload while off, idle
    connections and slowloris headers and bodies (``_HOSTILE_MIX``). Each answer must
    come within ``wait_s`` seconds.

    Returns:
        ``sent``, ``answered_exactly`` (normal requests: 200, their own id, the model's
        outputs bit for bit), ``failed_clearly`` (hostile requests answered 4xx or 503
        with a JSON ``{"error": message}``, 413 for oversized bodies, 408 naming
        ``read_timeout`` for a slow body; idle and slow-header connections closed by the
        keep-alive timeout or refused 503 at the cap), ``hung`` (no answer within
        ``wait_s``), ``wrong`` (anything else: a normal request not answered exactly, a
        hostile one answered 200 or 500, a connection dropped without an answer, the
        front not answering exactly afterwards or not exiting within 15 s of SIGTERM),
        and figures of its own: per kind, statuses, seconds.
    """
    import collections
    import threading

    began = time.perf_counter()
    server, url = _serve(256, HOSTILE_FLAGS)
    log = collections.deque(maxlen=20)

    def drain_stderr():  # a full stderr pipe would stall the server
        for line in server.stderr:
            log.append(line.decode(errors="replace").rstrip())

    threading.Thread(target=drain_stderr, daemon=True).start()
    port = int(url.rsplit(":", 1)[1])
    try:
        result = _run_loop(_hostile(url, port, requests, seconds, seed, concurrency,
                                    wait_s))
        result["server_alive_after"] = server.poll() is None
        result["wrong"] += not result["server_alive_after"]
    finally:
        stop = time.monotonic()
        server.terminate()
        try:
            code = server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            code = server.wait(5)
    result["server_exit_s"] = round(time.monotonic() - stop, 2)
    result["server_exit_code"] = code
    result["wrong"] += result["server_exit_s"] >= 15  # SIGTERM must end it, bounded
    result["server_flags"] = HOSTILE_FLAGS
    result["concurrency"] = concurrency
    if result["wrong"] or result["hung"]:
        result["server_log_tail"] = list(log)
    result["seconds"] = round(time.perf_counter() - began, 2)
    return result


# -- before and after: two trees' servers, one client alternating between them -----------
async def _alternate(urls: dict, pids: dict, rounds: int, requests: int,
                     clients: int) -> dict:
    import aiohttp

    body = _json_infer(np.random.default_rng(0).standard_normal((1, 16)).astype(
        np.float32))
    per_round = {name: [] for name in urls}

    async def burst(session, url, count):
        async def client(n):
            for _ in range(n):
                async with session.post(url + _INFER, data=body) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status
        began = time.perf_counter()
        await asyncio.gather(*(client(count // clients) for _ in range(clients)))
        return time.perf_counter() - began

    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0)) as session:
        for url in urls.values():
            await burst(session, url, 500)  # warm
        for r in range(rounds):  # alternating, and each first in every other round
            for name in (list(urls) if r % 2 == 0 else list(reversed(urls))):
                cpu = _cpu_seconds(pids[name])
                wall = await burst(session, urls[name], requests)
                per_round[name].append(
                    {"server_cpu_us_per_request": round(
                        (_cpu_seconds(pids[name]) - cpu) / requests * 1e6, 1),
                     "requests_per_s": round(requests / wall, 1)})
    return per_round


def compare(other_tree: str, *, rounds: int = 10, requests: int = 6000,
            clients: int = 20, max_batch_size: int = 256) -> dict:
    """Server CPU per request and requests/s of ``python -m async_search.http`` from
    ``other_tree`` (a checkout before a change) and from this tree, both running at
    once, one client sending ``requests`` one-element JSON requests to each in turn,
    ``rounds`` times: a shared, busy host slows both alike. Reports each round and the
    range of after/before CPU ratios."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    servers, urls, pids = {}, {}, {}
    try:
        for name, root in (("before", os.path.abspath(other_tree)), ("after", here)):
            server = subprocess.Popen(
                [sys.executable, "-m", "async_search.http", "--port", "0",
                 "--max-batch-size", str(max_batch_size)], stderr=subprocess.PIPE,
                cwd=root)
            servers[name] = server
            while not (match := _SERVING.search(server.stderr.readline())):
                if server.poll() is not None:
                    raise RuntimeError(f"the server of {root} did not start")
            urls[name], pids[name] = match.group(1).decode(), server.pid
        per_round = _run_loop(_alternate(urls, pids, rounds, requests, clients))
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(10)
    ratios = sorted(a["server_cpu_us_per_request"] / b["server_cpu_us_per_request"]
                    for a, b in zip(per_round["after"], per_round["before"]))
    return {"other_tree": other_tree, "max_batch_size": max_batch_size,
            "requests_per_round": requests, "clients": clients,
            "cpu_ratio_after_over_before": {"min": round(ratios[0], 3),
                                            "median": round(statistics.median(ratios), 3),
                                            "max": round(ratios[-1], 3)},
            "rounds": per_round}


# -- clients that never read their answers ----------------------------------------------
def large_answer_model():
    """``--model benchmarks.http_load:large_answer_model``: 16 FP32 inputs, a 4 MiB
    float32 answer per row (its first 16 values are the input)."""
    from async_search.models import with_spec

    def answer(x):
        out = np.zeros((len(x), 2 ** 20), np.float32)
        out[:, :16] = x
        return out

    return with_spec(answer, (16,), np.float32)


def _rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


async def _slow_readers(url: str, pid: int, clients: int, seconds: float) -> dict:
    """``clients`` sockets send a 1 KB request for a 4 MiB answer and never read; one
    normal client asks for the same answers meanwhile, and reads them. Samples the
    server's RSS."""
    import socket

    import aiohttp

    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"id": "s" * 700, "inputs": [{
        "name": "input", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}],
        "parameters": {"binary_data_output": True}}).encode()
    request = (b"POST /v2/models/large_answer_model/infer HTTP/1.1\r\nHost: x\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
    small = _json_infer(np.ones((1, 16), np.float32),
                        parameters={"binary_data_output": True})
    loop = asyncio.get_running_loop()
    samples, served = [], 0
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v2/models/large_answer_model/infer",
                                data=small) as resp:  # warm: one answer read whole
            await resp.read()
        baseline = _rss_mib(pid)
        sockets = []
        for _ in range(clients):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(sock, request)
            sockets.append(sock)
        began = time.monotonic()
        while (elapsed := time.monotonic() - began) < seconds:
            async with session.post(f"{url}/v2/models/large_answer_model/infer",
                                    data=small) as resp:  # read whole: 4 MiB
                await resp.read()
                served += resp.status == 200
            samples.append((round(elapsed, 2), _rss_mib(pid)))
            await asyncio.sleep(0.2)
    closed = 0
    for sock in sockets:  # closed by the server (EOF or reset) before its whole answer?
        sock.setblocking(True)
        sock.settimeout(0.5)
        try:
            while sock.recv(2 ** 20):
                pass
            closed += 1
        except ConnectionError:
            closed += 1
        except OSError:  # still open: nothing ended it
            pass
        finally:
            sock.close()
    peak = max(rss for _, rss in samples)
    return {"clients": clients, "seconds": seconds, "rss_baseline_mib": baseline,
            "rss_peak_mib": peak, "rss_end_mib": samples[-1][1],
            "held_for_s": max((t for t, rss in samples
                               if rss - baseline > (peak - baseline) / 2), default=0),
            "slow_clients_closed_by_server": closed,
            "normal_requests_served_meanwhile": served, "rss_samples": samples[::5]}


def slow_readers(clients: int = 16, seconds: float = 8.0, server_args: str = "") -> dict:
    """The report's slow readers against ``python -m async_search.http`` (4 MiB answers,
    ``--write-timeout 2`` unless ``server_args`` says otherwise): the server's RSS over
    time, how many slow clients it closed, and normal requests answered meanwhile."""
    server, url = _serve(256, f"--model benchmarks.http_load:large_answer_model "
                              f"{server_args}")
    try:
        return _run_loop(_slow_readers(url, server.pid, clients, seconds))
    finally:
        server.terminate()
        server.wait(15)


def main() -> None:
    # SIGTERM (timeout, kill) ends the run as Ctrl-C does, so that the servers and
    # children it started end with it (they outlived it, re-parented to init).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--tensors", choices=["json", "binary"], default="json")
    p.add_argument("--large", type=int, default=0,
                   help="clients sending near-limit JSON bodies beside the small load")
    p.add_argument("--large-bytes", type=int, default=2 ** 20 - 48 * 1024,
                   help="size of each large JSON body (keep it under the server's "
                        "--max-json-bytes)")
    p.add_argument("--server-args", default="",
                   help="more flags for python -m async_search.http, e.g. "
                        "'--offload-bytes 1000000000' to parse every body on the loop")
    p.add_argument("--slow-readers", type=int, default=0,
                   help="clients that each ask for a 4 MiB answer and never read it "
                        "(the server runs with --write-timeout 2 unless --server-args "
                        "says otherwise)")
    p.add_argument("--compare", metavar="TREE",
                   help="a checkout before a change: run its server beside this tree's "
                        "and alternate (server CPU per request, requests/s; 20 clients "
                        "and 10 rounds, whatever --clients says)")
    p.add_argument("--load", help=argparse.SUPPRESS)  # run as the load generator
    args = p.parse_args()
    if args.clients < 1 or args.large_bytes < 1:
        p.error(f"--clients and --large-bytes must be integers >= 1, "
                f"got {args.clients} and {args.large_bytes}")
    if min(args.large, args.slow_readers) < 0:
        p.error(f"--large and --slow-readers must be integers >= 0, "
                f"got {args.large} and {args.slow_readers}")
    if not 0 < args.duration < math.inf or not 0 <= args.warmup < math.inf:
        p.error(f"--duration must be more than 0 seconds and --warmup at least 0, "
                f"got {args.duration} and {args.warmup}")
    if args.compare and not os.path.isfile(os.path.join(args.compare, "async_search",
                                                        "__init__.py")):
        p.error(f"--compare {args.compare}: not a checkout (no async_search package)")
    if args.compare:
        print(json.dumps({"batching_on": compare(args.compare),
                          "batching_off": compare(args.compare, max_batch_size=1)},
                         indent=2))
        return
    if args.slow_readers:
        print(json.dumps(slow_readers(args.slow_readers, max(args.duration, 8.0),
                                      args.server_args or "--write-timeout 2"),
                         indent=2))
        return
    if args.load:
        print(json.dumps(_run_loop(_load(args.load, args.clients, args.warmup,
                                         args.duration, args.tensors, args.large,
                                         args.large_bytes))))
        return
    if args.large:
        print(json.dumps({
            "clients": args.clients, "duration_s": args.duration,
            "tensors": args.tensors, "cpus": os.cpu_count(),
            "server_args": args.server_args, "large_bytes": args.large_bytes,
            "small_only": _measure(256, args),
            "with_large_json": _measure(256, args, large=args.large),
            "goal": {"small_p99_ms": 100}}, indent=2))
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
