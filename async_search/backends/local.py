"""The local backend: searches and servers in the calling process, in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Awaitable, Callable, Dict, Hashable, List, Sequence

from async_search.backends.attempts import GRACE_S, Deadlines, bounded_search, task_outcome
from async_search.backends.config import Progress, RunConfig
from async_search.backends.results import SearchResults, merge_stats, raise_failures
from async_search.backends.servers import ServersHook
from async_search.errors import CloseTimeoutError
from async_search.servers.batching import BatchingServer


async def gather_searches(search_fn: Callable[[Any, Any], Awaitable[Any]],
                          starts: Sequence[Any], evaluate: Any, *,
                          return_exceptions: bool = False,
                          deadlines: Deadlines | None = None) -> List[Any]:
    """Runs ``search_fn(start, evaluate)`` for every start concurrently; results in order.

    Args:
        return_exceptions: a failed search's exception takes its place in the results.
        deadlines: the run's deadline (searches still running then are cancelled) and
            each search's timeout; either fails the search with SearchTimeoutError.

    Raises:
        SearchError: (unless ``return_exceptions``) naming every start whose search
            raised; the others still finish.
    """
    deadlines = deadlines or Deadlines()
    tasks = [asyncio.ensure_future(bounded_search(search_fn, s, evaluate,
                                                  deadlines.search_s)) for s in starts]
    late: set = set()
    try:
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=deadlines.run_left())
            for task in late:  # past the run's deadline: stopped at their next await
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=GRACE_S)
    finally:
        for task in tasks:
            task.cancel()
    results: List[Any] = []
    failures: Dict[int, BaseException] = {}  # raised, not returned: a result may be one
    for index, task in enumerate(tasks):
        if task in late and (task.cancelled() or not task.done()):
            outcome, raised = deadlines.run_timeout_error(index), True
        else:  # (cancelled: the search cancelled itself)
            outcome, raised = task_outcome(task, f"the search of start {index}")
        if raised:
            failures[index] = outcome
        results.append(outcome)
    if not return_exceptions:
        raise_failures(failures, len(starts))
    return results


async def run_local(search_fn, starts: Sequence[Any], model_factory: Callable[[], Any],
                    config: RunConfig, progress: Progress | None = None, *,
                    servers_hook: ServersHook | None = None,
                    deadlines: Deadlines | None = None) -> SearchResults:
    """Every search in this loop, served by ``num_servers`` workers of one server."""
    if deadlines is None:
        deadlines = Deadlines.from_config(config.timeout, config.search_timeout)
    on_batch = (lambda record: progress(record.size)) if progress is not None else None
    began = time.perf_counter()
    async with BatchingServer(model_factory(), config.policy, on_batch=on_batch,
                              model_thread=config.model_thread) as evaluate:
        for _ in range(config.num_servers - 1):
            await evaluate.add_worker(model_factory())
        # The models' building is start-up, as on Ray: not the searches' wall time.
        start = time.perf_counter()
        try:
            hand_over(servers_hook, evaluate, config)
            results = await gather_searches(search_fn, starts, evaluate,
                                            return_exceptions=config.return_exceptions,
                                            deadlines=deadlines)
        finally:
            wall = time.perf_counter() - start
            if servers_hook is not None:
                await servers_hook.finish()
            # Every search has ended (or the run fails): what is still queued or in
            # the model is no one's, so nothing is drained, and a model stuck in a
            # batch (a search_timeout ended its searches) is not waited for.
            with contextlib.suppress(CloseTimeoutError):
                await evaluate.aclose(drain=False, timeout=GRACE_S)
    # Every search ran here: one process, whatever num_procs asked for (the
    # requested number stays in num_procs_requested).
    stats = merge_stats(config, wall, [evaluate.stats], [evaluate.trace], num_clients=1,
                        origin=start)
    stats["startup_s"] = start - began
    return SearchResults(results, stats)


def hand_over(hook: ServersHook | None, evaluate: BatchingServer, config: RunConfig) -> None:
    """Gives ``on_servers`` the one server of this process: a push swaps the model of
    every device worker at once, between batches (``BatchingServer.update_model``), so
    that every request queued after it runs on the new model."""
    if hook is None:
        return

    async def push(model_or_weights: Any, version: Hashable) -> None:
        evaluate.update_model(model_or_weights, version)

    hook.serving(push, evaluate.version, config.num_servers, config.backend)
