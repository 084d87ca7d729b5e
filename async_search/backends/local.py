"""The local backend: searches and servers in the calling process, in one event loop."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, List, Sequence

from async_search.backends.config import (Progress, RunConfig, SearchResults, merge_stats,
                                          raise_failures)
from async_search.servers.batching import BatchingServer

__all__ = ["run_local", "gather_searches"]


async def gather_searches(search_fn: Callable[[Any, Any], Awaitable[Any]],
                          starts: Sequence[Any], evaluate: Any) -> List[Any]:
    """Runs ``search_fn(start, evaluate)`` for every start concurrently; results in order.

    Raises:
        SearchError: naming every start whose search raised (the others still finish).
    """
    results = await asyncio.gather(*(search_fn(s, evaluate) for s in starts),
                                   return_exceptions=True)
    raise_failures({i: r for i, r in enumerate(results) if isinstance(r, BaseException)},
                   len(starts))
    return results


async def run_local(search_fn, starts: Sequence[Any], model_factory: Callable[[], Any],
                    config: RunConfig, progress: Progress | None = None) -> SearchResults:
    """Every search in this loop, served by ``num_servers`` workers of one server."""
    on_batch = (lambda record: progress(record.size)) if progress is not None else None
    start = time.perf_counter()
    async with BatchingServer(model_factory(), config.policy, on_batch=on_batch,
                              model_thread=config.model_thread) as evaluate:
        for _ in range(config.num_servers - 1):
            await evaluate.add_worker(model_factory())
        try:
            results = await gather_searches(search_fn, starts, evaluate)
        finally:
            wall = time.perf_counter() - start
    stats = merge_stats(config, wall, [evaluate.stats], [evaluate.trace])
    return SearchResults(results, stats)
