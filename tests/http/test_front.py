import asyncio
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

aiohttp = pytest.importorskip("aiohttp")  # the http extra

import async_search as asr
from async_search.http.front import HttpFront, HttpLimits
from async_search.http.repository import ModelSource
from async_search.models import MLP, with_spec
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)

MODEL = MLP((16,), hidden_sizes=(32,), output_size=4, seed=0)
X = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)


def infer_body(x, name="input", datatype="FP32"):
    return json.dumps({"inputs": [{"name": name, "shape": list(x.shape),
                                   "datatype": datatype,
                                   "data": x.ravel().tolist()}]}).encode()


async def in_thread(fn, *args):
    return await asyncio.wait_for(asyncio.to_thread(fn, *args), 30)


async def post(session, url, data, headers=None):
    async with session.post(url, data=data, headers=headers) as resp:
        return resp.status, await resp.read()


def triton_session(port):
    """Everything tritonclient does against the front, in one synchronous call."""
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    client = th.InferenceServerClient(url=f"127.0.0.1:{port}")
    try:
        report = {"live": client.is_server_live(), "ready": client.is_server_ready(),
                  "model_ready": client.is_model_ready("mlp"),
                  "metadata": client.get_model_metadata("mlp"), "outputs": []}
        for binary_in, binary_out in [(False, False), (True, True), (True, False),
                                      (False, True)]:
            tensor = th.InferInput("input", list(X.shape), "FP32")
            tensor.set_data_from_numpy(X, binary_data=binary_in)
            result = client.infer("mlp", [tensor], request_id="r7", outputs=[
                th.InferRequestedOutput("output", binary_data=binary_out)])
            report["outputs"].append(result.as_numpy("output"))
            report["id"] = result.get_response()["id"]
        result = client.infer("mlp", [tensor])  # no outputs named: all, as binary
        report["outputs"].append(result.as_numpy("output"))
        bad = th.InferInput("input", [2, 8], "FP32")
        bad.set_data_from_numpy(np.zeros((2, 8), np.float32))
        try:
            client.infer("mlp", [bad])
        except InferenceServerException as e:
            report["bad"] = (e.status(), e.message())
        return report
    finally:
        client.close()


async def test_tritonclient_runs_inference_with_json_and_binary_tensors():
    async with HttpFront({"mlp": ModelSource(lambda: MODEL)}) as front:
        report = await in_thread(triton_session, front.port)
    assert report["live"] and report["ready"] and report["model_ready"]
    assert report["metadata"]["inputs"] == [
        {"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
    assert report["metadata"]["outputs"] == [
        {"name": "output", "datatype": "FP32", "shape": [-1, 4]}]
    assert len(report["outputs"]) == 5
    for y in report["outputs"]:
        np.testing.assert_array_equal(y, MODEL(X))
    assert report["id"] == "r7"
    status, message = report["bad"]
    assert status == "400" and "the model takes shape [-1, 16]" in message


def load_cycle(port):
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    client = th.InferenceServerClient(url=f"127.0.0.1:{port}")
    tensor = th.InferInput("input", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    try:
        client.unload_model("mlp")
        report = {"ready_after_unload": client.is_model_ready("mlp")}
        try:
            client.infer("mlp", [tensor])
        except InferenceServerException as e:
            report["unloaded_infer"] = (e.status(), e.message())
        client.load_model("mlp")
        report["ready_after_load"] = client.is_model_ready("mlp")
        report["output"] = client.infer("mlp", [tensor]).as_numpy("output")
        return report
    finally:
        client.close()


async def test_models_are_unloaded_and_loaded_while_serving():
    async with HttpFront({"mlp": ModelSource(lambda: MODEL)},
                         enable_repository=True) as front:
        first = front.repository.entry("mlp").server
        report = await in_thread(load_cycle, front.port)
        second = front.repository.entry("mlp").server
        assert second is not None and second is not first
        async with aiohttp.ClientSession() as s:
            status, payload = await post(
                s, f"{front.url}/v2/repository/models/mlp/load",
                json.dumps({"parameters": {"num_workers": 2}}))
            assert status == 200 and second.num_workers == 2
            status, payload = await post(
                s, f"{front.url}/v2/repository/models/mlp/load",
                json.dumps({"parameters": {"workers": 2}}))
            assert status == 400 and b"unknown load parameters ['workers']" in payload
            status, payload = await post(s, f"{front.url}/v2/repository/index", b"")
            assert json.loads(payload) == [
                {"name": "mlp", "version": "0", "state": "READY", "reason": ""}]
    assert first._closed  # the unloaded server was drained and closed
    assert report["ready_after_unload"] is False and report["ready_after_load"] is True
    assert report["unloaded_infer"][0] == "503"
    assert "is not loaded" in report["unloaded_infer"][1]
    np.testing.assert_array_equal(report["output"], MODEL(X))


class Gated:
    """The model blocks its device thread on the first batch until the test opens it."""

    input_spec = MODEL.input_spec

    def __init__(self):
        self.gate = threading.Event()
        self.started = threading.Event()
        self.batches = []

    def __call__(self, x):
        self.started.set()
        assert self.gate.wait(10)
        self.batches.append(len(x))
        return MODEL(x)


class Counting:
    """Counts the requests the front makes, then passes them on."""

    def __init__(self, evaluate):
        self.evaluate = evaluate
        self.calls = 0

    async def with_version(self, x):
        self.calls += 1
        return await self.evaluate.with_version(x)

    def __call__(self, x):
        return self.evaluate(x)


async def test_http_requests_join_the_same_batches_as_in_process_requests():
    model = Gated()
    async with asr.serve(model, max_batch_size=64, pipeline_depth=1) as evaluate:
        counting = Counting(evaluate)
        async with HttpFront({"mlp": counting}) as front, aiohttp.ClientSession() as s:
            blocker = asyncio.ensure_future(evaluate(X[:1]))  # holds the device
            assert await in_thread(model.started.wait, 10)
            url = f"{front.url}/v2/models/mlp/infer"
            remote = [asyncio.ensure_future(post(s, url, infer_body(X[i % 5:i % 5 + 1])))
                      for i in range(8)]
            local = [asyncio.ensure_future(evaluate(X[i % 5:i % 5 + 1]))
                     for i in range(8)]
            await wait_until(lambda: counting.calls == 8,
                             "all eight HTTP requests reach the server")
            model.gate.set()
            answers = await asyncio.wait_for(asyncio.gather(*remote), 10)
            await asyncio.wait_for(asyncio.gather(blocker, *local), 10)
    assert model.batches == [1, 16]  # eight from the network, eight from this loop
    for i, (status, payload) in enumerate(answers):
        assert status == 200
        y = json.loads(payload)["outputs"][0]["data"]
        np.testing.assert_array_equal(np.float32(y), MODEL(X[i % 5:i % 5 + 1]).ravel())


def raw_http(port, request: bytes, close_early=False) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        if close_early:
            sock.shutdown(socket.SHUT_WR)
        return read_answer(sock)


def read_answer(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except (ConnectionResetError, socket.timeout):
        pass
    return b"".join(chunks)


def header(payload, **params):
    return json.dumps({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                                   "parameters": params}]}).encode()


async def test_bad_requests_get_4xx_errors_and_the_server_keeps_serving():
    good = infer_body(X[:2])
    h = header(None, binary_data_size=64)
    as_strings = json.loads(good)
    as_strings["inputs"][0]["data"][3] = "1"  # a number sent as a string: not a number
    as_strings["inputs"][0]["data"][5] = "NaN"  # the documented spelling: taken
    cases = [
        ("/v2/models/mlp/infer", json.dumps(as_strings).encode(), {}, 400,
         "input 'input' 'data' element [3] holds the string '1'"),
        ("/v2/models/mlp/infer", b"{not json", {}, 400, "not valid JSON"),
        ("/v2/models/mlp/infer", b'{"inputs": 3}', {}, 400, "must have 'inputs'"),
        ("/v2/models/mlp/infer", infer_body(X[:2, :8]), {}, 400, "[-1, 16]"),
        ("/v2/models/mlp/infer", infer_body(X[:2].astype(np.float64), datatype="FP64"),
         {}, 400, "has datatype FP64"),
        ("/v2/models/mlp/infer", infer_body(X[:2], name="x"), {}, 400, "unknown input"),
        ("/v2/models/mlp/infer", h + X[:1].tobytes()[:30],
         {"Inference-Header-Content-Length": str(len(h))}, 400, "truncated"),
        ("/v2/models/mlp/infer", good, {"Inference-Header-Content-Length": "-3"}, 400,
         "Inference-Header-Content-Length must be an integer, got '-3'"),
        ("/v2/models/nope/infer", good, {}, 404, "unknown model 'nope'"),
        ("/v2/models/mlp/versions/7/infer", good, {}, 404, "has no version '7'"),
        ("/v2/nowhere", good, {}, 404, "Not Found"),
        ("/v2/models/mlp/infer", b"x" * 5000, {}, 413, "over the front's limit of 4096"),
        ("/v2/repository/models/mlp/load", b"[1]", {}, 400, "must be a JSON object"),
    ]
    async with HttpFront({"mlp": ModelSource(lambda: MODEL)}, max_body_bytes=4096,
                         enable_repository=True) as front:
        async with aiohttp.ClientSession() as s:
            for path, data, headers, status, message in cases:
                got, payload = await post(s, front.url + path, data, headers)
                assert got == status, (path, payload)
                assert message in json.loads(payload)["error"], payload
                got, payload = await post(s, f"{front.url}/v2/models/mlp/infer", good)
                assert got == 200
            async def chunks():  # no Content-Length: the limit holds while reading
                for _ in range(10):
                    yield b" " * 1000
            got, payload = await post(s, f"{front.url}/v2/models/mlp/infer", chunks())
            assert got == 413 and "limit of 4096 bytes" in json.loads(payload)["error"]
            async with s.get(f"{front.url}/v2/models/mlp/infer") as resp:
                assert resp.status == 405 and "error" in json.loads(await resp.read())
        # A body cut off by the client, and a request that is not HTTP at all.
        cut = (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n"
               b"\r\n" + good[:100])
        await in_thread(raw_http, front.port, cut, True)
        answer = await in_thread(raw_http, front.port, b"\x16\x03\x01garbage\r\n\r\n")
        assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0]
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"Content-Type: application/json" in head and b"garbage" not in body
        assert json.loads(body)["error"]  # "...not TLS" from aiohttp 3.10 on
        async with aiohttp.ClientSession() as s:
            got, payload = await post(s, f"{front.url}/v2/models/mlp/infer", good)
            assert got == 200
            np.testing.assert_array_equal(
                np.float32(json.loads(payload)["outputs"][0]["data"]), MODEL(X[:2]).ravel())


async def test_a_model_that_raises_gets_500_and_the_next_request_is_served():
    calls = []

    def flaky(x):
        calls.append(len(x))
        if len(calls) == 1:
            raise FloatingPointError("overflow in layer 3")
        return x[:, :2] * 2

    model = with_spec(flaky, (16,), np.float32)
    async with HttpFront({"f": ModelSource(lambda: model)}) as front, \
            aiohttp.ClientSession() as s:
        url = f"{front.url}/v2/models/f/infer"
        status, payload = await post(s, url, infer_body(X[:1]))
        assert status == 500
        assert json.loads(payload) == {
            "error": "model 'f' failed: FloatingPointError: overflow in layer 3"}
        status, payload = await post(s, url, infer_body(X[:1]))
        assert status == 200


async def test_a_model_whose_spec_is_big_endian_takes_http_requests_as_in_process():
    # A byte order is no datatype: FP32 is what the spec ">f4" takes.
    model = with_spec(lambda x: x[:, :2] * 2, (16,), ">f4")
    async with HttpFront({"be": ModelSource(lambda: model)}) as front, \
            aiohttp.ClientSession() as s:
        status, payload = await post(s, f"{front.url}/v2/models/be/infer",
                                     infer_body(X[:2]))
        assert status == 200, payload
        output = json.loads(payload)["outputs"][0]
        np.testing.assert_allclose(np.reshape(output["data"], output["shape"]),
                                   X[:2, :2] * 2)
        status, payload = await post(s, f"{front.url}/v2/models/be/infer",
                                     infer_body(X[:2].astype(np.float64), datatype="FP64"))
        assert status == 400 and b"FP32" in payload  # another datatype still is refused


async def test_versions_appear_in_responses_routes_and_metrics():
    async with asr.serve(MODEL) as evaluate, HttpFront({"mlp": evaluate}) as front, \
            aiohttp.ClientSession() as s:
        status, payload = await post(s, f"{front.url}/v2/models/mlp/versions/0/infer",
                                     infer_body(X[:1]))
        assert status == 200 and json.loads(payload)["model_version"] == "0"
        new = MLP((16,), hidden_sizes=(32,), output_size=4, seed=1)
        evaluate.update_model(new, 1)
        status, payload = await post(s, f"{front.url}/v2/models/mlp/infer",
                                     infer_body(X[:1]))
        response = json.loads(payload)
        assert response["model_version"] == "1"
        np.testing.assert_array_equal(np.float32(response["outputs"][0]["data"]),
                                      new(X[:1]).ravel())
        status, _ = await post(s, f"{front.url}/v2/models/mlp/versions/0/infer",
                               infer_body(X[:1]))
        assert status == 404
        async with s.get(f"{front.url}/v2/models/mlp") as resp:
            assert json.loads(await resp.read())["versions"] == ["1"]
        async with s.get(f"{front.url}/metrics") as resp:
            text = (await resp.read()).decode()
        assert resp.headers["Content-Type"].startswith("text/plain")
        assert 'async_search_http_requests_total{code="200",model="mlp",version="1"} 1.0' \
            in text
        assert 'async_search_model_version_info{model="mlp",server="",version="1"} 1.0' \
            in text


async def test_a_request_naming_a_version_is_never_answered_by_another():
    # The version was checked when the request came: a model updated while it waited
    # answered it with the new version's outputs, and a 200.
    from tests.http.served_models import UpdatedWhileWaiting

    async with HttpFront({"m": UpdatedWhileWaiting()}) as front, \
            aiohttp.ClientSession() as s:
        status, payload = await post(s, f"{front.url}/v2/models/m/versions/0/infer",
                                     infer_body(X[:1]))
        assert status == 404, payload
        assert re.search(r"model 'm' has no version '0' any more: it was updated while "
                         r"the request waited, and version '1' answered it",
                         json.loads(payload)["error"])
        status, payload = await post(s, f"{front.url}/v2/models/m/versions/1/infer",
                                     infer_body(X[:1]))
        assert status == 200 and json.loads(payload)["model_version"] == "1"
        status, payload = await post(s, f"{front.url}/v2/models/m/infer", infer_body(X[:1]))
        assert status == 200 and json.loads(payload)["model_version"] == "1"


async def test_a_load_under_way_gets_409_at_once_and_the_index_says_loading():
    # Loads and unloads queued behind a factory that never returned, each holding its
    # request (aiohttp cancels no handler when its client goes) until the front's exit.
    gate = threading.Event()

    def factory():
        gate.wait(30)
        return MODEL

    try:
        async with HttpFront({"m": ModelSource(factory, load_on_start=False)},
                             enable_repository=True) as front, \
                aiohttp.ClientSession() as s:
            repository = f"{front.url}/v2/repository"
            loading = asyncio.ensure_future(post(s, f"{repository}/models/m/load", b""))
            async def state():
                async with s.post(f"{repository}/index") as resp:
                    return json.loads(await resp.read())[0]["state"]
            await wait_until(lambda: front.repository.index()[0]["state"] == "LOADING",
                             "loading")
            assert await state() == "LOADING"
            for action in ("load", "unload"):
                status, payload = await asyncio.wait_for(
                    post(s, f"{repository}/models/m/{action}", b""), 5)
                assert status == 409, (action, payload)
                assert "model 'm' is loading now" in json.loads(payload)["error"]
            gate.set()
            status, _ = await asyncio.wait_for(loading, 10)
            assert status == 200 and await state() == "READY"
    finally:
        gate.set()


async def test_a_body_that_arrives_across_an_unload_and_load_is_served_by_the_new_server():
    # The server was picked before the body was read: the one the unload closed
    # answered 503 "the server is closed", though the model was ready again.
    async with HttpFront({"m": ModelSource(lambda: MODEL)}, enable_repository=True) \
            as front, aiohttp.ClientSession() as s:
        body = infer_body(X[:1])
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        try:
            writer.write(f"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
            await writer.drain()
            await wait_until(lambda: front.requests_in_progress == 1, "the request read")
            for action in ("unload", "load"):
                status, _ = await post(s, f"{front.url}/v2/repository/models/m/{action}",
                                       b"")
                assert status == 200
            writer.write(body[10:])
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(65536), 10)
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        data = json.loads(answer.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"]
        np.testing.assert_allclose(np.float32(data), MODEL(X[:1]).ravel())


async def test_a_function_that_reports_no_version_is_served_with_an_empty_version():
    async def plain(x):  # no version, no with_version: the version is unknown
        return MODEL(x)

    async with HttpFront({"f": plain}) as front, aiohttp.ClientSession() as s:
        status, payload = await post(s, f"{front.url}/v2/models/f/infer",
                                     infer_body(X[:1]))
        assert status == 200 and json.loads(payload)["model_version"] == ""
        status, payload = await post(s, f"{front.url}/v2/models/f/versions/0/infer",
                                     infer_body(X[:1]))
        assert status == 404 and "has no version '0'" in json.loads(payload)["error"]
        async with s.get(f"{front.url}/v2/models/f") as resp:
            assert json.loads(await resp.read())["versions"] == []


def test_every_repository_error_has_one_status():
    from aiohttp import web

    from async_search import errors
    from async_search.http.front import http_status

    assert http_status(errors.ModelNotFoundError("x")) == 404
    assert http_status(errors.ModelNotReadyError("x")) == 503
    assert http_status(errors.LoadParametersError("x")) == 400
    assert http_status(errors.ModelLoadError("x")) == 500
    assert http_status(errors.ModelBusyError("x")) == 409
    assert http_status(errors.ProtocolError("x", status=413)) == 413
    assert http_status(web.HTTPNotFound()) == 404
    assert http_status(RuntimeError("x")) is None  # the front's own failure: a 500


async def test_binds_localhost_by_default():
    async with HttpFront({"mlp": ModelSource(lambda: MODEL)}) as front:
        assert front.host == "127.0.0.1" and front.url.startswith("http://127.0.0.1:")
        assert front.addresses == [("127.0.0.1", front.port)]


def test_python_m_async_search_http_serves_the_builtin_mlp():
    server = subprocess.Popen([sys.executable, "-m", "async_search.http", "--port", "0"],
                              stderr=subprocess.PIPE, env={**os.environ})
    try:
        line = b""
        for _ in range(50):
            line = server.stderr.readline()
            if b"serving" in line or not line:
                break
        match = re.search(rb"http://127\.0\.0\.1:(\d+)", line)
        assert match, line
        port = int(match.group(1))
        answer = raw_http(port, b"GET /v2/models/mlp HTTP/1.1\r\nHost: x\r\n"
                                b"Connection: close\r\n\r\n")
        metadata = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert metadata["inputs"] == [{"name": "input", "datatype": "FP32",
                                       "shape": [-1, 16]}]
        server.send_signal(signal.SIGTERM)
        assert server.wait(10) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(5)


async def test_codec_pool_runs_calls_in_other_processes_and_replaces_dead_ones():
    import time

    from async_search.http import kserve
    from async_search.http.codec_pool import CodecPool
    from async_search.errors import ProtocolError

    pool = CodecPool(1)
    try:
        pid = await pool.run(os.getpid)
        assert pid != os.getpid()
        with pytest.raises(ProtocolError, match="not valid JSON") as info:
            await pool.run(kserve.decode_request, b"{")
        assert info.value.status == 400
        slow = asyncio.ensure_future(pool.run(time.sleep, 0.3))
        await wait_until(lambda: not pool._idle, "the worker takes the slow call")
        slow.cancel()  # the worker finishes that call before it takes the next
        assert await pool.run(os.getpid) == pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ProtocolError, match="codec worker process failed") as info:
            await pool.run(os.getpid)
        assert info.value.status == 503
        assert await pool.run(os.getpid) not in (pid, os.getpid())
    finally:
        await pool.aclose(5)
    with pytest.raises(ProtocolError, match="shutting down"):
        await pool.run(os.getpid)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_codec_worker_that_cannot_start_leaves_no_descriptor_open(loop):
    # Under uvloop, a worker start that failed with EMFILE left two socket pairs open:
    # a front at ulimit -n 32 stayed at its limit, and every large JSON body got 503
    # "a codec worker process failed (OSError)" from then on, one at a time.
    import resource

    from async_search.errors import ProtocolError
    from async_search.event_loops import loop_factory
    from async_search.http.codec_pool import CodecPool

    factory = loop_factory(loop == "uvloop")
    if loop == "uvloop" and factory is None:
        pytest.skip("uvloop is not installed")
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd")

    def open_fds():
        return set(os.listdir("/proc/self/fd"))

    async def starts():
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        warm = CodecPool(1)  # what a loop opens once for good (uvloop's spare /dev/null)
        try:
            await warm.run(int, "1")
        finally:
            await warm.aclose(5)
        before = open_fds()
        outcomes = []
        pool = CodecPool(1)
        try:
            # Out of descriptors at each step of a start, until one starts.
            while 7 not in outcomes and len(outcomes) < 16:
                fillers = []
                resource.setrlimit(resource.RLIMIT_NOFILE, (len(before) + 64, hard))
                try:
                    while True:  # every descriptor taken, then some of them let go
                        try:
                            fillers.append(os.open(os.devnull, os.O_RDONLY))
                        except OSError:
                            break
                    free = len(outcomes)
                    for fd in fillers[len(fillers) - free:]:
                        os.close(fd)
                    del fillers[len(fillers) - free:]
                    try:
                        outcomes.append(await pool.run(int, "7"))
                    except ProtocolError as e:
                        assert e.status == 503 and "ulimit -n" in str(e), e
                        outcomes.append(None)
                finally:
                    for fd in fillers:
                        os.close(fd)
                    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            assert await pool.run(int, "8") == 8  # and it goes on working
        finally:
            await pool.aclose(5)
        for _ in range(100):  # closed pipes are let go of on the loop's next turns
            if not open_fds() - before:
                break
            await asyncio.sleep(0.02)
        leaked = open_fds() - before
        return outcomes, [os.readlink(f"/proc/self/fd/{fd}") for fd in leaked
                          if os.path.exists(f"/proc/self/fd/{fd}")]

    with asyncio.Runner(loop_factory=factory) as runner:
        outcomes, leaked = runner.run(starts())
    assert None in outcomes and 7 in outcomes, outcomes
    assert not leaked, leaked


def test_limits_are_validated_and_every_one_has_a_flag():
    from async_search.http.__main__ import _parser
    from async_search.http.front import HttpLimits

    with pytest.raises(ValueError, match="max_connections must be an integer >= 1, "
                                         "got 0"):
        HttpLimits(max_connections=0)
    with pytest.raises(ValueError, match="read_timeout must be a number of seconds > 0"):
        HttpLimits(read_timeout=float("inf"))
    with pytest.raises(ValueError, match="max_workers must be an integer >= 1 or None"):
        HttpLimits(max_workers=0)
    with pytest.raises(ValueError, match="write_timeout must be a number of seconds > 0"):
        HttpLimits(write_timeout=0)
    with pytest.raises(ValueError, match="max_unsent_bytes must be an integer >= 1"):
        HttpLimits(max_unsent_bytes=True)
    args = _parser().parse_args(["--max-json-bytes", "1000", "--max-connections", "9",
                                 "--keepalive-timeout", "2", "--read-timeout", "3",
                                 "--shutdown-timeout", "4", "--offload-bytes", "5",
                                 "--offload-workers", "1", "--max-workers", "6",
                                 "--write-timeout", "7", "--max-unsent-bytes", "8",
                                 "--enable_repository", "--repository_token", "t"])
    for field in dataclasses.fields(HttpLimits):
        assert getattr(args, field.name) is not None, field.name
    assert (args.write_timeout, args.max_unsent_bytes) == (7, 8)
    assert args.enable_repository and args.repository_token == "t"
    defaults = _parser().parse_args([])
    assert not defaults.enable_repository and defaults.host == "127.0.0.1"
    assert defaults.max_connections == HttpLimits().max_connections


async def test_server_metadata_lists_the_repository_only_when_it_is_on():
    for kwargs, listed in [({}, False), ({"enable_repository": True}, True),
                           ({"repository_token": "t"}, True)]:
        async with HttpFront({"mlp": ModelSource(lambda: MODEL)}, **kwargs) as front, \
                aiohttp.ClientSession() as s:
            async with s.get(f"{front.url}/v2") as resp:
                extensions = json.loads(await resp.read())["extensions"]
        assert ("model_repository" in extensions) == listed
        assert "binary_tensor_data" in extensions


def test_the_connection_cap_stays_under_half_the_file_limit():
    import resource

    from async_search.http.limits import (FRONT_DESCRIPTORS, WORKER_DESCRIPTORS,
                                          connection_cap, refusal_cap)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    spare = soft - FRONT_DESCRIPTORS - 2 * WORKER_DESCRIPTORS  # two codec workers
    assert connection_cap(10 ** 9, 2) == (10 ** 9 if soft == resource.RLIM_INFINITY
                                          else spare // 2)
    assert connection_cap(3) == 3
    if soft == resource.RLIM_INFINITY:
        return
    assert refusal_cap(10 ** 9, 2) == spare - spare // 2
    # At a low limit the front's own descriptors and its workers' come first: half of
    # ulimit -n 32 (16 connections) left none to start a codec worker with.
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, hard))
    try:
        assert connection_cap(512, 1) == (32 - FRONT_DESCRIPTORS - WORKER_DESCRIPTORS) // 2
        assert connection_cap(512, 1) + refusal_cap(512, 1) + FRONT_DESCRIPTORS + \
            WORKER_DESCRIPTORS <= 32
        assert connection_cap(512, 8) == 1  # never none
        assert refusal_cap(512, 8) == 0
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resident_memory_stays_flat_over_100000_http_requests():
    """100,000 requests through the HTTP front (JSON, binary tensors, 400s for numbers
    sent as strings, a metrics scrape now and then): resident memory after the
    warm-up rounds stays within 5 %. About 20 s on two busy cores."""
    from tests.servers.resident_memory import assert_flat, resident_memory_of

    report = resident_memory_of("http", 100_000)
    assert report["statuses"] == {"200": 90_000, "400": 10_000}
    assert_flat(report["rss_mib"])


async def test_a_gzip_body_of_binary_tensors_is_read_by_its_inflated_json_length():
    # Inference-Header-Content-Length is the JSON's length before compression (as
    # tritonclient sends it): it was checked against the compressed Content-Length.
    import gzip

    async def twice(x):
        return 2 * x

    x = np.ones((64, 16), np.float32)  # compresses well
    header = json.dumps({"id": "r" * 300, "inputs": [{
        "name": "input", "datatype": "FP32", "shape": [64, 16],
        "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    body = gzip.compress(header + x.tobytes())
    assert len(body) < len(header)
    async with HttpFront({"twice": twice}) as front, aiohttp.ClientSession() as session:
        status, answer = await post(session, f"{front.url}/v2/models/twice/infer", body, {
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
    assert status == 200, answer
    out = json.loads(answer)["outputs"][0]
    assert out["shape"] == [64, 16] and set(out["data"]) == {2.0}


async def test_a_small_body_that_inflates_past_the_limit_gets_413_and_the_front_serves_on():
    import gzip

    async def twice(x):
        return 2 * x

    bomb = gzip.compress(b"\0" * (8 << 20))  # 8 MiB of zeros in a few kB
    limits_front = HttpFront({"twice": twice}, max_body_bytes=1 << 20)
    async with limits_front as front, aiohttp.ClientSession() as session:
        status, answer = await post(session, f"{front.url}/v2/models/twice/infer", bomb,
                                    {"Content-Type": "application/json",
                                     "Content-Encoding": "gzip"})
        assert status == 413 and b"decoded" in answer, answer[:200]
        status, answer = await post(session, f"{front.url}/v2/models/twice/infer",
                                    infer_body(np.ones(4, np.float32)))
        assert status == 200, answer[:200]
        status, answer = await post(session, f"{front.url}/v2/models/twice/infer",
                                    b"abc", {"Content-Encoding": "compress"})
        assert status == 415, answer[:200]


async def test_an_authorization_header_that_is_not_text_gets_403_not_500():
    async with HttpFront({"mlp": MODEL}, repository_token="s3cret") as front:
        host, port = front.url.split("//")[1].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v2/repository/models/mlp/unload HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer \xff\xfe\r\nContent-Length: 0\r\n"
                     b"Connection: close\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]


async def test_an_answer_refused_for_unsent_bytes_counts_as_a_503_and_says_it_is_too_big():
    async def identity(x):
        return x

    limits = dataclasses.replace(HttpLimits(), max_unsent_bytes=100_000)
    async with HttpFront({"id": identity}, limits=limits) as front, \
            aiohttp.ClientSession() as session:
        n = 20_000  # 80 kB of FP32 out: over half of max_unsent_bytes, so never written
        status, answer = await post(session, f"{front.url}/v2/models/id/infer",
                                    infer_body(np.zeros(n, np.float32)))
        async with session.get(f"{front.url}/metrics") as resp:
            metrics = await resp.text()
    assert status == 503 and b"ask for fewer rows" in answer, answer[:200]
    assert 'requests_total{code="503",model="id"' in metrics
    assert 'code="200"' not in metrics.split("async_search_http_requests_total")[-1]


async def test_an_upstream_gone_or_late_is_503_or_504_which_clients_retry_not_500():
    # Both were 500 "model failed", which a client never retries.
    async def gone(x):
        raise asr.errors.ServerDiedError("the upstream server's connection is gone")

    async def late(x):
        raise asr.errors.RequestTimeoutError("no answer within the request's timeout")

    async with HttpFront({"gone": gone, "late": late}) as front, \
            aiohttp.ClientSession() as session:
        for name, expected, said in (("gone", 503, "is unavailable"),
                                     ("late", 504, "did not answer in time")):
            status, answer = await post(session, f"{front.url}/v2/models/{name}/infer",
                                        infer_body(np.ones((1, 4), np.float32)))
            assert status == expected and said.encode() in answer, answer


@pytest.mark.parametrize("flags, message", [
    (["--port", "70000"], "port must be an integer in"),
    (["--max-body-bytes", "0"], "max_body_bytes must be an integer >= 1"),
    (["--max-batch-size", "0"], "max_batch_size must be an integer >= 1"),
    (["--port", "0", "--grpc-port", "99999"], "port must be an integer in"),
    (["--port", "0", "--grpc-max-concurrent-rpcs", "-5"], "must be an integer >= 1"),
    (["--port", "0", "--grpc-port", "0", "--grpc-max-concurrent-rpcs", "0"],
     "must be an integer >= 1"),
    (["--port", "0", "--num-workers", "0"], "num_workers must be an integer >= 1"),
    (["--port", "0", "--num-workers", "100000"], "over max_workers"),
    (["--port", "0", "--model", "nosuchmodule:make"], "No module named 'nosuchmodule'"),
    (["--port", "0", "--model", "os:nosuchfunction"], "has no attribute"),
    (["--port", "0", "--model", "os:getcwd"], "loading model 'getcwd' failed"),
    # taken for no name: the model was served as 'mlp' without a word
    (["--port", "0", "--name", ""], "model names must be non-empty strings"),
])
def test_python_m_async_search_http_refuses_bad_flags_in_one_line(flags, message):
    done = subprocess.run([sys.executable, "-m", "async_search.http", *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-800:]
    assert done.stderr.strip().splitlines()[-1].startswith("python -m async_search.http: ")
    assert message in done.stderr
    assert "serving" not in done.stderr  # refused before anything bound (a bad
    # --grpc-port was refused once the HTTP front served)


def gated_front(**options):
    """A front of a model that does not return (it is opened only at the test's end)
    and a grace of 0.5 s: ``(model, front)``."""
    model = Gated()
    return model, HttpFront({"mlp": ModelSource(lambda: model, model_thread=True)},
                            limits=HttpLimits(shutdown_timeout=0.5), **options)


async def stuck_request(front, session, model):
    """A request whose batch has reached the model, which holds it."""
    stuck = asyncio.ensure_future(
        post(session, f"{front.url}/v2/models/mlp/infer", infer_body(X[:1])))
    assert await in_thread(model.started.wait, 10)
    return stuck


async def test_a_model_that_never_returns_holds_the_exit_one_grace_at_most():
    # The exit waited for the model's batch, however many signals came.
    import time

    model, front = gated_front()
    try:
        async with front, aiohttp.ClientSession() as s:
            stuck = await stuck_request(front, s, model)
            began = time.monotonic()
            exiting = asyncio.ensure_future(front.aclose())
            status, payload = await asyncio.wait_for(stuck, 10)
            assert status == 503 and b"shutdown grace of 0.5 s" in payload
            await asyncio.wait_for(exiting, 10)
            assert time.monotonic() - began < 4  # the grace, then one more for the model
    finally:
        model.gate.set()


async def test_an_unload_whose_model_never_returns_ends_within_the_grace():
    # The front's own repository waited for the model's batch without end while
    # serving (bounded only at the exit), and so did every load and unload after it.
    import time

    model, front = gated_front(enable_repository=True)
    try:
        async with front, aiohttp.ClientSession() as s:
            stuck = await stuck_request(front, s, model)
            began = time.monotonic()
            status, _ = await asyncio.wait_for(
                post(s, f"{front.url}/v2/repository/models/mlp/unload", b""), 10)
            assert status == 200 and time.monotonic() - began < 4
            status, payload = await asyncio.wait_for(stuck, 10)
            assert status == 503, payload
            status, _ = await asyncio.wait_for(
                post(s, f"{front.url}/v2/repository/models/mlp/load", b""), 10)
            assert status == 200
    finally:
        model.gate.set()


async def test_unknown_unload_parameters_are_named_cut_and_at_most_ten():
    # A 100 KB key, or 20,000 keys (229 KB), came back whole in the 400's message.
    async with HttpFront({"mlp": ModelSource(lambda: MODEL)},
                         enable_repository=True) as front, aiohttp.ClientSession() as s:
        url = f"{front.url}/v2/repository/models/mlp/unload"
        for parameters in ({"k" * 100_000: 1}, {f"key{i}": 1 for i in range(20_000)}):
            status, payload = await post(s, url, json.dumps({"parameters": parameters}))
            assert status == 400 and len(payload) < 1000, (status, len(payload))
            assert "unknown unload parameters" in json.loads(payload)["error"]
        assert front.repository.entry("mlp").ready  # nothing was unloaded


async def test_a_load_body_over_max_json_bytes_gets_413_chunked_or_not():
    # Only the Content-Length was checked: a chunked 12.5 MB body was parsed, and loaded.
    payload = json.dumps({"parameters": {"num_workers": 1}, "pad": [1.5] * 1000}).encode()

    async def chunks():
        for i in range(0, len(payload), 500):
            yield payload[i:i + 500]

    async with HttpFront({"mlp": ModelSource(lambda: MODEL)}, enable_repository=True,
                         limits=HttpLimits(max_json_bytes=1000)) as front, \
            aiohttp.ClientSession() as s:
        url = f"{front.url}/v2/repository/models/mlp/load"
        for data in (chunks(), payload):
            status, answer = await post(s, url, data)
            assert status == 413, (status, answer[:200])
            assert "max_json_bytes of 1000" in json.loads(answer)["error"]


def closing_request(body: bytes) -> bytes:
    """An inference request for "twice" that asks to close the connection after it."""
    return (b"POST /v2/models/twice/infer HTTP/1.1\r\nHost: x\r\nConnection: close"
            b"\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


async def test_a_burst_of_connections_each_with_its_request_gets_an_answer_each():
    # At the cap, connections whose requests had arrived but had not reached the
    # handlers yet were closed as idle, with no answer (13 of 40 at a cap of 16).
    async def twice(x):
        return 2 * x

    cap, n = 8, 20
    request = closing_request(infer_body(np.ones((1, 4), np.float32)))
    async with HttpFront({"twice": twice},
                         limits=HttpLimits(max_connections=cap)) as front:
        sockets = []
        try:
            for _ in range(n):  # all sent before the front (this loop) accepts any
                sockets.append(socket.create_connection(("127.0.0.1", front.port),
                                                        timeout=10))
                sockets[-1].sendall(request)
            answers = await in_thread(lambda: [read_answer(s) for s in sockets])
        finally:
            for sock in sockets:
                sock.close()
    statuses = [answer.split(b"\r\n", 1)[0] for answer in answers]
    assert set(statuses) <= {b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable"}, \
        statuses
    assert statuses.count(b"HTTP/1.1 200 OK") >= cap
    assert front.connections.evicted == 0


async def test_a_burst_of_new_connections_over_the_cap_gets_503s_not_silent_closes():
    # Each newcomer closed the connection accepted just before it as idle, its request
    # not arrived yet: of 300 clients at a cap of 32, 268 got EOF with no status. And a
    # refused client that had sent its request got a reset, not the 503.
    async def twice(x):
        return 2 * x

    cap, n = 8, 24
    request = closing_request(infer_body(np.ones((1, 4), np.float32)))
    async with HttpFront({"twice": twice},
                         limits=HttpLimits(max_connections=cap)) as front:
        limiter = front.connections
        sockets = []
        try:
            for _ in range(n):  # no byte sent before the front has accepted them all
                sockets.append(socket.create_connection(("127.0.0.1", front.port),
                                                        timeout=10))
            await wait_until(lambda: limiter.refused + limiter.evicted >= n - cap,
                             "the front took every connection")
            for sock in sockets:
                sock.sendall(request)
            answers = await in_thread(lambda: [read_answer(s) for s in sockets])
        finally:
            for sock in sockets:
                sock.close()
        statuses = [answer.split(b"\r\n", 1)[0] for answer in answers]
        assert statuses.count(b"HTTP/1.1 200 OK") == cap, statuses
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(refused) == n - cap, statuses
        assert all(b"too many open connections" in a for a in refused)
        # Closed for a newcomer before they sent, or refused: each got its 503.
        assert limiter.evicted + limiter.refused == n - cap
        for _ in refused:  # a client that retries gets through
            with socket.create_connection(("127.0.0.1", front.port), timeout=10) as sock:
                sock.sendall(request)
                answer = await in_thread(read_answer, sock)
            assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:200]


async def test_a_flood_of_silent_connections_does_not_lock_out_real_requests():
    # A new connection was protected from eviction for 0.5 s: 40 silent connections a
    # second held every slot of a cap of 4, and real requests got 503.
    async def twice(x):
        return 2 * x

    async with HttpFront({"twice": twice}, limits=HttpLimits(max_connections=4)) as front:
        held = []

        async def flood():
            while True:
                held.append((await asyncio.open_connection("127.0.0.1", front.port))[1])
                await asyncio.sleep(0.05)

        flooding = asyncio.ensure_future(flood())
        statuses = []
        try:
            await asyncio.sleep(0.5)
            for _ in range(5):
                reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
                writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"
                             b"Connection: close\r\n\r\n")
                statuses.append(await asyncio.wait_for(reader.readline(), 10))
                writer.close()
                await asyncio.sleep(0.2)
        finally:
            flooding.cancel()
            for writer in held:
                writer.close()
        assert statuses == [b"HTTP/1.1 200 OK\r\n"] * 5, statuses
        assert front.connections.evicted >= 10


async def test_a_closed_front_keeps_neither_itself_nor_its_models_alive():
    # aiohttp caches each handler with its app, process-wide (up to 1024): the front's
    # bound methods kept every closed front and the models it served alive.
    import gc
    import weakref

    class Doubling:
        def __call__(self, x):
            return 2 * x

    async def serve_one_request():
        model = Doubling()
        async with asr.serve(with_spec(model, (4,), np.float32)) as evaluate:
            async with HttpFront({"m": evaluate}) as front:
                async with aiohttp.ClientSession() as session:
                    status, _ = await post(session, f"{front.url}/v2/models/m/infer",
                                           infer_body(np.ones((1, 4), np.float32)))
                    assert status == 200
                    async with session.get(f"{front.url}/v2/health/ready") as answer:
                        assert answer.status == 200
        return weakref.ref(model), weakref.ref(front)

    refs = [await serve_one_request() for _ in range(3)]
    gc.collect()
    assert [(model(), front()) for model, front in refs] == [(None, None)] * 3


@pytest.mark.parametrize("order", ["first_in_first_out", "last_in_first_out"])
async def test_fronts_of_one_loop_leave_its_exception_handler_as_it_was_in_any_order(
        order):
    # Each front's accept-error handler restored the one it replaced only when it was
    # still on top: fronts stopped in the order they started left one on the loop.
    async def twice(x):
        return 2 * x

    loop = asyncio.get_running_loop()
    before = loop.get_exception_handler()
    first = await HttpFront({"twice": twice}).__aenter__()
    second = await HttpFront({"twice": twice}).__aenter__()
    for front in [first, second] if order == "first_in_first_out" else [second, first]:
        await front.__aexit__(None, None, None)
    assert loop.get_exception_handler() is before


async def test_a_silent_connection_closed_for_a_newcomer_lingers_until_its_503_is_read():
    # aiohttp's clean-up of the detached handler closed the socket a millisecond after
    # the 503: a request arriving then met a reset, as a refused one did before.
    async def twice(x):
        return 2 * x

    async with HttpFront({"twice": twice}, limits=HttpLimits(max_connections=1)) as front:
        silent = socket.create_connection(("127.0.0.1", front.port), timeout=10)
        await wait_until(lambda: front.connections.open == 1, "the first is accepted")
        newcomer = socket.create_connection(("127.0.0.1", front.port), timeout=10)
        try:
            await wait_until(lambda: front.connections.evicted == 1, "the first is evicted")
            await asyncio.sleep(0.3)
            assert len(front.connections._lingering) == 1
            silent.sendall(closing_request(infer_body(np.ones((1, 4), np.float32))))
            answer = await in_thread(read_answer, silent)
            assert answer.startswith(b"HTTP/1.1 503") and b"too many open" in answer
        finally:
            silent.close()
            newcomer.close()
