"""The process backend: searches in worker processes, model servers in this process.

Each client process runs its share of the starts concurrently in its own event loop.
Its evaluate function is a ``CoalescingClient`` on a ``pipe`` of two ``SocketQueue``s:
one message per loop iteration of requests, and the server's answers (each with the
model version that computed it, for ``evaluate.with_version``) coming back in order.
This process serves every client's connection with a ``ConnectionServer``, through one
BatchingServer whose ``num_servers`` device workers take batches from one stream; a push
(``on_servers``) swaps through it, so that it returns once every client knows the new
version (a cache inside a client never serves the old one after). A client reports
each search's outcome as it ends, and ends its stream by closing it when its searches
are done; a client that dies ends it too (its socket closes), and the starts it had not
reported run again in a new client process (``retries``, ``attempts.run_share``); past
a deadline, a client is killed and its unfinished starts fail with SearchTimeoutError.

Every message gets exactly one answer, and every start one outcome, whatever the model
or the search raised or returned: answers are made portable (``wire.Failure`` for an
exception, a check for outputs holding objects), and each search's outcome is pickled
on its own and checked to load, so what cannot travel fails its own request or start,
named, and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import io
import itertools
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import types
from typing import Any, Callable, Dict, List, Sequence, Tuple

from async_search.backends.attempts import (GRACE_S, ClientSearches, Deadlines, Started,
                                            WorkerBroke, WorkerLost, check_travels,
                                            run_share, run_shares)
from async_search.backends.client import CoalescingClient
from async_search.backends.config import Progress, RunConfig
from async_search.backends.results import SearchResults, finish, merge_stats
from async_search.backends.servers import ServersHook
from async_search.base import TensorSpec
from async_search.connections import Connection, pipe
from async_search.errors import CloseTimeoutError, describe
from async_search.event_loops import loop_factory
from async_search.machine import open_file_limit
from async_search.process_tree import (descendants, die_with_parent, end_processes,
                                       starting_children)
from async_search.queues import ClosedConnection, SocketQueue, socket_queue
from async_search.servers.batching import BatchingServer
from async_search.servers.connection_server import ConnectionServer
from async_search.wire import arrived, pack, pack_error


#: spawn, not fork: the serving process may hold threads (device threads, TensorFlow).
_CONTEXT = "spawn"


async def run_process(search_fn, starts: Sequence[Any], model_factory: Callable[[], Any],
                      config: RunConfig, progress: Progress | None = None, *,
                      servers_hook: ServersHook | None = None,
                      deadlines: Deadlines | None = None) -> SearchResults:
    """Runs the starts round-robin over ``num_procs`` client processes; a start whose
    process died runs again in a new one (``config.retries``)."""
    check_travels(search_fn, starts, "the process backend", "(a module-level function, "
                  "or a functools.partial of one)")
    _check_main_not_needed(search_fn, starts)
    if deadlines is None:
        deadlines = Deadlines.from_config(config.timeout, config.search_timeout)
    on_batch = (lambda record: progress(record.size)) if progress is not None else None
    context = multiprocessing.get_context(_CONTEXT)
    began = time.perf_counter()  # uvloop's loop.time() counts whole milliseconds
    clients: List[dict] = []
    async with BatchingServer(model_factory(), config.policy, on_batch=on_batch,
                              model_thread=config.model_thread) as evaluate:
        for _ in range(config.num_servers - 1):
            await evaluate.add_worker(model_factory())
        # The models' building is start-up, as on Ray: not the searches' wall time
        # (the client processes' start is, as the searches wait on it).
        start_time = time.perf_counter()
        try:
            # A push swaps the model here, where every client's messages are served (a
            # message read after it, so sent after it, runs on the new model), and
            # returns once every client has learned the new version.
            connections = ConnectionServer(evaluate, portable=True)
            if servers_hook is not None:
                servers_hook.serving(connections.update_model, evaluate.version,
                                     config.num_servers, config.backend)
            numbers = itertools.count()  # client processes, retries included

            async def launch(indices: List[int], attempt: int) -> _ClientProcess:
                try:
                    return _ClientProcess(next(numbers), indices,
                                          [starts[j] for j in indices], search_fn,
                                          evaluate.input_spec, config, connections,
                                          context)
                except OSError as e:
                    if e.errno in (errno.EMFILE, errno.ENFILE):
                        raise _out_of_descriptors(e, config.num_procs) from e
                    raise

            shares = [list(range(i, len(starts), config.num_procs))
                      for i in range(min(config.num_procs, max(len(starts), 1)))]
            outcomes = await run_shares([
                # Ray keeps its lost starts together: its servers hold an answer queue
                # per share and attempt, not per half.
                run_share(share, launch, retries=config.retries, deadlines=deadlines,
                          record=clients.append, split_lost=True) for share in shares])
            wall = time.perf_counter() - start_time
        finally:
            if servers_hook is not None:
                await servers_hook.finish()
            # Every search has ended (or the run fails): what is still queued or in
            # the model is no one's, so nothing is drained, and a model stuck in a
            # batch (a search_timeout ended its searches) is not waited for.
            with contextlib.suppress(CloseTimeoutError):
                await evaluate.aclose(drain=False, timeout=GRACE_S)
    results_: List[Any] = [None] * len(starts)
    failures: Dict[int, BaseException] = {}
    for share_outcomes in outcomes:
        for index, (ok, value) in share_outcomes.items():
            if ok:
                results_[index] = value
            else:
                failures[index] = value
    stats = merge_stats(config, wall, [evaluate.stats], [evaluate.trace],
                        num_clients=len(shares), origin=start_time)
    stats["startup_s"] = start_time - began
    stats["clients"] = clients
    return SearchResults(finish(results_, failures, config), stats)


#: File descriptors a client process holds in this process (its sockets, the pipes of
#: its start), about; the run's own come on top.
_DESCRIPTORS_PER_CLIENT = 8


def _out_of_descriptors(e: OSError, num_procs: int) -> OSError:
    """The error of a client process that could not start for want of descriptors,
    saying what to change (multiprocessing's own names neither the limit nor why)."""
    if e.errno == errno.ENFILE:  # the system's table, not this process's limit
        return OSError(e.errno, (
            f"the process backend could not start a client process: the system's table "
            f"of open files is full ({e.strerror}); each client holds about "
            f"{_DESCRIPTORS_PER_CLIENT} descriptors here: use fewer num_procs (now "
            f"{num_procs}), or raise the system's limit (fs.file-max)"))
    limit = open_file_limit()
    return OSError(e.errno, (
        f"the process backend ran out of file descriptors starting a client process "
        f"({e.strerror}): each client holds about {_DESCRIPTORS_PER_CLIENT} in this "
        f"process, and the open-file limit (ulimit -n) is {limit or 'unknown'}; raise "
        f"it to about {64 + _DESCRIPTORS_PER_CLIENT * num_procs} for num_procs="
        f"{num_procs}, or use fewer num_procs"))


class _ClientProcess:
    """One attempt at some starts: a client process whose connection is served here, and
    the queue on which it reports (``Worker``)."""

    def __init__(self, number: int, indices: List[int], starts: List[Any], search_fn,
                 spec: TensorSpec | None, config: RunConfig, connections: ConnectionServer,
                 context):
        self._indices = indices
        with contextlib.ExitStack() as undo:  # its sockets closed if the start fails
            server_end, client_end = pipe(socket_queue)
            undo.callback(server_end.inbound.close)
            undo.callback(server_end.outbound.close)
            results = SocketQueue()
            undo.callback(results.close)
            work = SocketQueue()
            undo.callback(work.close)
            # Only sockets and a few small values go through spawn: multiprocessing
            # writes them to the new process in one blocking write, which never returns
            # when they fill the pipe and the process dies (or hangs) before reading
            # them. The searches and their starts follow on ``work``, which never blocks
            # this loop.
            self._process = context.Process(
                target=client_main, name=f"async_search-client-{number}", daemon=True,
                args=(client_end, results, work, spec, config.use_uvloop,
                      config.search_timeout, os.getpid(), config.client_waves))
            with starting_children(), _main_script_importable():  # deaf to Ctrl-C
                self._process.start()
            undo.pop_all()  # started: the sockets are its own now
        self._alive = False  # its first word (_ALIVE) not heard yet
        self._work = work.writer_only()
        # Arrays in them travel out of band: no copy here, views of the frame there.
        self._work.put((search_fn, starts))
        self.name = f"client process {number} (pid {self._process.pid})"
        self.usage: dict | None = None  # its CPU and wall seconds, once it is done
        self._results = results.reader_only()
        self._server_end = server_end.close_unused_ends()
        self._serving = asyncio.ensure_future(connections.serve(self._server_end))
        self._stopped = False
        self._closed_with: int | None = None  # its exit code, once stop closed it

    async def events(self):
        while True:
            try:
                kind, payload = await self._results.get_async()
            except ClosedConnection:
                code = self._closed_with
                if code is None:  # (not yet closed by stop)
                    await asyncio.to_thread(self._process.join, 5)
                    code = self._process.exitcode
                if not self._alive and code is not None and code > 0:
                    # An error in Python's start of the process, before client_main:
                    # every new process would meet it again.
                    raise WorkerBroke(
                        f"it exited with code {code} before it began: Python's start "
                        f"of a spawned process failed, and what it printed says why "
                        f"(a spawned process imports the main script again: in a "
                        f"script, call run_searches under "
                        f"`if __name__ == \"__main__\":`)") from None
                raise WorkerLost(f"died with exit code {code}") from None
            except Exception as e:  # a report that does not load
                raise WorkerBroke(f"it sent a report that could not be read ({e!r})") from e
            if kind == _ALIVE:
                self._alive = True
            elif kind == _STARTED:
                yield Started(self.name)
            elif kind == _UNLOADABLE:  # every attempt would fail the same way
                raise WorkerBroke(f"it could not load its searches: {payload}")
            elif kind == _OUTCOMES:
                yield [arrived(self._indices[k], is_result, value, self.name)
                       for k, is_result, value in payload]
            else:  # _DONE, with the client's usage
                self.usage = payload if isinstance(payload, dict) else None
                return

    async def stop(self, wait_s: float) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._results.close()
        self._work.close()
        process = self._process
        try:
            try:
                if wait_s > 0:  # it exits by itself once its last bytes are written
                    await asyncio.to_thread(process.join, wait_s)
            finally:
                # Stuck, stopped, past its deadline, or the run failed; or this stop
                # was cancelled (a Ctrl-C's run cancels it twice: the run, then what is
                # left of it). Ended and reaped in one thread, which runs to its end
                # even if this await is cancelled: no zombie keeps its pipes.
                if process.is_alive():
                    await asyncio.to_thread(_end_process, process)
            # Its stream has ended (closed, or its socket gone with it): serving ends.
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self._serving), GRACE_S)
            self._serving.cancel()
            await asyncio.wait([self._serving], timeout=GRACE_S)
        finally:
            # The serving's end closed the stream, not its sockets in this process:
            # left to the collector, each warns (ResourceWarning; an error under -W
            # error).
            for queue in (self._server_end.inbound, self._server_end.outbound):
                queue.close()
            # Reaped: its sentinel pipe is closed now, not when the collector gets to
            # it (a failed run's traceback keeps it for a while: a retry at a tight
            # ulimit -n ran out of descriptors).
            if process.exitcode is not None:
                self._closed_with = process.exitcode
                process.close()


def _end_process(process: Any) -> None:
    """Kills a client process with what it started (a search's subprocess would outlive
    the run), then reaps it."""
    _kill_tree(process.pid)
    process.kill()  # (where processes cannot be listed, it alone)
    process.join(5)


def _kill_tree(pid: int) -> None:
    """Kills the process ``pid`` (a child of this one) and every process below it."""
    tree = [p for p in descendants() if p.pid == pid]
    if tree:
        end_processes(tree + descendants(pid), grace_s=0.0, kill_wait_s=1.0)


#: What a client process reports, each ``(kind, payload)``: first, that it runs (Python
#: started it); its searches started; the outcomes of those that ended in one loop
#: iteration; it is done (with ``cpu_s`` and ``searching_s``: its CPU and wall seconds
#: from its searches' start to their end, and ``began_at`` and ``ended_at``, those two
#: times on the ``perf_counter`` clock); or, instead of the last three, its searches
#: do not load here (why, as text).
_ALIVE, _STARTED, _OUTCOMES, _DONE, _UNLOADABLE = (
    "alive", "started", "outcomes", "done", "unloadable")


def _main_is_importable() -> bool:
    """Whether a spawned process can import this one's ``__main__``: a module run with
    ``-m`` or a script that is a file, not a notebook, ``python -c`` or stdin, nor a
    package's ``__main__`` (spawn never imports one again), nor a zipapp's."""
    if getattr(sys, "frozen", False):  # a frozen program's processes load it their way
        return True
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return name != "__main__" and not name.endswith(".__main__")
    path = getattr(main, "__file__", None)
    return path is not None and os.path.exists(path)


class _MainDefinitions(pickle.Pickler):
    """A pickler that notes the functions and classes of ``__main__`` it meets."""

    def __init__(self, file: Any):
        super().__init__(file)
        self.found: List[str] = []

    def reducer_override(self, obj: Any) -> Any:
        if (isinstance(obj, (type, types.FunctionType))
                and getattr(obj, "__module__", None) == "__main__"):
            self.found.append(getattr(obj, "__qualname__", repr(obj)))
        return NotImplemented  # pickled as usual


def _check_main_not_needed(search_fn, starts: Sequence[Any]) -> None:
    """TypeError, before any client starts, for a search or start that refers to a
    function or class of a ``__main__`` that a client process cannot import (a notebook's
    cell, ``python -c``): each client would fail to load its searches."""
    if _main_is_importable():
        return
    for what, obj in (("search_fn", search_fn), ("the starts", starts)):
        pickler = _MainDefinitions(io.BytesIO())
        with contextlib.suppress(Exception):  # check_travels has said what cannot
            pickler.dump(obj)
        if pickler.found:
            raise TypeError(
                f"{what} refers to {pickler.found[0]!r}, defined in a __main__ that the "
                f"process backend's client processes cannot import (a notebook, "
                f"python -c, stdin, a package's __main__.py): define it in a .py module "
                f"and import it from there, or use backend=\"ray\"")


@contextlib.contextmanager
def _main_script_importable():
    """Hides a main script's ``__file__`` that names no file (``python - < script.py``:
    ``<stdin>``) while a process is spawned: spawn would run that path again in the new
    process, which fails there; without it, the new process runs no main script, as
    under ``python -c``."""
    with _SPAWNING:  # one start at a time: another's restore must not come mid-start
        main = sys.modules.get("__main__")
        path = getattr(main, "__file__", None)
        hide = (path is not None and getattr(main, "__spec__", None) is None
                and not os.path.exists(path))
        if hide:
            del main.__file__
        try:
            yield
        finally:
            if hide:
                main.__file__ = path


#: Held while a client process is spawned (``_main_script_importable``).
_SPAWNING = threading.Lock()


def client_main(connection: Connection, results: SocketQueue, work: SocketQueue,
                spec: TensorSpec | None, use_uvloop: bool, search_s: float | None,
                parent: int, waves: int = 1) -> None:
    """A client process: takes ``(search_fn, starts)`` from ``work`` and runs the starts
    concurrently, requests going over ``connection``; reports on ``results`` that they
    started, then each start's outcome as it ends (``search_s``: each search's
    timeout). It ends when its parent, ``parent`` (a pid), dies."""
    # Ctrl-C reaches every process of the terminal's group: the serving process decides
    # (it cancels the run and kills its clients), so a client neither dies half-way
    # through a message nor prints a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)  # one whose searches never evaluate would outlive it
    connection.close_unused_ends()
    try:
        results.writer_only().put((_ALIVE, None))
    except ClosedConnection:  # the run ended already
        os._exit(1)
    try:
        search_fn, starts = work.reader_only().get()
    except ClosedConnection:
        if work.unreadable is not None:  # bytes that are no message
            results.put((_UNLOADABLE, describe(work.unreadable)))
        os._exit(1)  # else the run ended before it sent them
    except Exception as e:  # noqa: BLE001 - what loading raised: a module not here, say
        results.put((_UNLOADABLE, describe(e)))
        os._exit(1)
    work.close()
    with asyncio.Runner(loop_factory=loop_factory(use_uvloop)) as runner:
        try:
            runner.run(_client(connection, results, search_fn, starts, spec, search_s,
                               waves))
        except ClosedConnection:  # the serving process is gone: nobody to tell
            os._exit(1)
        # Every outcome is reported and written. A thread that a timed-out search left
        # running (asyncio.to_thread) must not hold this process: the loop's close and
        # the interpreter's exit would wait for it, and the run for them.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)


def _tell(results: SocketQueue, ready: list) -> None:
    """Hands outcomes to the run, from a loop callback: a run that stopped (Ctrl-C,
    SIGTERM) closed its end, and there is nobody left to tell."""
    try:
        results.put((_OUTCOMES, ready))
    except ClosedConnection:  # (raised in a callback, it was logged as a traceback)
        os._exit(1)


async def _client(connection: Connection, results: SocketQueue, search_fn,
                  starts: List[Any], spec: TensorSpec | None,
                  search_s: float | None, waves: int = 1) -> None:
    client = CoalescingClient(
        connection, spec, where="the serving process",
        message_requests=-(-len(starts) // waves) if waves > 1 and starts else None)
    cpu, began = time.process_time(), time.perf_counter()
    results.put((_STARTED, None))
    # Each outcome travels on its own, checked to load: one that cannot fails its own
    # start, with the reason, and never the others; each leaves as its search ends.
    await ClientSearches(search_fn, starts, client, search_s, _packed,
                         functools.partial(_tell, results)).run()
    # Whether this client's CPU or its round trips were the limit (the run's stats).
    ended = time.perf_counter()
    results.put((_DONE, {"cpu_s": round(time.process_time() - cpu, 4),
                         "searching_s": round(ended - began, 4),
                         "began_at": began, "ended_at": ended}))
    connection.close()
    await client.aclose()  # it hears of no more swaps
    # The puts leave at the end of this loop iteration: the loop must run until every
    # byte is written, or the end of a large report is lost when this process exits.
    try:
        await asyncio.gather(results.drain(), connection.drain())
    except ConnectionError:  # the server ended the run (on_servers failed): nobody reads
        pass


def _packed(outcome: Any, raised: bool) -> Tuple[bool, bytes]:
    """``(is_result, payload)``: a result that travels, or a ``Failure`` that does."""
    if raised:
        return False, pickle.dumps(pack_error(outcome))
    return pack(outcome)
