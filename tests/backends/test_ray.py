import asyncio
import os
import signal

import numpy as np
import pytest

import async_search as asr
from tests.backends import searches
from tests.helpers import wait_until

ray = pytest.importorskip("ray")
# One Ray session for every test (tests/conftest.py); the scenarios every backend
# shares are in test_backends.py.
pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("ray_session")]


@pytest.mark.parametrize("how", ["ray.kill", "SIGKILL"])
def test_killing_a_server_actor_mid_run_loses_no_request(how):
    from async_search.backends.ray_backend import SERVER_NAME_PREFIX

    killed = []

    def live_servers():
        return sorted(name for name in ray.util.list_named_actors()
                      if name.startswith(SERVER_NAME_PREFIX))

    def serving_server():
        """A live server actor that has served elements, or None (asks each one; the
        driver's loop only waits on the run's refs meanwhile)."""
        for name in live_servers():
            try:  # an actor of an earlier run may still be going away
                actor = ray.get_actor(name)
                if ray.get(actor.elements.remote(), timeout=30) > 0:
                    return actor
            except (ValueError, ray.exceptions.RayActorError):
                continue
        return None

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
