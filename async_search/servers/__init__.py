"""Serving: the batching coroutine, its dispatch policy, device thread and stats."""

from async_search.servers.batching import BatchingServer
from async_search.servers.immediate import Immediate, immediate
from async_search.servers.policy import DispatchPolicy, Reason
from async_search.servers.serve import serve

__all__ = ["BatchingServer", "DispatchPolicy", "Immediate", "Reason", "immediate", "serve"]
