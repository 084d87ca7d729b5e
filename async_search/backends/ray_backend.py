"""The Ray backend: searches in Ray tasks, model servers as Ray actors.

Each server is an async actor holding a BatchingServer. Each client task runs its share
of the starts in its own event loop; its evaluate function is a ``servers.Router``
(least outstanding, with a circuit breaker and stats per server) over one
``CoalescingClient`` per server (with one server, that client itself): a loop
iteration's requests to a server leave as one message. Ray places the tasks and actors, starts and stops them, pushes weights and
finds the dead; the messages do not go through actor calls, which cost a millisecond
or more each here, but through a direct socket from the client task to the server
actor (``queues.ray_actor.DirectListener``: the address and its token come with the
actor's handle), one frame per loop iteration as in the process backend, each client
served on the actor's one BatchingServer by its ``ConnectionServer``. A client that
cannot reach the actor's address (a firewall between nodes) falls back on actor calls:
the actor also hosts a request queue, read by the same ``ConnectionServer`` on a forked
connection, and one answer queue per client (``QueueHost``); a loop iteration's
requests then leave as one actor call that also waits for their answers
(``stats["transports"]`` says which each client used). The server actors are spread
over every GPU of the cluster (``gpu_placement``): the servers on a GPU share
``total_gpu_frac`` of it, and each uses the GPU Ray assigns it (``stats["server_gpus"]``).

A server that dies (killed, crashed) fails its outstanding requests with
ServerDiedError: its socket closes (or its actor calls fail), and each client also
awaits a call to the actor that returns only when the server stops, so that Ray's own
news of a dead actor or node ends the connection too. The router sends them again to
a surviving server; when none survives, they fail. Each answer carries the model version that computed it
(``evaluate.with_version``); ``on_servers`` pushes a new model to every live actor and
waits for each to answer. Failures travel as ``remote.Failure`` (answers are made
portable where they are made), and each search's outcome is pickled on its own, so an
exception or result that cannot travel fails its own start, named, with its traceback as
text, and never the client task.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from typing import Any, Callable, Dict, Hashable, List, Sequence, Tuple

from async_search.backends.client import CoalescingClient
from async_search.backends.config import (Progress, RunConfig, SearchResults, finish,
                                          loop_factory, merge_stats)
from async_search.backends.gpu_placement import place_servers, release_gpus, reserve_gpus
from async_search.backends.servers import ServersHook
from async_search.connections import Connection, ForkedConnection, KeyedConnection
from async_search.errors import SearchError, ServerDiedError
from async_search.queues import close_stream
from async_search.queues.ray_actor import (ActorQueue, DirectAddress, DirectListener,
                                           QueueHost, connect_direct)
from async_search.ray_init import ensure_ray
from async_search.remote import arrived, pack, pack_error
from async_search.servers.batching import BatchingServer
from async_search.servers.connection_server import ConnectionServer
from async_search.servers.policy import DispatchPolicy
from async_search.servers.router import Router

__all__ = ["run_ray", "ServerActor", "SERVER_NAME_PREFIX"]

#: Server actors are named ``async_search-server-<run id>-<i>`` (``ray.get_actor``).
SERVER_NAME_PREFIX = "async_search-server-"

_REQUESTS = "requests"
#: Seconds ``stop`` waits for direct connections that their clients have not closed
#: (and for a connection's last answers to leave).
_STOP_WAIT_S = 10.0


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

    async def stop(self):
        """Answers what was received, stops, and returns (stats, trace)."""
        close_stream(self.hosted(_REQUESTS))
        if self._listener is not None:
            self._listener.close()
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
                  servers_hook: ServersHook | None = None) -> SearchResults:
    """Runs the starts round-robin over ``num_procs`` Ray tasks and ``num_servers`` actors."""
    ray = ensure_ray(config.address)
    # Servers spread over every GPU (gpu_placement: Ray packs fractions, so several
    # GPUs take a placement group of whole ones, released in the last finally below).
    placement, gpu_group = await reserve_gpus(ray, place_servers(
        ray.cluster_resources().get("GPU", 0), config.num_servers, config.total_gpu_frac))
    actor_cls = ray.remote(ServerActor)
    run_id = uuid.uuid4().hex[:8]
    num_clients = min(config.num_procs, max(len(starts), 1))
    servers = [actor_cls.options(name=f"{SERVER_NAME_PREFIX}{run_id}-{i}", num_cpus=0,
                                 max_concurrency=10_000,
                                 **placement.actor_options(i, gpu_group)).remote(
        model_factory, config.policy, config.model_thread, num_clients)
        for i in range(config.num_servers)]
    startup_time = time.perf_counter()
    try:
        started = await asyncio.gather(*(s.start.remote() for s in servers),
                                       return_exceptions=True)
        alive = [(s, spec) for s, spec in zip(servers, started)
                 if not isinstance(spec, BaseException)]
        if not alive:
            raise ServerDiedError(f"no server actor started: {started[0]!r}")
        servers = [s for s, _ in alive]
        server_gpus = await asyncio.gather(*(s.gpu_ids.remote() for s in servers),
                                           return_exceptions=True)
        spec = alive[0][1][0]
        addresses = [address for _, (_, address) in alive]
        if servers_hook is not None:
            version = await servers[0].model_version.remote()
            servers_hook.serving(_pusher(ray, servers), version, len(servers),
                                 config.backend)
        start_time = time.perf_counter()  # the searches' clock starts once servers serve
        startup = start_time - startup_time
        cpus = ray.cluster_resources().get("CPU", 1)
        task = ray.remote(_client_task).options(
            num_cpus=min(1.0, cpus / num_clients), max_retries=0)
        shares = [list(range(i, len(starts), config.num_procs)) for i in range(num_clients)]
        refs = [task.remote(search_fn, [starts[j] for j in share], servers, addresses,
                            number, spec, config.use_uvloop)
                for number, share in enumerate(shares)]
        watcher_state = {"reported": 0}
        watcher = (asyncio.ensure_future(_report_progress(servers, progress, watcher_state))
                   if progress is not None else None)
        try:
            outcomes = await asyncio.gather(*refs, return_exceptions=True)
        finally:
            wall = time.perf_counter() - start_time
            if watcher is not None:
                watcher.cancel()
            if servers_hook is not None:
                await servers_hook.finish()
        finals = await asyncio.gather(*(s.stop.remote() for s in servers),
                                      return_exceptions=True)
    finally:
        if servers_hook is not None:  # idempotent: for the paths that skipped the above
            await servers_hook.finish()
        for server in servers:
            ray.kill(server)
        release_gpus(ray, gpu_group)
    if progress is not None:  # what the last reading missed
        progress(max(0, sum(stats["elements"] for stats, _ in _alive(finals))
                     - watcher_state["reported"]))
    results: List[Any] = [None] * len(starts)
    failures: Dict[int, BaseException] = {}
    routers: List[dict] = []
    transports: List[List[str]] = []
    for number, (share, outcome) in enumerate(zip(shares, outcomes)):
        if isinstance(outcome, BaseException):
            error = SearchError(f"client task {number} failed ({outcome!r}); its starts "
                                f"{share} did not finish")
            failures.update({index: error for index in share})
            continue
        report, routing, ways = outcome
        routers.append(routing)
        transports.append(ways)
        for k, is_result, payload in report:
            index, ok, value = arrived(share[k], is_result, payload,
                                       f"client task {number}")
            if ok:
                results[index] = value
            else:
                failures[index] = value
    alive = _alive(finals)
    stats = merge_stats(config, wall, [s for s, _ in alive], [t for _, t in alive])
    stats["servers_died"] = config.num_servers - len(alive)
    stats["startup_s"] = startup
    # per server started, the GPUs Ray assigned it (its CUDA_VISIBLE_DEVICES); [] on CPU
    stats["server_gpus"] = [ids if isinstance(ids, list) else None for ids in server_gpus]
    # each client task's Router stats (requests, breakers); None for a client of one
    # server, which needs no router
    stats["routers"] = routers
    stats["transports"] = transports  # per client task, per server: "socket" or "actor"
    return SearchResults(finish(results, failures, config), stats)


def _pusher(ray, servers: list):
    """``push(model_or_weights, version)`` for ``ModelServers``: swaps the model of every
    live server actor and returns once each has answered. A client's call made after
    that reaches an actor after its swap, so it runs on the new model; a message resent
    from a dead server goes to a survivor, which has swapped too."""

    async def push(model_or_weights: Any, version: Hashable) -> None:
        ref = ray.put(model_or_weights)  # sent once, read by every actor
        acks = await asyncio.gather(*(s.update_model.remote(ref, version) for s in servers),
                                    return_exceptions=True)
        died = [a for a in acks if isinstance(a, ray.exceptions.RayActorError)]
        if len(died) == len(acks):
            raise ServerDiedError(f"every server actor died; none took version {version!r}: "
                                  f"{died[0]!r}")
        for ack in acks:
            if isinstance(ack, BaseException) and not isinstance(
                    ack, ray.exceptions.RayActorError):
                raise ack

    return push


def _alive(finals: list) -> list:
    return [f for f in finals if not isinstance(f, BaseException)]


async def _report_progress(servers: list, progress: Progress, state: dict,
                           period: float = 0.25) -> None:
    """Reads the servers' element counts a few times a second, for a progress bar only
    (never on the path of a request)."""
    while True:
        await asyncio.sleep(period)
        counts = await asyncio.gather(*(s.elements.remote() for s in servers),
                                      return_exceptions=True)
        total = sum(c for c in counts if isinstance(c, int))
        if total > state["reported"]:
            progress(total - state["reported"])
            state["reported"] = total


def _client_task(search_fn, starts: List[Any], servers: list,
                 addresses: List[DirectAddress], number: int, spec, use_uvloop: bool):
    """A Ray task: runs its starts concurrently, requests going to the server actors."""
    with asyncio.Runner(loop_factory=loop_factory(use_uvloop)) as runner:
        return runner.run(_client(search_fn, starts, servers, addresses, number, spec))


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


async def _watch(server, connection: Connection) -> None:
    """Ends ``connection`` when Ray reports the server actor dead (a socket to a lost
    node may say nothing for a long while)."""
    try:
        await server.watch.remote()
    except Exception:  # RayActorError: the actor (or its node) is gone
        with contextlib.suppress(Exception):
            connection.inbound.close()  # its reader fails what is pending with
            connection.outbound.close()  # ServerDiedError, and so does a new request


async def _client(search_fn, starts: List[Any], servers: list,
                  addresses: List[DirectAddress], number: int, spec):
    """``(report, router stats, transports)``: each start's outcome, packed to travel."""
    connections, transports, watchers = [], [], []
    try:
        for server, address in zip(servers, addresses):
            connection, transport = await _connect(server, address, number)
            connections.append(connection)
            transports.append(transport)
            if transport == "socket":
                watchers.append(asyncio.ensure_future(_watch(server, connection)))
        clients = {f"server-{i}": CoalescingClient(c, spec, where=f"server actor {i}")
                   for i, c in enumerate(connections)}
        # One server: nothing to route or fail over to (its death fails its requests
        # with ServerDiedError either way), and a router's ~4 us per request would be
        # a third of a round trip: the client is the evaluate function, as in the
        # process backend.
        router = Router(clients, policy="least_outstanding") if len(clients) > 1 else None
        evaluate = router if router is not None else clients["server-0"]
        outcomes = await asyncio.gather(*(search_fn(s, evaluate) for s in starts),
                                        return_exceptions=True)
        for connection in connections:  # this client sends nothing more
            with contextlib.suppress(Exception):  # (the server may be gone)
                connection.close()
        await asyncio.gather(*(c.drain() for c in connections), return_exceptions=True)
        await asyncio.gather(*(c.aclose() for c in clients.values()))  # no more notices
    finally:
        for watcher in watchers:
            watcher.cancel()
        for connection, transport in zip(connections, transports):
            if transport == "socket":  # the server has our last message: let go
                connection.inbound.close()
                connection.outbound.close()
    # Each outcome is pickled on its own and checked to load: one that cannot travel
    # fails its own start (with the reason), not the whole task.
    dumps, loads = _pickler()
    report = []
    for k, outcome in enumerate(outcomes):
        if isinstance(outcome, BaseException):
            report.append((k, False, dumps(pack_error(outcome, dumps, loads))))
        else:
            report.append((k, *pack(outcome, dumps, loads)))
    return report, None if router is None else router.stats, transports


def _pickler():
    """``(dumps, loads)`` as Ray moves objects: cloudpickle out, pickle in."""
    import pickle

    from ray import cloudpickle

    return cloudpickle.dumps, pickle.loads
