"""The serving core: the batching coroutine and what runs it.

``serve`` and ``BatchingServer`` batch the requests of one loop (dispatch by a
``DispatchPolicy``, the model in device workers, ``BatchRecord`` stats); ``immediate`` is
the unbatched baseline; ``serve_connection`` serves clients over a Connection (whose
``wire.ModelUpdate`` and ``wire.VersionedRequest`` messages swap the model and report
versions). Several servers behind one evaluate are ``async_search.routing``; the KServe
v2 HTTP front is ``async_search.http``.
"""

from async_search.servers.batching import BatchingServer
from async_search.servers.connection_server import serve_connection
from async_search.servers.policy import DispatchPolicy, Reason
from async_search.servers.serving import serve
from async_search.servers.stats import BatchRecord
from async_search.servers.unbatched import Immediate, immediate
from async_search.wire import ModelUpdate, VersionedRequest

__all__ = [
    "BatchingServer", "BatchRecord", "DispatchPolicy", "Immediate", "Reason",
    "immediate", "serve", "serve_connection", "ModelUpdate", "VersionedRequest",
]
