"""The Ray backend: searches in Ray tasks, model servers as Ray actors.

Each server is an async actor holding a BatchingServer. Each client task runs its share
of the starts in its own event loop; its evaluate function is a ``routing.Router``
(least outstanding, with a circuit breaker and stats per server) over one
``CoalescingClient`` per server (with one server, that client itself): a loop
iteration's requests to a server leave as one message. Ray places the tasks and
actors, starts and stops them, pushes weights and finds the dead; the messages do not
go through actor calls, which cost a millisecond or more each here, but through a direct
socket from the client task to the server actor (``queues.ray_actor.DirectListener``:
the address and its token come with the actor's handle), one frame per loop iteration
as in the process backend, each client served on the actor's one BatchingServer by its
``ConnectionServer``. A client that cannot reach the actor's address (a firewall between
nodes) falls back on actor calls: the actor also hosts a request queue, read by the same
``ConnectionServer`` on a forked connection, and one answer queue per client attempt
(``QueueHost``); a loop iteration's requests then leave as one actor call that also
waits for their answers (``stats["transports"]`` says which each client used).

Placement (``RayPlacement``): the client tasks are spread over the nodes, the server
actors round robin over the live nodes, or over every GPU of the cluster
(``gpu_placement``: the servers on a GPU share ``total_gpu_frac`` of it, and each uses
the GPU Ray assigns it, ``stats["server_gpus"]``).

A client task is a streaming generator: it yields its node and process, then each
search's outcome as the search ends, from an event loop in a thread of its own (a yield
never stalls the searches). A task, node or server lost mid-run costs only the starts
not reported yet, which ``attempts.run_share`` runs again in a new task, with the
servers alive then (a dead server actor is replaced first, with the model last pushed,
unless a server refused it and none took it);
past a deadline the task is cancelled and its process killed.

A server that dies (killed, crashed) fails its outstanding requests with
ServerDiedError: its socket closes (or its actor calls fail), and each client also
awaits a call to the actor that returns only when the server stops, so that Ray's own
news of a dead actor or node ends the connection too. The router sends them again to a
surviving server; when none survives, they fail (and the start runs again). Each answer
carries the model version that computed it (``evaluate.with_version``); ``on_servers``
pushes a new model to every live actor and waits for each to answer. Failures travel as
``wire.Failure`` (answers are made portable where they are made), and each search's
outcome is pickled on its own, so an exception or result that cannot travel fails its
own start, named, with its traceback as text, and never the client task.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import os
import queue
import threading
import time
import uuid
import warnings
from typing import Any, Awaitable, Callable, Dict, Hashable, List, Sequence, Tuple

from async_search import process_tree
from async_search.backends.attempts import (GRACE_S, ClientSearches, Deadlines, Started,
                                            check_travels,
                                            WorkerBroke, WorkerLost, run_share, run_shares)
from async_search.backends.client import CoalescingClient
from async_search.backends.config import Progress, RunConfig
from async_search.backends.gpu_placement import place_servers, release_gpus, reserve_gpus
from async_search.backends.results import SearchResults, finish, merge_stats
from async_search.backends.servers import ServersHook
from async_search.base import TensorSpec
from async_search.connections import Connection, ForkedConnection, KeyedConnection
from async_search.errors import CloseTimeoutError, ServerDiedError, add_note, describe
from async_search.event_loops import loop_factory
from async_search.queues import close_stream
from async_search.queues.ray_actor import ActorQueue, QueueHost
from async_search.queues.ray_direct import DirectAddress, DirectListener, connect_direct
from async_search.ray_init import ensure_ray
from async_search.routing.router import Router
from async_search.servers.batching import BatchingServer
from async_search.servers.connection_server import ACK_TIMEOUT_S, ConnectionServer
from async_search.servers.policy import DispatchPolicy
from async_search.wire import arrived, pack, pack_error


#: Server actors are named ``async_search-server-<run id>-<i>`` (``ray.get_actor``).
SERVER_NAME_PREFIX = "async_search-server-"
#: Client tasks are named ``async_search-client-<run id>-<n>`` (their workers' title).
CLIENT_NAME_PREFIX = "async_search-client-"
#: Seconds between calls to a server actor that Ray could not reach.
_UNAVAILABLE_RETRY_S = 1.0
#: Seconds a push waits for each live server actor's swap (which itself waits up to
#: ``ACK_TIMEOUT_S`` for its clients to learn of it): one silent past that (stopped,
#: or its loop stuck) is killed, so that it serves the older model to no one, and
#: replaced with the rest.
_SWAP_S = ACK_TIMEOUT_S + 15.0
#: Seconds a retry waits for Ray's word on each server that looks alive.
_PROBE_S = 5.0
#: Seconds a replacement server actor has to start (be placed and build its model):
#: one Ray cannot place (its GPU's node is gone, and no other has one free) would keep
#: every retry waiting for good; it is killed, and its place stays empty.
_REPLACE_S = 120.0
#: Seconds a client task gathers outcomes before it yields them (their last one, and
#: the task's end, leave at once).
_GATHER_S = 0.02

_REQUESTS = "requests"
#: Seconds ``stop`` waits for direct connections that their clients have not closed
#: (and for a connection's last answers to leave).
_STOP_WAIT_S = 10.0
#: Seconds the runner waits for each server actor's stats once the searches ended.
_ACTOR_STOP_S = _STOP_WAIT_S + 5.0
#: Seconds a client task may take to end after its last report: longer, and a thread
#: left running by a timed-out search holds it (and its CPU), so it is killed.
_CLIENT_END_S = 2.0


def _answers(client: int) -> str:
    return f"answers-{client}"


class ServerActor(QueueHost):
    """A model server in its own Ray actor process (made remote by ``run_ray``), serving
    its clients' direct connections and the request queue it hosts, with one
    BatchingServer."""

    def __init__(self, model_factory: Callable[[], Any], policy: DispatchPolicy,
                 model_thread: bool | str = "auto", num_clients: int = 1, *,
                 stop_wait_s: float = _STOP_WAIT_S):
        super().__init__()
        self._stop_wait_s = stop_wait_s
        self._model_factory = model_factory
        self._policy = policy
        self._model_thread = model_thread
        self._num_clients = num_clients
        self._lifetime = contextlib.AsyncExitStack()
        self._server: BatchingServer | None = None
        self._connections: ConnectionServer | None = None
        self._serving: asyncio.Task | None = None
        self._listener: DirectListener | None = None
        self._direct: Dict[asyncio.Task, Connection] = {}
        self._stopped: asyncio.Future | None = None

    async def start(self):
        """Builds the model and starts serving; returns ``(input spec, DirectAddress)``
        (the address is None when this actor cannot listen: clients use actor calls)."""
        self._stopped = asyncio.get_running_loop().create_future()
        self._server = await self._lifetime.enter_async_context(BatchingServer(
            self._model_factory(), self._policy, model_thread=self._model_thread))
        connection = ForkedConnection(self.hosted(_REQUESTS), {
            c: self.hosted(_answers(c)) for c in range(self._num_clients)})
        # Every client, direct or by actor calls, hears of each swap from it.
        self._connections = ConnectionServer(self._server, portable=True)
        self._serving = asyncio.ensure_future(self._connections.serve(connection))
        listener = DirectListener(self._serve_direct)
        try:
            address = await listener.start()
        except OSError:  # no address to listen on here: actor calls it is
            return self._server.input_spec, None
        self._listener = listener
        return self._server.input_spec, address

    def _serve_direct(self, key: int, inbound, outbound) -> None:
        """Serves a client's direct connection until it closes it (or its process ends)."""
        connection = Connection(inbound, outbound)
        task = asyncio.ensure_future(self._serve_until_closed(connection))
        self._direct[task] = connection
        task.add_done_callback(self._direct.pop)

    async def _serve_until_closed(self, connection: Connection) -> None:
        try:
            await self._connections.serve(connection)
            try:  # the last answers leave before the socket closes
                await asyncio.wait_for(connection.outbound.drain(), self._stop_wait_s)
            except asyncio.TimeoutError:
                pass
        finally:
            connection.inbound.close()
            connection.outbound.close()

    async def watch(self) -> None:
        """Returns when the server stops. A client awaits it for the whole run: when
        Ray finds the actor (or its node) dead, the call fails, and the client ends its
        connection even if no socket said so."""
        await asyncio.shield(self._stopped)

    async def update_model(self, model_or_weights, version):
        """Swaps the model between batches; returns ``version`` once swapped and every
        client has learned it, so that every call received after the answer runs on the
        new model and no client's cache serves the old one."""
        await self._connections.update_model(model_or_weights, version)
        return version

    def model_version(self):
        return self._server.version

    def pid(self) -> int:
        return os.getpid()

    def gpu_ids(self) -> list:
        """The GPUs Ray assigned this actor (it sets CUDA_VISIBLE_DEVICES to them, so a
        model on the first CUDA device runs on the first of them); [] without one."""
        import ray

        return list(ray.get_gpu_ids())

    def elements(self) -> int:
        return self._server.stats["elements"] if self._server is not None else 0

    def node(self) -> str:
        """The Ray node this actor runs on (its id, hex)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    async def stop(self):
        """Stops, and returns (stats, trace). It is called once every search has ended
        (or the run fails): what is still queued or in the model is no one's, so
        nothing is drained, and a model stuck in a batch (a search_timeout ended its
        searches) is not waited for, as the process backend does."""
        close_stream(self.hosted(_REQUESTS))
        if self._listener is not None:
            self._listener.close()
        with contextlib.suppress(CloseTimeoutError):  # fails what it still holds
            await self._server.aclose(drain=False, timeout=GRACE_S)
        if self._serving is not None:
            await self._serving
        if self._direct:  # clients close their connections when done; a client task
            # that ended without closing its own gets them closed here
            _, left = await asyncio.wait(list(self._direct), timeout=self._stop_wait_s)
            for task in left:  # still serving, so still held: the server answers what
                self._direct[task].inbound.close()  # it read, then ends
            if left:
                await asyncio.wait(left)
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)
        await self._lifetime.aclose()
        return self._server.stats, self._server.trace


async def run_ray(search_fn, starts: Sequence[Any], model_factory: Callable[[], Any],
                  config: RunConfig, progress: Progress | None = None, *,
                  servers_hook: ServersHook | None = None,
                  deadlines: Deadlines | None = None) -> SearchResults:
    """Runs the starts round-robin over ``num_procs`` Ray tasks and ``num_servers`` actors;
    a start whose task, node or servers died runs again in a new task (``retries``)."""
    if deadlines is None:
        deadlines = Deadlines.from_config(config.timeout, config.search_timeout)
    ray = ensure_ray(config.address)
    dumps, loads = _pickler()
    check_travels(search_fn, starts, "the Ray backend", dumps=dumps, loads=loads)
    num_shares = min(config.num_procs, max(len(starts), 1))
    # Each attempt of a share has its own answer queue on every server (for clients
    # that reach their servers by actor calls): an answer never reaches a later attempt.
    pool = _ServerPool(ray, model_factory, config, num_shares * (config.retries + 1))
    clients: List[dict] = []
    routers: List[dict] = []
    transports: List[List[str]] = []
    shares = [list(range(i, len(starts), config.num_procs)) for i in range(num_shares)]
    outcomes: List[Dict[int, Tuple[bool, Any]]] = []
    finals: list = []
    startup_time = time.perf_counter()
    start_time = startup_time
    wall = 0.0
    try:
        try:
            await _within(pool.start(), deadlines)
        except asyncio.TimeoutError:  # the run's time ran out before its servers served
            outcomes = [{i: (False, deadlines.run_timeout_error(
                i, " (it ran out while the server actors started)")) for i in share}
                for share in shares]
        else:
            if servers_hook is not None:
                version = await pool.live()[0].actor.model_version.remote()
                servers_hook.serving(pool.push, version, config.num_servers,
                                     config.backend)
            start_time = time.perf_counter()  # the searches' clock starts once they serve
            client_task, task_options = ray.remote(_client_task), _task_options(
                ray, config, num_shares)

            # First attempts go round robin over the live nodes (soft: a node that is
            # full or gone passes its task on); Ray's SPREAD alone put all of four
            # clients on one of two nodes now and then. Retries keep SPREAD, which
            # avoids a node that failed.
            placements = []  # per share: a soft affinity for one of the live nodes
            if config.placement.spread_clients and not config.placement.client_resources:
                nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
                if len(nodes) > 1:
                    from ray.util.scheduling_strategies import (
                        NodeAffinitySchedulingStrategy)

                    placements = [NodeAffinitySchedulingStrategy(
                        nodes[k % len(nodes)], soft=True) for k in range(num_shares)]

            def task(name: str, key: int):
                if key < len(placements):  # a first attempt
                    return client_task.options(name=name, **{
                        **task_options, "scheduling_strategy": placements[key]})
                return client_task.options(name=name, **task_options)

            labels = itertools.count()
            run_id = uuid.uuid4().hex[:8]
            here = ray.get_runtime_context().get_node_id()  # this driver's node
            shares_of = {index: number for number, share in enumerate(shares)
                         for index in share}

            async def launch(indices: List[int], attempt: int) -> _ClientTask:
                if attempt > 0:  # a new attempt gets live servers: the dead replaced
                    await pool.replace_dead()
                live = pool.live()
                if not live:
                    raise WorkerLost("died before it started: no server actor is alive")
                key = shares_of[indices[0]] + attempt * num_shares
                return _ClientTask(ray, task, f"{run_id}-{next(labels)}", key, search_fn,
                                   indices, [starts[j] for j in indices], live, pool.spec,
                                   config, routers, transports, here)

            watcher_state = {"reported": 0}
            watcher = (asyncio.ensure_future(_report_progress(pool, progress,
                                                              watcher_state))
                       if progress is not None else None)
            try:
                outcomes = await run_shares([
                    run_share(share, launch, retries=config.retries, deadlines=deadlines,
                              retryable=_servers_died, record=clients.append)
                    for share in shares])
            finally:
                wall = time.perf_counter() - start_time
                if watcher is not None:
                    watcher.cancel()
                if servers_hook is not None:
                    await servers_hook.finish()
            finals = await pool.stop(deadlines)
            if progress is not None:  # what the last reading missed
                progress(max(0, sum(stats["elements"] for stats, _ in finals)
                             - watcher_state["reported"]))
    finally:
        if servers_hook is not None:  # idempotent: for the paths that skipped the above
            await servers_hook.finish()
        pool.kill()
    results: List[Any] = [None] * len(starts)
    failures: Dict[int, BaseException] = {}
    for share_outcomes in outcomes:
        for index, (ok, value) in share_outcomes.items():
            if ok:
                results[index] = value
            else:
                failures[index] = value
    # The trace on the searches' clock: the servers start one after another, and a
    # curve from the first one's start ran past the run's wall time by their skew.
    stats = merge_stats(config, wall, [s for s, _ in finals], [t for _, t in finals],
                        num_clients=num_shares, origin=start_time)
    stats["servers_died"] = pool.died
    stats["servers_replaced"] = pool.replaced
    stats["startup_s"] = start_time - startup_time
    # per server started, the GPUs Ray assigned it (its CUDA_VISIBLE_DEVICES); [] on CPU
    stats["server_gpus"] = [server.gpus for server in pool.servers]
    stats["server_nodes"] = [server.node for server in pool.servers]  # Ray node ids
    # each client task's Router stats (requests, breakers); None for a client of one
    # server, which needs no router
    stats["routers"] = routers
    stats["transports"] = transports  # per client task, per server: "socket" or "actor"
    stats["clients"] = clients  # per attempt: its starts, task, node, how it ended
    return SearchResults(finish(results, failures, config), stats)


async def _within(awaitable, deadlines: Deadlines):
    """``await awaitable``, bounded by the run's deadline (asyncio.TimeoutError)."""
    left = deadlines.run_left()
    return await (awaitable if left is None else asyncio.wait_for(awaitable, left))


def _servers_died(error: BaseException) -> bool:
    """A search failed because every server its client could reach died: it runs again
    (with the servers alive then)."""
    return isinstance(error, ServerDiedError)


def _task_options(ray, config: RunConfig, num_clients: int) -> dict:
    """``.options`` of the client tasks: a share of a CPU each, no retries by Ray (the
    runner retries, ``attempts``), spread over the nodes unless asked otherwise."""
    cpus = ray.cluster_resources().get("CPU", 1)
    options: Dict[str, Any] = {"num_cpus": min(1.0, cpus / num_clients), "max_retries": 0}
    if config.placement.spread_clients:
        options["scheduling_strategy"] = "SPREAD"
    if config.placement.client_resources:
        options["resources"] = dict(config.placement.client_resources)
    return options


#: Ray's errors that mean a task's worker, node or objects were lost (not the task's
#: own failure): its starts run again.
def _lost_errors(ray) -> tuple:
    e = ray.exceptions
    return (e.WorkerCrashedError, e.NodeDiedError, e.LocalRayletDiedError,
            e.ObjectLostError, e.OutOfMemoryError, e.RaySystemError)


@dataclasses.dataclass
class _Server:
    """A server actor of the run and what the runner knows of it."""

    actor: Any
    address: DirectAddress | None
    watch: asyncio.Future  # fails when Ray finds the actor (or its node) dead
    gpus: list | None = None
    node: str | None = None
    died: bool = False  # a call to it failed with RayActorError (before the watch did)

    @property
    def alive(self) -> bool:
        """False once Ray has said that it died (a server stopped by the run, or whose
        watch the run dropped, is not dead)."""
        watch = self.watch
        return not (self.died or watch.done() and not watch.cancelled()
                    and watch.exception() is not None)


@functools.lru_cache(maxsize=None)
def _server_actor_class(ray: Any) -> Any:
    """``ServerActor`` as Ray's actor class, made once: each ``ray.remote(cls)`` is a
    new class to Ray, whose methods' metadata it keeps until it disconnects (a driver
    that ran many runs grew with each). Ray exports it again in a new session."""
    return ray.remote(ServerActor)


class _ServerPool:
    """The run's server actors: started (spread over the GPUs and nodes), watched,
    replaced when dead before a retry, pushed to, stopped."""

    def __init__(self, ray, model_factory: Callable[[], Any], config: RunConfig,
                 num_clients: int):
        self._ray = ray
        self._model_factory = model_factory
        self._config = config
        self._num_clients = num_clients
        self._actor_cls = _server_actor_class(ray)
        self._run_id = uuid.uuid4().hex[:8]
        self._placement = None
        self._group = None
        self._slots: List[_Server | None] = []
        self.servers: List[_Server] = []  # every server that started, replacements too
        self.spec = None
        self.replaced = 0
        self._latest: Tuple[Any, Hashable] | None = None  # the last push
        self._swapping = asyncio.Lock()
        self._replacing = asyncio.Lock()
        self._stopping = False
        self._actors: list = []  # every actor made, to kill at the end

    @property
    def died(self) -> int:
        """Servers found dead while the run went on."""
        return sum(not server.alive for server in self.servers)

    def live(self) -> List[_Server]:
        return [s for s in self._slots if s is not None and s.alive]

    async def start(self) -> None:
        """Places and starts ``num_servers`` actors; raises ServerDiedError if none
        starts, ValueError if they need a GPU the cluster lacks."""
        ray, config = self._ray, self._config
        gpus = ray.cluster_resources().get("GPU", 0)
        if config.placement.server_gpus == "required" and not gpus:
            raise ValueError("RayPlacement(server_gpus='required'): the Ray cluster has no "
                             "GPU (ray.cluster_resources() lists none)")
        if config.placement.server_gpus == "none":
            gpus = 0
        cluster = ray.cluster_resources()
        missing = sorted(name for name, amount in config.placement.server_resources.items()
                         if amount and name not in cluster)
        if missing:  # Ray waits for a node that has them, without a word
            warnings.warn(f"RayPlacement(server_resources=...): no node of the Ray cluster "
                          f"has {', '.join(missing)} (it has {', '.join(sorted(cluster))}): "
                          f"the server actors wait until one joins, or the run's timeout "
                          f"ends the run", stacklevel=2)
        # Servers spread over every GPU (gpu_placement: Ray packs fractions, so several
        # GPUs take a placement group of whole ones, released by ``kill``).
        self._placement, self._group = await reserve_gpus(ray, place_servers(
            gpus, config.num_servers, config.total_gpu_frac),
            server_resources=config.placement.server_resources)
        nodes = self._nodes()
        actors = [self._make(i, 0, nodes) for i in range(config.num_servers)]
        started = await asyncio.gather(*(a.start.remote() for a in actors),
                                       return_exceptions=True)
        self._slots = [None] * config.num_servers
        up = [i for i, answer in enumerate(started)
              if not isinstance(answer, BaseException)]
        known = await asyncio.gather(*(self._server_of(actors[i], started[i])
                                       for i in up))
        for i, server in zip(up, known):
            self._slots[i] = server
            self.servers.append(server)
        if not self.live():
            error = started[0]
            if isinstance(error, self._ray.exceptions.RayTaskError):
                # The model factory (or the model) raised: its own exception, as the
                # other backends raise it, its words first (Ray's wrapper puts its own
                # header and traceback before them); the actor's traceback in a note.
                cause = getattr(error, "cause", None)
                if isinstance(cause, BaseException):
                    add_note(cause, f"(raised in a Ray server actor while it started; "
                                   f"none started) {error}".rstrip())
                else:  # Ray could not bring the exception itself back
                    cause = error.as_instanceof_cause()
                    add_note(cause, "(raised while the server actors started: none "
                                    "started)")
                raise cause from None
            raise ServerDiedError(f"no server actor started: {error!r}")
        self.spec = next(s for s in started if not isinstance(s, BaseException))[0]
        specs = {answer[0].describe() for answer in started if not isinstance(
            answer, BaseException) and isinstance(answer[0], TensorSpec)}
        if len(specs) > 1:
            # Requests are checked against one spec: those routed to the other
            # servers would fail there (the process and local backends refuse the
            # same in add_worker).
            raise ValueError(f"model_factory made models that take different inputs "
                             f"({', '.join(sorted(specs))}): every server of a run must "
                             f"take the same")

    def _make(self, i: int, generation: int, nodes: List[str]):
        config = self._config
        name = f"{SERVER_NAME_PREFIX}{self._run_id}-{i}" + (
            f"-{generation}" if generation else "")
        options: Dict[str, Any] = dict(name=name, num_cpus=0, max_concurrency=10_000,
                                       **self._placement.actor_options(i, self._group))
        if config.placement.server_resources:
            options["resources"] = dict(config.placement.server_resources)
        if nodes and "scheduling_strategy" not in options:
            if options["num_gpus"] or config.placement.server_resources:
                options["scheduling_strategy"] = "SPREAD"  # Ray knows what is free
            else:
                # Round robin over the live nodes: such a server asks for nothing, so
                # it fits anywhere. (Ray's SPREAD put both of two such servers on one
                # of two nodes half the time, and a soft affinity for the head node
                # chose the other one.)
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                    nodes[(i + generation) % len(nodes)], soft=False)
        actor = self._actor_cls.options(**options).remote(
            self._model_factory, config.policy, config.model_thread, self._num_clients)
        self._actors.append(actor)
        return actor

    def _nodes(self) -> List[str]:
        """The live nodes, to spread the servers over (none when they are not to be
        spread)."""
        if not self._config.placement.spread_servers:
            return []
        return sorted(n["NodeID"] for n in self._ray.nodes() if n.get("Alive"))

    async def _server_of(self, actor, answer) -> _Server:
        """The runner's record of a started actor: its address, GPUs, node, and a watch."""
        _, address = answer
        where = await asyncio.gather(actor.gpu_ids.remote(), actor.node.remote(),
                                     return_exceptions=True)
        return _Server(actor, address, asyncio.ensure_future(_until_stopped(actor)),
                       *(w if not isinstance(w, BaseException) else None for w in where))

    async def replace_dead(self) -> None:
        """Starts a new actor in the place of each dead one (with the model last pushed,
        unless a server refused it and none took it)
        so that a new attempt has every server; one that fails to start, or that Ray
        does not place within ``_REPLACE_S``, stays empty (none is started once the
        cluster has no GPU left for servers that ask for one)."""
        async with self._replacing:  # attempts of several shares ask at once
            await self._ask_ray(self.live())
            dead = [i for i, s in enumerate(self._slots) if s is None or not s.alive]
            if not dead or self._stopping:
                return
            self.replaced += len(dead)
            if any(self._placement.num_gpus) and not self._ray.cluster_resources().get(
                    "GPU", 0):
                return  # the GPUs' nodes are gone: nowhere to place a replacement
            nodes = self._nodes()
            actors = {i: self._make(i, self.replaced, nodes) for i in dead}
            started = await asyncio.gather(*(_outcome(_answer_within(
                a.start.remote(), _REPLACE_S)) for a in actors.values()))
            async with self._swapping:  # a push made meanwhile reaches them too
                for (i, actor), answer in zip(actors.items(), started):
                    if answer is _SILENT:  # not placed in time: never, maybe
                        with contextlib.suppress(Exception):
                            self._ray.kill(actor)
                        continue
                    if isinstance(answer, BaseException):
                        continue
                    if self._latest is not None:
                        try:  # bounded: a silent replacement would hold every push
                            if await _answer_within(actor.update_model.remote(
                                    *self._latest), _SWAP_S) is _SILENT:
                                with contextlib.suppress(Exception):
                                    self._ray.kill(actor)
                                continue
                        except Exception:  # noqa: BLE001 - it stays out
                            continue
                    self._slots[i] = await self._server_of(actor, answer)
                    self.servers.append(self._slots[i])

    async def _ask_ray(self, servers: List[_Server]) -> None:
        """Marks dead the servers that Ray says are. A retry follows a client that lost
        its servers: the client saw their sockets close at once, while the watches wait
        for Ray's news of the death, which may come later; a call to each answers now
        (an actor Ray cannot reach, or that stays silent, is no death yet)."""
        died = self._ray.exceptions.RayActorError
        unavailable = getattr(self._ray.exceptions, "ActorUnavailableError", ())

        async def ask(server: _Server) -> None:
            try:
                await asyncio.wait_for(server.actor.node.remote(), _PROBE_S)
            except unavailable:
                pass
            except died:
                server.died = True
            except Exception:  # noqa: BLE001 - a timeout, or no answer: no death yet
                pass

        await asyncio.gather(*(ask(server) for server in servers))

    async def push(self, model_or_weights: Any, version: Hashable) -> None:
        """``push`` for ``ModelServers``: swaps the model of every live server actor and
        returns once each has answered. A client's call made after that reaches an
        actor after its swap, so it runs on the new model; a message resent from a dead
        server goes to a survivor, which has swapped too (and so has a replacement,
        started with the model last pushed: so a push while every server is dead
        returns too; a push that a server refused and none took is not that model)."""
        errors = self._ray.exceptions
        unavailable = getattr(errors, "ActorUnavailableError", ())
        async with self._swapping:
            ref = self._ray.put(model_or_weights)  # sent once, read by every actor
            before, self._latest = self._latest, (ref, version)
            live = self.live()
            acks = await asyncio.gather(*(_answer_within(
                s.actor.update_model.remote(ref, version), _SWAP_S) for s in live),
                return_exceptions=True)
            # A server Ray cannot reach for now (ActorUnavailableError, a kind of
            # RayActorError) is not dead: it would serve the old model once back.
            # Asked again for a while; one still out of reach fails the push.
            asked_until = time.monotonic() + _PROBE_S
            while True:
                out = [i for i, a in enumerate(acks) if isinstance(a, unavailable)]
                if not out or time.monotonic() >= asked_until:
                    break
                await asyncio.sleep(0.1)
                again = await asyncio.gather(
                    *(_answer_within(live[i].actor.update_model.remote(ref, version),
                                     _SWAP_S) for i in out), return_exceptions=True)
                for i, ack in zip(out, again):
                    acks[i] = ack
            for server, ack in zip(live, acks):
                if ack is _SILENT:  # out of the run
                    server.died = True
                    with contextlib.suppress(Exception):
                        self._ray.kill(server.actor)
            refused = any(isinstance(a, BaseException) and not isinstance(
                a, errors.RayActorError) for a in acks)
            taken = any(not isinstance(a, BaseException) and a is not _SILENT
                        for a in acks)
            if refused and not taken:
                # A server refused it and none took it (the others died): no server
                # serves it, and a replacement would refuse it too (and be dropped,
                # its slot left empty for good).
                self._latest = before
        for ack in acks:
            if isinstance(ack, unavailable):
                raise ServerDiedError(
                    f"a server actor could not be reached to swap to version "
                    f"{version!r} (it may serve the older model): {ack!r}")
        # Dead ones are skipped, even all of them: the replacements start on the model
        # last pushed (replace_dead), and a run with none to replace them fails anyway.
        for ack in acks:
            if isinstance(ack, BaseException) and not isinstance(ack,
                                                                 errors.RayActorError):
                raise ack  # the swap failed in a server: a TimeoutError of its own too

    async def stop(self, deadlines: Deadlines) -> List[Tuple[dict, list]]:
        """Stops every live server: ``(stats, trace)`` of those that answered (within
        the run's deadline and a grace, when it has one)."""
        self._stopping = True
        live = self.live()
        left = deadlines.run_left()
        # Bounded even without a deadline: an actor that cannot answer (stopped) is
        # killed with the rest, and only its stats are missing.
        bound = _ACTOR_STOP_S if left is None else min(_ACTOR_STOP_S, left + GRACE_S)
        stops = [asyncio.ensure_future(_outcome(s.actor.stop.remote())) for s in live]
        if stops:
            await asyncio.wait(stops, timeout=bound)
        finals = [stop.result() if stop.done() else asyncio.TimeoutError("no answer")
                  for stop in stops]
        for stop in stops:
            stop.cancel()
        died = self._ray.exceptions.RayActorError
        unavailable = getattr(self._ray.exceptions, "ActorUnavailableError", ())
        for server, final in zip(live, finals):  # Ray's answer, before the watch's
            if isinstance(final, died) and not isinstance(final, unavailable):
                server.died = True
        # A server Ray could not reach: its node may have just died, and Ray says so of
        # its actors a moment later. Its word is awaited for a while (bounded), so that
        # the run's servers_died does not depend on how soon after the loss it ended.
        unreachable = [s.watch for s, final in zip(live, finals)
                       if isinstance(final, unavailable) and not s.watch.done()]
        if unreachable:
            left = deadlines.run_left()
            await asyncio.wait(unreachable, timeout=_PROBE_S if left is None
                               else max(0.0, min(_PROBE_S, left)))
        return [f for f in finals if not isinstance(f, BaseException)]

    def kill(self) -> None:
        """Kills every actor of the run and releases its GPUs."""
        for actor in self._actors:
            with contextlib.suppress(Exception):
                self._ray.kill(actor)
        for server in self.servers:
            server.watch.cancel()
        release_gpus(self._ray, self._group)


#: What ``_answer_within`` returns for an actor that did not answer in time.
_SILENT = object()


async def _answer_within(ref: Any, seconds: float) -> Any:
    """What the actor call ``ref`` answers (raising what it raised, a TimeoutError of
    its own too), or ``_SILENT`` when it has not answered within ``seconds``."""
    task = asyncio.ensure_future(ref)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:  # the push was: nothing waits on the call now
        task.cancel()
        raise
    if not done:
        task.cancel()
        return _SILENT
    return task.result()


async def _outcome(awaitable: Awaitable) -> Any:
    """What ``awaitable`` returns, or the exception it raises (returned)."""
    try:
        return await awaitable
    except Exception as e:  # noqa: BLE001 - the caller sorts them
        return e


async def _report_progress(pool: _ServerPool, progress: Progress, state: dict,
                           period: float = 0.25) -> None:
    """Reads the servers' element counts a few times a second, for a progress bar only
    (never on the path of a request)."""
    while True:
        await asyncio.sleep(period)
        counts = await asyncio.gather(*(s.actor.elements.remote() for s in pool.live()),
                                      return_exceptions=True)
        total = sum(c for c in counts if isinstance(c, int))
        if total > state["reported"]:
            progress(total - state["reported"])
            state["reported"] = total


class _ClientTask:
    """One attempt at some starts: a Ray task (a streaming generator) that reports its
    node, then each search's outcome as it ends (``attempts.Worker``)."""

    def __init__(self, ray, task, label: str, key: int, search_fn, indices: List[int],
                 starts: List[Any], servers: List[_Server], spec, config: RunConfig,
                 routers: List[dict], transports: List[List[str]], here: str):
        self._ray = ray
        self._here = here
        self._process: process_tree.Pid | None = None  # its worker, when on this node
        self._node: str | None = None  # its node, once it said
        self._indices = indices
        self._routers, self._transports = routers, transports
        self.name = f"client task {label}"
        # Ray names the worker process after its task (``ray::<name>``) while it runs.
        self._title = f"ray::{CLIENT_NAME_PREFIX}{label}"
        self._stream = task(f"{CLIENT_NAME_PREFIX}{label}", key).remote(
            search_fn, starts,
                                   [s.actor for s in servers],
                                   [s.address for s in servers], key, spec,
                                   config.use_uvloop, config.search_timeout,
                                   config.client_waves)
        self._done = False  # its last report came
        self._stopped = False
        self.usage: dict | None = None  # cpu_s and searching_s, once it is done

    async def events(self):
        ray = self._ray
        try:
            async for ref in self._stream:
                kind, *payload = await ref
                if kind == _STARTED:
                    node, ip, pid, started = payload
                    self.name = f"{self.name} on node {node[:8]} ({ip}, pid {pid})"
                    self._node = node
                    if node == self._here and started is not None:
                        self._process = process_tree.Pid(pid, started)
                    yield Started(self.name, node)
                elif kind == _OUTCOMES:
                    loads = _pickler()[1]
                    yield [arrived(self._indices[k], is_result, value, self.name, loads)
                           for k, is_result, value in payload[0]]
                else:  # _DONE
                    routing, ways, self.usage = payload
                    self._routers.append(routing)
                    self._transports.append(ways)
                    self._done = True
                    return
        except _lost_errors(ray) as e:
            raise WorkerLost(f"died: {describe(e)}") from e
        except ray.exceptions.RayError as e:
            raise WorkerBroke(describe(e)) from e
        raise WorkerBroke("its stream ended without its last report")

    async def stop(self, wait_s: float) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._done:  # its task ends once its loop's thread has: soon, unless a thread
            try:  # a timed-out search left running holds it (and its worker's CPU)
                await asyncio.wait_for(self._drain(), min(wait_s, _CLIENT_END_S))
                return
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - killed below
                pass
        # Killed with its worker process: nothing of its searches runs on.
        with contextlib.suppress(Exception):
            self._ray.cancel(self._stream, force=True)
        # Its end comes back once the worker is gone (TaskCancelledError).
        try:
            await asyncio.wait_for(self._drain(), GRACE_S)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - it is killed anyway
            pass
        # A worker that cannot answer Ray (stopped, or stuck outside Python) is killed
        # by its raylet only seconds later: on this node, it is killed here and now
        # (found by its title when it was stopped before its first word reached us).
        if self._node is None or self._node == self._here:
            await asyncio.to_thread(self._kill_here)

    def _kill_here(self) -> None:
        found = [self._process] if self._process is not None else [
            p for p in process_tree.descendants(0)  # every process (0: the root of all)
            if process_tree.command_line(p) == self._title]
        live = [p for p in found if process_tree.is_alive(p)]
        if live:
            process_tree.end_processes(live, grace_s=0.0, kill_wait_s=1.0)

    async def _drain(self) -> None:
        with contextlib.suppress(Exception):
            async for _ in self._stream:
                pass


#: What a client task yields, each a tuple starting with its kind: ``(_STARTED, node id,
#: node ip, pid, start time)``; ``(_OUTCOMES, [(k, is_result, payload), ...])`` for the
#: searches that ended meanwhile; ``(_DONE, router stats, transports, usage)``.
_STARTED, _OUTCOMES, _DONE = "started", "outcomes", "done"


def _client_task(search_fn, starts: List[Any], servers: list,
                 addresses: List[DirectAddress | None], number: int, spec,
                 use_uvloop: bool, search_s: float | None, waves: int = 1):
    """A Ray task (a generator): runs its starts concurrently, requests going to the
    server actors, and yields each outcome as its search ends."""
    import ray

    context = ray.get_runtime_context()
    loop = _ClientLoop(_Client(search_fn, starts, servers, addresses, number, spec,
                               search_s, waves), use_uvloop)
    try:
        loop.wait_connected()
        yield (_STARTED, context.get_node_id(), ray.util.get_node_ip_address(), os.getpid(),
               _start_time())
        yield from loop.reports()
    finally:
        loop.join()


class _ClientLoop:
    """A client task's event loop, in a thread of its own: the task's yields wait for
    the runner to take each item, and the searches go on meanwhile. ``reports()`` lets
    the searches start and gives what the task yields: outcomes as they end (those
    ready together in one item), then the client's stats."""

    def __init__(self, client: "_Client", use_uvloop: bool):
        self._client = client
        self._use_uvloop = use_uvloop
        self._items: queue.Queue = queue.Queue()
        self._go = threading.Event()
        client.on_outcomes = lambda ready: self._items.put((_OUTCOMES, ready))
        self._thread = threading.Thread(target=self._main, name="async_search-client",
                                        daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            with asyncio.Runner(loop_factory=loop_factory(self._use_uvloop)) as runner:
                runner.run(self._client.connect())
                self._items.put(("connected",))
                runner.run(asyncio.to_thread(self._go.wait))
                self._items.put((_DONE, *runner.run(self._client.run())))
        except BaseException as e:  # noqa: BLE001 - raised in the task's thread
            self._items.put(("error", e))

    def _next(self) -> tuple:
        item = self._items.get()
        if item[0] == "error":
            raise item[1]
        return item

    def wait_connected(self) -> None:
        self._next()

    def reports(self):
        self._go.set()
        while True:
            item = self._next()
            if item[0] == _DONE:
                yield item
                return
            # What else ends within a short window leaves with it: each item costs the
            # runner a fraction of a millisecond, and outcomes are not urgent.
            ready, last = list(item[1]), None
            until = time.monotonic() + _GATHER_S
            while last is None and (left := until - time.monotonic()) > 0:
                try:
                    following = self._items.get(timeout=left)
                except queue.Empty:
                    break
                if following[0] == "error":
                    raise following[1]
                if following[0] == _DONE:
                    last = following
                else:
                    ready += following[1]
            yield _OUTCOMES, ready
            if last is not None:
                yield last
                return

    def join(self) -> None:
        self._go.set()
        self._thread.join()


def _start_time() -> float | None:
    """This process's start time as ``process_tree.Pid`` has it (None where /proc is not:
    the driver then leaves its kill to Ray)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
        return float(text[text.rfind(")") + 2:].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class _Client:
    """A client task's searches, its connections to the server actors, and the
    outcomes ready to leave."""

    def __init__(self, search_fn, starts: List[Any], servers: list,
                 addresses: List[DirectAddress | None], number: int, spec,
                 search_s: float | None, waves: int = 1):
        self._search_fn, self._starts = search_fn, starts
        self._servers, self._addresses = servers, addresses
        self._number, self._spec, self._search_s = number, spec, search_s
        self._waves = waves
        #: called with the outcomes of the searches that ended in one loop iteration
        self.on_outcomes: Callable[[List[tuple]], None] = lambda ready: None
        self._connections: List[Connection] = []
        self._transports: List[str] = []
        self._watchers: List[asyncio.Future] = []

    async def connect(self) -> None:
        for server, address in zip(self._servers, self._addresses):
            connection, transport = await _connect(server, address, self._number)
            self._connections.append(connection)
            self._transports.append(transport)
            if transport == "socket":
                self._watchers.append(asyncio.ensure_future(_watch(server, connection)))

    async def run(self) -> Tuple[dict | None, List[str], dict]:
        """Runs the searches; ``(router stats, transports, usage)`` once every outcome
        is out (usage: this worker process's CPU and wall seconds while they ran)."""
        connections, transports = self._connections, self._transports
        try:
            # Waves: each server's client gets its share of the requests (the router
            # spreads them), so a wave is that share over the waves.
            share = -(-len(self._starts) // (self._waves * len(connections)))
            wave = share if self._waves > 1 and self._starts else None
            clients = {f"server-{i}": CoalescingClient(c, self._spec,
                                                       where=f"server actor {i}",
                                                       message_requests=wave)
                       for i, c in enumerate(connections)}
            # One server: nothing to route or fail over to (its death fails its requests
            # with ServerDiedError either way), and a router's ~4 us per request would
            # be a third of a round trip: the client is the evaluate function, as in
            # the process backend.
            router = (Router(clients, policy="least_outstanding") if len(clients) > 1
                      else None)
            evaluate = router if router is not None else clients["server-0"]
            dumps, loads = _pickler()
            cpu, began = time.process_time(), time.perf_counter()
            # Each outcome is pickled on its own and checked to load: one that cannot
            # travel fails its own start (with the reason), not the whole task.
            await ClientSearches(self._search_fn, self._starts, evaluate, self._search_s,
                                 lambda outcome, raised: _packed(outcome, raised,
                                                                 dumps, loads),
                                 self.on_outcomes).run()
            # Whether this client's CPU or its round trips were the limit (run stats).
            ended = time.perf_counter()
            usage = {"cpu_s": round(time.process_time() - cpu, 4),
                     "searching_s": round(ended - began, 4),
                     "began_at": began, "ended_at": ended}
            for connection in connections:  # this client sends nothing more
                with contextlib.suppress(Exception):  # (the server may be gone)
                    connection.close()
            await asyncio.gather(*(c.drain() for c in connections), return_exceptions=True)
            await asyncio.gather(*(c.aclose() for c in clients.values()))  # no notices
        finally:
            for watcher in self._watchers:
                watcher.cancel()
            for connection, transport in zip(connections, transports):
                if transport == "socket":  # the server has our last message: let go
                    connection.inbound.close()
                    connection.outbound.close()
        return None if router is None else router.stats, transports, usage


def _packed(outcome: Any, raised: bool, dumps, loads) -> Tuple[bool, bytes]:
    if raised:
        return False, dumps(pack_error(outcome, dumps, loads))
    return pack(outcome, dumps, loads)


async def _connect(server, address: DirectAddress | None, number: int,
                   ) -> Tuple[Connection, str]:
    """``(connection, transport)``: a direct socket to the server actor, else (it cannot
    be reached from here, or does not listen) its hosted queues, a round trip per actor
    call."""
    try:
        if address is not None:
            inbound, outbound = await connect_direct(address, number)
            return Connection(inbound, outbound), "socket"
    except (OSError, asyncio.TimeoutError):
        pass
    answers = ActorQueue(server, _answers(number))
    # A loop iteration's message and the wait for answers travel in one call.
    requests = ActorQueue(server, _REQUESTS).with_replies(answers)
    return KeyedConnection(number, Connection(answers, requests)), "actor"


async def _until_stopped(actor) -> None:
    """Returns when the server actor stops; raises RayActorError once Ray says that it
    died. An actor that Ray cannot reach for a while (ActorUnavailableError: its node
    cut off, not yet found dead) is asked again: that is no death yet."""
    import ray

    unavailable = getattr(ray.exceptions, "ActorUnavailableError", ())
    while True:
        try:
            return await actor.watch.remote()
        except unavailable:
            await asyncio.sleep(_UNAVAILABLE_RETRY_S)


async def _watch(server, connection: Connection) -> None:
    """Ends ``connection`` when Ray reports the server actor dead (a socket to a lost
    node may say nothing for a long while)."""
    try:
        await _until_stopped(server)
    except Exception:  # RayActorError: the actor (or its node) is gone
        with contextlib.suppress(Exception):
            connection.inbound.close()  # its reader fails what is pending with
            connection.outbound.close()  # ServerDiedError, and so does a new request


def _pickler():
    """``(dumps, loads)`` as Ray moves objects: cloudpickle out, pickle in."""
    import pickle

    from ray import cloudpickle

    return cloudpickle.dumps, pickle.loads
