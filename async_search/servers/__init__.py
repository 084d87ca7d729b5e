"""Serving: the batching coroutine, its dispatch policy, device thread and stats."""

from async_search.servers.batching import BatchingServer
from async_search.servers.connection_server import CLOSE, serve_connection
from async_search.servers.immediate import Immediate, immediate
from async_search.servers.policy import DispatchPolicy, Reason
from async_search.servers.serve import serve

__all__ = [
    "BatchingServer", "CLOSE", "DispatchPolicy", "Immediate", "Reason", "immediate", "serve",
    "serve_connection",
]
