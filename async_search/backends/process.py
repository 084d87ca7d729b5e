"""The process backend: searches in worker processes, model servers in this process.

Each client process runs its share of the starts concurrently in its own event loop and
talks to this process over a socket pair: one frame per loop iteration of requests
(``CoalescingClient``), one frame per response (with the model version that computed
it, for ``evaluate.with_version``), arrays out of band. This process serves
every client's messages through one BatchingServer whose ``num_servers`` device workers
take batches from one stream. All I/O is asyncio streams: no threads to read, no polling.

Every message gets exactly one answer, and every start one outcome, whatever the model
or the search raised or returned: failures travel as ``remote.Failure`` (the exception
itself when it round-trips through pickle, else a RemoteError standing for it, with its
traceback as text), each search's outcome is pickled on its own and checked to load, so
what cannot travel fails its own request or start, named, and nothing else.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import pickle
import socket
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

from async_search.backends.client import CoalescingClient
from async_search.backends.config import (Progress, RunConfig, SearchResults, finish,
                                          loop_factory, merge_stats)
from async_search.backends.local import hand_over
from async_search.backends.remote import (Failure, arrived, pack, pack_error,
                                          plain_outputs, round_trips, unpack_error)
from async_search.backends.servers import ServersHook
from async_search.base import TensorSpec
from async_search.errors import (ModelOutputError, SearchError, ServerClosedError,
                                 ServerDiedError)
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
    return SearchResults(finish(results, failures, config),
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


async def _serve_client(number: int, share: List[int], sock: socket.socket,
                        process: multiprocessing.Process, evaluate: BatchingServer,
                        ) -> List[Tuple[int, bool, Any]]:
    """Serves one client's messages until it reports its results, or dies.

    Every message gets exactly one answer: its outputs, or a failure that can travel
    (``remote.pack_error``); outputs that cannot travel fail that message with
    ModelOutputError. Nothing raised while answering escapes into a callback.
    """
    reader, writer = await asyncio.open_connection(sock=sock)
    where = f"client process {number} (pid {process.pid})"

    def answer_error(message_id: int, error: BaseException) -> None:
        try:
            write_frame(writer, ("result", message_id, pack_error(error), None))
        except Exception:  # cannot happen (a Failure always pickles); if it does, the
            writer.close()  # client sees the connection end and fails its requests

    def reply(message_id: int, fut: asyncio.Future) -> None:
        if writer.is_closing():
            return
        if fut.cancelled():
            answer_error(message_id, ServerClosedError(
                "the serving process dropped this request (its server is stopping)"))
            return
        error = fut.exception()
        if error is None:
            outputs, version = fut.result()
            frame = ("result", message_id, outputs, version)
            if not plain_outputs(outputs, version):  # objects in them: check the trip
                ok, why = round_trips(frame)
                if not ok:
                    error = ModelOutputError(
                        f"the model's outputs ({type(outputs).__name__}) cannot be sent to "
                        f"the client process: {type(why).__name__}: {why}")
            if error is None:
                try:
                    write_frame(writer, frame)
                    return
                except Exception as e:
                    error = ModelOutputError(f"the model's outputs cannot be sent to the "
                                             f"client process: {e!r}")
        answer_error(message_id, error)

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
            except Exception as e:  # a message that does not load: which one is unknown
                error = SearchError(f"{where} sent a message that could not be read "
                                    f"({e!r}); its starts {share} did not finish")
                return [(index, False, error) for index in share]
            if kind == "eval":
                message_id, batch = body
                try:
                    fut = evaluate.call_with_version(batch)
                except Exception as e:  # a bad request: fails that message alone
                    answer_error(message_id, e)
                    continue
                fut.add_done_callback(functools.partial(reply, message_id))
            elif kind == "done":
                (report,) = body
                return [arrived(share[k], is_result, payload, where)
                        for k, is_result, payload in report]
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
        while True:
            try:
                _, message_id, outputs, version = await read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                client.fail_all(
                    ServerDiedError("the serving process closed the connection"))
                return
            except Exception as e:  # an answer that does not load (the server checks
                # what it sends, so not expected): its message is unknown, so every
                # waiting request fails rather than waiting forever
                client.fail_in_flight(ModelOutputError(
                    f"an answer from the serving process could not be read: {e!r}"))
                continue
            if isinstance(outputs, Failure):
                outputs = unpack_error(outputs, "raised in the serving process")
            client.deliver(message_id, outputs, version)

    receiving = asyncio.ensure_future(receive())
    outcomes = await asyncio.gather(*(search_fn(s, client) for s in starts),
                                    return_exceptions=True)
    # Each outcome travels on its own, checked to load: one that cannot fails its own
    # start, with the reason, and never the others.
    report = [(k, *_packed(r)) for k, r in enumerate(outcomes)]
    write_frame(writer, ("done", report))
    receiving.cancel()
    # drain() returns once the buffer is below its low-water mark, not empty: the loop
    # must run until close has flushed every byte, or the end of a large report is lost
    # when this process exits (the server then saw a client die with exit code 0).
    writer.close()
    try:
        await writer.wait_closed()
    except ConnectionError:  # the server ended the run (on_servers failed): nobody reads
        pass


def _packed(outcome: Any) -> Tuple[bool, bytes]:
    """``(is_result, payload)``: a result that travels, or a ``Failure`` that does."""
    if isinstance(outcome, BaseException):
        return False, pickle.dumps(pack_error(outcome))
    return pack(outcome)
