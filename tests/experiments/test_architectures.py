import dataclasses
import json

import pytest

from async_search.experiments import ModelConfig
from async_search.experiments import architectures as arch
from async_search.experiments.topologies import TopologyConfig
from async_search.training.selfplay import SelfPlayConfig

pytestmark = pytest.mark.timeout(180)

PARAMS = arch.SamplesConfig(num_samples=40, games_per_client=2,
                            selfplay=SelfPlayConfig(simulations=8, num_parallel=4))
TOPOLOGY = TopologyConfig(num_clients=2, num_servers=2, cache_capacity=10_000,
                          timeout_s=60)
MODEL = ModelConfig(kind="numpy", trained=False, hidden_sizes=(16,))


def _boom():
    raise RuntimeError("no model today")


def test_all_three_topologies_produce_the_same_samples(tmp_path):
    seen = []
    result = arch.run_architectures(arch.ARCHITECTURES, PARAMS, TOPOLOGY, MODEL,
                                    save_path=str(tmp_path / "a.png"), show_progress=False,
                                    on_report=seen.append)
    assert result.ok, result.failures
    assert [r.architecture for r in seen] == ["pipe", "queue", "client"]
    assert [r.samples_equal for r in result.reports] == [None, True, True]
    for r in result.reports:
        assert r.samples >= 40 == r.samples_asked and r.time_s > 0 and r.batches > 0
        assert 0 < r.hit_rate < 1 and r.hits <= r.lookups
        assert r.elements <= r.lookups - r.hits  # only misses reach the servers
        assert r.mean_batch_size == pytest.approx(r.elements / r.batches)
    caching = {r.architecture: r.caching for r in result.reports}
    assert caching["client"] == "per client" and "central" in caching["queue"]
    data = json.loads(open(result.json_path).read())
    assert [a["architecture"] for a in data["architectures"]] == ["pipe", "queue", "client"]
    table = arch.format_architecture_table(result.reports).splitlines()
    assert "cache hit rate" in table[0] and "mean batch size" in table[0]
    assert len(table) == 5


def test_a_server_that_cannot_build_its_model_fails_the_run_quickly(monkeypatch):
    real = arch.build

    def broken_build(architecture, params, topology, model_factory, **kw):
        return real(architecture, params, topology, _boom, **kw)

    monkeypatch.setattr(arch, "build", broken_build)
    # The server's own error ends the run: waiting out TOPOLOGY.timeout_s would fail
    # with "timed out waiting for the processes" instead of this message.
    with pytest.raises(RuntimeError, match="server-0 failed: RuntimeError: no model"):
        arch.run_topology("client", PARAMS, dataclasses.replace(TOPOLOGY, num_servers=1),
                          MODEL)


def test_a_report_names_every_figure():
    r = arch.ArchitectureReport(
        architecture="queue", caching="central (cache manager)", num_clients=2,
        num_servers=2, samples=1000, time_s=10.0, startup_s=3.0, lookups=100, hits=40,
        deduplicated=5, hit_rate=0.4, batches=20, elements=55, mean_batch_size=2.75,
        model_time_s=1.0, digest="x", samples_equal=False, samples_asked=900)
    text = arch.format_architecture(r)
    for part in ("Time to play 1000 positions (whole games; 900 asked for): 10.00 s",
                 "100 positions/s",
                 "Cache hit rate: 40.0 %", "mean size 2.75", "SAMPLES DIFFER"):
        assert part in text


def test_bad_parameters_fail_before_any_process_starts():
    with pytest.raises(ValueError, match="architecture must be one of pipe, queue, client"):
        arch.run_architectures(["ring"], PARAMS, TOPOLOGY, MODEL, show_progress=False)
    with pytest.raises(ValueError, match="num_servers=10000 is more than"):
        TopologyConfig(num_servers=10_000)


def _die(*args):
    import os
    os._exit(3)


def test_a_client_that_dies_fails_the_run_instead_of_hanging(monkeypatch):
    real = arch.build

    def dying_clients(*args, **kw):
        wiring = real(*args, **kw)
        procs = tuple(dataclasses.replace(p, target=_die) if p.role == "client" else p
                      for p in wiring.processes)
        return dataclasses.replace(wiring, processes=procs)

    monkeypatch.setattr(arch, "build", dying_clients)
    with pytest.raises(RuntimeError, match=r"queue: client-\d died with exit code 3"):
        arch.run_topology("queue", PARAMS, TOPOLOGY, MODEL)


def test_the_positions_reported_are_those_played_and_timed_after_start_up():
    """Each slot plays whole games past its quota: the report counts (and rates) the
    positions played, not the ones asked for, and the bar opens when start-up is over."""
    seen = []
    r = arch.run_topology("client", PARAMS, dataclasses.replace(TOPOLOGY, num_servers=1),
                          MODEL, progress=seen.append,
                          on_start=lambda: seen.append("start"))
    assert seen[0] == "start" and "start" not in seen[1:]
    assert r.samples == sum(seen[1:]) > PARAMS.num_samples == r.samples_asked
    assert r.samples_per_s == pytest.approx(r.samples / r.time_s)
    table = arch.format_architecture_table([r]).splitlines()
    assert table[0].split()[:5] == ["architecture", "caching", "positions", "time", "(s)"]
    assert table[2].split()[3] == str(r.samples)
