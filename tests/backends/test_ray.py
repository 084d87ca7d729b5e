import asyncio
import os
import signal
import types

import numpy as np
import pytest

import async_search as asr
from tests.backends import searches
from tests.helpers import ray_server_that_served, wait_until

ray = pytest.importorskip("ray")
# One Ray session for every test (tests/conftest.py); the scenarios every backend
# shares are in test_backends.py.
pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("ray_session")]


@pytest.mark.parametrize("how", ["ray.kill", "SIGKILL"])
def test_killing_a_server_actor_mid_run_loses_no_request(how):
    killed = []
    serving_server = ray_server_that_served  # (the driver's loop only waits on the
    # run's refs meanwhile)

    async def run():
        task = asyncio.ensure_future(asr.run_searches_async(
            searches.slow_echo_sum, [30] * 16, searches.small_mlp, backend="ray",
            num_procs=2, num_servers=3, max_batch_size=8))
        # Wait until a server is busy serving, then kill it.
        await wait_until(serving_server, "a server actor has served elements",
                         timeout=60, interval=0.05)
        victim = serving_server()
        if how == "ray.kill":
            ray.kill(victim)
        else:
            os.kill(await victim.pid.remote(), signal.SIGKILL)
        killed.append(victim)
        return await task

    out = asyncio.run(run())
    assert killed
    assert out == searches.baseline(searches.echo_sum, [30] * 16, searches.small_mlp())
    assert out.stats["servers_died"] == 1


async def test_ray_queues_carry_connected_functions_to_a_connection_server():
    from async_search.connections import get_connected_functions
    from async_search.queues import close_stream, ray_queue

    model = searches.small_mlp()
    fns, server_end = get_connected_functions(ray_queue, num_fns=2, ordered=False)
    serving = asyncio.ensure_future(asr.serve_connection(model, server_end))
    xs = [np.full((2, 3), i, np.float32) for i in range(6)]
    ys = await asyncio.wait_for(asyncio.gather(*(fns[i % 2](x) for i, x in enumerate(xs))),
                                60)
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, model(x))
    close_stream(server_end.inbound)  # the server reads to the end, then stops
    stats = await asyncio.wait_for(serving, 30)
    assert stats["elements"] == 12


def test_clients_reach_their_servers_by_direct_sockets_not_actor_calls():
    out = asr.run_searches(searches.echo_sum, [5] * 8, searches.small_mlp, backend="ray",
                           num_procs=2, num_servers=2)
    assert out == searches.baseline(searches.echo_sum, [5] * 8, searches.small_mlp())
    assert out.stats["transports"] == [["socket", "socket"]] * 2
    assert all(r is not None for r in out.stats["routers"])  # two servers: routed


def _server_actor(num_clients=1, **kwargs):
    from async_search.backends.ray_backend import ServerActor
    from async_search.servers.policy import DispatchPolicy

    actor = ray.remote(ServerActor).options(num_cpus=0, max_concurrency=10_000).remote(
        searches.small_mlp, DispatchPolicy(max_batch_size=8), False, num_clients, **kwargs)
    spec, address = ray.get(actor.start.remote(), timeout=60)
    return actor, spec, address


def _unreachable(address):
    """``address`` with a port that nobody listens on."""
    import dataclasses
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return dataclasses.replace(address, host="127.0.0.1", port=port)


@pytest.mark.parametrize("why", ["unreachable", "not listening"])
def test_a_client_that_cannot_reach_the_socket_falls_back_on_actor_calls(why):
    from async_search.backends.ray_backend import _Client
    from async_search.wire import arrived

    baseline = searches.baseline(searches.echo_sum, [4, 6, 3], searches.small_mlp())
    actor, spec, address = _server_actor()
    address = _unreachable(address) if why == "unreachable" else None

    async def searched():
        client = _Client(searches.echo_sum, [4, 6, 3], [actor], [address], 0, spec, None)
        report = []
        client.on_outcomes = report.extend
        await client.connect()
        routing, transports, _ = await client.run()
        return sorted(report), routing, transports

    async def run():
        report, routing, transports = await asyncio.wait_for(searched(), 60)
        stats, _ = await asyncio.wait_for(actor.stop.remote(), 60)
        return report, routing, transports, stats

    try:
        report, routing, transports, stats = asyncio.run(run())
    finally:
        ray.kill(actor)
    assert transports == ["actor"] and routing is None  # one server: no router
    assert [arrived(k, ok, payload, "client")[2] for k, ok, payload in report] == list(
        baseline)
    assert stats["elements"] == 13


async def test_stop_closes_a_direct_connection_its_client_left_open_in_bounded_time():
    """A client task that ended without closing its socket (its worker process lives
    on) must not keep ``stop`` waiting: the server answers what it read and closes."""
    from async_search.connections import Connection, FifoConnectedFunction
    from async_search.queues.ray_direct import connect_direct

    actor, spec, address = _server_actor(stop_wait_s=1.0)
    try:
        inbound, outbound = await connect_direct(address, key=0)
        fn = FifoConnectedFunction(Connection(inbound, outbound))
        x = np.ones((2, 3), np.float32)
        y = await asyncio.wait_for(fn(x), 30)
        np.testing.assert_allclose(y, searches.small_mlp()(x), rtol=1e-6)
        stats, _ = await asyncio.wait_for(actor.stop.remote(), 60)  # never closed
        assert stats["elements"] == 2
        from async_search.queues import ClosedConnection
        with pytest.raises(ClosedConnection):
            await asyncio.wait_for(inbound.get_async(), 30)
        inbound.close()
        outbound.close()
    finally:
        ray.kill(actor)


async def test_a_direct_client_learns_from_ray_that_its_server_died():
    """The watch: when Ray reports the actor dead, the client's connection ends (and
    its pending request fails with ServerDiedError) even if no socket said so."""
    from async_search.backends.ray_backend import _watch
    from async_search.connections import Connection, FifoConnectedFunction
    from async_search.errors import ServerDiedError
    from async_search.queues.ray_direct import DirectListener, connect_direct

    # A socket that stays open (its listener is in this process and never answers),
    # and a real actor that dies: only Ray can tell.
    accepted = []
    listener = DirectListener(lambda *conn: accepted.append(conn), host="127.0.0.1")
    silent = await listener.start()
    actor, _, _ = _server_actor()
    try:
        inbound, outbound = await connect_direct(silent, key=0)
        connection = Connection(inbound, outbound)
        fn = FifoConnectedFunction(connection)
        pending = fn(np.ones((1, 3), np.float32))
        watcher = asyncio.ensure_future(_watch(actor, connection))
        await asyncio.sleep(0.5)
        assert not pending.done()
        ray.kill(actor)
        with pytest.raises(ServerDiedError):
            await asyncio.wait_for(pending, 60)
        await asyncio.wait_for(watcher, 10)
    finally:
        listener.close()
        for _, a, b in accepted:
            a.close()
            b.close()
        ray.kill(actor)


async def test_a_server_ray_cannot_reach_for_a_while_is_not_taken_for_dead(monkeypatch):
    """ActorUnavailableError (its node cut off, not yet found dead) is asked again; only
    Ray's word that the actor died ends the watch with an error."""
    from async_search.backends import ray_backend

    monkeypatch.setattr(ray_backend, "_UNAVAILABLE_RETRY_S", 0.01)

    class Actor:
        def __init__(self, answers):
            self.answers = list(answers)
            self.watch = self  # actor.watch.remote()

        def remote(self):
            answer = self.answers.pop(0)

            async def call():
                if isinstance(answer, BaseException):
                    raise answer
                return answer
            return call()

    unavailable = ray.exceptions.ActorUnavailableError("cut off", None)
    stopping = Actor([unavailable, unavailable, None])
    assert await asyncio.wait_for(ray_backend._until_stopped(stopping), 10) is None
    assert stopping.answers == []
    dying = Actor([unavailable, ray.exceptions.ActorDiedError()])
    with pytest.raises(ray.exceptions.ActorDiedError):
        await asyncio.wait_for(ray_backend._until_stopped(dying), 10)


def test_a_thread_a_timed_out_search_left_running_does_not_keep_its_client_task():
    # Its task ends once its loop's thread has, which waits for the thread (30 s): the
    # runner kills it, so that its worker's CPU is free for the next run.
    import time

    began = time.monotonic()
    out = asr.run_searches(searches.stuck_in_a_thread, [1, 2], searches.small_mlp,
                           backend="ray", num_procs=2, search_timeout=1.0,
                           return_exceptions=True)
    assert all(isinstance(r, asr.SearchTimeoutError) for r in out), out
    assert time.monotonic() - began < 20.0
    freed_by = time.monotonic() + 5.0  # the thread sleeps on for 30 s
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]:
        assert time.monotonic() < freed_by, "a client task still holds its CPU"
        time.sleep(0.05)


async def test_a_push_asks_again_a_server_ray_cannot_reach_for_now(monkeypatch):
    """ActorUnavailableError is a RayActorError, but not a death: the server would
    serve the old model once back. It is asked again; one that stays out of reach
    fails the push."""
    import types

    from async_search.backends import ray_backend
    from async_search.errors import ServerDiedError

    monkeypatch.setattr(ray_backend, "_PROBE_S", 0.5)

    class Actor:
        def __init__(self, failures):
            self.failures = list(failures)
            self.version = 0
            self.update_model = types.SimpleNamespace(remote=self.update)

        def update(self, ref, version):
            async def call():
                if self.failures:
                    raise self.failures.pop(0)
                self.version = version
                return version
            return call()

    def pool_of(*actors):
        pool = ray_backend._ServerPool.__new__(ray_backend._ServerPool)
        pool._ray = types.SimpleNamespace(exceptions=ray.exceptions, put=lambda x: x)
        pool._swapping = asyncio.Lock()
        pool._latest = None
        never = asyncio.get_running_loop().create_future()
        pool._slots = [ray_backend._Server(a, None, never) for a in actors]
        return pool

    cut_off = ray.exceptions.ActorUnavailableError("unreachable for now", None)
    ok, back_soon = Actor([]), Actor([cut_off, cut_off])
    await asyncio.wait_for(pool_of(ok, back_soon).push("weights", 7), 10)
    assert ok.version == back_soon.version == 7
    gone_for_good = Actor([cut_off] * 1000)
    with pytest.raises(ServerDiedError, match="could not be reached to swap"):
        await asyncio.wait_for(pool_of(Actor([]), gone_for_good).push("weights", 8), 10)
    assert gone_for_good.version == 0


async def test_a_push_one_server_refused_while_the_others_died_is_not_kept():
    """No live server took it: a replacement started on it would refuse it too, and be
    dropped, its slot empty for good. One server took it: it is kept."""
    import types

    from async_search.backends import ray_backend

    class Actor:
        def __init__(self, answer):
            self.answer = answer
            self.update_model = types.SimpleNamespace(remote=self.update)

        def update(self, ref, version):
            async def call():
                if isinstance(self.answer, BaseException):
                    raise self.answer
                return version
            return call()

    def pool_of(*actors):
        pool = ray_backend._ServerPool.__new__(ray_backend._ServerPool)
        pool._ray = types.SimpleNamespace(exceptions=ray.exceptions, put=lambda x: x,
                                          kill=lambda actor: None)
        pool._swapping = asyncio.Lock()
        pool._latest = ("good", 7)
        never = asyncio.get_running_loop().create_future()
        pool._slots = [ray_backend._Server(a, None, never) for a in actors]
        return pool

    died, refused = ray.exceptions.ActorDiedError(), ValueError("weights -1 do not fit")
    pool = pool_of(Actor(died), Actor(refused))
    with pytest.raises(ValueError, match="do not fit"):
        await asyncio.wait_for(pool.push("bad", 8), 10)
    assert pool._latest == ("good", 7)
    taken = pool_of(Actor(refused), Actor(None))  # one took it: it serves version 8
    with pytest.raises(ValueError, match="do not fit"):
        await asyncio.wait_for(taken.push("new", 8), 10)
    assert taken._latest == ("new", 8)
    everyone_died = pool_of(Actor(died), Actor(died))  # replacements start on it
    await asyncio.wait_for(everyone_died.push("new", 8), 10)
    assert everyone_died._latest == ("new", 8)


async def test_a_cancelled_wait_for_an_actor_call_cancels_the_call_too():
    from async_search.backends.ray_backend import _SILENT, _answer_within

    loop = asyncio.get_running_loop()
    call = loop.create_future()  # an actor call that never answers
    waiting = asyncio.ensure_future(_answer_within(call, 30))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert call.cancelled()
    assert await _answer_within(loop.create_future(), 0.01) is _SILENT


class _Unplaceable:
    """A Ray actor handle whose start never answers: Ray cannot place the actor."""

    def __init__(self, loop):
        self.start = types.SimpleNamespace(remote=loop.create_future)


class _ClusterWithout:
    """What the server pool asks of Ray, from a cluster of ``gpus`` GPUs."""

    exceptions = ray.exceptions

    def __init__(self, gpus):
        self.gpus, self.killed = gpus, []

    def cluster_resources(self):
        return {"CPU": 2.0, **({"GPU": self.gpus} if self.gpus else {})}

    def nodes(self):
        return []

    def kill(self, actor):
        self.killed.append(actor)


@pytest.mark.parametrize("gpus_left", [0, 1])
async def test_a_replacement_ray_cannot_place_leaves_its_place_empty(monkeypatch, gpus_left):
    # The node of every GPU died: each replacement asked for a GPU that no node had,
    # and the retry waited on its start for good (the run hung). None is started once
    # no GPU is left; one not placed in time (_REPLACE_S) is killed.
    from async_search.backends import ray_backend
    from async_search.backends.config import RunConfig
    from async_search.backends.gpu_placement import place_servers

    monkeypatch.setattr(ray_backend, "_REPLACE_S", 0.2)
    pool = ray_backend._ServerPool(ray, searches.small_mlp, RunConfig(backend="ray"), 1)
    pool._ray = cluster = _ClusterWithout(gpus_left)
    pool._placement, pool._slots = place_servers(1, 2), [None, None]
    made = []

    def make(i, generation, nodes):
        made.append(_Unplaceable(asyncio.get_running_loop()))
        return made[-1]

    pool._make = make
    await asyncio.wait_for(pool.replace_dead(), 10)
    assert pool._slots == [None, None] and pool.live() == []
    assert cluster.killed == made and len(made) == (2 if gpus_left else 0)


def test_runs_after_the_first_add_no_actor_class_to_ray():
    # Each run made ServerActor a new Ray actor class, whose methods' metadata Ray keeps
    # until it disconnects: a driver running many runs grew with each.
    metadata = getattr(getattr(ray.actor, "_ActorClassMethodMetadata", None), "_cache",
                       None)
    if metadata is None:
        pytest.skip("this Ray keeps no actor class metadata where this test looks")
    asr.run_searches(searches.echo_sum, [1, 2], searches.small_mlp, backend="ray")
    before = len(metadata)
    for _ in range(2):
        out = asr.run_searches(searches.echo_sum, [1, 2], searches.small_mlp,
                               backend="ray")
        assert out == searches.baseline(searches.echo_sum, [1, 2], searches.small_mlp())
    assert len(metadata) == before
