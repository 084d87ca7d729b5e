"""Serving over HTTP: the KServe v2 front, its client, and what surrounds them.

``HttpFront`` serves a ``ModelRepository`` over the KServe v2 protocol (``kserve``: the
codec) within ``HttpLimits``, with Prometheus ``ServingMetrics``; ``GrpcFront`` serves
the same protocol over gRPC; ``python -m async_search.http`` runs them.
``RemoteEvaluate`` and ``GrpcRemoteEvaluate`` are the clients: evaluate functions
against any KServe v2 server. aiohttp, prometheus-client and grpc are optional extras,
so every name here is imported on first use.
"""

import importlib
from typing import TYPE_CHECKING, Any

from async_search.extras import extra_error, is_missing_extra

if TYPE_CHECKING:  # what a type checker reads (each is imported on first use)
    from async_search.http.client import RemoteEvaluate
    from async_search.http.front import HttpFront
    from async_search.http.grpc_client import GrpcRemoteEvaluate
    from async_search.http.grpc_front import GrpcFront
    from async_search.http.limits import HttpLimits
    from async_search.http.metrics import ServingMetrics
    from async_search.http.repository import ModelRepository, ModelSource

__all__ = ["HttpFront", "HttpLimits", "ModelRepository", "ModelSource", "ServingMetrics",
           "RemoteEvaluate", "GrpcFront", "GrpcRemoteEvaluate"]

_HOMES = {"HttpFront": "front", "HttpLimits": "limits", "ModelRepository": "repository",
          "ModelSource": "repository", "ServingMetrics": "metrics",
          "RemoteEvaluate": "client", "GrpcFront": "grpc_front",
          "GrpcRemoteEvaluate": "grpc_client"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        try:
            home = importlib.import_module(f"{__name__}.{_HOMES[name]}")
        except ModuleNotFoundError as e:  # an extra not installed: say which
            if not is_missing_extra(e):  # a broken install: reported as it is
                raise
            raise extra_error(e, f"async_search.http.{name}") from e
        return getattr(home, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
