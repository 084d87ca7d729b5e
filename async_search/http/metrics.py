"""Prometheus metrics of served models, read from the servers' stats when scraped.

The hot path pays nothing for most of them: a custom collector walks each watched
evaluate function (a cache, a router, the servers behind them) at scrape time and turns
their ``stats`` into metric families: batches, elements, the batch-size histogram (the
server already counts batches per size), time in the model, queue wait, failed
batches, workers, the model version, cache hits and misses, breaker states and routed
requests, and per-batch histograms of model time and queue wait (the server counts
them per bucket). Only what no stats hold is observed as it happens: the latency and
status of each network request (``observe_request``, called by the HTTP front once per
request), every error response the front sends, by status and by the layer that
refused the request (``observe_error``: aiohttp's HTTP parser, the front's routes and
handlers, the connection cap), and the connections it drops (``observe_dropped``:
a client that took no byte of its answer for ``write_timeout``, an idle connection
closed for a new one).

Every ``ServingMetrics`` has a registry of its own, never prometheus-client's global
one, so that two servers in one process (or two tests) never share counters.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Sequence, Tuple

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from async_search.base import version_of
from async_search.http.kserve import version_label
from async_search.routing.breaker import BreakerState
from async_search.routing.cache import CachedEvaluate
from async_search.routing.router import Router
from async_search.servers.stats import TIME_BUCKETS_S


#: Request latency buckets, seconds: 100 us to 10 s.
LATENCY_BUCKETS: Tuple[float, ...] = TIME_BUCKETS_S
#: Batch size buckets: powers of two up to 4096.
BATCH_SIZE_BUCKETS: Tuple[int, ...] = tuple(2 ** i for i in range(13))
#: The versions of a model whose request counts are kept (the latest ones): a trainer
#: that updates the weights every iteration would otherwise add series without end.
KEPT_VERSIONS = 16


class ServingMetrics:
    """Metrics of the models a process serves, exposed in the Prometheus text format.

    Args:
        namespace: the prefix of every metric name.
        latency_buckets: bucket bounds (seconds) of the latency histograms.

    Example:
        >>> import asyncio, numpy as np
        >>> import async_search as asr
        >>> from async_search.models import MLP
        >>> metrics = ServingMetrics()
        >>> async def main():
        ...     async with asr.serve(MLP((4,))) as evaluate:
        ...         metrics.watch("mlp", evaluate)       # read at scrape time
        ...         await evaluate(np.zeros((2, 4), np.float32))
        ...         return metrics.render()
        >>> b'async_search_elements_total{model="mlp",server=""} 2.0' in asyncio.run(main())
        True
        >>> metrics.observe_request("mlp", "0", 200, 0.002)
        >>> b"async_search_http_requests_total" in metrics.render()
        True
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, *, namespace: str = "async_search",
                 latency_buckets: Sequence[float] = LATENCY_BUCKETS):
        self.namespace = namespace
        self.registry = CollectorRegistry(auto_describe=False)
        self._watched: Dict[str, Callable[[], Any]] = {}
        self._front: Callable[[], Dict[str, float]] | None = None
        self._requests = Counter(
            "http_requests", "Inference requests answered, by model, version and status "
            "(499: the client had gone before its answer)",
            ["model", "version", "code"], namespace=namespace, registry=self.registry)
        self._errors = Counter(
            "http_errors", "Error responses the HTTP front sent, by status and by the "
            "layer that refused the request (http_parser, front, connection)",
            ["code", "layer"], namespace=namespace, registry=self.registry)
        self._dropped = Counter(
            "http_dropped_connections", "Connections the HTTP front dropped, by reason "
            "(write_timeout: the client took no byte of its answer; evicted: idle, "
            "closed for a new connection at the cap)", ["reason"], namespace=namespace,
            registry=self.registry)
        self._latency = Histogram(
            "http_request_seconds", "Inference request latency, from the body read to "
            "the response, seconds", ["model"], namespace=namespace,
            buckets=latency_buckets, registry=self.registry)
        # model -> version -> the codes counted for it, oldest version first
        self._counted: Dict[str, Dict[str, set]] = {}
        self.registry.register(_StatsCollector(self))

    # -- what is watched --------------------------------------------------------------
    def watch(self, model: str, evaluate: Any = None, *,
              provider: Callable[[], Any] | None = None) -> None:
        """Report ``evaluate`` (a server, cache or router, read at scrape time) as
        ``model``; or, with ``provider``, whatever it returns at scrape time (None while
        the model is unloaded)."""
        if (evaluate is None) == (provider is None):
            raise ValueError("watch needs an evaluate function or a provider, not both")
        self._watched[model] = provider if provider is not None else (lambda: evaluate)

    def unwatch(self, model: str) -> None:
        """Stop reporting ``model``."""
        self._watched.pop(model, None)

    def watched(self) -> Dict[str, Any]:
        """model -> what it reports now (its provider called: None while unloaded)."""
        return {model: provider() for model, provider in list(self._watched.items())}

    def watch_front(self, gauges: Callable[[], Dict[str, float]] | None) -> None:
        """Report what ``gauges()`` returns at scrape time, each ``name: value`` as the
        gauge ``<namespace>_http_<name>`` (the HTTP front's requests in progress, open
        and stalled connections, unsent bytes); None stops."""
        self._front = gauges

    def front_gauges(self) -> Dict[str, float]:
        """The front's gauges now (empty when none is watched)."""
        return self._front() if self._front is not None else {}

    # -- what is observed as it happens ------------------------------------------------
    def observe_request(self, model: str, version: str, code: int, seconds: float) -> None:
        """One network request of ``model`` answered with status ``code``. The counts
        of a model's ``KEPT_VERSIONS`` latest versions are kept; an older version's
        series are dropped when a new version is counted."""
        versions = self._counted.setdefault(model, {})
        codes = versions.get(version)
        if codes is None:
            codes = versions[version] = set()
            while len(versions) > KEPT_VERSIONS:
                oldest = next(iter(versions))
                for counted in versions.pop(oldest):
                    self._requests.remove(model, oldest, counted)
        codes.add(str(code))
        self._requests.labels(model, version, str(code)).inc()
        self._latency.labels(model).observe(seconds)

    def observe_error(self, code: int, layer: str) -> None:
        """One error response with status ``code`` from ``layer`` (``http_parser``,
        ``front`` or ``connection``)."""
        self._errors.labels(str(code), layer).inc()

    def observe_dropped(self, reason: str) -> None:
        """One connection dropped for ``reason`` (``write_timeout`` or ``evicted``)."""
        self._dropped.labels(reason).inc()

    def render(self) -> bytes:
        """Every metric, in the Prometheus text exposition format."""
        return generate_latest(self.registry)


def _layers(evaluate: Any, server: str = "") -> Iterator[Tuple[str, str, Any]]:
    """(kind, server name, object) of each layer of an evaluate function."""
    if isinstance(evaluate, CachedEvaluate):
        yield "cache", server, evaluate
        yield from _layers(evaluate.evaluate, server)
    elif isinstance(evaluate, Router):
        yield "router", server, evaluate
        for name, inner in evaluate.servers.items():
            yield from _layers(inner, name)
    elif isinstance(getattr(evaluate, "stats", None), dict) and (
            "batches" in evaluate.stats):
        yield "server", server, evaluate


class _StatsCollector(Collector):
    """Turns the stats of the watched evaluate functions into metric families."""

    def __init__(self, metrics: ServingMetrics):
        self._metrics = metrics

    def collect(self):
        ns = self._metrics.namespace
        labels = ["model", "server"]

        def counter(name, doc, extra=()):
            return CounterMetricFamily(f"{ns}_{name}", doc, labels=[*labels, *extra])

        def gauge(name, doc, extra=()):
            return GaugeMetricFamily(f"{ns}_{name}", doc, labels=[*labels, *extra])

        batches = counter("batches", "Batches sent to the model")
        elements = counter("elements", "Elements computed by the model")
        requests = counter("requests", "Requests made to the server")
        model_seconds = counter("model_seconds", "Time in the model, seconds")
        queue_wait = counter("queue_wait_seconds", "Queue wait of each batch (since "
                             "the previous batch left, or a request came to an empty "
                             "queue), summed over batches, seconds")
        queue_wait_max = gauge("queue_wait_max_seconds", "Longest queue wait, seconds")
        failed = counter("failed_batches", "Batches whose model call raised or whose "
                                            "outputs could not be handed out")
        workers = gauge("workers", "Device workers serving the model")
        version = gauge("model_version_info", "The model version now serving",
                        ["version"])
        sizes = HistogramMetricFamily(f"{ns}_batch_size", "Elements per batch",
                                      labels=labels)
        batch_model = HistogramMetricFamily(
            f"{ns}_batch_model_seconds", "Time the model took per batch, seconds",
            labels=labels)
        batch_wait = HistogramMetricFamily(
            f"{ns}_batch_queue_wait_seconds", "How long a batch's queue waited before "
            "the batch left (since the previous batch left, or a request came to an "
            "empty queue), seconds", labels=labels)
        hits = counter("cache_hits", "Elements answered from the cache")
        misses = counter("cache_misses", "Elements the cache sent to the server")
        dedup = counter("cache_deduplicated", "Elements that joined an identical one "
                        "in flight")
        evictions = counter("cache_evictions", "Elements evicted from the cache")
        entries = gauge("cache_entries", "Elements in the cache")
        hit_ratio = gauge("cache_hit_ratio", "Hits over lookups")
        breaker = gauge("breaker_state", "Circuit breaker state (1 in the current "
                        "state)", ["state"])
        opened = counter("breaker_opened", "Times the breaker opened")
        routed = counter("routed_requests", "Requests the router sent to the server")
        route_failed = counter("routed_failures", "Routed requests the server failed")
        outstanding = gauge("outstanding_requests", "Requests in flight at the server")

        front = []
        for name, value in self._metrics.front_gauges().items():
            gauge_family = GaugeMetricFamily(f"{ns}_http_{name}",
                                             _FRONT_GAUGES.get(name, name))
            gauge_family.add_metric([], value)
            front.append(gauge_family)
        yield from front
        for model, evaluate in self._metrics.watched().items():
            for kind, server, obj in _layers(evaluate):
                key = [model, server]
                stats = obj.stats
                if kind == "server":
                    batches.add_metric(key, stats["batches"])
                    elements.add_metric(key, stats["elements"])
                    if "requests" in stats:
                        requests.add_metric(key, stats["requests"])
                    model_seconds.add_metric(key, stats["model_time_s"])
                    queue_wait.add_metric(
                        key, stats.get("queue_wait_mean_s", 0.0) * stats["batches"])
                    queue_wait_max.add_metric(key, stats.get("queue_wait_max_s", 0.0))
                    failed.add_metric(key, stats.get("failed_batches", 0))
                    workers.add_metric(key, stats.get("workers", 1))
                    version.add_metric([*key, version_label(version_of(obj))], 1)
                    buckets, total = _size_buckets(stats.get("batch_size_histogram", {}))
                    sizes.add_metric(key, buckets, total)
                    if "model_time_histogram" in stats:
                        batch_model.add_metric(key, _cumulative(
                            stats["model_time_histogram"]), stats["model_time_s"])
                        batch_wait.add_metric(key, _cumulative(
                            stats["queue_wait_histogram"]),
                            stats["queue_wait_mean_s"] * stats["batches"])
                elif kind == "cache":
                    hits.add_metric(key, stats["hits"])
                    misses.add_metric(key, stats["misses"])
                    dedup.add_metric(key, stats["deduplicated"])
                    evictions.add_metric(key, stats["evictions"])
                    entries.add_metric(key, stats["entries"])
                    hit_ratio.add_metric(key, stats["hit_rate"])
                else:
                    for name, s in stats["servers"].items():
                        for state in BreakerState:
                            breaker.add_metric([model, name, state.value],
                                               float(s["breaker"]["state"] == state.value))
                        opened.add_metric([model, name], s["breaker"]["opened"])
                        routed.add_metric([model, name], s["requests"])
                        route_failed.add_metric([model, name], s["failures"])
                        outstanding.add_metric([model, name], s["outstanding"])
        yield from (batches, elements, requests, model_seconds, queue_wait, queue_wait_max,
                    failed, workers, version, sizes, batch_model, batch_wait, hits, misses,
                    dedup, evictions, entries, hit_ratio, breaker, opened, routed,
                    route_failed, outstanding)


_FRONT_GAUGES = {
    "requests_in_progress": "Requests in the HTTP front's handlers",
    "open_connections": "Open HTTP connections",
    "stalled_connections": "Connections holding answer bytes their client has not taken",
    "unsent_bytes": "Bytes of answers held for clients that have not taken them",
}


def _cumulative(histogram: Dict[float, int]) -> list:
    """Cumulative Prometheus buckets from {upper bound: batches} (``inf`` last)."""
    buckets, count = [], 0
    for bound, batches in histogram.items():
        count += batches
        buckets.append(("+Inf" if bound == float("inf") else str(float(bound)), count))
    return buckets


def _size_buckets(histogram: Dict[int, int]) -> Tuple[list, float]:
    """Cumulative Prometheus buckets from a {batch size: batches} count."""
    buckets, total, count = [], 0.0, 0
    items = sorted(histogram.items())
    i = 0
    for bound in BATCH_SIZE_BUCKETS:
        while i < len(items) and items[i][0] <= bound:
            size, batches = items[i]
            count += batches
            total += size * batches
            i += 1
        buckets.append((str(float(bound)), count))
    for size, batches in items[i:]:
        count += batches
        total += size * batches
    buckets.append(("+Inf", count))
    return buckets, total
