"""A driver on a ``cluster.TwoNodeCluster``: runs one scenario, prints its result.

``python -m tests.backends.cluster_driver '<spec as JSON>'`` joins the cluster at
``spec["address"]`` (after waiting for ``spec["nodes"]`` live nodes), runs
``run_searches_async`` with ``spec["options"]`` on ``spec["starts"]``, injects
``spec["fault"]`` once the servers have evaluated ``fault["after_elements"]`` elements
(``{"kind": "kill", "pid": raylet}`` or ``{"kind": "partition", "link": name,
"seconds": s}``), and prints ``RESULT {json}``: whether the results equal the
sequential baseline, the run's placement stats, and this driver's node.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

from tests.backends import searches

SEARCHES = {"echo_sum": searches.echo_sum, "slow_echo_sum": searches.slow_echo_sum}
#: What each search is compared with: the same computation without the sleeps.
BASELINES = {"echo_sum": searches.echo_sum, "slow_echo_sum": searches.echo_sum}


def wait_for_nodes(ray, count: int, timeout: float = 90.0) -> list:
    deadline = time.monotonic() + timeout
    while True:
        alive = [n for n in ray.nodes() if n["Alive"]]
        if len(alive) >= count:
            return alive
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(alive)} live nodes after {timeout} s, not {count}")
        time.sleep(0.2)


async def run(spec: dict) -> dict:
    import ray

    import async_search as asr
    from async_search.backends import RayPlacement
    from async_search.ray_init import ensure_ray

    ensure_ray(spec["address"])
    nodes = wait_for_nodes(ray, spec.get("nodes", 2))
    fault = spec.get("fault")
    counted = [0]
    faults: list = []

    def progress(elements: int) -> None:
        counted[0] += elements
        if fault and not faults and counted[0] >= fault["after_elements"]:
            faults.append(asyncio.ensure_future(inject(fault)))

    options = dict(spec["options"])
    if "placement" in options:
        options["placement"] = RayPlacement(**options["placement"])
    search = SEARCHES[spec["search"]]
    began = time.monotonic()
    out = await asr.run_searches_async(search, spec["starts"], searches.small_mlp,
                                       backend="ray", address=spec["address"],
                                       progress=progress, return_exceptions=True,
                                       **options)
    elapsed = time.monotonic() - began
    injected = [await f for f in faults]
    expected = await searches.sequential(BASELINES[spec["search"]], spec["starts"],
                                           searches.small_mlp())
    stats = out.stats
    return {
        "equal": list(out) == list(expected),
        "failures": {i: repr(r) for i, r in enumerate(out) if isinstance(r, BaseException)},
        "driver_node": ray.get_runtime_context().get_node_id(),
        "nodes": {n["NodeID"]: n["NodeManagerAddress"] for n in nodes},
        "clients": stats["clients"],
        "server_nodes": stats["server_nodes"],
        "server_gpus": stats["server_gpus"],
        "transports": stats["transports"],
        "servers_died": stats["servers_died"],
        "servers_replaced": stats["servers_replaced"],
        "injected": injected,
        "elapsed_s": elapsed,
    }


async def inject(fault: dict) -> dict:
    """The fault, now: a raylet killed, or the link down for a while and up again."""
    if fault["kind"] == "kill":
        os.kill(fault["pid"], signal.SIGKILL)
        return {"kind": "kill", "at": time.monotonic()}
    link = fault["link"]
    subprocess.run(["ip", "link", "set", "dev", link, "down"], check=True)
    try:
        await asyncio.sleep(fault["seconds"])
    finally:
        subprocess.run(["ip", "link", "set", "dev", link, "up"], check=True)
    return {"kind": "partition", "seconds": fault["seconds"]}


def main() -> None:
    result = asyncio.run(run(json.loads(sys.argv[1])))
    print("RESULT " + json.dumps(result), flush=True)
    # Leave without the interpreter's teardown of a joined Ray (seconds, and noisy).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
