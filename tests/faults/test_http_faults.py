"""Hostile and careless HTTP clients against the front, one test per class of fault.

Each test keeps a ``Tally`` of what its requests got: answered exactly (200 and the
model's values), failed clearly (the expected 4xx, or 503 where the server says it is
full or closing, with a JSON ``{"error": message}``), hung (no answer within a bounded
wait), wrong (anything else: a 500, a body a strict JSON parser refuses, a wrong value).
Hung and wrong must be 0. All traffic goes to 127.0.0.1, bounded in count and time.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import resource
import signal
import subprocess
import sys

import aiohttp
import numpy as np
import pytest

from async_search.models import MLP, with_spec
from async_search.servers.http_front import HttpFront, HttpLimits
from async_search.servers.repository import ModelSource, default_max_workers
from tests.faults.faulty import Tally
from benchmarks.http_load import read_until_closed  # the benchmark's reader, shared
from tests.helpers import wait_until, within

pytestmark = pytest.mark.timeout(120)

MODEL = MLP((16,), hidden_sizes=(32,), output_size=4, seed=0)
X = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
WAIT_S = 20.0  # the most any one answer may take before it counts as hung


def strict_json(data: bytes):
    """``json.loads`` that refuses NaN and Infinity, as strict parsers do."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(data, parse_constant=refuse)


def infer_body(x, name="input", datatype="FP32", **extra) -> bytes:
    return json.dumps({"inputs": [{"name": name, "shape": list(x.shape),
                                   "datatype": datatype, "data": x.ravel().tolist()}],
                       **extra}).encode()


def tensor_body(**tensor) -> bytes:
    return json.dumps({"inputs": [{"name": "input", "datatype": "FP32", **tensor}]}
                      ).encode()


async def exchange(session, tally: Tally, url: str, data=None, *, method="POST",
                   headers=None, expect=200, check=None, message=None):
    """Send one request and count what it got. ``expect``: 200 (then ``check(payload)``
    must hold) or the failing status(es) expected, with ``message`` in the error."""
    tally.sent += 1

    async def go():
        async with session.request(method, url, data=data, headers=headers) as resp:
            return resp.status, await resp.read()

    try:
        status, body = await asyncio.wait_for(go(), WAIT_S)
    except asyncio.TimeoutError:
        tally.hung += 1
        return None
    try:
        payload = strict_json(body)
    except ValueError:
        tally.wrong += 1
        print("wrong (not strict JSON):", url, status, body[:300])
        return status, body
    statuses = expect if isinstance(expect, (set, tuple)) else {expect}
    if status == 200 and 200 in statuses and (check is None or check(payload)):
        tally.answered_exactly += 1
    elif (status in statuses and 400 <= status < 600 and status != 500
          and isinstance(payload, dict) and isinstance(payload.get("error"), str)
          and payload["error"] and (message is None or message in payload["error"])):
        tally.failed_clearly += 1
    else:
        tally.wrong += 1
        print("wrong:", url, status, body[:300])
    return status, body


def is_model_output(x):
    def check(payload):
        y = np.float32(payload["outputs"][0]["data"]).reshape(len(x), -1)
        return np.array_equal(y, MODEL(x))
    return check


def front(**kwargs) -> HttpFront:
    return HttpFront({"mlp": ModelSource(lambda: MODEL)}, **kwargs)


# -- 7: absurd shapes -------------------------------------------------------------------
async def test_absurd_shapes_get_400_with_a_message_before_any_allocation():
    header = lambda shape: json.dumps({"inputs": [{  # noqa: E731
        "name": "input", "datatype": "FP32", "shape": shape,
        "parameters": {"binary_data_size": 0}}]}).encode()
    json_cases = [
        [2 ** 63, 0], [10 ** 30, 0], [0, 2 ** 63], [2 ** 63], [10 ** 30, 10 ** 30],
        [2 ** 31, 2 ** 31, 0], [1, 2 ** 40], [-1, 16], [2, -3], [0] * 33, [1.0, 16],
        ["1", 16], [True, 16], [None], [[1], 16], {"n": 1}, "1x16", None, 7,
    ]
    tally = Tally()
    async with front() as f, aiohttp.ClientSession() as s:
        url = f"{f.url}/v2/models/mlp/infer"
        for shape in json_cases:
            await exchange(s, tally, url, tensor_body(shape=shape, data=[]), expect=400,
                           message="'shape'")
        for shape in ([2 ** 63, 0], [10 ** 30, 0], [2 ** 62, 4], [-5, 16]):
            h = header(shape)
            await exchange(s, tally, url, h, expect=400, message="'shape'",
                           headers={"Inference-Header-Content-Length": str(len(h))})
        await exchange(s, tally, url, infer_body(X), check=is_model_output(X))
    print(tally.as_dict())
    tally.check(answered=1, failed=len(json_cases) + 4)


# -- malformed input anywhere: a few dozen hostile bodies ------------------------------
def hostile_bodies():
    """(body, headers) pairs that must each get a 4xx: the benchmark's corpus
    (malformed JSON, absurd shapes, wrong datatypes, lying binary headers, garbage)."""
    from benchmarks.http_load import malformed_bodies

    return malformed_bodies()


async def test_hostile_bodies_get_4xx_and_the_server_keeps_answering():
    cases = hostile_bodies()
    assert len(cases) >= 60
    tally = Tally()
    async with front() as f, aiohttp.ClientSession() as s:
        url = f"{f.url}/v2/models/mlp/infer"
        for body, headers in cases:
            await exchange(s, tally, url, body, headers=headers, expect=(400, 404, 413))
        for path, method in [("/v2/models/mlp/infer", "GET"), ("/v2/models/%ff/infer",
                                                              "POST"),
                             ("/v2/models/mlp/versions/x/infer", "POST"),
                             ("/v2/" + "a" * 2000, "GET")]:
            await exchange(s, tally, f.url + path, b"{}", method=method,
                           expect=(404, 405))
        await exchange(s, tally, url, infer_body(X), check=is_model_output(X))
    print(tally.as_dict())
    tally.check(answered=1, failed=len(cases) + 4)


# -- 8: large bodies are parsed off the loop --------------------------------------------
def near_limit_json(limit: int) -> tuple[np.ndarray, bytes]:
    """The largest JSON body of whole rows under ``limit`` bytes."""
    rng = np.random.default_rng(1)
    probe = rng.standard_normal((100, 16)).astype(np.float32)
    rows = int(limit * 0.97 / (len(infer_body(probe)) / 100))
    x = rng.standard_normal((rows, 16)).astype(np.float32)
    body = infer_body(x)
    assert limit * 0.9 < len(body) <= limit, len(body)
    return x, body


async def test_large_json_bodies_do_not_stall_small_requests():
    limits = HttpLimits()
    x, big = await asyncio.to_thread(near_limit_json, limits.max_json_bytes)
    tally = Tally()
    small_before_first_large = 0
    large_done = 0
    async with front(limits=limits) as f, aiohttp.ClientSession() as s:
        url = f"{f.url}/v2/models/mlp/infer"
        answers = []

        async def large():
            nonlocal large_done

            async def post():
                async with s.post(url, data=big) as resp:
                    return resp.status, await resp.read()

            answers.append(await asyncio.wait_for(post(), WAIT_S))
            large_done += 1

        async def small(k):
            nonlocal small_before_first_large
            while large_done < 3:
                got = await exchange(s, tally, url, infer_body(X[k:k + 1]),
                                     check=is_model_output(X[k:k + 1]))
                if got is None or got[0] != 200:
                    return
                if large_done == 0:
                    small_before_first_large += 1

        await asyncio.gather(*[large() for _ in range(3)], small(0), small(1))
    for status, payload in answers:
        tally.sent += 1
        if status == 200 and np.array_equal(np.float32(strict_json(payload)["outputs"][0][
                "data"]).reshape(-1, 4), MODEL(x)):
            tally.answered_exactly += 1
        else:
            tally.wrong += 1
    print(tally.as_dict(), {"small_before_first_large": small_before_first_large,
                            "large_body_bytes": len(big)})
    tally.check(answered=tally.sent, failed=0)
    # Parsed on the loop, each large body would hold every small request for its whole
    # parse; off the loop, small requests keep completing while the large ones are
    # decoded, evaluated and encoded.
    assert small_before_first_large >= 10, small_before_first_large


async def test_json_bodies_over_the_json_bound_get_413_saying_use_binary():
    limits = HttpLimits(max_json_bytes=4096)
    tally = Tally()
    x = np.ones((100, 16), np.float32)
    async with front(limits=limits) as f, aiohttp.ClientSession() as s:
        url = f"{f.url}/v2/models/mlp/infer"
        await exchange(s, tally, url, infer_body(x), expect=413,
                       message="binary tensor extension")
        header = json.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                         "shape": list(x.shape),
                                         "parameters": {"binary_data_size": x.nbytes}}]}
                            ).encode()
        await exchange(s, tally, url, header + x.tobytes(), check=is_model_output(x),
                       headers={"Inference-Header-Content-Length": str(len(header))})
    tally.check(answered=1, failed=1)


# -- 9: slow and idle clients -----------------------------------------------------------
def status_of(answer: bytes | None) -> int | None:
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", answer or b"")
    return int(match.group(1)) if match else None


async def test_idle_slow_and_excess_connections_are_bounded_and_timed_out():
    cap = 16
    limits = HttpLimits(max_connections=cap, keepalive_timeout=0.5, read_timeout=1.0)
    tally = Tally()
    good = infer_body(X)
    async with front(limits=limits) as f, aiohttp.ClientSession() as s:
        url = f"{f.url}/v2/models/mlp/infer"
        opened = []
        # Twice the cap of idle connections, some sending half a request line.
        for i in range(2 * cap):
            reader, writer = await asyncio.open_connection("127.0.0.1", f.port)
            if i % 2:
                writer.write(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n")
            opened.append((reader, writer))
            await asyncio.sleep(0)
        # A real request still gets through: the longest-idle connection makes room.
        # Its answer also means the server has taken every earlier connection (they
        # are accepted in order), so the cap is checked after all of them.
        await exchange(s, tally, url, good, check=is_model_output(X))
        assert f.connections.open <= cap
        for reader, writer in opened:  # every idle one is closed, by eviction or timeout
            tally.sent += 1
            answer = await read_until_closed(reader, 5.0)
            if answer is None:
                tally.hung += 1
            elif answer == b"" or status_of(answer) == 503:
                tally.failed_clearly += 1
            else:
                tally.wrong += 1
            writer.close()
        # Slow bodies: 408 after read_timeout. When they fill the cap, every connection
        # is busy: one more gets 503 at once, and the server recovers.
        slow = []
        for _ in range(cap):
            reader, writer = await asyncio.open_connection("127.0.0.1", f.port)
            writer.write(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 1000\r\n\r\n" + good[:10])
            slow.append((reader, writer))
        await wait_until(lambda: f.connections.busy_connections == cap,
                         f"all {cap} slow bodies hold a busy connection")
        reader, writer = await asyncio.open_connection("127.0.0.1", f.port)
        tally.sent += 1
        answer = await read_until_closed(reader, 5.0)
        writer.close()
        refused = status_of(answer) == 503 and b"too many open connections" in answer
        tally.failed_clearly += refused
        tally.wrong += answer is not None and not refused
        tally.hung += answer is None
        for reader, writer in slow:
            tally.sent += 1
            answer = await read_until_closed(reader, 5.0)
            timed_out = status_of(answer) == 408 and b"read_timeout" in answer
            tally.failed_clearly += timed_out
            tally.wrong += answer is not None and not timed_out
            tally.hung += answer is None
            writer.close()
        await exchange(s, tally, url, good, check=is_model_output(X))
        assert f.connections.open <= cap
    print(tally.as_dict(), {"evicted": f.connections.evicted,
                            "refused": f.connections.refused})
    tally.check(answered=2, failed=2 * cap + 1 + cap)


async def test_exit_with_a_slow_client_connected_is_bounded():
    limits = HttpLimits(read_timeout=60.0, shutdown_timeout=1.0)
    f = front(limits=limits)
    await f.__aenter__()
    reader, writer = await asyncio.open_connection("127.0.0.1", f.port)
    writer.write(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Length: 1000\r\n\r\n{")
    await writer.drain()
    await wait_until(lambda: f.connections.busy_connections == 1,
                     "the slow client's request is in the front's handlers")
    # Bounded well under read_timeout and aiohttp's default shutdown timeout (60 s):
    # an exit that waits for either does not finish in time.
    await within(f.__aexit__(None, None, None), "the front's exit (shutdown_timeout=1)",
                 timeout=10)
    answer = await read_until_closed(reader, 5.0)
    writer.close()
    assert answer is not None  # closed, with 503 "shutting down" or plain EOF
    assert status_of(answer) in (503, None), answer


def _limit_files(n):
    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


def _serve(*flags, nofile=None):
    server = subprocess.Popen(
        [sys.executable, "-m", "async_search.http", "--port", "0", *flags],
        stderr=subprocess.PIPE, preexec_fn=_limit_files(nofile) if nofile else None,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    line = b""
    for _ in range(50):
        line = server.stderr.readline()
        if b"serving" in line or not line:
            break
    match = re.search(rb"http://127\.0\.0\.1:(\d+)", line)
    if not match:
        server.kill()
        raise AssertionError(line)
    return server, int(match.group(1))


async def test_more_idle_connections_than_files_do_not_exhaust_the_server_process():
    # The report: 1,100 idle connections under ulimit -n 1024 exhausted descriptors.
    # Scaled down: 300 idle connections to a server allowed 256 files, with the default
    # cap (512, lowered to half the file limit: 128).
    server, port = _serve("--keepalive-timeout", "1", nofile=256)
    tally = Tally()
    try:
        idle = []
        for _ in range(300):
            idle.append(await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port), 5))
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
            for k in range(3):
                x = np.ones((1, 16), np.float32) * k
                await exchange(s, tally, url, infer_body(x),
                               check=lambda p, x=x: np.allclose(
                                   np.float32(p["outputs"][0]["data"]),
                                   _builtin_mlp()(x).ravel()))
        for reader, writer in idle:
            tally.sent += 1
            answer = await read_until_closed(reader, 5.0)
            closed = answer == b"" or status_of(answer) == 503
            tally.failed_clearly += closed
            tally.hung += answer is None
            tally.wrong += answer is not None and not closed
            writer.close()
        assert server.poll() is None  # still serving
        # SIGTERM while a slow client is mid-body: the exit is bounded.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 1000\r\n\r\n{")
        await writer.drain()
        # One more request answered: the server has read what was sent before it.
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/v2/health/ready") as resp:
                assert resp.status == 200
        server.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.to_thread(server.wait, 10)
        except subprocess.TimeoutExpired:
            pytest.fail("the server did not exit within 10 s of SIGTERM with a slow "
                        "client mid-body")
        assert code == 0
        writer.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(5)
    print(tally.as_dict())
    tally.check(answered=3, failed=300)


def _builtin_mlp():
    from async_search.http import builtin_models
    return builtin_models()["mlp"]()


# -- 10: the repository ----------------------------------------------------------------
async def test_repository_is_off_by_default_and_load_parameters_are_bounded():
    tally = Tally()
    load = "/v2/repository/models/mlp/load"
    unload = "/v2/repository/models/mlp/unload"
    cap = default_max_workers()
    async with front() as f, aiohttp.ClientSession() as s:
        for path in (load, unload):
            await exchange(s, tally, f.url + path, b"", expect=403,
                           message="--enable-repository")
        await exchange(s, tally, f.url + load,
                       json.dumps({"parameters": {"num_workers": 300}}), expect=403)
        assert f.repository.entry("mlp").server.num_workers == 1
        assert f.addresses == [("127.0.0.1", f.port)]
    async with front(repository_token="s3cret") as f, aiohttp.ClientSession() as s:
        for headers in (None, {"Authorization": "Bearer wrong"},
                        {"Authorization": "s3cret"}):
            await exchange(s, tally, f.url + unload, b"", headers=headers, expect=403,
                           message="Authorization: Bearer")
        assert f.repository.entry("mlp").ready
        ok = {"Authorization": "Bearer s3cret"}
        await exchange(s, tally, f.url + load, json.dumps(
            {"parameters": {"num_workers": 2}}), headers=ok,
            check=lambda p: p["state"] == "READY")
        assert f.repository.entry("mlp").server.num_workers == 2
    async with front(enable_repository=True) as f, aiohttp.ClientSession() as s:
        for workers in (300, 10 ** 30, cap + 1, 0, -1, 2.5, "4", True, None, [2]):
            await exchange(s, tally, f.url + load, json.dumps(
                {"parameters": {"num_workers": workers}}), expect=400,
                message="num_workers must be an integer in [1, ")
        for body in (b"[1]", b"{", b'{"parameters": 3}', b"\xff",
                     json.dumps({"parameters": {f"k{i}": i for i in range(999)}}
                                ).encode(),
                     b'{"parameters": {"num_workers": 2, "x": 1}}'):
            await exchange(s, tally, f.url + load, body, expect=400)
        await exchange(s, tally, f.url + load, b"x" * (5 * 2 ** 20), expect=413)
        assert f.repository.entry("mlp").server.num_workers == 1
        await exchange(s, tally, f.url + "/v2/models/mlp/infer", infer_body(X),
                       check=is_model_output(X))
    print(tally.as_dict())
    tally.check(answered=2, failed=3 + 3 + 10 + 6 + 1)


# -- 11: non-finite outputs are strict JSON ---------------------------------------------
async def test_non_finite_outputs_are_written_as_strings_strict_parsers_accept():
    def special(x):
        y = x[:, :4].astype(np.float32).copy()
        y[:, 0], y[:, 1], y[:, 2] = np.nan, np.inf, -np.inf
        return y

    model = with_spec(special, (16,), np.float32)
    tally = Tally()
    expected = special(X)

    def same(payload):
        data = payload["outputs"][0]["data"]
        y = np.array(data, np.float32).reshape(expected.shape)  # as tritonclient reads
        return data[:3] == ["NaN", "Infinity", "-Infinity"] and np.array_equal(
            y, expected, equal_nan=True)

    async with HttpFront({"m": ModelSource(lambda: model)}) as f, \
            aiohttp.ClientSession() as s:
        url = f"{f.url}/v2/models/m/infer"
        await exchange(s, tally, url, infer_body(X), check=same)
        # Inputs may send either spelling; bare tokens are what lenient clients send.
        for data in (["NaN", "Infinity", "-Infinity"] + [1.0] * 13,
                     [math.nan, math.inf, -math.inf] + [1.0] * 13):
            body = json.dumps({"inputs": [{"name": "input", "shape": [1, 16],
                                           "datatype": "FP32", "data": data}]}).encode()
            await exchange(s, tally, url, body, check=lambda p: p["outputs"][0][
                "data"][3] == 1.0)
        for path in ("/v2", "/v2/models/m", "/v2/health/ready", "/v2/models/m/ready"):
            await exchange(s, tally, f.url + path, method="GET")
        # every error body is strict JSON too
        await exchange(s, tally, url, b"{", expect=400)
    print(tally.as_dict())
    tally.check(answered=7, failed=1)
