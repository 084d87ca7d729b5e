"""The Ray backend: searches in Ray tasks, model servers as Ray actors.

Each server is an async actor holding a BatchingServer, so concurrent calls from every
client join the same batches; it asks for ``total_gpu_frac / num_servers`` of a GPU when
the cluster has one. Each client task runs its share of the starts in its own event loop;
its requests of one loop iteration travel as one actor call (``CoalescingClient``), sent
to the server with the fewest messages outstanding, and awaited as Ray object refs (no
polling). A server that dies (killed, crashed) has its outstanding messages sent again to
a surviving server; when none survives, they fail with ServerDiedError. Each answer
carries the model version that computed it (``evaluate.with_version``); ``on_servers``
pushes a new model to every live actor and waits for each to answer.

Failures travel as ``remote.Failure`` (checked to load where they are made): a model's
exception is returned by the actor, not raised, and each search's outcome is pickled on
its own, so an exception or result that cannot travel fails its own start, named, with
its traceback as text, and never the client task.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any, Callable, Dict, Hashable, List, Sequence

from async_search.backends.client import CoalescingClient
from async_search.backends.config import (Progress, RunConfig, SearchResults, finish,
                                          loop_factory, merge_stats)
from async_search.remote import (Failure, arrived, pack, pack_error,
                                          plain_outputs, round_trips, unpack_error)
from async_search.backends.servers import ServersHook
from async_search.errors import ModelOutputError, SearchError, ServerDiedError
from async_search.servers.batching import BatchingServer
from async_search.ray_init import ensure_ray
from async_search.servers.policy import DispatchPolicy

__all__ = ["run_ray", "ServerActor", "SERVER_NAME_PREFIX"]

#: Server actors are named ``async_search-server-<run id>-<i>`` (``ray.get_actor``).
SERVER_NAME_PREFIX = "async_search-server-"


class ServerActor:
    """A model server in its own Ray actor process (made remote by ``run_ray``)."""

    def __init__(self, model_factory: Callable[[], Any], policy: DispatchPolicy,
                 model_thread: bool = True):
        self._model_factory = model_factory
        self._policy = policy
        self._model_thread = model_thread
        self._server: BatchingServer | None = None

    async def start(self):
        """Builds the model and starts serving; returns the model's input spec."""
        self._server = BatchingServer(self._model_factory(), self._policy,
                                      model_thread=self._model_thread)
        await self._server.__aenter__()
        return self._server.input_spec

    async def evaluate(self, batch):
        return await self._server(batch)

    async def evaluate_with_version(self, batch):
        """``(outputs, version)`` for ``batch``: version None when a swap split it; or,
        when the model (or the request) failed, a ``remote.Failure`` that always
        travels (the exception, or a RemoteError standing for it, with its traceback).
        Outputs that cannot travel fail with ModelOutputError."""
        dumps, loads = _pickler()
        try:
            outputs, version = await self._server.with_version(batch)
        except Exception as e:
            return pack_error(e, dumps, loads)
        if not plain_outputs(outputs, version):
            ok, why = round_trips((outputs, version), dumps, loads)
            if not ok:
                return pack_error(ModelOutputError(
                    f"the model's outputs ({type(outputs).__name__}) cannot be sent to "
                    f"the client task: {type(why).__name__}: {why}"), dumps, loads)
        return outputs, version

    async def update_model(self, model_or_weights, version):
        """Swaps the model between batches; returns ``version`` once swapped, so that
        every call received after the answer runs on the new model."""
        self._server.update_model(model_or_weights, version)
        return version

    def model_version(self):
        return self._server.version

    def pid(self) -> int:
        return os.getpid()

    def elements(self) -> int:
        return self._server._stats.elements if self._server is not None else 0

    async def stop(self):
        """Serves what is queued, stops, and returns (stats, trace)."""
        await self._server.aclose()
        return self._server.stats, self._server.trace


async def run_ray(search_fn, starts: Sequence[Any], model_factory: Callable[[], Any],
                  config: RunConfig, progress: Progress | None = None, *,
                  servers_hook: ServersHook | None = None) -> SearchResults:
    """Runs the starts round-robin over ``num_procs`` Ray tasks and ``num_servers`` actors."""
    ray = ensure_ray(config.address)
    gpus = ray.cluster_resources().get("GPU", 0)
    gpu_each = (config.total_gpu_frac or 1.0) * min(gpus, 1) / config.num_servers if gpus else 0
    actor_cls = ray.remote(ServerActor)
    run_id = uuid.uuid4().hex[:8]
    servers = [actor_cls.options(name=f"{SERVER_NAME_PREFIX}{run_id}-{i}", num_cpus=0,
                                 num_gpus=gpu_each, max_concurrency=10_000).remote(
        model_factory, config.policy, config.model_thread)
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
        spec = alive[0][1]
        if servers_hook is not None:
            version = await servers[0].model_version.remote()
            servers_hook.serving(_pusher(ray, servers), version, len(servers),
                                 config.backend)
        start_time = time.perf_counter()  # the searches' clock starts once servers serve
        startup = start_time - startup_time
        num_clients = min(config.num_procs, max(len(starts), 1))
        cpus = ray.cluster_resources().get("CPU", 1)
        task = ray.remote(_client_task).options(
            num_cpus=min(1.0, cpus / num_clients), max_retries=0)
        shares = [list(range(i, len(starts), config.num_procs)) for i in range(num_clients)]
        refs = [task.remote(search_fn, [starts[j] for j in share], servers, spec,
                            config.use_uvloop) for share in shares]
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
    if progress is not None:  # what the last reading missed
        progress(max(0, sum(stats["elements"] for stats, _ in _alive(finals))
                     - watcher_state["reported"]))
    results: List[Any] = [None] * len(starts)
    failures: Dict[int, BaseException] = {}
    for number, (share, outcome) in enumerate(zip(shares, outcomes)):
        if isinstance(outcome, BaseException):
            error = SearchError(f"client task {number} failed ({outcome!r}); its starts "
                                f"{share} did not finish")
            failures.update({index: error for index in share})
            continue
        for k, is_result, payload in outcome:
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


def _client_task(search_fn, starts: List[Any], servers: list, spec, use_uvloop: bool):
    """A Ray task: runs its starts concurrently, requests going to the server actors."""
    with asyncio.Runner(loop_factory=loop_factory(use_uvloop)) as runner:
        return runner.run(_client(search_fn, starts, servers, spec))


async def _client(search_fn, starts: List[Any], servers: list, spec) -> list:
    router = _ServerRouter(servers)
    client = CoalescingClient(router.send, spec)
    router.client = client
    outcomes = await asyncio.gather(*(search_fn(s, client) for s in starts),
                                    return_exceptions=True)
    # Each outcome is pickled on its own and checked to load: one that cannot travel
    # fails its own start (with the reason), not the whole task.
    dumps, loads = _pickler()
    report = []
    for k, outcome in enumerate(outcomes):
        if isinstance(outcome, BaseException):
            report.append((k, False, dumps(pack_error(outcome, dumps, loads))))
        else:
            report.append((k, *pack(outcome, dumps, loads)))
    return report


def _pickler():
    """``(dumps, loads)`` as Ray moves objects: cloudpickle out, pickle in."""
    import pickle

    from ray import cloudpickle

    return cloudpickle.dumps, pickle.loads


class _ServerRouter:
    """Sends each message to the live server with the fewest outstanding; resends the
    messages of a server that died to the others."""

    def __init__(self, servers: list):
        self.client: CoalescingClient | None = None
        self._outstanding = {i: 0 for i in range(len(servers))}
        self._servers = servers
        self._dead: Dict[int, str] = {}
        self._turn = os.getpid()  # ties go round-robin, from a different server per client

    def send(self, message_id: int, batch) -> None:
        if not self._outstanding:
            raise ServerDiedError(f"every server died: {self._describe_dead()}")
        self._turn += 1
        count = len(self._servers)
        index = min(self._outstanding,
                    key=lambda i: (self._outstanding[i], (i - self._turn) % count))
        self._outstanding[index] += 1
        ref = self._servers[index].evaluate_with_version.remote(batch)
        asyncio.ensure_future(self._await(index, message_id, batch, ref))

    async def _await(self, index: int, message_id: int, batch, ref) -> None:
        import ray

        version = None
        try:
            answer = await ref
        except ray.exceptions.RayActorError as e:
            if index in self._outstanding:
                del self._outstanding[index]
                self._dead[index] = type(e).__name__
            try:
                self.send(message_id, batch)  # to a survivor
            except ServerDiedError as died:
                self.client.deliver(message_id, died)
            return
        except Exception as e:  # Ray could not run the call or bring its answer back
            outputs = e
        else:
            if isinstance(answer, Failure):  # the model raised, or the request was bad
                outputs = unpack_error(answer, f"raised in server actor {index}")
            else:
                outputs, version = answer
        if index in self._outstanding:
            self._outstanding[index] -= 1
        self.client.deliver(message_id, outputs, version)

    def _describe_dead(self) -> str:
        return ", ".join(f"server {i} ({why})" for i, why in sorted(self._dead.items()))
