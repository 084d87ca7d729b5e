"""RemoteEvaluate against the project's own KServe v2 front, a proxy that drops
connections, and KServe's Python model server (a peer no one here wrote)."""

import asyncio
import contextlib
import json
import threading

import numpy as np
import pytest

pytest.importorskip("aiohttp")

import async_search as asr  # noqa: E402
from async_search.errors import (InputSpecError, ModelNotFoundError,  # noqa: E402
                                 ModelOutputError, ProtocolError, RemoteError,
                                 RequestTimeoutError, ServerClosedError,
                                 ServerDiedError)
from async_search.http.client import RemoteEvaluate  # noqa: E402
from async_search.http.front import HttpFront  # noqa: E402
from async_search.http.repository import ModelSource  # noqa: E402
from async_search.models import MLP  # noqa: E402
from tests.http.served_models import (MODEL, WIDE, X, Gated,  # noqa: E402
                                      PoisonedBy, Raising, SearchWorkload,
                                      check_answers_too_long_together_are_halved,
                                      check_only_the_poisoned_failed, poisoned_requests)
from tests.helpers import wait_until, within  # noqa: E402
from tests.kserve_peer import W, kserve_model_server, needs_kserve  # noqa: E402

pytestmark = pytest.mark.timeout(120)

OTHER = MLP((16,), hidden_sizes=(32,), output_size=4, seed=1)


def front(model=MODEL, **options):
    return HttpFront({"mlp": ModelSource(lambda: model, model_thread=True)}, **options)






class DroppingProxy:
    """A TCP proxy to a front that drops the connection of the next ``drops`` inference
    requests: before the server sees them (``mode="request"``), or after it answered,
    the answer lost (``mode="answer"``). ``drops=-1`` drops every one."""

    def __init__(self, port: int, drops: int, mode: str = "request"):
        self.target, self.drops, self.mode = port, drops, mode
        self.dropped = 0
        self._server = None
        self._tasks = set()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self):
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _drop_now(self, chunk: bytes) -> bool:
        if not chunk.startswith(b"POST") or self.drops == 0:
            return False
        self.drops -= 1 if self.drops > 0 else 0
        self.dropped += 1
        return True

    async def _connection(self, reader, writer):
        self._tasks.add(asyncio.current_task())
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        lose_answer = asyncio.Event()

        async def upstream():
            while chunk := await reader.read(1 << 16):
                if self._drop_now(chunk):
                    if self.mode == "request":
                        return
                    lose_answer.set()
                up_writer.write(chunk)
                await up_writer.drain()

        async def downstream():
            while chunk := await up_reader.read(1 << 16):
                if lose_answer.is_set():
                    return
                writer.write(chunk)
                await writer.drain()

        try:
            ways = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
            await asyncio.wait(ways, return_when=asyncio.FIRST_COMPLETED)
            for way in ways:
                way.cancel()
        finally:
            writer.close()
            up_writer.close()
            self._tasks.discard(asyncio.current_task())


# -- answers ---------------------------------------------------------------------------
async def test_requests_of_one_iteration_travel_in_one_http_request_with_equal_answers():
    async with front() as f, RemoteEvaluate(f.url, "mlp") as evaluate:
        assert evaluate.input_spec == MODEL.input_spec and evaluate.version == "0"
        ys = await within(asyncio.gather(*(evaluate(X[i:i + 1]) for i in range(5)),
                                         evaluate(X), evaluate(X[:0])), "answers")
        stats = evaluate.stats
    for i in range(5):
        np.testing.assert_array_equal(ys[i], MODEL(X[i:i + 1]))
    np.testing.assert_array_equal(ys[5], MODEL(X))
    assert ys[6].shape == (0, 4) and ys[6].dtype == np.float32
    assert stats["http_requests"] == 1 and stats["requests"] == 7
    assert stats["elements"] == 10
    ys[5][0, 0] = 99.0  # answers are the caller's own arrays, writable


async def test_searches_over_http_equal_searches_run_with_immediate():
    work = SearchWorkload()
    expected, expected_mcts = await work.expected()
    async with HttpFront(work.models) as f, RemoteEvaluate(f.url, "h") as h, \
            RemoteEvaluate(f.url, "net") as pv:
        got, got_mcts = await work.run(h, pv)
        assert h.stats["mean_requests_per_http_request"] > 2  # coalesced
    assert got == expected
    assert got_mcts == expected_mcts


async def test_requests_made_while_every_connection_is_busy_leave_together():
    model = Gated()
    async with front(model) as f, RemoteEvaluate(f.url, "mlp", max_connections=1) as ev:
        first = ev(X[:1])
        assert await within(asyncio.to_thread(model.started.wait, 10), "first batch")
        later = []
        for i in range(1, 5):  # four loop iterations, one request each
            later.append(ev(X[i:i + 1]))
            await asyncio.sleep(0)
        assert ev.stats["http_requests"] == 1 and ev.num_in_flight == 1
        model.gate.set()
        ys = await within(asyncio.gather(first, *later), "answers")
        stats = ev.stats
    assert stats["http_requests"] == 2  # the four waited and left as one
    for i, y in enumerate(ys):
        np.testing.assert_array_equal(y, MODEL(X[i:i + 1]))


async def test_a_request_cancelled_before_it_leaves_is_not_sent():
    async with front() as f, RemoteEvaluate(f.url, "mlp") as ev:
        dropped, kept = ev(X[:2]), ev(X[2:3])
        dropped.cancel()
        y = await within(kept, "the kept request")
        stats = ev.stats
    np.testing.assert_array_equal(y, MODEL(X[2:3]))
    assert stats["requests"] == 1 and stats["elements"] == 1


# -- versions --------------------------------------------------------------------------
async def test_the_version_follows_model_version_and_a_cache_in_front_sees_the_swap():
    async with front() as f, RemoteEvaluate(f.url, "mlp") as ev:
        cached = asr.CachedEvaluate(ev, capacity=100)  # accepted: it reports swaps
        token = ev.swap_token
        assert ev.version == "0" and token is not None
        y, version = await within(ev.with_version(X[:2]), "first answer")
        assert version == "0" and ev.swap_token is token
        np.testing.assert_array_equal(await cached(X[:1]), MODEL(X[:1]))
        np.testing.assert_array_equal(await cached(X[:1]), MODEL(X[:1]))
        assert cached.stats["hits"] == 1
        f.repository.entry("mlp").server.update_model(OTHER, version=7)
        y, version = await within(ev.with_version(X[1:3]), "answer of the new model")
        np.testing.assert_array_equal(y, OTHER(X[1:3]))
        assert version == "7" and ev.version == "7" and ev.swap_token is not token
        # the cache learnt of the swap from that answer: no result of the old model
        np.testing.assert_array_equal(await cached(X[:1]), OTHER(X[:1]))
        assert cached.stats["invalidations"] == 1


async def test_retries_ride_over_an_unload_until_the_model_is_loaded_again():
    async with front(enable_repository=True) as f, RemoteEvaluate(
            f.url, "mlp", retries=30, backoff_s=0.01) as ev:
        await f.repository.unload("mlp")
        fut = ev(X)
        await wait_until(lambda: ev.stats["retries"] >= 2, "503s are retried")
        await f.repository.load("mlp")
        y, version = await within(ev.with_version(X[:1]), "after the load")
        np.testing.assert_array_equal(await within(fut, "the retried request"), MODEL(X))
    np.testing.assert_array_equal(y, MODEL(X[:1]))
    assert version == "0"  # a reloaded model starts again at version 0 (the front's)


# -- faults ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["request", "answer"])
async def test_a_dropped_connection_is_retried_and_answered(mode):
    async with front() as f, DroppingProxy(f.port, drops=2, mode=mode) as proxy, \
            RemoteEvaluate(proxy.url, "mlp", backoff_s=0.01) as ev:
        ys = await within(asyncio.gather(ev(X[:2]), ev(X[2:])), "answers")
        stats = ev.stats
    assert proxy.dropped == 2 and stats["retries"] == 2
    np.testing.assert_array_equal(np.concatenate(ys), MODEL(X))


async def test_when_every_attempt_is_dropped_the_error_names_the_server():
    async with front() as f, DroppingProxy(f.port, drops=-1) as proxy, \
            RemoteEvaluate(proxy.url, "mlp", retries=2, backoff_s=0.01) as ev:
        with pytest.raises(ServerDiedError, match=f"127.0.0.1:{proxy.port}/v2/models/mlp"):
            await within(ev(X), "failure")
        assert ev.stats["http_requests"] == 3 and ev.stats["failed_http_requests"] == 1
        assert proxy.dropped == 3


async def test_a_request_past_its_deadline_fails_with_timeout_error():
    model = Gated()
    async with front(model) as f, RemoteEvaluate(f.url, "mlp", timeout=0.3) as ev:
        with pytest.raises(RequestTimeoutError, match="deadline of 0.3 s"):
            await asyncio.wait_for(ev(X), 5)  # (within() would rename it)
        model.gate.set()


async def test_a_request_timeout_fails_that_request_alone_and_drops_it_if_unsent():
    model = Gated()
    async with front(model) as f, RemoteEvaluate(f.url, "mlp", max_connections=1) as ev:
        sent_short, sent_long = ev(X[:1], timeout=0.2), ev(X[1:2])
        assert await within(asyncio.to_thread(model.started.wait, 10), "first batch")
        waiting_short, waiting_long = ev(X[2:3], timeout=0.2), ev(X[3:4])
        for fut in (sent_short, waiting_short):
            with pytest.raises(RequestTimeoutError, match="request's timeout of 0.2 s"):
                await asyncio.wait_for(fut, 5)
        model.gate.set()
        ys = await within(asyncio.gather(sent_long, waiting_long), "the others")
        stats = ev.stats
    np.testing.assert_array_equal(np.concatenate(ys), MODEL(X[[1, 3]]))
    assert stats["requests"] == 3  # the expired request that waited was never sent
    with pytest.raises(ValueError, match="timeout must be a finite number > 0"):
        ev(X, timeout=0)


async def test_the_deadline_bounds_the_retries():
    async with front() as f, DroppingProxy(f.port, drops=-1) as proxy, \
            RemoteEvaluate(proxy.url, "mlp", timeout=0.5, retries=10_000,
                           backoff_s=0.01) as ev:
        with pytest.raises(RequestTimeoutError, match="last attempt failed: .*could not"):
            await asyncio.wait_for(ev(X), 5)  # (within() would rename it)
        assert ev.stats["retries"] >= 1


async def test_a_deadline_that_cuts_an_attempt_short_still_names_the_failure_before_it():
    model = Gated()  # the retry reaches a model that never answers
    async with front(model) as f, DroppingProxy(f.port, drops=1) as proxy, \
            RemoteEvaluate(proxy.url, "mlp", timeout=0.5, retries=3,
                           backoff_s=0.01) as ev:
        with pytest.raises(RequestTimeoutError,
                           match=r"\(2 attempts\); the last attempt failed: .*could not"):
            await asyncio.wait_for(ev(X), 5)
        model.gate.set()
    assert proxy.dropped == 1


async def test_bad_input_is_refused_with_input_spec_error_and_nothing_is_sent():
    async with front() as f, RemoteEvaluate(f.url, "mlp") as ev:
        for bad in (X[:, :8], X.astype(np.float64), X.tolist(), np.float32(1.0),
                    np.zeros((2, 16), np.int32)):
            with pytest.raises(InputSpecError, match="16"):
                ev(bad)
        # a subclass or the other byte order is the same values, as a plain array
        y = await within(ev(np.ma.masked_array(X[:1], mask=False)), "subclass")
        z = await within(ev(X.astype(X.dtype.newbyteorder())), "swapped bytes")
        assert ev.stats["requests"] == 2
    assert type(y) is np.ndarray
    np.testing.assert_array_equal(y, MODEL(X[:1]))
    np.testing.assert_array_equal(z, MODEL(X))


async def test_a_dtype_without_a_protocol_datatype_fails_at_once_and_the_client_serves_on():
    # No input spec in the metadata: the request passes the client's check, and its
    # encoding (in a loop callback) failed without settling its future: a hang.
    async def identity(x):
        return x

    async with HttpFront({"id": identity}) as f, RemoteEvaluate(f.url, "id") as ev:
        with pytest.raises(InputSpecError, match="complex64 has no v2 datatype"):
            await within(ev(np.zeros((2, 3), np.complex64)), "the refusal")
        y = await within(ev(np.ones((2, 3), np.float32)), "the next request")
        with pytest.raises(InputSpecError, match="complex64"):  # not the spec now
            await within(ev(np.zeros((2, 3), np.complex64)), "a refusal")
    np.testing.assert_array_equal(y, np.ones((2, 3), np.float32))


async def test_a_first_request_the_model_refuses_fixes_no_spec_on_either_side():
    # The client and the served model both learnt [n] float64 from an empty first
    # request, and refused every [n, 4] float32 one after it (this client and others).
    def model(x):
        if x.dtype != np.float32 or x.shape[1:] != (4,):
            raise ValueError("takes [n, 4] float32")
        return x.sum(axis=1)

    good = np.ones((2, 4), np.float32)
    async with asr.serve(model) as served, HttpFront({"m": served}) as f, \
            RemoteEvaluate(f.url, "m", retries=0) as a, \
            RemoteEvaluate(f.url, "m", retries=0) as b:
        with pytest.raises(RemoteError, match="takes"):
            await within(a(np.array([])), "the refused first request")
        np.testing.assert_array_equal(await within(a(good), "the same client's"), [4, 4])
        np.testing.assert_array_equal(await within(b(good), "another client's"), [4, 4])
        assert a.input_spec == asr.TensorSpec((4,), np.float32)


async def test_a_client_opened_while_a_first_request_waits_takes_no_spec_from_it():
    # The metadata advertised the spec of a first request still in the model: a client
    # opened then took it as declared, and refused every right request after that one
    # failed.
    started = asyncio.Event()
    release = threading.Event()

    def model(x):
        started_in_loop()
        release.wait(10)
        if x.dtype != np.float32 or x.shape[1:] != (4,):
            raise ValueError("takes [n, 4] float32")
        return x.sum(axis=1)

    good = np.ones((2, 4), np.float32)
    async with asr.serve(model, model_thread=True) as served, \
            HttpFront({"m": served}) as f, RemoteEvaluate(f.url, "m", retries=0) as a:
        loop = asyncio.get_running_loop()

        def started_in_loop():
            loop.call_soon_threadsafe(started.set)

        first = asyncio.ensure_future(a(np.ones((1, 3), np.float32)))
        await within(started.wait(), "the first request in the model")
        async with RemoteEvaluate(f.url, "m", retries=0) as b:
            assert b.input_spec is None
            release.set()
            with pytest.raises(RemoteError, match="takes"):
                await within(first, "the refused first request")
            np.testing.assert_array_equal(await within(b(good), "b's request"), [4, 4])


async def test_what_the_server_answers_becomes_the_matching_error():
    with pytest.raises(ModelNotFoundError, match="unknown model 'nope'"):
        async with front() as f, RemoteEvaluate(f.url, "nope"):
            pass
    async with HttpFront({"bad": ModelSource(Raising, model_thread=True)}) as f:
        async with RemoteEvaluate(f.url, "bad") as ev:
            with pytest.raises(RemoteError, match="HTTP 500.*the model broke"):
                await within(ev(X), "500")
        async with RemoteEvaluate(f.url, "bad", input_spec=asr.TensorSpec(
                (8,), np.float32)) as ev:  # a spec the server does not take: its 400
            with pytest.raises(ProtocolError, match="answered 400") as info:
                await within(ev(X[:, :8]), "400")
            assert info.value.status == 400
    async with front(enable_repository=True) as f, RemoteEvaluate(
            f.url, "mlp", retries=1, backoff_s=0.01) as ev:
        await f.repository.unload("mlp")
        with pytest.raises(ServerClosedError, match="answered 503: model 'mlp' is not"):
            await within(ev(X), "503")


@pytest.mark.parametrize("bad_value, error, status", [(99.0, RemoteError, "500"),
                                                      (-99.0, ProtocolError, "400")])
async def test_a_failing_request_fails_alone_and_its_http_request_mates_are_answered(
        bad_value, error, status):
    xs = poisoned_requests(bad_value)
    async with HttpFront({"m": ModelSource(PoisonedBy, model_thread=True)}) as f, \
            RemoteEvaluate(f.url, "m") as ev:
        got = await within(asyncio.gather(*(ev(x) for x in xs), return_exceptions=True),
                           "answers")
        stats = ev.stats
    check_only_the_poisoned_failed(got, xs, error, status)
    # One HTTP request for all 8, then its halves until 2 and 5 stood alone: 4+4, 2+2
    # on each side, 1+1 for each failing pair.
    assert stats["requests"] == 8 and stats["split_http_requests"] == 10
    assert stats["mean_requests_per_http_request"] == 8


class FailsEverything(RemoteEvaluate):
    """A RemoteEvaluate whose transport answers every request with a 500 after
    ``delay`` seconds (the seam GrpcRemoteEvaluate fills with gRPC)."""

    def __init__(self, delay=0.0, **options):
        super().__init__("http://127.0.0.1:1", "m", input_spec=asr.TensorSpec(
            (1,), np.float32), **options)
        self.delay, self.sent = delay, 0

    async def _open_transport(self):
        pass

    async def _close_transport(self):
        pass

    async def _read_metadata(self):
        pass

    async def _attempt(self, request, left):
        self.sent += 1
        await asyncio.sleep(self.delay if self.delay >= 0 else left + 0.01)
        raise RemoteError("HTTP 500", "the model broke")


async def test_a_server_that_fails_everything_costs_a_bounded_number_of_halves():
    async with FailsEverything() as ev:
        got = await within(asyncio.gather(
            *(ev(np.full((1, 1), i, np.float32)) for i in range(64)),
            return_exceptions=True), "64 failures")
        stats = ev.stats
    assert all(isinstance(g, RemoteError) and "the model broke" in str(g) for g in got)
    assert ev.sent == 1 + stats["split_http_requests"] <= 1 + 4 * 6 + 2
    assert stats["mean_requests_per_http_request"] == 64


async def test_a_failed_request_with_one_caller_left_waiting_is_not_sent_again():
    async with FailsEverything(delay=0.1) as ev:
        got = await within(asyncio.gather(ev(np.zeros((1, 1), np.float32), timeout=0.05),
                                          ev(np.zeros((1, 1), np.float32)),
                                          return_exceptions=True), "two failures")
    assert isinstance(got[0], RequestTimeoutError) and isinstance(got[1], RemoteError)
    assert ev.sent == 1 and ev.stats["split_http_requests"] == 0


async def test_halves_past_the_deadline_are_not_sent_nor_counted():
    async with FailsEverything(delay=-1, timeout=0.2) as ev:  # the 500 comes too late
        got = await within(asyncio.gather(
            *(ev(np.zeros((1, 1), np.float32)) for _ in range(4)),
            return_exceptions=True), "four failures")
        stats = ev.stats
    assert all(isinstance(g, (RemoteError, RequestTimeoutError)) for g in got)
    assert ev.sent == 1 and stats["split_http_requests"] == 0
    assert stats["failed_http_requests"] == 1 and stats["mean_requests_per_http_request"] == 4


async def test_closing_fails_what_waits_and_later_calls():
    model = Gated()
    async with front(model) as f:
        ev = RemoteEvaluate(f.url, "mlp", max_connections=1)
        async with ev:
            sent = ev(X[:1])
            assert await within(asyncio.to_thread(model.started.wait, 10), "sent")
            waiting = ev(X[1:2])
        for fut in (sent, waiting):
            with pytest.raises(ServerClosedError, match="was closed"):
                await within(fut, "closed")
        with pytest.raises(ServerClosedError, match="not open"):
            ev(X)
        model.gate.set()


@pytest.mark.parametrize("url, name, options, said", [
    ("127.0.0.1:8000", "mlp", {}, "url must be"),
    ("http://h:1", "a/b", {}, "model_name must be"),
    ("http://h:1", "mlp", {"timeout": 0}, "timeout must be"),
    ("http://h:1", "mlp", {"retries": True}, "retries must be an integer >= 0, got True"),
    ("http://[::1", "mlp", {}, "is not an address"),  # aiohttp's InvalidURL, each call
    ("http://:8000", "mlp", {}, "names no host"),
    ("http://h:1", "mlp", {"max_response_bytes": 0}, "max_response_bytes must be")])
def test_arguments_are_checked_when_made(url, name, options, said):
    with pytest.raises(ValueError, match=said):
        RemoteEvaluate(url, name, **options)


GOOD_METADATA = {"name": "m", "versions": ["1"], "inputs": [
    {"name": "x", "datatype": "FP32", "shape": [-1, 16]}]}


def _output(**fields):
    return {"outputs": [{"name": "y", "datatype": "FP32", "shape": [2], **fields}]}


#: Answers of a server that does not speak the protocol, each a ModelOutputError.
BAD_ANSWERS = {
    "binary past the body": (b'{"model_name": "m", "outputs": [{"name": "y", '
                             b'"datatype": "FP32", "shape": [2, 4], '
                             b'"parameters": {"binary_data_size": 4096}}]}', "100"),
    "parameters a list": (json.dumps(_output(data=[1, 2], parameters=[1])).encode(), None),
    "INT8 out of range": (json.dumps({"outputs": [{"name": "y", "datatype": "INT8",
                                                   "shape": [2], "data": [300, 1]}]}
                                     ).encode(), None),
    "data null": (json.dumps(_output(data=None)).encode(), None),
    "nested too deep": (b"[" * 100_000 + b"]" * 100_000, None),
    # Data of the wrong types, which NumPy converted: the front refuses them in a
    # request, and the client took them from an answer ("1" as 1, null as NaN...).
    "a number as a string": (json.dumps(_output(data=["1", "2e3"])).encode(), None),
    "null among numbers": (json.dumps(_output(data=[None, 1.0])).encode(), None),
    "a fraction for INT32": (json.dumps({"outputs": [{
        "name": "y", "datatype": "INT32", "shape": [2], "data": [1.7, -2.9]}]}
        ).encode(), None),
    "a string for BOOL": (json.dumps({"outputs": [{
        "name": "y", "datatype": "BOOL", "shape": [2], "data": ["no", 0]}]}
        ).encode(), None),
    "two outputs of one name": (json.dumps({"outputs": [
        {"name": "a", "datatype": "FP32", "shape": [1], "data": [1.0]},
        {"name": "a", "datatype": "FP32", "shape": [1], "data": [2.0]}]}).encode(), None),
}


@contextlib.asynccontextmanager
async def answering(metadata, answer):
    """A server at a URL whose metadata and inference answers are given as they are."""
    from aiohttp import web

    async def on_metadata(request):
        return web.Response(body=metadata if isinstance(metadata, bytes)
                            else json.dumps(metadata).encode())

    async def on_infer(request):
        await request.read()
        body, length = answer
        return web.Response(body=body, headers={} if length is None else {
            "Inference-Header-Content-Length": length})

    async with serving(on_metadata, on_infer) as url:
        yield url


@contextlib.asynccontextmanager
async def serving(on_metadata, on_infer):
    """A server at a URL whose model ``m`` answers with these handlers."""
    from aiohttp import web

    app = web.Application()
    app.router.add_get("/v2/models/m", on_metadata)
    app.router.add_post("/v2/models/m/infer", on_infer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("answer", list(BAD_ANSWERS))
async def test_an_answer_that_is_not_the_protocol_s_is_a_model_output_error(answer):
    async with answering(GOOD_METADATA, BAD_ANSWERS[answer]) as url, \
            RemoteEvaluate(url, "m", retries=0) as ev:
        with pytest.raises(ModelOutputError, match="not the protocol's"):
            await within(ev(X[:2]), "bad answer")


@pytest.mark.parametrize("metadata", [{"inputs": [1, 2]}, b"[" * 100_000 + b"]" * 100_000])
async def test_metadata_that_is_not_the_protocol_s_is_a_model_output_error(metadata):
    with pytest.raises(ModelOutputError, match="not the protocol's JSON object"):
        async with answering(metadata, (b"", None)) as url, \
                RemoteEvaluate(url, "m", retries=0):
            pass


@pytest.mark.parametrize("where", ["metadata", "infer"])
async def test_an_error_body_of_deeply_nested_json_is_still_the_status_s_error(where):
    # json.loads raised RecursionError, which escaped to the caller.
    from aiohttp import web

    deep = b"[" * 100_000

    async def on_metadata(request):
        return web.Response(status=500, body=deep) if where == "metadata" else \
            web.Response(body=json.dumps(GOOD_METADATA).encode())

    async def on_infer(request):
        await request.read()
        return web.Response(status=500, body=deep)

    said = {"metadata": "the model metadata at .*/v2/models/m: \\[\\[",
            "infer": "the inference server at .*/v2/models/m/infer: \\[\\["}[where]
    async with serving(on_metadata, on_infer) as url:
        with pytest.raises(RemoteError, match=f"HTTP 500: {said}"):
            async with RemoteEvaluate(url, "m", retries=0) as ev:
                await within(ev(X[:2]), "500")


def _answer_of_length(length: int) -> bytes:
    """A good one-row answer padded with spaces (JSON allows them) to ``length`` bytes."""
    answer = json.dumps({"outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 2],
                                      "data": [1.0, 2.0]}]}).encode()
    return answer + b" " * (length - len(answer))


@pytest.mark.parametrize("how", ["gzip", "declared", "chunked"])
async def test_an_answer_longer_than_max_response_bytes_is_refused_before_it_is_held(how):
    # A 0.4 MiB gzip answer of 400 MiB took 1.3 GB of the client's memory: every answer
    # was read whole and inflated, whatever its length.
    import gzip

    from aiohttp import web

    limit = 1 << 20
    long = _answer_of_length(4 * limit)
    answers = {"size": len(long)}

    async def on_metadata(request):
        return web.Response(body=json.dumps(GOOD_METADATA).encode())

    async def on_infer(request):
        await request.read()
        body = long if answers["size"] == len(long) else _answer_of_length(
            answers["size"])
        if how == "gzip":
            return web.Response(body=gzip.compress(body, 1),
                                headers={"Content-Encoding": "gzip"})
        if how == "declared":
            return web.Response(body=body)
        response = web.StreamResponse()  # no length: chunked
        await response.prepare(request)
        for start in range(0, len(body), 1 << 16):
            await response.write(body[start:start + (1 << 16)])
        await response.write_eof()
        return response

    async with serving(on_metadata, on_infer) as url, \
            RemoteEvaluate(url, "m", retries=0, max_response_bytes=limit) as ev:
        with pytest.raises(asr.ResponseTooLongError, match=f"max_response_bytes={limit}"):
            await within(ev(X[:1]), "a long answer")
        answers["size"] = limit  # as long as the limit: taken, on the same client
        np.testing.assert_array_equal(await within(ev(X[:1]), "an answer at the limit"),
                                      [[1.0, 2.0]])


async def test_requests_whose_answers_are_too_long_together_are_sent_again_in_halves():
    # Each answer fits max_response_bytes, the 64 together do not: every one of them
    # failed (then most, past the budget for finding bad requests), where a 413 for a
    # request too large together is split.
    async with front(WIDE) as f, RemoteEvaluate(f.url, "mlp",
                                                max_response_bytes=64 << 10) as ev:
        await check_answers_too_long_together_are_halved(ev, "split_http_requests",
                                                         alone=X[:4])  # 80 KiB


async def test_a_redirect_is_not_followed_and_fails_as_the_server_s_failure():
    # aiohttp followed a 307 to another host, with the tensors and the headers (an API
    # key among them), and took that host's answer; a Location that is not an address
    # reached callers as aiohttp's own InvalidUrlRedirectClientError (a ValueError,
    # which a Router took for the caller's bad input).
    from aiohttp import web

    elsewhere = {"posts": 0}

    async def on_metadata(request):
        return web.Response(body=json.dumps(GOOD_METADATA).encode())

    async def other_infer(request):
        elsewhere["posts"] += 1
        return web.Response(body=_answer_of_length(200))

    async with serving(on_metadata, other_infer) as other:
        for location in (f"{other}/v2/models/m/infer", "http://[::1"):
            async def on_infer(request, location=location):
                await request.read()
                return web.Response(status=307, headers={"Location": location})

            async with serving(on_metadata, on_infer) as url, RemoteEvaluate(
                    url, "m", headers={"X-Api-Key": "secret"}) as ev:
                with pytest.raises(ServerDiedError, match="a redirect to .* does not "
                                                          "follow"):
                    await within(ev(X[:1]), "a redirected request")
                assert ev.stats["http_requests"] == 1  # not retried either
    assert elsewhere["posts"] == 0


async def test_a_port_that_does_not_speak_http_is_named_as_such():
    async def not_http(reader, writer):
        await reader.read(100)
        writer.write(b"\x00\x00\x12\x04 not http at all\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(not_http, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ServerDiedError, match="did not answer in HTTP"):
            async with RemoteEvaluate(f"http://127.0.0.1:{port}", "m", retries=0):
                pass
    finally:
        server.close()


# -- KServe's own model server ---------------------------------------------------------
@needs_kserve
async def test_kserve_model_server_answers_like_the_model(tmp_path):
    with kserve_model_server(tmp_path) as (port, _):
        async with RemoteEvaluate(f"http://127.0.0.1:{port}", "linear", timeout=60,
                                  retries=40, backoff_s=0.1) as ev:
            assert ev.input_spec == asr.TensorSpec((16,), np.float32)
            ys = await within(asyncio.gather(*(ev(X[i:i + 1]) for i in range(5))),
                              "KServe's answers", timeout=30)
            y, version = await within(ev.with_version(X), "with version", timeout=30)
            assert ev.stats["http_requests"] == 2
            assert version is None and ev.swap_token is None  # KServe reports none
            cached = asr.CachedEvaluate(ev)  # accepted; passes requests through
            np.testing.assert_array_equal(await within(cached(X), "cached"), X @ W)
    np.testing.assert_array_equal(np.concatenate(ys), X @ W)
    np.testing.assert_array_equal(y, X @ W)


def test_an_answer_s_header_length_is_read_as_ascii_digits_only():
    # int() read "2_3" as 23 (and other scripts' digits as ASCII ones).
    from async_search.errors import ModelOutputError
    from async_search.http.client import _decode_response

    header = json.dumps({"model_version": "1", "outputs": [{
        "name": "output", "datatype": "FP32", "shape": [1],
        "parameters": {"binary_data_size": 4}}]}).encode()
    payload = header + np.float32([7]).tobytes()
    length = str(len(header))
    assert _decode_response(payload, length, "the server")[0].tolist() == [7.0]
    with pytest.raises(ModelOutputError, match="Inference-Header-Content-Length is"):
        _decode_response(payload, length[0] + "_" + length[1:], "the server")
