"""Runners that place searches and model servers: local, worker processes, or Ray.

The same search function runs unchanged on every backend: an ``async def
search_fn(start, evaluate)`` that awaits ``evaluate(x)``. Backends other than local are
imported only when asked for, so that Ray stays optional. ``on_servers`` hands a
training loop the run's ``ModelServers``, to push new weights to every server while the
searches run.

Example:
    >>> from async_search import problems, search
    >>> puzzle = problems.SlidingPuzzle(3)
    >>> async def astar(start, evaluate):
    ...     return await search.batched_astar(puzzle, start, evaluate, budget=500,
    ...                                       buffer_size=4)
    >>> starts = [puzzle.scramble(10, seed=s) for s in range(4)]
    >>> out = run_searches(astar, starts, lambda: problems.ManhattanHeuristic(puzzle))
    >>> [r.status.value for r in out], out.stats["backend"]
    (['goal_found', 'goal_found', 'goal_found', 'goal_found'], 'local')
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import inspect
import multiprocessing
import time
from typing import Any, Awaitable, Callable, Sequence

from async_search.backends.attempts import GRACE_S, Deadlines
from async_search.backends.config import (BACKENDS, DEFAULT_RETRIES, Progress, RayPlacement,
                                          RunConfig)
from async_search.backends.results import SearchResults
from async_search.backends.servers import ModelServers, OnServers, ServersHook
from async_search.checks import check_callable
from async_search.event_loops import loop_factory
from async_search.servers.batch_size import AutoBatchSize
from async_search.servers.policy import DispatchPolicy

__all__ = ["run_searches", "run_searches_async", "RunConfig", "RayPlacement",
           "SearchResults", "BACKENDS", "DEFAULT_RETRIES", "ModelServers", "SearchFn"]

SearchFn = Callable[[Any, Any], Awaitable[Any]]

_RUNNERS = {"local": ("async_search.backends.local", "run_local"),
            "process": ("async_search.backends.process", "run_process"),
            "ray": ("async_search.backends.ray_backend", "run_ray")}


def _config(backend, num_procs, num_servers, max_batch_size, max_delay, pipeline_depth,
            use_uvloop, address, total_gpu_frac, model_thread, return_exceptions, retries,
            timeout, search_timeout, placement, client_waves) -> RunConfig:
    return RunConfig(backend, num_procs, num_servers,
                     DispatchPolicy(max_batch_size, max_delay, pipeline_depth),
                     use_uvloop, address, total_gpu_frac, model_thread, return_exceptions,
                     retries, timeout, search_timeout,
                     RayPlacement() if placement is None else placement, client_waves)


def _check_callables(search_fn: Any, model_factory: Any, progress: Any) -> None:
    """TypeError, before anything starts, for what cannot be called as the run calls it:
    not in every search's result, nor in a server far away. The likeliest slip, a model
    where its factory belongs, is named as such."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # Set while a spawned process imports the main script again: a script that
        # calls run_searches at its top level would start client processes there.
        raise RuntimeError(
            "run_searches was called while a spawned process imported the main script "
            "again (each client process of the process backend does): in a script, "
            "call it under `if __name__ == \"__main__\":`")
    check_callable("search_fn", search_fn)
    check_callable("model_factory", model_factory)
    check_callable("progress", progress, optional=True)
    inner = search_fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    if inspect.isasyncgenfunction(inner):
        raise TypeError(f"search_fn must be an async def that returns its result (it is "
                        f"awaited), not an async generator function: {search_fn!r:.80}")
    for fn, name, args, wanted in (
            (model_factory, "model_factory", (), "no arguments, where each server runs, "
             "to make its model: pass a function that makes it (lambda: model), not the "
             "model"),
            (search_fn, "search_fn", (None, None), "(start, evaluate)")):
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # some builtins have none: they are called as is
            continue
        try:
            signature.bind(*args)
        except TypeError:
            raise TypeError(f"{name} is called with {wanted}; {fn!r:.80} takes "
                            f"{signature}") from None


async def run_searches_async(search_fn: SearchFn, starts: Sequence[Any],
                             model_factory: Callable[[], Any], *, backend: str = "local",
                             num_procs: int = 1, num_servers: int = 1,
                             max_batch_size: int | str | AutoBatchSize = 256,
                             max_delay: float | None = None,
                             pipeline_depth: int = 2, use_uvloop: bool = False,
                             address: str | None = None,
                             total_gpu_frac: float | None = None,
                             model_thread: bool | str = "auto",
                             progress: Progress | None = None,
                             on_servers: OnServers | None = None,
                             return_exceptions: bool = False,
                             retries: int = DEFAULT_RETRIES, timeout: float | None = None,
                             search_timeout: float | None = None,
                             placement: RayPlacement | None = None,
                             client_waves: int = 1) -> SearchResults:
    """``run_searches`` inside a running loop (Jupyter): ``await`` it."""
    started = time.monotonic()
    config = _config(backend, num_procs, num_servers, max_batch_size, max_delay,
                     pipeline_depth, use_uvloop, address, total_gpu_frac, model_thread,
                     return_exceptions, retries, timeout, search_timeout, placement,
                     client_waves)
    _check_callables(search_fn, model_factory, progress)  # on_servers: ServersHook
    module, name = _RUNNERS[config.backend]
    runner = getattr(importlib.import_module(module), name)
    return await _run(runner, search_fn, _listed(starts), model_factory, config, progress,
                      on_servers, started)


def _listed(starts: Any) -> list:
    """``starts`` as a list; TypeError naming it when it is no iterable."""
    try:
        return list(starts)
    except TypeError:
        if hasattr(starts, "__iter__") or hasattr(starts, "__getitem__"):
            raise  # raised inside its own iteration: the caller's to see as it is
        raise TypeError(f"starts must be an iterable of starts (a list, a generator, an "
                        f"array), got {type(starts).__name__}") from None


async def _ending_the_rest(run: Awaitable[SearchResults]) -> SearchResults:
    """``await run``, then the end of every other task of this loop (run_searches' own):
    the runner's close cancels them and waits for them all, so a task that ignores its
    cancellation (a search past its deadline that swallows CancelledError, a task a
    search started) would hold the call for good. Those still running ``GRACE_S`` after
    their cancellation have their coroutines closed (GeneratorExit at their await); one
    that swallows that too (a bare ``except:``) still holds it."""
    try:
        return await run
    finally:
        rest = asyncio.all_tasks() - {asyncio.current_task()}
        for task in rest:
            task.cancel()
        if rest:
            _, stuck = await asyncio.wait(rest, timeout=GRACE_S)
            for task in stuck:
                with contextlib.suppress(RuntimeError):  # it ignored that too: lost
                    task.get_coro().close()
                task.cancel()  # its step now finds the coroutine closed, and it ends
            if stuck:
                await asyncio.wait(stuck, timeout=GRACE_S)
            for task in stuck:  # ended by the close ("cannot reuse already awaited
                if task.done() and not task.cancelled():  # coroutine"): not theirs
                    task.exception()


async def _run(runner, search_fn, starts: list, model_factory, config: RunConfig,
               progress: Progress | None, on_servers: OnServers | None,
               started: float) -> SearchResults:
    deadlines = Deadlines.from_config(config.timeout, config.search_timeout, started)
    if on_servers is None:
        return await runner(search_fn, starts, model_factory, config, progress,
                            deadlines=deadlines)
    hook = ServersHook(on_servers)
    run = asyncio.ensure_future(runner(search_fn, starts, model_factory, config, progress,
                                       servers_hook=hook, deadlines=deadlines))
    hook.on_error = run.cancel  # the callback's task failed: end the run now
    try:
        results = await run
    except BaseException as e:
        outer_cancel = isinstance(e, asyncio.CancelledError) and (
            asyncio.current_task().cancelling())
        if hook.error is None or outer_cancel:
            raise
        if isinstance(e, asyncio.CancelledError):  # cancelled for the callback's error
            raise hook.error from None
        raise hook.error
    if hook.error is not None:  # it failed as the searches ended
        raise hook.error
    return results


def run_searches(search_fn: SearchFn, starts: Sequence[Any],
                 model_factory: Callable[[], Any], *, backend: str = "local",
                 num_procs: int = 1, num_servers: int = 1,
                 max_batch_size: int | str | AutoBatchSize = 256,
                 max_delay: float | None = None, pipeline_depth: int = 2,
                 use_uvloop: bool = False, address: str | None = None,
                 total_gpu_frac: float | None = None, model_thread: bool | str = "auto",
                 progress: Progress | None = None,
                 on_servers: OnServers | None = None,
                 return_exceptions: bool = False, retries: int = DEFAULT_RETRIES,
                 timeout: float | None = None, search_timeout: float | None = None,
                 placement: RayPlacement | None = None,
                 client_waves: int = 1) -> SearchResults:
    """Runs ``search_fn(start, evaluate)`` for every start, batching all model calls.

    The starts are split round-robin over ``num_procs`` client processes (or Ray
    tasks), each running its share concurrently in its own event loop; ``num_servers``
    model servers, each with a model from ``model_factory`` (called where the server
    runs), take batches from one request stream.

    Args:
        search_fn: ``async def search_fn(start, evaluate) -> result``; for the process
            and Ray backends it must be picklable (a module-level function, or a
            ``functools.partial`` of one).
        starts: the start of each search.
        model_factory: builds a model (picklable for the Ray backend).
        backend: ``local``, ``process`` or ``ray``.
        num_procs: client processes. The local backend runs every search in this
            process, whatever it says: its stats report ``num_procs`` 1 (and this
            number as ``num_procs_requested``).
        num_servers: model servers (local and process: device threads here; Ray:
            actors spread over every GPU of the cluster, each asking for its share of
            the GPU it is placed on: ``backends.gpu_placement``).
        max_batch_size, max_delay, pipeline_depth: each server's dispatch policy.
        use_uvloop: run the event loops on uvloop, when installed.
        address: Ray: an existing cluster's address; None starts Ray locally (unless
            this process started it already: then that Ray is used). A cluster with
            token authentication needs ``RAY_AUTH_MODE=token`` and its token here
            (docs/backends.md, "Joining a cluster"). A Ray that ``run_searches`` starts
            keeps what searches and models print in its log files
            (``/tmp/ray/session_latest/logs/worker-*.out``); to see it here, call
            ``ray.init()`` first.
        total_gpu_frac: Ray: the fraction of each GPU in use that the servers on it
            share, in (0, 1] (None: all of it).
        model_thread: where servers run their models: "auto" (default: a device
            thread, or the server's loop while a batch takes under 200 us), True
            (device threads) or False (the loop).
        progress: called here with the number of elements evaluated, as batches
            complete (a progress bar's ``update``). What it raises goes to the loop's
            exception handler, call by call, and the run goes on: a progress bar that
            breaks never costs the searches.
        on_servers: called here once with the run's ``ModelServers`` as soon as its
            servers serve (before the searches start, on this loop); ``await
            servers.update_model(weights, version)`` swaps the model of every server
            while the searches run. If it returns a coroutine, that runs as a task beside
            the searches and is cancelled when they end. What it raises (or its task
            raises) ends the run: the searches are cancelled, the servers stop, and
            ``run_searches`` raises that exception. The handle raises RuntimeError once
            the run has ended.
        return_exceptions: True: a start whose search failed (or whose client process
            or task died) holds its exception in place among the results, and every
            good result is kept (as with ``asyncio.gather``). False (default): raise
            SearchError once every search has ended.
        retries: process and Ray: how many times a start whose worker died (its client
            process, Ray task or node, or every server it could reach) runs again, in
            a new worker on the survivors (default 3, as Ray's tasks; 0: never).
            What a search raises is never retried. Searches are deterministic given
            their start, so a retried one returns what it would have.
        timeout: seconds the run may take from this call (None: no limit). Searches not
            finished by then fail with ``errors.SearchTimeoutError`` (a TimeoutError),
            in place with ``return_exceptions``; their workers are killed, the servers
            stopped, and the call returns within a second of it.
        search_timeout: seconds each attempt of a search may run from its start (None:
            no limit); then it fails with SearchTimeoutError, and a worker whose
            searches are all past it is killed (one that is stuck or stopped too).
        placement: Ray: where the client tasks and server actors go
            (``RayPlacement``: spread over the nodes by default; servers on GPU nodes).
        client_waves: process and Ray: each client sends its searches' requests in
            this many messages at once, so that it computes one wave while the server
            evaluates another (default 1: one message a loop iteration;
            ``RunConfig.client_waves``).

    Returns:
        SearchResults: the results in the order of ``starts``, with ``.stats``.
        An exception from another process (process and Ray backends) arrives as itself
        when it can travel, else as ``errors.RemoteError`` (its type name, message and
        traceback as text); either way with ``remote_traceback`` (its traceback where
        it was raised, also shown as its cause) and a note naming its start.

    Raises:
        ValueError: for bad arguments, before anything starts.
        TypeError: ``search_fn``, ``model_factory``, ``progress`` or ``on_servers`` that
            cannot be called as the run calls them (a model passed as its factory, say),
            before anything starts.
        SearchError: (unless ``return_exceptions``) naming every start whose search (or
            client process) failed, in its message and in ``.failures`` (start index ->
            exception: ``errors.WorkerDiedError`` naming each attempt when its worker
            died every time, SearchTimeoutError past a deadline); the good results are
            not returned.
        RuntimeError: when called inside a running loop: use ``run_searches_async``.
    """
    started = time.monotonic()
    config = _config(backend, num_procs, num_servers, max_batch_size, max_delay,
                     pipeline_depth, use_uvloop, address, total_gpu_frac, model_thread,
                     return_exceptions, retries, timeout, search_timeout, placement,
                     client_waves)
    _check_callables(search_fn, model_factory, progress)  # on_servers: ServersHook
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("run_searches starts its own event loop; inside a running loop "
                           "(Jupyter) use: await asr.run_searches_async(...)")
    module, name = _RUNNERS[config.backend]
    runner = getattr(importlib.import_module(module), name)
    with asyncio.Runner(loop_factory=loop_factory(config.use_uvloop)) as loop_runner:
        return loop_runner.run(_ending_the_rest(_run(
            runner, search_fn, _listed(starts), model_factory, config, progress, on_servers,
            started)))
