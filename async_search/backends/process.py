"""The process backend: searches in worker processes, model servers in this process.

Each client process runs its share of the starts concurrently in its own event loop.
Its evaluate function is a ``CoalescingClient`` on a ``pipe`` of two ``SocketQueue``s:
one message per loop iteration of requests, and the server's answers (each with the
model version that computed it, for ``evaluate.with_version``) coming back in order.
This process serves every client's connection with a ``ConnectionServer``, through one
BatchingServer whose ``num_servers`` device workers take batches from one stream; a push
(``on_servers``) swaps through it, so that it returns once every client knows the new
version (a cache inside a client never serves the old one after). A client ends its
stream by closing it when its searches are done; a client that dies ends it too (its
socket closes), and only its own starts fail.

Every message gets exactly one answer, and every start one outcome, whatever the model
or the search raised or returned: answers are made portable (``remote.Failure`` for an
exception, a check for outputs holding objects), and each search's outcome is pickled
on its own and checked to load, so what cannot travel fails its own request or start,
named, and nothing else.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import signal
from typing import Any, Callable, Dict, List, Sequence, Tuple

from async_search.backends.client import CoalescingClient
from async_search.backends.config import (Progress, RunConfig, SearchResults, finish,
                                          loop_factory, merge_stats)
from async_search.backends.servers import ServersHook
from async_search.base import TensorSpec
from async_search.connections import Connection, pipe
from async_search.errors import SearchError
from async_search.process_tree import starting_children
from async_search.queues import ClosedConnection, SocketQueue, socket_queue
from async_search.remote import arrived, pack, pack_error
from async_search.servers.batching import BatchingServer
from async_search.servers.connection_server import ConnectionServer

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
    loop = asyncio.get_running_loop()
    start_time = loop.time()
    async with BatchingServer(model_factory(), config.policy, on_batch=on_batch,
                              model_thread=config.model_thread) as evaluate:
        for _ in range(config.num_servers - 1):
            await evaluate.add_worker(model_factory())
        processes: List[multiprocessing.Process] = []
        serving: asyncio.Future | None = None
        try:
            # A push swaps the model here, where every client's messages are served (a
            # message read after it, so sent after it, runs on the new model), and
            # returns once every client has learned the new version.
            connections = ConnectionServer(evaluate, portable=True)
            if servers_hook is not None:
                servers_hook.serving(connections.update_model, evaluate.version,
                                     config.num_servers, config.backend)
            spec = evaluate.input_spec
            server_ends, collecting = [], []
            for i in range(min(config.num_procs, max(len(starts), 1))):
                share = list(range(i, len(starts), config.num_procs))
                server_end, client_end = pipe(socket_queue)
                results = SocketQueue()
                process = context.Process(
                    target=client_main, name=f"async_search-client-{i}", daemon=True,
                    args=(client_end, results, search_fn, [starts[j] for j in share],
                          spec, config.use_uvloop))
                with starting_children():  # deaf to Ctrl-C, and never cut off half-way
                    process.start()
                processes.append(process)
                server_ends.append(server_end.close_unused_ends())
                collecting.append(_collect(i, share, results.reader_only(), process))
            serving = asyncio.ensure_future(connections.serve(server_ends))
            outcomes = await asyncio.gather(*collecting)
            await serving  # every stream has ended: each client closed it, or is gone
            wall = loop.time() - start_time
        finally:
            if serving is not None and not serving.done():
                serving.cancel()
            for process in processes:
                if process.is_alive():
                    process.kill()
            if servers_hook is not None:
                await servers_hook.finish()
    results_: List[Any] = [None] * len(starts)
    failures: Dict[int, BaseException] = {}
    for outcome in outcomes:
        for index, ok, value in outcome:
            if ok:
                results_[index] = value
            else:
                failures[index] = value
    return SearchResults(finish(results_, failures, config),
                         merge_stats(config, wall, [evaluate.stats], [evaluate.trace]))


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


async def _collect(number: int, share: List[int], results: SocketQueue,
                   process: multiprocessing.Process) -> List[Tuple[int, bool, Any]]:
    """The outcome of each of one client's starts: its report, or, if the client died
    or sent a report that cannot be read, an error for each of its starts."""
    where = f"client process {number} (pid {process.pid})"
    reported = False
    try:
        try:
            report = await results.get_async()
            reported = True
        except ClosedConnection:
            await asyncio.to_thread(process.join, 5)
            error = SearchError(f"{where} died with exit code {process.exitcode}; its "
                                f"starts {share} did not finish")
            return [(index, False, error) for index in share]
        except Exception as e:  # a report that does not load
            error = SearchError(f"{where} sent a report that could not be read ({e!r}); "
                                f"its starts {share} did not finish")
            return [(index, False, error) for index in share]
        return [arrived(share[k], is_result, payload, where)
                for k, is_result, payload in report]
    finally:
        results.close()
        if reported:  # it exits by itself once its last bytes are written
            await asyncio.to_thread(process.join, 10)
        if process.is_alive():  # cancelled (the run failed), or stuck: no reason to wait
            process.kill()
            await asyncio.to_thread(process.join, 5)


def client_main(connection: Connection, results: SocketQueue, search_fn,
                starts: List[Any], spec: TensorSpec | None, use_uvloop: bool) -> None:
    """A client process: runs its starts concurrently, requests going over
    ``connection``; reports each start's outcome on ``results``."""
    # Ctrl-C reaches every process of the terminal's group: the serving process decides
    # (it cancels the run and kills its clients), so a client neither dies half-way
    # through a message nor prints a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    connection.close_unused_ends()
    results.writer_only()
    with asyncio.Runner(loop_factory=loop_factory(use_uvloop)) as runner:
        runner.run(_client(connection, results, search_fn, starts, spec))


async def _client(connection: Connection, results: SocketQueue, search_fn,
                  starts: List[Any], spec: TensorSpec | None) -> None:
    client = CoalescingClient(connection, spec, where="the serving process")
    outcomes = await asyncio.gather(*(search_fn(s, client) for s in starts),
                                    return_exceptions=True)
    # Each outcome travels on its own, checked to load: one that cannot fails its own
    # start, with the reason, and never the others.
    results.put([(k, *_packed(r)) for k, r in enumerate(outcomes)])
    connection.close()
    await client.aclose()  # it hears of no more swaps
    # The puts leave at the end of this loop iteration: the loop must run until every
    # byte is written, or the end of a large report is lost when this process exits.
    try:
        await asyncio.gather(results.drain(), connection.drain())
    except ConnectionError:  # the server ended the run (on_servers failed): nobody reads
        pass


def _packed(outcome: Any) -> Tuple[bool, bytes]:
    """``(is_result, payload)``: a result that travels, or a ``Failure`` that does."""
    if isinstance(outcome, BaseException):
        return False, pickle.dumps(pack_error(outcome))
    return pack(outcome)
