"""GrpcRemoteEvaluate against the project's gRPC front and KServe's model server with
gRPC on: the same answers, coalescing, versions, deadlines, retries and errors as the
HTTP client's."""

import asyncio

import numpy as np
import pytest

pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")

import async_search as asr  # noqa: E402
from async_search.errors import (InputSpecError, ModelNotFoundError,  # noqa: E402
                                 ProtocolError, RemoteError, RequestTimeoutError,
                                 ServerClosedError, ServerDiedError)
from async_search.http.grpc_client import GrpcRemoteEvaluate  # noqa: E402
from async_search.http.grpc_front import GrpcFront  # noqa: E402
from async_search.http.repository import ModelSource  # noqa: E402
from async_search.models import MLP  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402
from tests.helpers import wait_until, within  # noqa: E402
from tests.kserve_peer import W, kserve_model_server, needs_kserve  # noqa: E402
from tests.http.served_models import (PoisonedBy, SearchWorkload,  # noqa: E402
                                      check_only_the_poisoned_failed, poisoned_requests)
from tests.http.test_grpc_front import Gated, Raising  # noqa: E402

pytestmark = pytest.mark.timeout(120)

MODEL = MLP((16,), hidden_sizes=(32,), output_size=4, seed=0)
OTHER = MLP((16,), hidden_sizes=(32,), output_size=4, seed=1)
X = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)


def front(model=MODEL, **options):
    return GrpcFront({"mlp": ModelSource(lambda: model, model_thread=True)}, **options)


# -- answers ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad_value, error, status", [
    (99.0, RemoteError, "INTERNAL"), (-99.0, ProtocolError, "INVALID_ARGUMENT")])
async def test_a_failing_request_fails_alone_and_its_rpc_mates_are_answered(
        bad_value, error, status):
    xs = poisoned_requests(bad_value)
    async with GrpcFront({"m": ModelSource(PoisonedBy, model_thread=True)}) as f, \
            GrpcRemoteEvaluate(f.address, "m") as ev:
        got = await within(asyncio.gather(*(ev(x) for x in xs), return_exceptions=True),
                           "answers")
        stats = ev.stats
    check_only_the_poisoned_failed(got, xs, error, status)
    assert stats["requests"] == 8 and stats["split_rpcs"] == 10
    assert stats["mean_requests_per_rpc"] == 8


async def test_requests_of_one_iteration_travel_in_one_rpc_with_equal_answers():
    async with front() as f, GrpcRemoteEvaluate(f.address, "mlp") as evaluate:
        assert evaluate.input_spec == MODEL.input_spec and evaluate.version == "0"
        ys = await within(asyncio.gather(*(evaluate(X[i:i + 1]) for i in range(5)),
                                         evaluate(X), evaluate(X[:0])), "answers")
        stats = evaluate.stats
    for i in range(5):
        np.testing.assert_array_equal(ys[i], MODEL(X[i:i + 1]))
    np.testing.assert_array_equal(ys[5], MODEL(X))
    assert ys[6].shape == (0, 4) and ys[6].dtype == np.float32
    assert stats["rpcs"] == 1 and stats["requests"] == 7 and stats["elements"] == 10
    assert stats["mean_requests_per_rpc"] == 7
    ys[5][0, 0] = 99.0  # answers are the caller's own arrays, writable


async def test_searches_over_grpc_equal_searches_run_with_immediate():
    work = SearchWorkload()
    expected, expected_mcts = await work.expected()
    async with GrpcFront(work.models) as f, GrpcRemoteEvaluate(f.address, "h") as h, \
            GrpcRemoteEvaluate(f.address, "net") as pv:
        got, got_mcts = await work.run(h, pv)
        assert h.stats["mean_requests_per_rpc"] > 2  # coalesced
    assert got == expected
    assert got_mcts == expected_mcts


async def test_requests_made_while_every_rpc_slot_is_busy_leave_together():
    model = Gated()
    async with front(model) as f, GrpcRemoteEvaluate(f.address, "mlp",
                                                     max_connections=1) as ev:
        first = ev(X[:1])
        assert await within(asyncio.to_thread(model.started.wait, 10), "first batch")
        later = []
        for i in range(1, 5):  # four loop iterations, one request each
            later.append(ev(X[i:i + 1]))
            await asyncio.sleep(0)
        assert ev.stats["rpcs"] == 1 and ev.num_in_flight == 1
        model.gate.set()
        ys = await within(asyncio.gather(first, *later), "answers")
        stats = ev.stats
    assert stats["rpcs"] == 2  # the four waited and left as one
    for i, y in enumerate(ys):
        np.testing.assert_array_equal(y, MODEL(X[i:i + 1]))


# -- versions --------------------------------------------------------------------------
async def test_the_version_follows_model_version_and_a_cache_in_front_sees_the_swap():
    async with front() as f, GrpcRemoteEvaluate(f.address, "mlp") as ev:
        cached = asr.CachedEvaluate(ev, capacity=100)
        token = ev.swap_token
        np.testing.assert_array_equal(await cached(X[:1]), MODEL(X[:1]))
        f.repository.entry("mlp").server.update_model(OTHER, version=7)
        y, version = await within(ev.with_version(X[1:3]), "answer of the new model")
        np.testing.assert_array_equal(y, OTHER(X[1:3]))
        assert version == "7" and ev.version == "7" and ev.swap_token is not token
        np.testing.assert_array_equal(await cached(X[:1]), OTHER(X[:1]))
        assert cached.stats["invalidations"] == 1
    async with front() as f, GrpcRemoteEvaluate(f.address, "mlp",
                                                model_version="0") as ev:
        np.testing.assert_array_equal(await within(ev(X), "version 0"), MODEL(X))
        f.repository.entry("mlp").server.update_model(OTHER, version=1)
        with pytest.raises(ModelNotFoundError, match="has no version '0'"):
            await within(ev(X), "version 0 is gone")


async def test_retries_ride_over_an_unload_until_the_model_is_loaded_again():
    async with front() as f, GrpcRemoteEvaluate(f.address, "mlp", retries=30,
                                                backoff_s=0.01) as ev:
        await f.repository.unload("mlp")
        fut = ev(X)
        await wait_until(lambda: ev.stats["retries"] >= 2, "UNAVAILABLE is retried")
        await f.repository.load("mlp")
        np.testing.assert_array_equal(await within(fut, "the retried request"), MODEL(X))


# -- faults ----------------------------------------------------------------------------
async def test_a_request_past_its_deadline_fails_with_timeout_error():
    model = Gated()
    async with front(model) as f, GrpcRemoteEvaluate(f.address, "mlp", timeout=0.3) as ev:
        with pytest.raises(RequestTimeoutError, match="deadline of 0.3 s"):
            await asyncio.wait_for(ev(X), 5)  # (within() would rename it)
        short = ev(X[:1], timeout=0.1)
        with pytest.raises(RequestTimeoutError, match="request's timeout of 0.1 s"):
            await asyncio.wait_for(short, 5)
        model.gate.set()


async def test_a_stopped_server_is_a_server_died_error_after_the_retries():
    async with front() as f:
        address = f.address
        ev = GrpcRemoteEvaluate(address, "mlp", retries=2, backoff_s=0.01)
        await ev.__aenter__()
    try:
        with pytest.raises(ServerDiedError, match=f"{address}.*could not be reached"):
            await within(ev(X), "failure")
        assert ev.stats["rpcs"] == 3 and ev.stats["failed_rpcs"] == 1
    finally:
        await ev.aclose()
    with pytest.raises(ServerDiedError, match="could not be reached"):
        async with GrpcRemoteEvaluate(address, "mlp", retries=1, backoff_s=0.01):
            pass


async def test_a_stopping_server_s_refusal_is_a_server_closed_error():
    model = Gated()
    f = front(model, shutdown_timeout=10)
    async with f, GrpcRemoteEvaluate(f.address, "mlp", retries=1, backoff_s=0.01) as ev:
        in_progress = ev(X[:1])
        assert await within(asyncio.to_thread(model.started.wait, 10), "a batch")
        exiting = asyncio.ensure_future(f.__aexit__(None, None, None))
        await wait_until(lambda: f.closing, "the drain began")
        with pytest.raises(ServerClosedError, match="UNAVAILABLE: the server is stopping"):
            await within(ev(X[1:]), "refused")
        model.gate.set()
        np.testing.assert_array_equal(await within(in_progress, "answered"),
                                      MODEL(X[:1]))
        await within(exiting, "the exit")


async def test_bad_input_is_refused_with_input_spec_error_and_nothing_is_sent():
    async with front() as f, GrpcRemoteEvaluate(f.address, "mlp") as ev:
        for bad in (X[:, :8], X.astype(np.float64), X.tolist(), np.float32(1.0)):
            with pytest.raises(InputSpecError, match="16"):
                ev(bad)
        z = await within(ev(X.astype(X.dtype.newbyteorder())), "swapped bytes")
        assert ev.stats["requests"] == 1
    np.testing.assert_array_equal(z, MODEL(X))


async def test_requests_too_large_together_are_sent_again_in_halves_as_over_http():
    # RESOURCE_EXHAUSTED for a message over the server's limit was retried, then every
    # request failed as a ServerDiedError ("the server is gone").
    xs = [np.full((4000, 16), i, np.float32) for i in range(6)]  # 256 kB each
    async with front(max_message_bytes=2 ** 20) as f, \
            GrpcRemoteEvaluate(f.address, "mlp") as ev:
        ys = await within(asyncio.gather(*(ev(x) for x in xs)), "answers")
        stats = ev.stats
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, MODEL(x))
    assert stats["split_rpcs"] >= 2 and stats["retries"] == 0


async def test_one_request_too_large_fails_at_once_with_a_413_protocol_error():
    async with front(max_message_bytes=2 ** 20) as f, \
            GrpcRemoteEvaluate(f.address, "mlp") as ev:
        with pytest.raises(ProtocolError, match="RESOURCE_EXHAUSTED") as info:
            await within(ev(np.zeros((20_000, 16), np.float32)), "413")
        assert info.value.status == 413 and ev.stats["retries"] == 0


async def test_an_upstream_gone_or_late_is_unavailable_not_internal():
    # Both were INTERNAL ("the model failed"), which a client never retries.
    async def gone(x):
        raise ServerDiedError("the upstream server's connection is gone")

    async def late(x):
        raise RequestTimeoutError("no answer within the request's timeout")

    async with GrpcFront({"gone": gone, "late": late}) as f:
        for name in ("gone", "late"):
            async with GrpcRemoteEvaluate(f.address, name, retries=1,
                                          backoff_s=0.01,
                                          input_spec=asr.TensorSpec((16,), np.float32)
                                          ) as ev:
                with pytest.raises(ServerClosedError, match="answered UNAVAILABLE: "
                                                            "(the upstream|no answer)"):
                    await within(ev(X), "UNAVAILABLE")
                assert ev.stats["retries"] == 1


async def test_what_the_server_answers_becomes_the_matching_error():
    with pytest.raises(ModelNotFoundError, match="NOT_FOUND: unknown model 'nope'"):
        async with front() as f, GrpcRemoteEvaluate(f.address, "nope"):
            pass
    async with GrpcFront({"bad": ModelSource(Raising, model_thread=True)}) as f:
        async with GrpcRemoteEvaluate(f.address, "bad") as ev:
            with pytest.raises(RemoteError, match="gRPC INTERNAL.*the model broke"):
                await within(ev(X), "INTERNAL")
        async with GrpcRemoteEvaluate(f.address, "bad", input_spec=asr.TensorSpec(
                (8,), np.float32)) as ev:  # a spec the server does not take
            with pytest.raises(ProtocolError, match="INVALID_ARGUMENT") as info:
                await within(ev(X[:, :8]), "INVALID_ARGUMENT")
            assert info.value.status == 400
    async with front() as f, GrpcRemoteEvaluate(f.address, "mlp", retries=1,
                                                backoff_s=0.01) as ev:
        await f.repository.unload("mlp")
        with pytest.raises(ServerClosedError, match="UNAVAILABLE: model 'mlp' is not"):
            await within(ev(X), "UNAVAILABLE")


async def test_closing_fails_what_waits_and_later_calls():
    model = Gated()
    async with front(model) as f:
        ev = GrpcRemoteEvaluate(f.address, "mlp", max_connections=1)
        async with ev:
            sent = ev(X[:1])
            assert await within(asyncio.to_thread(model.started.wait, 10), "sent")
            waiting = ev(X[1:2])
        for fut in (sent, waiting):
            with pytest.raises(ServerClosedError, match="GrpcRemoteEvaluate .* was closed"):
                await within(fut, "closed")
        with pytest.raises(ServerClosedError, match="not open"):
            ev(X)
        model.gate.set()


def test_arguments_are_checked_when_made():
    for bad in ("http://h:1", "", None, "grpc://h:1"):
        with pytest.raises(ValueError, match="target must be a gRPC address"):
            GrpcRemoteEvaluate(bad, "mlp")
    with pytest.raises(ValueError, match="model_name must be"):
        GrpcRemoteEvaluate("h:1", "a/b")
    with pytest.raises(ValueError, match="retries must be an integer >= 0"):
        GrpcRemoteEvaluate("h:1", "mlp", retries=-1)


# -- KServe's own model server, gRPC on ------------------------------------------------
@needs_kserve
async def test_kserve_model_server_answers_over_grpc_like_the_model(tmp_path):
    with kserve_model_server(tmp_path, grpc=True) as (_, grpc_port):
        async with GrpcRemoteEvaluate(f"127.0.0.1:{grpc_port}", "linear", timeout=60,
                                      retries=40, backoff_s=0.1) as ev:
            assert ev.input_spec == asr.TensorSpec((16,), np.float32)
            ys = await within(asyncio.gather(*(ev(X[i:i + 1]) for i in range(5))),
                              "KServe's answers", timeout=30)
            y, version = await within(ev.with_version(X), "with version", timeout=30)
            assert ev.stats["rpcs"] == 2
            with pytest.raises(InputSpecError):
                ev(X[:, :8])
    np.testing.assert_array_equal(np.concatenate(ys), X @ W)
    np.testing.assert_array_equal(y, X @ W)


async def test_an_answer_that_is_not_the_protocol_s_is_a_model_output_error():
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    from async_search.errors import ModelOutputError
    from async_search.http.grpc_tensors import pb

    class Truncating(service_pb2_grpc.GRPCInferenceServiceServicer):
        async def ModelMetadata(self, request, context):  # noqa: N802
            metadata = pb.ModelMetadataResponse(name="m", versions=["1"])
            metadata.inputs.add(name="x", datatype="FP32", shape=[-1, 16])
            return metadata

        async def ModelInfer(self, request, context):  # noqa: N802
            response = pb.ModelInferResponse(model_name="m")
            response.outputs.add(name="y", datatype="FP32", shape=[2, 4])
            response.raw_output_contents.append(b"\0" * 12)  # 32 bytes are due
            return response

    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Truncating(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with GrpcRemoteEvaluate(f"127.0.0.1:{port}", "m") as ev:
            assert ev.version == "1"
            with pytest.raises(ModelOutputError, match="not the protocol's: .*12 bytes"):
                await within(ev(X[:2]), "bad answer")
    finally:
        await server.stop(None)


class _Answering(service_pb2_grpc.GRPCInferenceServiceServicer):
    """A servicer whose metadata is good and whose ModelInfer answers ``answer()``."""

    def __init__(self, answer):
        self.answer = answer

    async def ModelMetadata(self, request, context):  # noqa: N802
        from async_search.http.grpc_tensors import pb

        metadata = pb.ModelMetadataResponse(name="m", versions=["1"])
        metadata.inputs.add(name="x", datatype="FP32", shape=[-1, 16])
        return metadata

    async def ModelInfer(self, request, context):  # noqa: N802
        return self.answer()


async def _served(servicer=None, raw_infer=None):
    """A gRPC server of ``servicer``, or of a ModelInfer that answers the bytes
    ``raw_infer`` (not a message) beside good metadata; (server, address)."""
    import grpc

    server = grpc.aio.server()
    if servicer is not None:
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    else:
        good = _Answering(None)

        async def infer(request, context):
            return raw_infer

        async def metadata(request, context):
            return (await good.ModelMetadata(None, None)).SerializeToString()

        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "inference.GRPCInferenceService",
            {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer),
             "ModelMetadata": grpc.unary_unary_rpc_method_handler(metadata)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_an_answer_that_is_not_a_message_is_a_model_output_error():
    # grpc gives None for bytes that do not parse: callers got AttributeError.
    from async_search.errors import ModelOutputError

    server, address = await _served(raw_infer=b"\xff\xff\xff\xff not a message")
    try:
        async with GrpcRemoteEvaluate(address, "m", retries=0) as ev:
            with pytest.raises(ModelOutputError, match="not a ModelInferResponse"):
                await within(ev(X[:2]), "bytes that are not a message")
    finally:
        await server.stop(None)


async def test_an_answer_longer_than_max_response_bytes_is_refused_and_the_client_serves_on():
    # No limit on the answers a client took: a 600 MiB answer to one row was held
    # whole (2 GB of the client's memory) before it was found wrong.
    from async_search.http.grpc_tensors import pb

    limit = 1 << 20
    size = {"bytes": 2 * limit}

    def answer():
        response = pb.ModelInferResponse(model_name="m")
        values = size["bytes"] // 4
        response.outputs.add(name="y", datatype="FP32", shape=[1, values])
        response.raw_output_contents.append(b"\0" * (values * 4))
        return response

    server, address = await _served(_Answering(answer))
    try:
        async with GrpcRemoteEvaluate(address, "m", retries=0,
                                      max_response_bytes=limit) as ev:
            with pytest.raises(asr.ResponseTooLongError, match=f"max_response_bytes={limit}"):
                await within(ev(X[:1]), "a long answer")
            assert ev.stats["split_rpcs"] == 0  # not the request's fault: not split
            size["bytes"] = limit  # as long as the limit: taken
            y = await within(ev(X[:1]), "an answer at the limit")
            assert y.shape == (1, limit // 4)
    finally:
        await server.stop(None)


def test_a_response_with_two_outputs_of_one_name_is_refused():
    from async_search.http.grpc_tensors import decode_response, pb

    response = pb.ModelInferResponse(model_name="m")
    for value in (1.0, 2.0):
        response.outputs.add(name="a", datatype="FP32", shape=[1]).contents.fp32_contents\
            .append(value)
    with pytest.raises(ProtocolError, match="second output named 'a'"):
        decode_response(response)


async def test_requests_whose_answers_are_too_long_together_are_sent_again_in_halves():
    from tests.http.served_models import WIDE, check_answers_too_long_together_are_halved

    # (grpc's limit: 32 KiB of tensors and 64 KiB of room for the rest of a message)
    async with front(WIDE) as f, GrpcRemoteEvaluate(f.address, "mlp",
                                                    max_response_bytes=32 << 10) as ev:
        await check_answers_too_long_together_are_halved(ev, "split_rpcs",
                                                         alone=X)  # 100 KiB
