"""Several servers behind one evaluate: routing, circuit breakers and a result cache.

``Router`` sends each request to one of several evaluate functions (``RoundRobin``,
``LeastOutstanding``, or ``ConsistentHash`` over a ``HashRing``), each behind a
``CircuitBreaker`` that stops sending to a server that keeps failing;
``CachedEvaluate`` answers repeated requests from a cache that follows model swaps.
"""

from async_search.routing.breaker import BreakerPolicy, BreakerState, CircuitBreaker
from async_search.routing.cache import CachedEvaluate
from async_search.routing.hash_ring import HashRing
from async_search.routing.router import (ConsistentHash, LeastOutstanding, RoundRobin,
                                         Router, RoutingPolicy)

__all__ = [
    "Router", "RoutingPolicy", "RoundRobin", "LeastOutstanding", "ConsistentHash",
    "HashRing", "CircuitBreaker", "BreakerPolicy", "BreakerState", "CachedEvaluate",
]
