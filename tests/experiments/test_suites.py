import json
import os

import pytest

from async_search.experiments import (Experiment, continuous_runs, default_runs,
                                      json_path_for, multi_server_runs, run_experiment)
from async_search.experiments import suites

from tests.experiments.conftest import TINY_MODEL, require_backend, tiny_search


def test_default_runs_are_the_prototypes_comparison():
    names = [r.name for r in default_runs()]
    assert names == ["sync", "async", "process x1", "process x2", "ray x1", "ray x2"]
    assert [r.name for r in default_runs(skip_sync=True, backends=("local",))] == ["async"]
    assert default_runs()[0].is_baseline
    (cont,) = continuous_runs(skip_sync=True)
    assert (cont.backend, cont.num_procs, cont.max_batch_size) == ("process", 1, 1024)
    sync, ray = multi_server_runs(num_procs=3, num_servers=2, total_gpu_frac=0.5)
    assert sync.is_baseline and (ray.backend, ray.num_procs, ray.num_servers,
                                 ray.total_gpu_frac) == ("ray", 3, 2, 0.5)


def test_json_sits_beside_the_plot():
    assert json_path_for("results/results.png") == "results/results.json"


def test_experiment_runs_local_and_processes_saves_plot_and_figures(tmp_path):
    require_backend("process")
    pytest.importorskip("matplotlib")  # the plot extra: it saves the plot
    seen = []
    exp = Experiment("tiny", tiny_search(), TINY_MODEL,
                     default_runs(backends=("local", "process")))
    result = run_experiment(exp, save_path=str(tmp_path / "r.png"), show_progress=False,
                            on_report=seen.append, command="python main.py --tiny")
    assert result.ok and not result.failures
    assert [r.name for r in result.reports] == [r.name for r in seen] == [
        "sync", "async", "process x1", "process x2"]
    assert [r.matches_baseline for r in result.reports] == [None, True, True, True]
    assert len({r.elements for r in result.reports}) == 1
    assert os.path.getsize(result.png_path) > 10_000
    data = json.loads(open(result.json_path).read())
    assert data["command"] == "python main.py --tiny" and data["plot"] == result.png_path
    assert [r["name"] for r in data["runs"]] == [r.name for r in result.reports]
    assert data["params"]["search"]["gnn_budget"] == 120
    assert data["runs"][3]["num_procs"] == 2


def test_a_stop_while_the_plot_is_drawn_leaves_json_naming_no_plot(tmp_path, monkeypatch):
    # An earlier run's picture stays where the new one would go: the new JSON must not
    # name it as its own.
    (tmp_path / "r.png").write_bytes(b"\x89PNG earlier run")

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(suites, "plot_runs", stopped)
    exp = Experiment("tiny", tiny_search(), TINY_MODEL,
                     default_runs(skip_sync=True, backends=("local",)))
    with pytest.raises(KeyboardInterrupt):
        run_experiment(exp, save_path=str(tmp_path / "r.png"), show_progress=False)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["plot"] is None and [r["name"] for r in data["runs"]] == ["async"]


def test_without_the_baseline_the_first_run_is_the_reference(tmp_path):
    exp = Experiment("tiny", tiny_search("rollout"), TINY_MODEL,
                     default_runs(skip_sync=True, backends=("local",)))
    result = run_experiment(exp, save_path=None, show_progress=False)
    assert result.ok and result.reports[0].matches_baseline is None
    assert result.png_path is None and result.json_path is None


def test_continuous_astar_in_a_worker_process_equals_the_baseline(tmp_path):
    require_backend("process")
    pytest.importorskip("matplotlib")  # the plot extra: it saves the plot
    exp = Experiment("cont", tiny_search("continuous", num_searches=1, gnn_budget=300,
                                         max_in_flight=16), TINY_MODEL, continuous_runs())
    result = run_experiment(exp, save_path=str(tmp_path / "c.png"), show_progress=False)
    assert result.ok, result.failures
    sync, cont = result.reports
    assert cont.matches_baseline and cont.backend == "process"
    assert cont.mean_batch_size > sync.mean_batch_size


def test_a_failing_run_is_reported_and_the_others_still_run(monkeypatch):
    real = suites.run_one

    def flaky(spec, *args, **kwargs):
        if spec.name == "async":
            raise RuntimeError("server exploded")
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(suites, "run_one", flaky)
    failed = []
    exp = Experiment("tiny", tiny_search(), TINY_MODEL, default_runs(backends=("local",)))
    result = run_experiment(exp, show_progress=False,
                            on_failure=lambda name, error: failed.append((name, error)))
    assert not result.ok
    assert failed == [("async", "RuntimeError: server exploded")] == list(result.failures)
    assert [r.name for r in result.reports] == ["sync"]


def test_a_bad_experiment_cannot_be_made():
    # Checked when made: nothing can run it.
    with pytest.raises(ValueError, match="gnn_budget must be an integer >= 1, got 0"):
        Experiment("bad", tiny_search(gnn_budget=0), TINY_MODEL, default_runs())
    with pytest.raises(ValueError, match="at least one run"):
        Experiment("bad", tiny_search(), TINY_MODEL, ())


@pytest.mark.timeout(240)
def test_ray_with_two_servers_and_two_clients_equals_the_baseline(tmp_path):
    require_backend("ray")
    ray = pytest.importorskip("ray")
    started_here = not ray.is_initialized()
    exp = Experiment("ray", tiny_search("mcts", gnn_budget=24), TINY_MODEL,
                     multi_server_runs(num_procs=2, num_servers=2))
    try:
        result = run_experiment(exp, save_path=str(tmp_path / "m.png"),
                                show_progress=False)
    finally:
        if started_here and ray.is_initialized():
            ray.shutdown()
    assert result.ok, result.failures
    sync, multi = result.reports
    assert (multi.backend, multi.num_procs, multi.num_servers) == ("ray", 2, 2)
    assert multi.matches_baseline and multi.elements == sync.elements


def test_a_workload_made_by_the_caller_is_not_made_again(monkeypatch):
    """main.py prints the workload before the runs: its starts (seconds for a large
    --scramble) are built once."""
    exp = Experiment("tiny", tiny_search(), TINY_MODEL,
                     default_runs(backends=("local",), skip_sync=True))
    workload = suites.make_workload(exp.search, exp.model)

    def again(*args, **kwargs):
        raise AssertionError("the workload was made twice")

    monkeypatch.setattr(suites, "make_workload", again)
    result = run_experiment(exp, save_path=None, show_progress=False, workload=workload)
    assert result.ok and [r.name for r in result.reports] == ["async"]


def test_multi_server_run_names_count_in_the_singular_and_plural():
    (ray,) = multi_server_runs(num_procs=1, num_servers=1, skip_sync=True)
    assert ray.name == "ray 1 client, 1 server"
    (ray,) = multi_server_runs(num_procs=2, num_servers=3, skip_sync=True)
    assert ray.name == "ray 2 clients, 3 servers"
