"""Server actors spread over every GPU of a Ray cluster, fractions kept.

The placement itself is plain arithmetic (``place_servers``), tested here without Ray.
The end-to-end test needs a cluster with GPUs: Ray lets a cluster declare fake ones, but
the suite's shared Ray session has none, so it runs in a subprocess that starts its own
cluster (and never touches the shared one).
"""

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_search.backends.gpu_placement import GpuPlacement, bundle_resources, place_servers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def servers_per_gpu(placement: GpuPlacement) -> Counter:
    return Counter(placement.bundles)


def test_a_cluster_without_gpus_asks_for_none():
    assert place_servers(0, 3, None) == GpuPlacement((0.0, 0.0, 0.0), None, 1.0)
    assert place_servers(0.0, 1, 0.5).num_gpus == (0.0,)


def test_one_gpu_is_shared_by_every_server_as_before():
    assert place_servers(1, 4, None).num_gpus == (0.25,) * 4
    assert place_servers(1, 4, 0.5).num_gpus == (0.125,) * 4
    assert place_servers(1, 4, 0.5).bundles is None  # nothing reserved: Ray packs
    assert place_servers(0.5, 2, None).num_gpus == (0.25, 0.25)  # a declared half GPU


def test_one_server_takes_one_gpu_of_many_without_a_reservation():
    assert place_servers(8, 1, None) == GpuPlacement((1.0,), None, 1.0)
    assert place_servers(8, 1, 0.3) == GpuPlacement((0.3,), None, 0.3)


def test_servers_spread_over_every_gpu_each_with_a_whole_one_when_they_fit():
    assert place_servers(4, 4, None) == GpuPlacement((1.0,) * 4, (0, 1, 2, 3), 1.0)
    assert place_servers(4, 2, None) == GpuPlacement((1.0, 1.0), (0, 1), 1.0)


def test_several_servers_share_each_gpu_with_the_fraction_per_gpu():
    placement = place_servers(2, 6, 0.6)
    assert placement.bundles == (0, 1, 0, 1, 0, 1)
    assert placement.num_gpus == (0.2,) * 6
    assert placement.num_bundles == 2


def test_uneven_servers_get_uneven_shares_and_every_gpu_is_used():
    placement = place_servers(3, 4, None)
    assert placement.bundles == (0, 1, 2, 0)
    assert placement.num_gpus == (0.5, 1.0, 1.0, 0.5)


def test_packed_falls_back_to_the_old_share_of_one_gpu():
    assert place_servers(4, 3, 0.9).packed() == GpuPlacement((0.3,) * 3, None, 0.9)
    one = place_servers(1, 2, None)
    assert one.packed() is one


@pytest.mark.parametrize("bad", [dict(cluster_gpus=-1), dict(num_servers=0),
                                 dict(num_servers=True), dict(total_gpu_frac=0.0),
                                 dict(total_gpu_frac=1.5), dict(total_gpu_frac="0.5")])
def test_bad_arguments_are_named(bad):
    arguments = {**dict(cluster_gpus=2, num_servers=2, total_gpu_frac=None), **bad}
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        place_servers(**arguments)


def test_actor_options_name_the_bundle_only_with_a_group():
    placement = place_servers(2, 2, None)
    assert placement.actor_options(1) == {"num_gpus": 1.0}
    pytest.importorskip("ray")
    options = placement.actor_options(1, group="a placement group")
    assert options["num_gpus"] == 1.0
    assert options["scheduling_strategy"].placement_group_bundle_index == 1


@settings(max_examples=300, deadline=None)
@given(gpus=st.integers(1, 16), servers=st.integers(1, 64),
       fraction=st.one_of(st.none(), st.floats(0.01, 1.0)))
def test_every_gpu_is_used_balanced_and_never_asked_for_more_than_the_fraction(
        gpus, servers, fraction):
    placement = place_servers(gpus, servers, fraction)
    assert len(placement.num_gpus) == servers
    if gpus == 1 or servers == 1:
        assert placement.bundles is None
        assert sum(placement.num_gpus) <= (fraction or 1.0) + 1e-9
        return
    counts = servers_per_gpu(placement)
    assert len(counts) == min(gpus, servers)  # every GPU that can have a server has one
    assert max(counts.values()) - min(counts.values()) <= 1  # balanced
    for gpu in counts:
        total = sum(s for s, b in zip(placement.num_gpus, placement.bundles) if b == gpu)
        assert total <= (fraction or 1.0) + 1e-9
    assert all(share > 0 for share in placement.num_gpus)


@settings(deadline=None, max_examples=200)
@given(gpus=st.integers(2, 8), servers=st.integers(2, 32),
       amount=st.floats(0.001, 4.0))
def test_each_bundle_holds_the_custom_resources_of_the_servers_placed_in_it(
        gpus, servers, amount):
    placement = place_servers(gpus, servers, None)
    bundles = bundle_resources(placement, {"lab": amount, "other": 1.0})
    assert len(bundles) == placement.num_bundles
    for b, bundle in enumerate(bundles):
        held = placement.bundles.count(b)
        assert bundle["GPU"] == 1.0
        assert bundle["lab"] == pytest.approx(amount * held)
        assert bundle["other"] == held
    assert bundle_resources(placement) == [{"GPU": 1.0}] * placement.num_bundles


# -- on a Ray cluster with fake GPUs, in its own process --------------------------------
CLUSTER_SCRIPT = textwrap.dedent("""
    import asyncio, json, os, sys
    import numpy as np
    import ray
    import async_search as asr
    from async_search.backends import RayPlacement, gpu_placement

    ray.init(address="local", num_cpus=2, num_gpus=3, resources={"lab": 6},
             include_dashboard=False, log_to_driver=False)

    class VisibleDeviceModel:
        # Built in the server actor: answers with the GPU its process sees first.
        input_spec = asr.TensorSpec((3,), np.float32)

        def __init__(self):
            self.device = float(os.environ.get("CUDA_VISIBLE_DEVICES", "-1").split(",")[0])

        def __call__(self, x):
            return np.full((len(x), 1), self.device, np.float32)

    async def which_device(start, evaluate):
        y = await evaluate(np.zeros((1, 3), np.float32))
        return float(y[0, 0])

    def run(num_servers, fraction, **options):
        out = asr.run_searches(which_device, list(range(12)), VisibleDeviceModel,
                               backend="ray", num_procs=2, num_servers=num_servers,
                               total_gpu_frac=fraction, **options)
        return {"devices": sorted(set(out)), "server_gpus": out.stats["server_gpus"]}

    report = {"whole": run(3, None), "halves": run(6, None), "fraction": run(6, 0.5),
              "one": run(1, 0.5),
              # custom resources too: each GPU's bundle holds its servers' share
              "labelled": run(4, None, timeout=120, placement=RayPlacement(
                  server_resources={"lab": 1.5}))}

    # Another job holds one whole GPU: the servers spread over the two free ones (the
    # run asked for all three, waited RESERVE_WAIT_S, then packed them on one GPU).
    gpu_placement.RESERVE_WAIT_S = 2.0
    @ray.remote(num_gpus=1, num_cpus=0)
    class Whole:
        def ids(self):
            return ray.get_gpu_ids()

    import time
    whole = Whole.remote()
    report["held"] = ray.get(whole.ids.remote())
    deadline = time.monotonic() + 60  # Ray's count of free GPUs follows a moment later
    while ray.available_resources().get("GPU", 0) > 2.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    report["one_taken"] = run(4, None)
    ray.kill(whole)
    deadline = time.monotonic() + 60
    while ray.available_resources().get("GPU", 0) < 3.0 and time.monotonic() < deadline:
        time.sleep(0.1)

    @ray.remote(num_gpus=0.5, num_cpus=0)
    class Holder:
        def ready(self):
            return True

    # Another job holds half of two GPUs: whole GPUs cannot be reserved, and the run
    # must not wait for them.
    holders = [Holder.remote() for _ in range(3)]
    ray.get([h.ready.remote() for h in holders])
    report["partly_taken"] = run(3, None)
    # Killed actors give their GPUs back a moment later: wait (bounded) for them.
    deadline = time.monotonic() + 60
    while ray.available_resources().get("GPU", 0) < 1.5 and time.monotonic() < deadline:
        time.sleep(0.1)
    report["free_after"] = ray.available_resources().get("GPU", 0)
    report["groups_left"] = [g["state"] for g in ray.util.placement_group_table().values()
                             if g["state"] != "REMOVED"]
    print("REPORT " + json.dumps(report))
    ray.shutdown()
""")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_servers_spread_over_fake_gpus_and_use_the_gpu_ray_assigns():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", CLUSTER_SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    report = json.loads(lines[-1][len("REPORT "):])

    whole = report["whole"]
    assert sorted(ids[0] for ids in whole["server_gpus"]) == [0, 1, 2]
    assert set(whole["devices"]) <= {0.0, 1.0, 2.0} and whole["devices"]
    for case in ("halves", "fraction"):  # two servers on each GPU
        gpus = Counter(ids[0] for ids in report[case]["server_gpus"])
        assert gpus == {0: 2, 1: 2, 2: 2}, (case, report[case])
    assert len(report["one"]["server_gpus"]) == 1 and len(report["one"]["server_gpus"][0]) == 1
    # the model saw, as its first CUDA device, a GPU Ray assigned to its server
    gpus = Counter(ids[0] for ids in report["labelled"]["server_gpus"])
    assert sorted(gpus.values()) == [1, 1, 2], report["labelled"]
    for case in ("whole", "halves", "fraction", "one", "labelled", "one_taken",
                 "partly_taken"):
        assigned = {float(ids[0]) for ids in report[case]["server_gpus"]}
        assert set(report[case]["devices"]) <= assigned, (case, report[case])
    assert len(report["partly_taken"]["server_gpus"]) == 3  # packed, but served
    free = {0, 1, 2} - set(report["held"])
    assert Counter(ids[0] for ids in report["one_taken"]["server_gpus"]) == {
        gpu: 2 for gpu in free}, report["one_taken"]
    assert report["free_after"] == pytest.approx(1.5)  # the runs released what they took
    assert report["groups_left"] == []
