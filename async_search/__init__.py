"""async_search: neural-guided searches as asyncio coroutines, with batched model serving.

Example:
    >>> import numpy as np, async_search as asr
    >>> from async_search.models import MLP
    >>> async def main():
    ...     async with asr.serve(MLP((4,)), max_batch_size=256) as evaluate:
    ...         return await evaluate(np.zeros((3, 4), np.float32))
"""

from async_search.backends import SearchResults, run_searches, run_searches_async
from async_search.base import (Evaluate, Model, Outputs, TensorSpec, Versioned,
                               VersionedEvaluate)
from async_search.errors import (CircuitOpenError, InputSpecError, ModelOutputError,
                                 RequestTimeoutError, SearchError, SearchTimeoutError,
                                 ServerClosedError, ServerDiedError, WorkerDiedError)
from async_search.servers import CachedEvaluate, Router, immediate, serve, serve_connection

__all__ = [
    "Evaluate", "Model", "Outputs", "TensorSpec", "Versioned", "VersionedEvaluate",
    "CircuitOpenError", "InputSpecError", "ModelOutputError", "SearchError",
    "ServerClosedError", "ServerDiedError", "RequestTimeoutError", "SearchTimeoutError",
    "WorkerDiedError",
    "immediate", "serve", "serve_connection", "CachedEvaluate", "Router",
    "run_searches", "run_searches_async", "SearchResults",
]
