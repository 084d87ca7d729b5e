"""Searches that outlive their worker: ``run_searches(..., retries=N)`` on the process
and Ray backends. A start whose client process or Ray task died (or, on Ray, whose
every server died) runs again in a new worker; what finished is kept; when every
attempt is lost, WorkerDiedError names each. Losing a whole node is in
test_ray_cluster.py."""

import asyncio
import functools
import os
import signal

import pytest

import async_search as asr
from async_search.errors import ServerDiedError, WorkerDiedError
from tests.backends import searches
from tests.helpers import ray_server_that_served, wait_until

pytestmark = pytest.mark.timeout(300)

REMOTE = ["process", pytest.param("ray", marks=pytest.mark.slow)]


@pytest.fixture(params=REMOTE)
def remote(request) -> str:
    """The backends with workers that can die: process, then Ray."""
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return request.param


def expected(starts):
    return searches.baseline(searches.echo_sum, starts, searches.small_mlp())


def test_a_worker_that_died_once_is_replaced_and_every_search_returns(remote, tmp_path):
    search = functools.partial(searches.die_once, marker_dir=str(tmp_path))
    starts = list(range(6))
    out = asr.run_searches(search, starts, searches.small_mlp, backend=remote,
                           num_procs=2, retries=1)
    assert out == expected(starts)
    attempts = out.stats["clients"]
    died = [a for a in attempts if a["ended"].startswith("died")]
    assert len(died) == 1 and 2 in died[0]["starts"]
    retry = [a for a in attempts if a["attempt"] == 1]
    # Only what the dead worker had not reported runs again, start 2 among it.
    assert len(retry) == 1 and 2 in retry[0]["starts"]
    assert set(retry[0]["starts"]) <= set(died[0]["starts"])
    assert retry[0]["ended"] == "finished"


def test_without_retries_a_dead_worker_fails_what_it_had_not_reported(remote, tmp_path):
    search = functools.partial(searches.die_once, marker_dir=str(tmp_path))
    out = asr.run_searches(search, list(range(6)), searches.small_mlp, backend=remote,
                           num_procs=2, retries=0, return_exceptions=True)
    error = out[2]
    assert isinstance(error, WorkerDiedError) and isinstance(error, asr.SearchError)
    assert "start 2 did not finish: its worker died (1 attempt): attempt 1: " in str(error)
    assert len(error.attempts) == 1
    # The other client's starts finished.
    assert [out[i] for i in (1, 3, 5)] == [expected(list(range(6)))[i] for i in (1, 3, 5)]


def test_a_start_that_kills_every_worker_it_gets_fails_naming_each_attempt(remote):
    out = asr.run_searches(searches.kill_self_on_two, list(range(4)), searches.small_mlp,
                           backend=remote, num_procs=2, retries=2, return_exceptions=True)
    error = out[2]
    assert isinstance(error, WorkerDiedError)
    assert len(error.attempts) == 3
    for n, attempt in enumerate(error.attempts, 1):
        assert attempt.startswith(f"attempt {n}: client ")
        assert ("died with exit code -9" if remote == "process" else "died: ") in attempt
    assert out[1] == 1 and out[3] == 3  # the other worker's starts


def test_retries_are_checked_before_anything_starts():
    # 101: past MAX_RETRIES (Ray's servers would hold an answer queue per attempt)
    for bad in (-1, 1.5, True, "2", 101, 10**9):
        with pytest.raises(ValueError, match="retries"):
            asr.run_searches(searches.echo_sum, [1], searches.small_mlp, retries=bad)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("retries", [1, 0])
def test_a_lost_server_actor_is_replaced_for_the_retry(retries):
    """One server: its death fails every search that was waiting on it. With a retry,
    they run again against a new server actor, which has the model last pushed."""
    pushed = []

    async def push(servers):
        await servers.update_model(7, version=7)  # VersionModel's weights: its version
        pushed.append(7)

    async def run():
        task = asyncio.ensure_future(asr.run_searches_async(
            searches.versions_seen, list(range(4)), searches.version_model, backend="ray",
            num_procs=2, num_servers=1, on_servers=push, retries=retries,
            return_exceptions=True))
        await wait_until(_serving_server, "the server actor has served", timeout=120,
                         interval=0.05)
        os.kill(await _serving_server().pid.remote(), signal.SIGKILL)
        return await task

    out = asyncio.run(run())
    assert pushed == [7]
    if retries == 0:
        assert all(isinstance(r, ServerDiedError) for r in out), out
        return
    assert out.stats["servers_died"] == 1 and out.stats["servers_replaced"] == 1
    # Every search returned, from its second attempt, on the replacement: version 7
    # (pushed before it was killed, so before the replacement started) and no other.
    assert out == [[7]] * 4
    assert len(out.stats["server_nodes"]) == 2  # the first server and its replacement


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_push_every_server_refused_is_not_the_model_a_replacement_starts_on():
    """Version 7, then weights every server refuses, then the server dies: the
    replacement refused the model last pushed, was dropped, and so was every later
    one, until every attempt failed for want of a server."""
    pushed = []

    async def push(servers):
        await servers.update_model(7, version=7)
        with pytest.raises(Exception, match="weights -1 do not fit"):
            await servers.update_model(-1, version=8)
        pushed.append(servers.version)

    async def run():
        task = asyncio.ensure_future(asr.run_searches_async(
            searches.versions_seen, list(range(4)), searches.refuses_negative_weights,
            backend="ray", num_procs=2, num_servers=1, on_servers=push, retries=1,
            return_exceptions=True, timeout=120))
        await wait_until(lambda: pushed and _serving_server(),
                         "the pushes returned and the server served", timeout=120,
                         interval=0.05)
        os.kill(await _serving_server().pid.remote(), signal.SIGKILL)
        return await task

    out = asyncio.run(run())
    assert pushed == [7]  # the refused push left the version as it was
    assert out.stats["servers_died"] == 1 and out.stats["servers_replaced"] == 1, out
    assert out == [[7]] * 4  # the replacement serves version 7


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_ray_placement_options_reach_the_cluster():
    from async_search.backends import RayPlacement

    starts = [3, 1, 2, 4]
    out = asr.run_searches(searches.echo_sum, starts, searches.small_mlp, backend="ray",
                           num_procs=2, num_servers=2,
                           placement=RayPlacement(spread_clients=False,
                                                  spread_servers=False, server_gpus="none"))
    assert out == expected(starts)
    import ray
    here = ray.get_runtime_context().get_node_id()
    assert out.stats["server_nodes"] == [here, here]
    assert {a["node"] for a in out.stats["clients"]} == {here}
    with pytest.raises(ValueError, match="server_gpus='required'.*has no GPU"):
        asr.run_searches(searches.echo_sum, starts, searches.small_mlp, backend="ray",
                         placement=RayPlacement(server_gpus="required"))


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_servers_that_cannot_be_placed_end_with_the_runs_timeout():
    """A resource no node has: Ray waits for it forever; the run's timeout ends it."""
    from async_search.backends import RayPlacement
    from async_search.errors import SearchTimeoutError

    # It waited without a word: a misspelt name hung a run without a timeout for good.
    with pytest.warns(UserWarning, match="no node of the Ray cluster has no_such_node"):
        out = asr.run_searches(searches.echo_sum, [1, 2], searches.small_mlp,
                               backend="ray", timeout=3.0, return_exceptions=True,
                               placement=RayPlacement(server_resources={"no_such_node": 1}))
    assert all(isinstance(r, SearchTimeoutError) for r in out)
    assert "while the server actors started" in str(out[0])


def test_bad_placements_are_named():
    from async_search.backends import RayPlacement

    for bad, name in ((dict(server_gpus="gpu"), "server_gpus"),
                      (dict(spread_clients=1), "spread_clients"),
                      (dict(server_resources={"GPU": -1}), "server_resources"),
                      # Ray refused these only once started (a GPU key also overwrote
                      # a bundle's whole GPU)
                      (dict(server_resources={"GPU": 0.5}), "GPU is Ray's own"),
                      (dict(client_resources={"CPU": 1}), "CPU is Ray's own"),
                      (dict(server_resources={"lab": 1e-5}), "at least 0.0001"),
                      (dict(client_resources=["x"]), "client_resources")):
        with pytest.raises(ValueError, match=name):
            RayPlacement(**bad)
    with pytest.raises(ValueError, match="placement must be a RayPlacement"):
        asr.run_searches(searches.echo_sum, [1], searches.small_mlp, placement="spread")


def _serving_server():
    """A server actor of the run that has served more than 20 elements, or None."""
    return ray_server_that_served(more_than=20)


def _push_after(fault, monkeypatch=None, **options):
    """Runs versions_seen on Ray; once a server has served, ``fault(pid)`` hits it and
    then version 7 is pushed. Returns (results, how the push ended, its seconds)."""
    import time

    pushed = []

    async def run():
        hit = asyncio.Event()

        async def push(servers):
            await asyncio.wait_for(hit.wait(), 120)
            began = time.monotonic()
            try:
                await servers.update_model(7, version=7)
                pushed.append(("returned", time.monotonic() - began))
            except Exception as e:
                pushed.append((repr(e), time.monotonic() - began))
                raise

        task = asyncio.ensure_future(asr.run_searches_async(
            searches.versions_seen, list(range(4)), searches.version_model, backend="ray",
            on_servers=push, retries=1, return_exceptions=True, **options))
        await wait_until(_serving_server, "a server actor has served", timeout=120,
                         interval=0.05)
        fault(await _serving_server().pid.remote())
        await asyncio.sleep(0.3)  # Ray learns of the fault, no replacement yet
        hit.set()
        return await task

    out = asyncio.run(run())
    return out, pushed


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_push_while_the_only_server_is_dead_returns_and_its_replacement_takes_it():
    # Before, the push raised ServerDiedError ("none took version 7"), which ended the
    # run, while the replacement then served version 7 anyway.
    out, pushed = _push_after(lambda pid: os.kill(pid, signal.SIGKILL), num_procs=2,
                              num_servers=1, timeout=120)
    assert [how for how, _ in pushed] == ["returned"], pushed
    assert all(isinstance(seen, list) and seen[-1] == 7 for seen in out), out
    assert out.stats["servers_replaced"] >= 1


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_push_kills_a_server_actor_that_does_not_answer_its_swap(monkeypatch):
    # A stopped actor never answered: the push waited until the run ended. Now, past
    # _SWAP_S, it is killed (it would serve the older model) and its clients' starts run
    # again on its replacement, which takes the pushed model.
    from async_search.backends import ray_backend

    monkeypatch.setattr(ray_backend, "_SWAP_S", 3.0)
    out, pushed = _push_after(lambda pid: os.kill(pid, signal.SIGSTOP), num_procs=2,
                              num_servers=2, timeout=60)
    assert [how for how, _ in pushed] == ["returned"], pushed
    assert 2.5 < pushed[0][1] < 20
    assert all(isinstance(seen, list) and seen[-1] == 7 for seen in out), out
    assert out.stats["servers_died"] >= 1


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_swap_that_times_out_in_a_server_fails_the_push_and_kills_nothing():
    # A TimeoutError the swap raised in the actor read as a silent server: the server
    # was killed, the push "returned", and every search was lost.
    outcome = []

    async def push(servers):
        await asyncio.sleep(0.5)
        try:
            await servers.update_model(7, version=7)
            outcome.append("returned")
        except Exception as e:  # noqa: BLE001 - what the push raised is the point
            outcome.append(type(e).__name__)

    out = asr.run_searches(searches.versions_seen, list(range(2)),
                           searches.swap_times_out, backend="ray", num_procs=1,
                           num_servers=1, on_servers=push, retries=1, timeout=120)
    assert outcome and outcome[0] != "returned" and "TimeoutError" in outcome[0]
    assert out == [[0], [0]] and out.stats["servers_died"] == 0
