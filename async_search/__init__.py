"""async_search: neural-guided searches as asyncio coroutines, with batched model serving.

Example:
    >>> import asyncio, numpy as np, async_search as asr
    >>> from async_search.models import MLP
    >>> async def main():
    ...     async with asr.serve(MLP((4,)), max_batch_size=256) as evaluate:
    ...         return await evaluate(np.zeros((3, 4), np.float32))
    >>> asyncio.run(main()).shape
    (3, 1)
"""

from async_search.backends import SearchResults, run_searches, run_searches_async
from async_search.base import (Evaluate, Model, Outputs, TensorSpec, TimedEvaluate,
                               Versioned, VersionedEvaluate)
from async_search.errors import (CheckpointError, CircuitOpenError, ClosedConnection,
                                 CloseTimeoutError, ConnectionGoneError,
                                 DeviceNotFoundError, FileWriteError, InputSpecError,
                                 LoadParametersError, MalformedMessageError,
                                 ModelBusyError, ModelLoadError, ModelNotFoundError,
                                 ModelNotReadyError, ModelOutputError, ModelRaisedError,
                                 ProtocolError, RemoteError, RemoteTraceback,
                                 ResponseTooLongError,
                                 RepositoryError, RequestTimeoutError, SearchError,
                                 SearchTimeoutError, ServerClosedError, ServerCrashedError,
                                 ServerDiedError, WorkerDiedError)
from async_search.routing import CachedEvaluate, Router
from async_search.servers import immediate, serve, serve_connection

__all__ = [
    "Evaluate", "Model", "Outputs", "TensorSpec", "TimedEvaluate", "Versioned",
    "VersionedEvaluate",
    # every exception a caller can get (errors.py)
    "CheckpointError", "CircuitOpenError", "ClosedConnection", "CloseTimeoutError",
    "ConnectionGoneError", "DeviceNotFoundError", "FileWriteError", "InputSpecError",
    "LoadParametersError", "MalformedMessageError", "ModelBusyError", "ModelLoadError",
    "ModelNotFoundError", "ModelNotReadyError",
    "ModelOutputError", "ModelRaisedError", "ProtocolError", "RemoteError",
    "RemoteTraceback", "RepositoryError", "RequestTimeoutError", "ResponseTooLongError",
    "SearchError", "SearchTimeoutError", "ServerClosedError", "ServerCrashedError",
    "ServerDiedError", "WorkerDiedError",
    "immediate", "serve", "serve_connection", "CachedEvaluate", "Router",
    "run_searches", "run_searches_async", "SearchResults",
]
