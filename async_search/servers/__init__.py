"""Serving: the batching coroutine and what surrounds it.

``serve`` and ``BatchingServer`` batch the requests of one loop; ``immediate`` is the
unbatched baseline; ``serve_connection`` serves clients over a Connection (whose
``ModelUpdate`` and ``VersionedRequest`` messages swap the model and report versions).
Around them: a result cache (``CachedEvaluate``), routing across servers (``Router``
with round robin, least outstanding or consistent hashing), circuit breakers, a model
repository, and, with the ``http`` extra, Prometheus metrics and a KServe v2 HTTP front
(imported on first use, so that the core needs numpy alone).
"""

from async_search.servers.batching import BatchingServer
from async_search.servers.breaker import BreakerPolicy, BreakerState, CircuitBreaker
from async_search.servers.cache import CachedEvaluate
from async_search.servers.connection_server import (ModelUpdate, VersionedRequest,
                                                   serve_connection)
from async_search.servers.immediate import Immediate, immediate
from async_search.servers.policy import DispatchPolicy, Reason
from async_search.servers.repository import ModelRepository, ModelSource
from async_search.servers.hash_ring import HashRing
from async_search.servers.router import (ConsistentHash, LeastOutstanding, RoundRobin,
                                         Router, RoutingPolicy)
from async_search.servers.serve import serve
from async_search.servers.stats import BatchRecord

__all__ = [
    "BatchingServer", "BatchRecord", "DispatchPolicy", "Immediate", "Reason",
    "immediate", "serve", "serve_connection", "ModelUpdate", "VersionedRequest",
    "CachedEvaluate", "Router", "RoutingPolicy", "RoundRobin", "LeastOutstanding",
    "ConsistentHash", "HashRing", "CircuitBreaker", "BreakerPolicy", "BreakerState",
    "ModelRepository", "ModelSource", "HttpFront", "ServingMetrics",
]

_LAZY = {"HttpFront": "async_search.servers.http_front",
         "ServingMetrics": "async_search.servers.metrics"}


def __getattr__(name: str):
    # aiohttp and prometheus-client are the optional ``http`` extra: import on first use.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
