"""The process backend: searches in worker processes, model servers in this process.

Each client process runs its share of the starts concurrently in its own event loop and
talks to this process over a socket pair: one frame per loop iteration of requests
(``CoalescingClient``), one frame per response (with the model version that computed
it, for ``evaluate.with_version``), arrays out of band. This process serves
every client's messages through one BatchingServer whose ``num_servers`` device workers
take batches from one stream. All I/O is asyncio streams: no threads to read, no polling.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import socket
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

from async_search.backends.client import CoalescingClient
from async_search.backends.config import (Progress, RunConfig, SearchResults, loop_factory,
                                          merge_stats, raise_failures)
from async_search.backends.local import hand_over
from async_search.backends.servers import ServersHook
from async_search.base import TensorSpec
from async_search.errors import SearchError, ServerDiedError
from async_search.servers.batching import BatchingServer
from async_search.transport import read_frame, write_frame

__all__ = ["run_process", "client_main"]

#: spawn, not fork: the serving process may hold threads (device threads, TensorFlow).
_CONTEXT = "spawn"


async def run_process(search_fn, starts: Sequence[Any], model_factory: Callable[[], Any],
                      config: RunConfig, progress: Progress | None = None, *,
                      servers_hook: ServersHook | None = None) -> SearchResults:
    """Runs the starts round-robin over ``num_procs`` client processes."""
    _check_picklable(search_fn, starts)
    on_batch = (lambda record: progress(record.size)) if progress is not None else None
    context = multiprocessing.get_context(_CONTEXT)
    start_time = time.perf_counter()
    async with BatchingServer(model_factory(), config.policy, on_batch=on_batch,
                              model_thread=config.model_thread) as evaluate:
        for _ in range(config.num_servers - 1):
            await evaluate.add_worker(model_factory())
        try:
            # A push swaps the model here, where every client's messages are served: a
            # message read after it (so sent after it) runs on the new model.
            hand_over(servers_hook, evaluate, config)
            spec = evaluate.input_spec
            clients = []
            for i in range(min(config.num_procs, max(len(starts), 1))):
                share = list(range(i, len(starts), config.num_procs))
                ours, theirs = socket.socketpair()
                process = context.Process(
                    target=client_main, name=f"async_search-client-{i}", daemon=True,
                    args=(theirs, search_fn, [starts[j] for j in share], spec,
                          config.use_uvloop))
                process.start()
                theirs.close()
                clients.append(_serve_client(i, share, ours, process, evaluate))
            outcomes = await asyncio.gather(*clients)
            wall = time.perf_counter() - start_time
        finally:
            if servers_hook is not None:
                await servers_hook.finish()
    results: List[Any] = [None] * len(starts)
    failures: Dict[int, BaseException] = {}
    for outcome in outcomes:
        for index, ok, value in outcome:
            if ok:
                results[index] = value
            else:
                failures[index] = value
    raise_failures(failures, len(starts))
    return SearchResults(results, merge_stats(config, wall, [evaluate.stats],
                                              [evaluate.trace]))


def _check_picklable(search_fn, starts: Sequence[Any]) -> None:
    """Fails before any process starts if the searches cannot travel to one."""
    for what, obj in (("search_fn", search_fn), ("starts", starts)):
        try:
            pickle.dumps(obj)
        except Exception as e:
            raise TypeError(
                f"the process backend sends {what} to worker processes, so it must be "
                f"picklable (a module-level function, or a functools.partial of one): "
                f"{e}") from e


async def _serve_client(number: int, share: List[int], sock: socket.socket,
                        process: multiprocessing.Process, evaluate: BatchingServer,
                        ) -> List[Tuple[int, bool, Any]]:
    """Serves one client's messages until it reports its results, or dies."""
    reader, writer = await asyncio.open_connection(sock=sock)

    def reply(message_id: int, fut: asyncio.Future) -> None:
        if writer.is_closing() or fut.cancelled():
            return
        error = fut.exception()
        outputs, version = (error, None) if error else fut.result()
        write_frame(writer, ("result", message_id, outputs, version))

    try:
        while True:
            try:
                kind, *body = await read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                await asyncio.to_thread(process.join, 5)
                error = SearchError(
                    f"client process {number} (pid {process.pid}) died with exit code "
                    f"{process.exitcode}; its starts {share} did not finish")
                return [(index, False, error) for index in share]
            if kind == "eval":
                message_id, batch = body
                try:
                    fut = evaluate.call_with_version(batch)
                except Exception as e:  # a bad request: fails that message alone
                    write_frame(writer, ("result", message_id, e, None))
                    continue
                fut.add_done_callback(lambda f, m=message_id: reply(m, f))
            elif kind == "done":
                (outcome,) = body
                return [(share[k], ok, value) for k, ok, value in outcome]
    finally:
        writer.close()
        await asyncio.to_thread(process.join, 10)
        if process.is_alive():
            process.kill()


def client_main(sock: socket.socket, search_fn, starts: List[Any], spec: TensorSpec | None,
                use_uvloop: bool) -> None:
    """A client process: runs its starts concurrently, requests going over ``sock``."""
    with asyncio.Runner(loop_factory=loop_factory(use_uvloop)) as runner:
        runner.run(_client(sock, search_fn, starts, spec))


async def _client(sock: socket.socket, search_fn, starts: List[Any],
                  spec: TensorSpec | None) -> None:
    reader, writer = await asyncio.open_connection(sock=sock)
    client = CoalescingClient(lambda mid, batch: write_frame(writer, ("eval", mid, batch)),
                              spec)

    async def receive():
        try:
            while True:
                _, message_id, outputs, version = await read_frame(reader)
                client.deliver(message_id, outputs, version)
        except (asyncio.IncompleteReadError, ConnectionError):
            client.fail_all(ServerDiedError("the serving process closed the connection"))

    receiving = asyncio.ensure_future(receive())
    outcomes = await asyncio.gather(*(search_fn(s, client) for s in starts),
                                    return_exceptions=True)
    report = [(k, not isinstance(r, BaseException), r) for k, r in enumerate(outcomes)]
    try:
        write_frame(writer, ("done", report))
    except Exception as e:  # an unpicklable result or error: say so instead
        write_frame(writer, ("done", [(k, False, SearchError(f"could not send back: {e!r}"))
                                      for k in range(len(starts))]))
    try:
        await writer.drain()
    except ConnectionError:  # the server ended the run (on_servers failed): nobody reads
        pass
    receiving.cancel()
    writer.close()
