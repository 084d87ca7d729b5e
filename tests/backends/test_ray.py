import asyncio
import os
import signal

import numpy as np
import pytest

import async_search as asr
from tests.backends import searches

ray = pytest.importorskip("ray")
# One Ray session for this package's tests (tests/backends/conftest.py).
pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("ray_session")]


@pytest.mark.parametrize("num_procs", [1, 2])
def test_ray_results_equal_the_local_backend(num_procs):
    starts = searches.starts(8)
    local = asr.run_searches(searches.astar, starts, searches.mlp_heuristic)
    seen = []
    out = asr.run_searches(searches.astar, starts, searches.mlp_heuristic, backend="ray",
                           num_procs=num_procs, progress=seen.append)
    assert out == local
    assert out.stats["backend"] == "ray" and out.stats["elements"] == local.stats["elements"]
    assert sum(seen) == out.stats["elements"]


def test_several_ray_servers_each_serve_batches():
    out = asr.run_searches(searches.echo_sum, [6] * 24, searches.small_mlp, backend="ray",
                           num_procs=2, num_servers=2, max_batch_size=4)
    assert out == searches.baseline(searches.echo_sum, [6] * 24, searches.small_mlp())
    assert len(out.stats["servers"]) == 2
    assert all(server["batches"] >= 1 for server in out.stats["servers"])


def test_a_search_that_raises_in_a_ray_task_is_reported():
    with pytest.raises(asr.SearchError, match="start 3"):
        asr.run_searches(searches.fails_on_three, list(range(5)), searches.small_mlp,
                         backend="ray", num_procs=2)


@pytest.mark.parametrize("how", ["ray.kill", "SIGKILL"])
def test_killing_a_server_actor_mid_run_loses_no_request(how):
    from async_search.backends.ray_backend import SERVER_NAME_PREFIX

    killed = []

    def live_servers():
        return sorted(name for name in ray.util.list_named_actors()
                      if name.startswith(SERVER_NAME_PREFIX))

    async def run():
        task = asyncio.ensure_future(asr.run_searches_async(
            searches.slow_echo_sum, [30] * 16, searches.small_mlp, backend="ray",
            num_procs=2, num_servers=3, max_batch_size=8))
        # Wait until a server is busy serving, then kill it.
        for _ in range(600):
            if live_servers():
                victim = ray.get_actor(live_servers()[0])
                if await victim.elements.remote() > 0:
                    break
            await asyncio.sleep(0.05)
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
