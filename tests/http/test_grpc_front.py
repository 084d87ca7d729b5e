"""The gRPC front: the protocol's methods, its status codes for every failure, its
drain, and tritonclient's own gRPC client as a peer that no one here wrote."""

import asyncio
import contextlib
import logging
import re
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")
pytest.importorskip("aiohttp")

import tritonclient.grpc.aio as triton  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from async_search.http.front import HttpFront  # noqa: E402
from async_search.http.grpc_front import GrpcFront  # noqa: E402
from async_search.http.grpc_tensors import REFUSED_KEY, TOO_LARGE_KEY, pb  # noqa: E402
from async_search.http.repository import ModelSource  # noqa: E402
from async_search.models import with_spec  # noqa: E402
from tests.http.served_models import (MODEL, X, Gated, Raising,  # noqa: E402
                                      UpdatedWhileWaiting)
from tests.helpers import wait_until, within  # noqa: E402

pytestmark = pytest.mark.timeout(120)

Code = grpc.StatusCode






def front(model=MODEL, **options):
    return GrpcFront({"mlp": ModelSource(lambda: model, model_thread=True)}, **options)


def infer_request(x, name="mlp", input_name="input", version=""):
    message = pb.ModelInferRequest(model_name=name, model_version=version)
    message.inputs.add(name=input_name, datatype="FP32" if x.dtype == np.float32 else
                       "FP64", shape=x.shape)
    message.raw_input_contents.append(x.tobytes())
    return message


async def status_of(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await within(call, "the status")
    return info.value


async def test_a_request_naming_a_version_is_never_answered_by_another():
    # The version was checked when the request came: a model updated while it waited
    # answered with the new version's outputs.
    async with GrpcFront({"m": UpdatedWhileWaiting()}) as f, \
            grpc.aio.insecure_channel(f.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        error = await status_of(stub.ModelInfer(infer_request(X[:1], "m", version="0")))
        assert error.code() == Code.NOT_FOUND
        assert re.search(r"model 'm' has no version '0' any more: it was updated while "
                         r"the request waited, and version '1' answered it",
                         error.details())
        answer = await within(stub.ModelInfer(infer_request(X[:1], "m", version="1")),
                              "an answer")
        assert answer.model_version == "1"


async def test_the_front_s_own_repository_bounds_an_unload_by_the_grace():
    async with front(shutdown_timeout=0.7) as f:
        assert f.repository.close_timeout == 0.7


# -- tritonclient's client as a peer ---------------------------------------------------
async def test_tritonclient_s_grpc_client_gets_the_model_s_answers():
    async with front() as f:
        client = triton.InferenceServerClient(f.address)
        try:
            assert await client.is_server_live() and await client.is_server_ready()
            assert await client.is_model_ready("mlp")
            assert (await client.get_server_metadata()).name == "async_search"
            metadata = await client.get_model_metadata("mlp", as_json=True)
            assert metadata["inputs"] == [{"name": "input", "datatype": "FP32",
                                           "shape": ["-1", "16"]}]
            assert metadata["versions"] == ["0"]
            tensor = triton.InferInput("input", list(X.shape), "FP32")
            tensor.set_data_from_numpy(X)
            result = await within(client.infer("mlp", [tensor], request_id="r7"),
                                  "tritonclient's answer")
            np.testing.assert_array_equal(result.as_numpy("output"), MODEL(X))
            assert result.get_response().id == "r7"
            assert result.get_response().model_version == "0"
            with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
                await client.get_model_metadata("nope")
        finally:
            await client.close()


# -- status codes ----------------------------------------------------------------------
async def test_every_failure_is_a_status_code_with_a_message():
    models = {"mlp": ModelSource(lambda: MODEL), "bad": ModelSource(Raising,
                                                                    model_thread=True)}
    async with GrpcFront(models) as f, grpc.aio.insecure_channel(f.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        cases = [
            (infer_request(X[:, :8]), Code.INVALID_ARGUMENT, r"shape \[5, 8\]; the model "
                                                             r"takes shape \[-1, 16\]"),
            (infer_request(X.astype(np.float64)), Code.INVALID_ARGUMENT, "datatype FP64"),
            (infer_request(X, input_name="x"), Code.INVALID_ARGUMENT, "unknown input 'x'"),
            (pb.ModelInferRequest(model_name="mlp"), Code.INVALID_ARGUMENT,
             "must have 'inputs'"),
            (infer_request(X, name="nope"), Code.NOT_FOUND, "unknown model 'nope'"),
            (infer_request(X, version="9"), Code.NOT_FOUND, "has no version '9'"),
            (infer_request(X, name="bad"), Code.INTERNAL, "the model broke"),
        ]
        # Two inputs are refused before either is decoded (700,000 of them held the
        # loop, the HTTP front's requests too, for 6 s): the second's datatype unread.
        two = infer_request(X)
        two.inputs.add(name="extra", datatype="NOPE", shape=[1])
        cases.append((two, Code.INVALID_ARGUMENT,
                      "the model takes one input 'input', the request has 2$"))
        for message, code, match in cases:
            error = await status_of(stub.ModelInfer(message))
            assert error.code() == code and re.search(match, error.details()), (
                code, error.details())
        error = await status_of(stub.ModelMetadata(pb.ModelMetadataRequest(name="x")))
        assert error.code() == Code.NOT_FOUND
        # the server lives on: the next request gets its answer
        answer = await within(stub.ModelInfer(infer_request(X)), "an answer")
        np.testing.assert_array_equal(
            np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(5, 4),
            MODEL(X))
        await f.repository.unload("mlp")
        error = await status_of(stub.ModelInfer(infer_request(X)))
        assert error.code() == Code.UNAVAILABLE and "is not loaded" in error.details()
        assert (REFUSED_KEY, "1") in tuple(error.trailing_metadata())
        assert not (await stub.ModelReady(pb.ModelReadyRequest(name="mlp"))).ready


async def test_bytes_that_are_not_the_message_get_invalid_argument_and_nothing_else_does():
    async with front() as f, grpc.aio.insecure_channel(f.address) as channel:
        for method in ("ModelInfer", "ModelMetadata", "ModelReady"):
            raw = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            for junk in (b"\x0a\x02\xff\xfe", b"\xff" * 5, b"\x0a\x10mlp"):
                error = await status_of(raw(junk))
                assert error.code() == Code.INVALID_ARGUMENT, (method, junk, error)
                assert "not a valid protobuf message" in error.details()
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert len((await stub.ModelInfer(infer_request(X))).raw_output_contents[0]) == 80


async def test_a_message_over_the_limit_is_refused_and_nothing_else_is():
    async with front(max_message_bytes=4096) as f, \
            grpc.aio.insecure_channel(f.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        error = await status_of(stub.ModelInfer(infer_request(np.zeros((100, 16),
                                                                       np.float32))))
        assert error.code() == Code.RESOURCE_EXHAUSTED
        assert len((await stub.ModelInfer(infer_request(X))).raw_output_contents[0]) == 80


async def test_a_client_s_deadline_cancels_its_request_on_the_server():
    model = Gated()
    async with front(model) as f, grpc.aio.insecure_channel(f.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        first = asyncio.ensure_future(stub.ModelInfer(infer_request(X[:1])))
        assert await within(asyncio.to_thread(model.started.wait, 10), "first batch")
        error = await status_of(stub.ModelInfer(infer_request(X[1:]), timeout=0.2))
        assert error.code() == Code.DEADLINE_EXCEEDED
        await wait_until(lambda: f.requests_in_progress == 1,
                         "the expired request left the handlers")
        model.gate.set()
        assert len((await within(first, "first")).raw_output_contents) == 1


# -- the drain -------------------------------------------------------------------------
async def test_stopping_answers_what_is_in_progress_and_refuses_what_comes():
    model = Gated()
    f = front(model, shutdown_timeout=10)
    async with f:
        channel = grpc.aio.insecure_channel(f.address)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        in_progress = asyncio.ensure_future(stub.ModelInfer(infer_request(X[:2])))
        assert await within(asyncio.to_thread(model.started.wait, 10), "a batch")
        exiting = asyncio.ensure_future(f.__aexit__(None, None, None))
        await asyncio.sleep(0.2)
        assert f.closing and not (await stub.ServerReady(pb.ServerReadyRequest())).ready
        error = await status_of(stub.ModelInfer(infer_request(X)))
        assert error.code() == Code.UNAVAILABLE and "stopping" in error.details()
        assert (REFUSED_KEY, "1") in tuple(error.trailing_metadata())
        # metadata and a model's readiness are answered throughout, as HTTP's GETs
        assert (await stub.ModelReady(pb.ModelReadyRequest(name="mlp"))).ready
        assert (await stub.ModelMetadata(pb.ModelMetadataRequest(name="mlp"))).inputs
        model.gate.set()
        answer = await within(in_progress, "the answer in progress")
        await within(exiting, "the exit")
        await channel.close()
    np.testing.assert_array_equal(
        np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(2, 4),
        MODEL(X[:2]))


async def test_what_outlasts_the_grace_is_answered_unavailable():
    model = Gated()
    f = front(model, shutdown_timeout=0.3)
    async with f:
        channel = grpc.aio.insecure_channel(f.address)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stuck = asyncio.ensure_future(stub.ModelInfer(infer_request(X[:2])))
        assert await within(asyncio.to_thread(model.started.wait, 10), "a batch")
        exiting = asyncio.ensure_future(f.__aexit__(None, None, None))
        error = await status_of(stuck)
        assert error.code() == Code.UNAVAILABLE
        assert "shutdown grace of 0.3 s" in error.details()
        model.gate.set()
        await within(exiting, "the exit")
        await channel.close()


# -- beside the HTTP front -------------------------------------------------------------
async def test_http_and_grpc_requests_join_the_same_batches():
    from async_search.http.client import RemoteEvaluate

    model = Gated()
    source = ModelSource(lambda: model, model_thread=True, pipeline_depth=1)
    async with HttpFront({"mlp": source}) as http, GrpcFront(http.repository) as g, \
            grpc.aio.insecure_channel(g.address) as channel, \
            RemoteEvaluate(http.url, "mlp") as over_http:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        first = asyncio.ensure_future(stub.ModelInfer(infer_request(X[:1])))
        assert await within(asyncio.to_thread(model.started.wait, 10), "first batch")
        by_grpc = [asyncio.ensure_future(stub.ModelInfer(infer_request(X[i:i + 1])))
                   for i in (1, 2)]
        by_http = [over_http(X[i:i + 1]) for i in (3, 4)]
        await asyncio.sleep(0.3)  # all four wait behind the first batch
        model.gate.set()
        answers = await within(asyncio.gather(first, *by_grpc), "gRPC answers")
        ys = await within(asyncio.gather(*by_http), "HTTP answers")
        stats = http.repository.entry("mlp").server.stats
    assert stats["batches"] == 2 and stats["elements"] == 5
    for i, answer in enumerate(answers):
        np.testing.assert_array_equal(
            np.frombuffer(answer.raw_output_contents[0], np.float32), MODEL(X[i:i + 1])[0])
    np.testing.assert_array_equal(np.concatenate(ys), MODEL(X[3:]))


def test_python_m_async_search_http_serves_grpc_with_grpc_port():
    server = subprocess.Popen([sys.executable, "-m", "async_search.http", "--port", "0",
                               "--grpc-port", "0"], stderr=subprocess.PIPE)
    try:
        lines = [server.stderr.readline().decode() for _ in range(2)]
        match = re.search(r"grpc://(127\.0\.0\.1:\d+)", "".join(lines))
        assert match, lines
        client = __import__("tritonclient.grpc", fromlist=["InferenceServerClient"])
        sync = client.InferenceServerClient(match.group(1))
        x = np.ones((3, 16), np.float32)
        tensor = client.InferInput("input", [3, 16], "FP32")
        tensor.set_data_from_numpy(x)
        y = sync.infer("mlp", [tensor], client_timeout=30).as_numpy("output")
        sync.close()
        assert y.shape == (3, 4)
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(5)
        server.stderr.close()


def test_arguments_are_checked_when_made():
    with pytest.raises(ValueError, match="port must be"):
        GrpcFront({}, port=70000)
    with pytest.raises(ValueError, match="max_message_bytes must be"):
        GrpcFront({}, max_message_bytes=0)
    with pytest.raises(ValueError, match="shutdown_timeout must be"):
        GrpcFront({}, shutdown_timeout=-1)
    with pytest.raises(ValueError, match="max_unsent_bytes must be"):
        GrpcFront({}, max_unsent_bytes=0)


async def test_a_second_signal_ends_the_grace_and_a_hung_model_holds_no_exit():
    # end_grace (the second signal) answered nothing before the grace's end, and the
    # exit then waited for the model's batch as long as the model took.
    import time

    model = Gated()  # never opened: a model that does not return
    f = front(model, shutdown_timeout=20)
    try:
        async with f:
            channel = grpc.aio.insecure_channel(f.address)
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            stuck = asyncio.ensure_future(stub.ModelInfer(infer_request(X[:2])))
            assert await within(asyncio.to_thread(model.started.wait, 10), "a batch")
            began = time.monotonic()
            exiting = asyncio.ensure_future(f.__aexit__(None, None, None))
            await asyncio.sleep(0.2)
            f.end_grace()
            error = await status_of(stuck)
            assert error.code() == Code.UNAVAILABLE
            assert "a second signal ended the shutdown grace" in error.details()
            await within(exiting, "the exit", timeout=10)
            assert time.monotonic() - began < 5
            await channel.close()
    finally:
        model.gate.set()


async def test_methods_the_front_does_not_serve_answer_unimplemented_without_a_traceback(
        caplog):
    # The stubs' own methods raised NotImplementedError: a traceback logged per call,
    # and the client told "Unexpected <class 'NotImplementedError'>".
    async with front() as f, grpc.aio.insecure_channel(f.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for name, call in [
                ("RepositoryModelLoad", stub.RepositoryModelLoad(
                    pb.RepositoryModelLoadRequest(model_name="mlp"))),
                ("ModelStatistics", stub.ModelStatistics(pb.ModelStatisticsRequest()))]:
            error = await status_of(call)
            assert error.code() == Code.UNIMPLEMENTED, (name, error)
            assert error.details() == f"{name} is not served by this front over gRPC"

        async def requests():
            yield infer_request(X)

        stream = stub.ModelStreamInfer(requests())
        assert await within(stream.code(), "the stream's status") == Code.UNIMPLEMENTED
        assert await stream.details() == ("ModelStreamInfer is not served by this front "
                                          "over gRPC")
        assert (await stub.ServerLive(pb.ServerLiveRequest())).live
    assert not [r for r in caplog.records if "NotImplementedError" in r.getMessage()
                or r.exc_info], [r.getMessage() for r in caplog.records]


# -- answers clients do not take -------------------------------------------------------
class _StalledClient:
    """A raw HTTP/2 client whose flow-control window is 0 and never opened
    (no WINDOW_UPDATE): the server can send it headers and trailers, never an answer's
    bytes. It acknowledges SETTINGS and PING, as a live client does."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer
        self.ended: set = set()  # streams the server ended (trailers: a refusal)
        self.next_id = 1
        self.reading = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, port: int) -> "_StalledClient":
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                     + _frame(4, 0, 0, struct.pack(">HI", 4, 0)))  # INITIAL_WINDOW 0
        return cls(reader, writer)

    def infer(self, message, port: int) -> None:
        headers = b"".join(_literal(n, v) for n, v in (
            (b":method", b"POST"), (b":scheme", b"http"),
            (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
            (b":authority", b"127.0.0.1:%d" % port),
            (b"content-type", b"application/grpc"), (b"te", b"trailers")))
        body = message.SerializeToString()
        self.writer.write(_frame(1, 0x4, self.next_id, headers) + _frame(
            0, 0x1, self.next_id, b"\0" + struct.pack(">I", len(body)) + body))
        self.next_id += 2

    async def _read(self) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await self.reader.readexactly(9)
                size = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
                stream = int.from_bytes(head[5:], "big") & 0x7FFFFFFF
                payload = await self.reader.readexactly(size)
                if kind in (0, 1) and flags & 0x1:
                    self.ended.add(stream)
                elif kind == 4 and not flags & 0x1:
                    self.writer.write(_frame(4, 0x1, 0))
                elif kind == 6 and not flags & 0x1:
                    self.writer.write(_frame(6, 0x1, 0, payload))

    async def close(self) -> None:
        self.reading.cancel()
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + \
        stream.to_bytes(4, "big") + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header without indexing (names and values under 127 bytes)."""
    return b"\0" + bytes([len(name)]) + name + bytes([len(value)]) + value


WIDE = 250_000  # FP32 values per row: answers of 1 MB a row


def wide_front(**options):
    model = with_spec(lambda x: np.full((len(x), WIDE), 1.5, np.float32), (1,),
                      np.float32)
    return GrpcFront({"wide": ModelSource(lambda: model, model_thread=True,
                                          max_batch_size=1)}, **options)


async def test_answers_a_client_does_not_take_are_bounded_by_max_unsent_bytes():
    # grpc holds a returned answer until flow control lets it out, for as long as its
    # client stays connected: a client that never read made the server hold every
    # answer it asked for (4 MB answers: RSS +12 MB per RPC, without bound).
    one_row = infer_request(np.ones((1, 1), np.float32), name="wide")
    async with wide_front(max_unsent_bytes=8 * 2 ** 20) as f, \
            grpc.aio.insecure_channel(f.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stalled = await _StalledClient.connect(f.port)
        try:
            for _ in range(6):
                stalled.infer(one_row, f.port)
            # two answers (3 MB each as counted) are held; the four others refused
            await wait_until(lambda: len(stalled.ended) == 4, "four refusals")
            assert 6 * 10 ** 6 < f.unsent_bytes <= 8 * 2 ** 20
            error = await status_of(stub.ModelInfer(one_row))
            assert error.code() == Code.RESOURCE_EXHAUSTED, error
            assert re.search(r"holds \d+ bytes of answers that clients have not taken.*"
                             r"max_unsent_bytes of 8388608; retry shortly",
                             error.details()), error.details()
            # not marked too large: clients retry it, not split it
            assert TOO_LARGE_KEY not in dict(error.trailing_metadata())
            # an answer over the bound alone: marked too large, to be split
            error = await status_of(stub.ModelInfer(
                infer_request(np.ones((3, 1), np.float32), name="wide")))
            assert error.code() == Code.RESOURCE_EXHAUSTED
            assert "ask for fewer rows" in error.details()
            assert (TOO_LARGE_KEY, "1") in tuple(error.trailing_metadata())
        finally:
            await stalled.close()
        # the client gone, its answers are let go: others are answered again
        await wait_until(lambda: f.unsent_bytes == 0, "the stalled answers let go")
        answer = await within(stub.ModelInfer(one_row), "an answer")
        assert len(answer.raw_output_contents[0]) == 4 * WIDE
        # (the client can hold the answer a moment before the server hears it was sent:
        # seen once, with three test runs sharing two cores)
        await wait_until(lambda: f.unsent_bytes == 0, "the answer's bytes let go")


async def test_a_client_that_leaves_before_its_answer_is_sent_logs_no_error(caplog):
    # grpc logged an ERROR with a traceback (ExecuteBatchError) for each such answer.
    one_row = infer_request(np.ones((1, 1), np.float32), name="wide")
    async with wide_front() as f:
        stalled = await _StalledClient.connect(f.port)
        try:
            stalled.infer(one_row, f.port)
            await wait_until(lambda: f.unsent_bytes > 0, "the answer held")
        finally:
            await stalled.close()
        await wait_until(lambda: f.unsent_bytes == 0, "the answer let go")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
        r.getMessage() for r in caplog.records]
    assert not logging.getLogger("grpc._cython.cygrpc").filters  # removed at the exit
