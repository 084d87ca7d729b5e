"""Serving over HTTP: the KServe v2 front, its client, and what surrounds them.

``HttpFront`` serves a ``ModelRepository`` over the KServe v2 protocol (``kserve``: the
codec) within ``HttpLimits``, with Prometheus ``ServingMetrics``; ``GrpcFront`` serves
the same protocol over gRPC; ``python -m async_search.http`` runs them.
``RemoteEvaluate`` and ``GrpcRemoteEvaluate`` are the clients: evaluate functions
against any KServe v2 server. aiohttp, prometheus-client and grpc are optional extras,
so every name here is imported on first use.
"""

import importlib

from async_search.extras import extra_error, is_missing_extra

__all__ = ["HttpFront", "HttpLimits", "ModelRepository", "ModelSource", "ServingMetrics",
           "RemoteEvaluate", "GrpcFront", "GrpcRemoteEvaluate"]

_HOMES = {"HttpFront": "front", "HttpLimits": "limits", "ModelRepository": "repository",
          "ModelSource": "repository", "ServingMetrics": "metrics",
          "RemoteEvaluate": "client", "GrpcFront": "grpc_front",
          "GrpcRemoteEvaluate": "grpc_client"}


def __getattr__(name: str):
    if name in _HOMES:
        try:
            home = importlib.import_module(f"{__name__}.{_HOMES[name]}")
        except ModuleNotFoundError as e:  # an extra not installed: say which
            if not is_missing_extra(e):  # a broken install: reported as it is
                raise
            raise extra_error(e, f"async_search.http.{name}") from e
        return getattr(home, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
