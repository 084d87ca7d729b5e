import dataclasses

import pytest

from async_search.experiments import RunSpec, compare_results, make_workload, run_one
from async_search.experiments.runs import run_baseline

from tests.experiments.conftest import TINY_MODEL, require_backend, tiny_search


@pytest.fixture(scope="module")
def workload():
    return make_workload(tiny_search(), TINY_MODEL)


@pytest.fixture(scope="module")
def baseline(workload):
    return run_baseline(RunSpec("sync", "baseline"), workload)


def test_baseline_reports_one_batch_per_request(workload, baseline):
    results, report = baseline
    assert report.backend == "sync" and report.matches_baseline is None
    assert report.batches == sum(r.requests for r in results) == len(report.trace)
    assert report.elements == sum(r.evaluations for r in results)
    assert report.elements == sum(b.size for b in report.trace)
    assert 0 < report.model_time_s <= report.search_time_s <= report.elapsed_s
    finished = [b.finished_s for b in report.trace]
    assert finished == sorted(finished)


def test_baseline_counts_progress_itself(workload, baseline):
    seen = []
    _, report = run_baseline(RunSpec("sync", "baseline"), workload, seen.append)
    assert sum(seen) == report.elements == baseline[1].elements


@pytest.mark.parametrize("backend", ["local", "process"])
def test_batched_runs_equal_the_baseline(workload, baseline, backend):
    require_backend(backend)
    seen = []
    spec = RunSpec(backend, "g", backend, num_procs=2 if backend == "process" else 1)
    results, report = run_one(spec, workload, seen.append, reference=baseline[0])
    assert results == baseline[0]
    assert report.matches_baseline is True and report.mismatch == ""
    assert report.elements == baseline[1].elements == sum(seen)
    assert report.batches < baseline[1].batches  # requests were batched together
    assert report.mean_batch_size > baseline[1].mean_batch_size
    assert len(report.trace) == report.batches


def test_a_run_that_differs_says_which_search_and_how(workload, baseline):
    wrong = list(baseline[0])
    wrong[1] = dataclasses.replace(wrong[1], nodes_expanded=-1)
    _, report = run_one(RunSpec("async", "g", "local"), workload, reference=wrong)
    assert report.matches_baseline is False
    assert "search 1 of 3 differs" in report.mismatch
    assert "nodes_expanded=-1" in report.mismatch


def test_compare_results_notices_a_missing_result():
    assert compare_results([1, 2], [1, 2]) == ""
    assert "1 results where the reference has 2" in compare_results([1, 2], [1])


def test_figures_are_json_ready_without_the_trace(baseline):
    figures = baseline[1].figures()
    assert "trace" not in figures
    assert figures["batches"] == baseline[1].batches and figures["name"] == "sync"


def test_a_bad_spec_fails_before_anything_runs(workload):
    with pytest.raises(ValueError, match="num_servers"):
        run_one(RunSpec("x", "g", "local", num_servers=0), workload)
