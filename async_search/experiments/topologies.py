"""Three inference topologies for self-play, wired from real processes.

Every box below is a ``multiprocessing`` process (spawned); every arrow is a
``Connection`` over ``queues.process_queue``s (awaited without polling); servers run ``asr.serve_connection``; caches are
``CachedEvaluate`` (keyed by element bytes, merging duplicates in flight).

- ``pipe``: each client has its own pipe to a load balancer, which looks its requests up
  in a central cache and relays the misses, over one pipe per server, to the server with
  the fewest requests outstanding (a ``Router``).
- ``queue``: clients send into one request queue read by a central cache manager, which
  puts the misses on one inference queue that every server takes from; the servers put
  their answers on one response queue back to the manager.
- ``client``: each client has its own cache and talks to one server directly (client i
  to server i mod num_servers); no process in between.

``build`` returns the processes to start and, once the clients are done, the queues whose
streams to close (``queues.close_stream``) so that every relay and server ends. The process mains report to the
parent over an ``events`` queue: ``("ready", name)``, ``("progress", samples)``,
``("client", name, {slot: samples}, cache stats)``, ``("relay", name, cache stats)``,
``("server", name, stats)``, or ``("error", name, traceback)``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

from async_search.checks import check_float, check_int
from async_search.connections import (Connection, FifoConnectedFunction,
                                      PassThroughConnection, UnorderedConnectedFunction,
                                      forked_pipe, pipe)
from async_search.problems import ConnectFour
from async_search.queues import ClosedConnection, process_queue
from async_search.servers import DispatchPolicy, serve_connection
from async_search.routing.cache import CachedEvaluate
from async_search.routing.router import Router
from async_search.event_loops import loop_factory
from async_search.experiments.selfplay import SamplesConfig, play_slot


ARCHITECTURES = ("pipe", "queue", "client")

#: Where each topology caches results.
CACHING = {"pipe": "central (load balancer)", "queue": "central (cache manager)",
           "client": "per client"}


@dataclasses.dataclass(frozen=True)
class TopologyConfig:
    """How many processes of each kind, and how they batch and cache.

    Attributes:
        num_clients: self-play client processes.
        num_servers: inference server processes.
        cache_capacity: entries of each cache (0 keeps none; duplicates in flight are
            still merged).
        max_batch_size, max_delay: each server's dispatch policy.
        use_uvloop: run every process's event loop on uvloop (when installed).
        timeout_s: the longest the parent waits for any step (start-up, self-play,
            shutdown) before it kills the processes and fails.
    """

    num_clients: int = 2
    num_servers: int = 2
    cache_capacity: int = 100_000
    max_batch_size: int = 256
    max_delay: Optional[float] = None
    use_uvloop: bool = False
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        from async_search.backends.config import max_servers

        for name in ("num_clients", "num_servers", "max_batch_size"):
            check_int(f"TopologyConfig.{name}", getattr(self, name), minimum=1)
        if self.num_servers > max_servers("process"):
            raise ValueError(f"TopologyConfig.num_servers={self.num_servers} is more than "
                             f"this machine can start (at most {max_servers('process')})")
        check_int("TopologyConfig.cache_capacity", self.cache_capacity, minimum=0)
        DispatchPolicy(self.max_batch_size, self.max_delay)
        check_float("TopologyConfig.timeout_s", self.timeout_s, minimum=0.0, strict=True)

    def describe(self) -> str:
        """One line: processes of each kind, cache capacity, batch size."""
        return (f"{self.num_clients} client process{'es' if self.num_clients > 1 else ''}, "
                f"{self.num_servers} server{'s' if self.num_servers > 1 else ''}, "
                f"cache capacity {self.cache_capacity}, batches up to {self.max_batch_size}")


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """A process to start: its name, role (client, relay, server) and main."""

    name: str
    role: str
    target: Callable[..., None]
    args: Tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Topology:
    """The processes of a topology, and the streams to close once the clients are done."""

    processes: Tuple[ProcessSpec, ...]
    close: Tuple[Any, ...]
    """The queues whose streams end the relays and servers (``queues.close_stream``)."""


# -- process mains ------------------------------------------------------------------------

def _run(name: str, events: Any, use_uvloop: bool, coro_fn: Callable[[], Any]) -> None:
    # Ctrl-C reaches every process of the terminal's group; the parent ends the
    # topology's processes itself, so none prints a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with asyncio.Runner(loop_factory=loop_factory(use_uvloop)) as runner:
            runner.run(coro_fn())
    except BaseException:  # report, so that the parent fails at once instead of waiting
        events.put(("error", name, traceback.format_exc()))
        raise


def server_main(name: str, connection: Connection, model_factory: Callable[[], Any],
                policy: DispatchPolicy, use_uvloop: bool, events: Any) -> None:
    """An inference server: serves ``connection`` until its stream ends, then reports its
    stats."""
    async def body():
        model = model_factory()
        events.put(("ready", name))
        stats = await serve_connection(model, connection, policy=policy)
        events.put(("server", name, {k: stats[k] for k in (
            "batches", "elements", "model_time_s", "wall_time_s")}))
    _run(name, events, use_uvloop, body)


def client_main(name: str, connection: Connection, ordered: bool, slots: List[int],
                num_slots: int, samples: SamplesConfig, cache_capacity: Optional[int],
                use_uvloop: bool, start: Any, timeout_s: float, events: Any) -> None:
    """A self-play client: plays its slots concurrently once ``start`` is set."""
    async def body():
        cls = FifoConnectedFunction if ordered else UnorderedConnectedFunction
        fn = cls(connection)
        evaluate = fn if cache_capacity is None else CachedEvaluate(
            fn, capacity=cache_capacity, fixed_model=True)  # self-play swaps no model
        game = ConnectFour()
        events.put(("ready", name))
        if not await asyncio.to_thread(start.wait, timeout_s):
            raise TimeoutError(f"{name}: no start signal in {timeout_s} s")
        results = await asyncio.gather(*(
            play_slot(game, evaluate, slot=s, num_slots=num_slots, config=samples,
                      on_game=lambda n: events.put(("progress", n))) for s in slots))
        await fn.aclose()
        cache = evaluate.stats if cache_capacity is not None else None
        events.put(("client", name, dict(zip(slots, results)), cache))
    _run(name, events, use_uvloop, body)


async def _relay(connection: Connection, evaluate: Any) -> None:
    """Answers the messages of ``connection`` with ``evaluate`` until its stream ends;
    evaluations overlap, and answers go back in the order received (as a forked or
    pass-through connection routes them)."""
    answers: asyncio.Queue = asyncio.Queue()

    async def send_in_order():
        while True:
            task = await answers.get()
            if task is None:
                return
            try:
                connection.send(await task)
            except Exception as e:  # the evaluation failed: the error is the answer
                connection.send(e)

    sender = asyncio.ensure_future(send_in_order())
    while True:
        try:
            x = await connection.recv_async()
        except ClosedConnection:
            break
        answers.put_nowait(asyncio.ensure_future(evaluate(x)))
    answers.put_nowait(None)
    await sender


def balancer_main(name: str, client_ends: List[Connection], server_ends: List[Connection],
                  cache_capacity: int, use_uvloop: bool, events: Any) -> None:
    """The pipe topology's load balancer: a central cache, then the least-loaded server."""
    async def body():
        router = Router({f"server-{i}": UnorderedConnectedFunction(c)
                         for i, c in enumerate(server_ends)}, policy="least_outstanding")
        cached = CachedEvaluate(router, capacity=cache_capacity, fixed_model=True)
        events.put(("ready", name))
        # Each client's messages are (uid, x): the relay passes the uid through.
        await asyncio.gather(*(_relay(PassThroughConnection(c), cached)
                               for c in client_ends))
        events.put(("relay", name, cached.stats))
    _run(name, events, use_uvloop, body)


def cache_manager_main(name: str, requests: Connection, inference: Connection,
                       cache_capacity: int, use_uvloop: bool, events: Any) -> None:
    """The queue topology's cache manager: one request queue in, the inference queue out."""
    async def body():
        cached = CachedEvaluate(UnorderedConnectedFunction(inference),
                                capacity=cache_capacity, fixed_model=True)
        events.put(("ready", name))
        await _relay(PassThroughConnection(requests), cached)  # clients send (uid, x)
        events.put(("relay", name, cached.stats))
    _run(name, events, use_uvloop, body)


# -- wiring -------------------------------------------------------------------------------

def build(architecture: str, samples: SamplesConfig, topology: TopologyConfig,
          model_factory: Callable[[], Any], *, events: Any, start: Any) -> Topology:
    """The processes of ``architecture``, and the streams to close when the clients are
    done.

    Queues, ``events`` and ``start`` belong to the spawn context (``process_queue``'s)."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {', '.join(ARCHITECTURES)}, got "
                         f"{architecture!r}")
    qf = process_queue
    n, m = topology.num_clients, topology.num_servers
    policy = DispatchPolicy(topology.max_batch_size, topology.max_delay)
    uv = topology.use_uvloop
    num_slots = n * samples.games_per_client
    slots = [list(range(i * samples.games_per_client, (i + 1) * samples.games_per_client))
             for i in range(n)]

    def client(i, connection, ordered, cache):
        return ProcessSpec(f"client-{i}", "client", client_main,
                           (f"client-{i}", connection, ordered, slots[i], num_slots,
                            samples, cache, uv, start, topology.timeout_s, events))

    def server(j, connection):
        return ProcessSpec(f"server-{j}", "server", server_main,
                           (f"server-{j}", connection, model_factory, policy, uv, events))

    procs: List[ProcessSpec] = []
    close: List[Any] = []
    if architecture == "pipe":
        client_pipes = [pipe(qf) for _ in range(n)]    # (client end, balancer end)
        server_pipes = [pipe(qf) for _ in range(m)]    # (balancer end, server end)
        # The balancer's functions send (uid, x): each server passes the uid through.
        procs += [server(j, PassThroughConnection(p[1])) for j, p in enumerate(server_pipes)]
        procs.append(ProcessSpec("load-balancer", "relay", balancer_main, (
            "load-balancer", [p[1] for p in client_pipes], [p[0] for p in server_pipes],
            topology.cache_capacity, uv, events)))
        procs += [client(i, p[0], False, None) for i, p in enumerate(client_pipes)]
        close += [p[1].inbound for p in client_pipes]
        close += [p[1].inbound for p in server_pipes]
    elif architecture == "queue":
        manager_end, client_ends = forked_pipe(qf, n)
        inference_end, manager_fn_end = forked_pipe(qf, 1)
        # Every server takes from the one inference queue; each passes the manager's
        # uids through, so that answers may come back from any server in any order.
        procs += [server(j, PassThroughConnection(inference_end.copy())) for j in range(m)]
        procs.append(ProcessSpec("cache-manager", "relay", cache_manager_main, (
            "cache-manager", manager_end, manager_fn_end[0], topology.cache_capacity, uv,
            events)))
        procs += [client(i, c, False, None) for i, c in enumerate(client_ends)]
        close += [manager_end.inbound, inference_end.inbound]
    else:
        assigned: Dict[int, List[int]] = {j: [i for i in range(n) if i % m == j]
                                          for j in range(m)}
        for j in range(m):
            server_end, ends = forked_pipe(qf, max(len(assigned[j]), 1))
            procs.append(server(j, server_end))
            procs += [client(i, ends[k], True, topology.cache_capacity)
                      for k, i in enumerate(assigned[j])]
            close.append(server_end.inbound)
    return Topology(tuple(procs), tuple(close))
