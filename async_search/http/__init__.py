"""Serving over HTTP: the KServe v2 front, its client, and what surrounds them.

``HttpFront`` serves a ``ModelRepository`` over the KServe v2 protocol (``kserve``: the
codec) within ``HttpLimits``, with Prometheus ``ServingMetrics``; ``GrpcFront`` serves
the same protocol over gRPC; ``python -m async_search.http`` runs them.
``RemoteEvaluate`` and ``GrpcRemoteEvaluate`` are the clients: evaluate functions
against any KServe v2 server. aiohttp, prometheus-client and grpc are optional extras,
so every name here is imported on first use.
"""

import importlib

__all__ = ["HttpFront", "HttpLimits", "ModelRepository", "ModelSource", "ServingMetrics",
           "RemoteEvaluate", "GrpcFront", "GrpcRemoteEvaluate"]

_HOMES = {"HttpFront": "front", "HttpLimits": "limits", "ModelRepository": "repository",
          "ModelSource": "repository", "ServingMetrics": "metrics",
          "RemoteEvaluate": "client", "GrpcFront": "grpc_front",
          "GrpcRemoteEvaluate": "grpc_client"}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
