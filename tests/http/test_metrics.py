import asyncio

import numpy as np
import pytest

prometheus_client = pytest.importorskip("prometheus_client")  # the http extra

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import async_search as asr
from async_search.http.metrics import ServingMetrics
from async_search.models import MLP
from async_search.routing.breaker import BreakerPolicy
from async_search.routing.cache import CachedEvaluate
from async_search.routing.router import Router

pytestmark = pytest.mark.timeout(60)

MODEL = MLP((4,), hidden_sizes=(8,), output_size=2, seed=0)


def samples(metrics):
    """{(sample name, frozenset(labels)): value} of everything rendered."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(found, name, **labels):
    return found[(name, frozenset(labels.items()))]


def xs(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


async def test_server_stats_are_read_when_scraped():
    metrics = ServingMetrics()
    async with asr.serve(MODEL, max_batch_size=8) as evaluate:
        metrics.watch("mlp", evaluate)
        await asyncio.gather(*(evaluate(xs(3, seed=i)) for i in range(5)))  # 15: 8 + 7
        await evaluate(xs(2))
        stats = evaluate.stats
        found = samples(metrics)
    key = {"model": "mlp", "server": ""}
    assert value(found, "async_search_batches_total", **key) == stats["batches"]
    assert value(found, "async_search_elements_total", **key) == 17
    assert value(found, "async_search_model_seconds_total", **key) == pytest.approx(
        stats["model_time_s"])
    assert value(found, "async_search_workers", **key) == 1
    assert value(found, "async_search_model_version_info", version="0", **key) == 1
    histogram = stats["batch_size_histogram"]
    for bound in (1, 2, 4, 8, 16):
        assert value(found, "async_search_batch_size_bucket", le=str(float(bound)),
                     **key) == sum(n for size, n in histogram.items() if size <= bound)
    assert value(found, "async_search_batch_size_count", **key) == stats["batches"]
    assert value(found, "async_search_batch_size_sum", **key) == 17
    for name in ("batch_model_seconds", "batch_queue_wait_seconds"):
        assert value(found, f"async_search_{name}_count", **key) == stats["batches"]
        assert value(found, f"async_search_{name}_bucket", le="+Inf", **key) == (
            stats["batches"])
    assert value(found, "async_search_batch_model_seconds_sum", **key) == pytest.approx(
        stats["model_time_s"])
    # The model (a small MLP) takes far less than 10 s a batch.
    assert value(found, "async_search_batch_model_seconds_bucket", le="10.0", **key) == (
        stats["batches"])


async def test_cache_router_and_breakers_are_reported_per_server():
    clock = [0.0]

    class Down:
        async def __call__(self, x):
            raise RuntimeError("down")

    metrics = ServingMetrics()
    async with asr.serve(MODEL) as a:
        router = Router({"a": a, "b": Down()}, clock=lambda: clock[0],
                        breaker=BreakerPolicy(failure_threshold=1))
        cached = CachedEvaluate(router, capacity=100)
        metrics.watch("mlp", cached)
        for i in range(4):
            await cached(xs(2, seed=i % 2))
        found = samples(metrics)
    m = {"model": "mlp"}
    assert value(found, "async_search_cache_hits_total", server="", **m) == 4
    assert value(found, "async_search_cache_misses_total", server="", **m) == 4
    assert value(found, "async_search_cache_hit_ratio", server="", **m) == 0.5
    assert value(found, "async_search_breaker_state", server="b", state="open", **m) == 1
    assert value(found, "async_search_breaker_state", server="b", state="closed", **m) == 0
    assert value(found, "async_search_breaker_state", server="a", state="closed", **m) == 1
    assert value(found, "async_search_breaker_opened_total", server="b", **m) == 1
    assert value(found, "async_search_routed_requests_total", server="a", **m) == 2
    assert value(found, "async_search_routed_failures_total", server="b", **m) == 1
    assert value(found, "async_search_elements_total", server="a", **m) == 4


async def test_version_label_follows_a_model_update():
    metrics = ServingMetrics()
    async with asr.serve(MODEL) as evaluate:
        metrics.watch("mlp", evaluate)
        evaluate.update_model(MLP((4,), hidden_sizes=(8,), output_size=2, seed=1), "v2")
        found = samples(metrics)
    assert value(found, "async_search_model_version_info", model="mlp", server="",
                 version="v2") == 1
    assert ("async_search_model_version_info",
            frozenset({"model": "mlp", "server": "", "version": "0"}.items())) not in found


def test_request_observations_feed_histograms():
    metrics = ServingMetrics()
    for seconds in (0.0002, 0.003, 0.003):
        metrics.observe_request("mlp", "1", 200, seconds)
    metrics.observe_request("mlp", "", 400, 0.0001)
    found = samples(metrics)
    assert value(found, "async_search_http_requests_total", model="mlp", version="1",
                 code="200") == 3
    assert value(found, "async_search_http_request_seconds_bucket", model="mlp",
                 le="0.0025") == 2
    assert value(found, "async_search_http_request_seconds_count", model="mlp") == 4


def test_request_counts_are_kept_for_a_model_s_latest_versions_only():
    # One series per version ever served: a trainer updating every iteration grew the
    # scrape without end (3000 versions: half a megabyte).
    from async_search.http.metrics import KEPT_VERSIONS

    metrics = ServingMetrics()
    metrics.observe_request("other", "0", 200, 0.001)
    for version in range(3 * KEPT_VERSIONS):
        for code in (200, 503):
            metrics.observe_request("m", str(version), code, 0.001)
    metrics.observe_request("m", str(3 * KEPT_VERSIONS - 1), 200, 0.001)
    counted = {(dict(labels)["model"], dict(labels)["version"], dict(labels)["code"]): v
               for (name, labels), v in samples(metrics).items()
               if name == "async_search_http_requests_total"}
    kept = range(2 * KEPT_VERSIONS, 3 * KEPT_VERSIONS)
    assert set(counted) == {("other", "0", "200")} | {
        ("m", str(v), code) for v in kept for code in ("200", "503")}
    assert counted[("m", str(3 * KEPT_VERSIONS - 1), "200")] == 2.0  # counts go on
    latency = samples(metrics)[("async_search_http_request_seconds_count",
                                frozenset({("model", "m")}))]
    assert latency == 6 * KEPT_VERSIONS + 1  # every request, whatever its version


def test_each_metrics_object_has_its_own_registry():
    one, two = ServingMetrics(), ServingMetrics()
    one.observe_request("mlp", "0", 200, 0.001)
    assert value(samples(one), "async_search_http_requests_total", model="mlp",
                 version="0", code="200") == 1
    assert not any(k[0].startswith("async_search_http_requests") for k in samples(two))
    default = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "async_search" not in default


def test_an_unloaded_model_reports_nothing_and_watch_checks_its_arguments():
    metrics = ServingMetrics()
    metrics.watch("gone", provider=lambda: None)
    assert not any(dict(k[1]).get("model") == "gone" for k in samples(metrics))
    with pytest.raises(ValueError, match="an evaluate function or a provider"):
        metrics.watch("x")


def test_errors_drops_and_the_fronts_gauges_are_reported():
    metrics = ServingMetrics()
    for code, layer in [(400, "http_parser"), (400, "http_parser"), (404, "front"),
                        (503, "connection")]:
        metrics.observe_error(code, layer)
    metrics.observe_dropped("write_timeout")
    gauges = {"requests_in_progress": 3, "unsent_bytes": 4096}
    metrics.watch_front(lambda: gauges)
    found = samples(metrics)
    assert value(found, "async_search_http_errors_total", code="400",
                 layer="http_parser") == 2
    assert value(found, "async_search_http_errors_total", code="503",
                 layer="connection") == 1
    assert value(found, "async_search_http_dropped_connections_total",
                 reason="write_timeout") == 1
    assert value(found, "async_search_http_requests_in_progress") == 3
    assert value(found, "async_search_http_unsent_bytes") == 4096
    metrics.watch_front(None)  # the front has closed: its gauges are gone
    assert not any(k[0] == "async_search_http_unsent_bytes" for k in samples(metrics))


async def test_an_inference_whose_client_hung_up_counts_as_499_not_200():
    import threading

    import aiohttp

    from async_search.http import HttpFront
    from async_search.models import with_spec

    release = threading.Event()

    def model(x):
        if (x[:, 0] > 1000).any():  # the slow request: answered once its client left
            release.wait(10)
        return x.sum(axis=1, keepdims=True)

    def body(v):
        return {"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32",
                            "data": [v, 2, 3]}]}

    async with asr.serve(with_spec(model, (3,), np.float32), model_thread=True) as ev, \
            HttpFront({"m": ev}) as front, aiohttp.ClientSession() as session:
        url = f"{front.url}/v2/models/m/infer"
        async with session.post(url, json=body(1)) as answer:
            assert answer.status == 200
        with pytest.raises(asyncio.TimeoutError):
            async with session.post(url, json=body(2000),
                                    timeout=aiohttp.ClientTimeout(total=0.2)):
                pass
        await asyncio.sleep(0.3)  # the front has seen the connection close
        release.set()
        for _ in range(100):  # the handler ends once the model answers
            if ("async_search_http_requests_total", frozenset(
                    {"model": "m", "version": "0", "code": "499"}.items())) in samples(
                    front.metrics):
                break
            await asyncio.sleep(0.05)
        found = samples(front.metrics)
        assert value(found, "async_search_http_requests_total", model="m", version="0",
                     code="499") == 1
        assert value(found, "async_search_http_requests_total", model="m", version="0",
                     code="200") == 1


async def test_an_inference_the_front_did_not_expect_to_fail_counts_as_a_500():
    """A model giving more outputs than its output_names: answered 500 (internal error),
    and counted nowhere but the front's errors, so the model's error rate read 0 %."""
    import aiohttp

    from async_search.http import HttpFront
    from async_search.http.repository import ModelSource
    from async_search.models import with_spec

    def two():  # two outputs, one name
        return with_spec(lambda x: (x[:, :1], x[:, 1:2]), (3,), np.float32)

    body = {"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32",
                        "data": [1, 2, 3]}]}
    async with HttpFront({"two": ModelSource(two, output_names=("a",))}) as front, \
            aiohttp.ClientSession() as session:
        for _ in range(3):
            async with session.post(f"{front.url}/v2/models/two/infer",
                                    json=body) as answer:
                assert answer.status == 500
        found = samples(front.metrics)
    assert value(found, "async_search_http_requests_total", model="two", version="0",
                 code="500") == 3
    assert value(found, "async_search_http_request_seconds_count", model="two") == 3
