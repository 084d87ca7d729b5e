"""Deadlines on every backend: ``run_searches(..., timeout=...)`` for the run and
``search_timeout`` for each search. What is unfinished fails with SearchTimeoutError, in
place with ``return_exceptions``; a worker that is stuck or stopped is killed, so that
nothing of the run keeps running once the call has returned.

The bounds on elapsed time here only stop a hang (a few seconds past the deadline on a
busy machine); ``benchmarks/deadlines.py`` measures how far past its deadline a run
returns."""

import functools
import os
import time

import pytest

import async_search as asr
from async_search.errors import SearchTimeoutError
from tests.backends import searches

pytestmark = pytest.mark.timeout(180)

#: Past a deadline, a run must have returned within this (a hang bound, not a timing).
HANG_S = 8.0


def expected(starts):
    return searches.baseline(searches.echo_sum, starts, searches.small_mlp())


def alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (a zombie, dead but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_a_search_past_its_search_timeout_fails_in_place_and_the_rest_finish(backend):
    starts = [1, 2, 3, 4]
    # One start per client process or task: the endless one is alone in its worker.
    out = backend.run(searches.endless_on_two, starts, searches.small_mlp,
                      num_procs=1 if backend.name == "local" else 4, search_timeout=3.0,
                      return_exceptions=True)
    error = out[1]
    assert isinstance(error, SearchTimeoutError) and isinstance(error, TimeoutError)
    assert "search_timeout of 3.0 s" in str(error)
    assert out[:1] + out[2:] == [r for s, r in zip(starts, expected(starts)) if s != 2]


def test_without_return_exceptions_a_timed_out_search_is_a_named_failure(backend):
    with pytest.raises(asr.SearchError, match="1 of 3 searches failed; the first, "
                                              "start 2") as info:
        backend.run(searches.endless_on_two, [0, 1, 2], searches.small_mlp,
                    search_timeout=2.0)
    assert isinstance(info.value.failures[2], SearchTimeoutError)


def test_the_run_timeout_fails_what_is_unfinished_and_returns_soon_after(backend):
    timeout = 4.0 if backend.name == "local" else 8.0  # worker processes start first
    starts = [1, 2, 3, 4]
    began = time.monotonic()
    out = backend.run(searches.endless_on_two, starts, searches.small_mlp, timeout=timeout,
                      return_exceptions=True)
    elapsed = time.monotonic() - began
    assert elapsed < timeout + HANG_S
    error = out[1]
    assert isinstance(error, SearchTimeoutError)
    assert f"within the run's timeout of {timeout} s" in str(error)
    assert out[:1] + out[2:] == [r for s, r in zip(starts, expected(starts)) if s != 2]


def test_a_run_that_ends_in_time_is_untouched_by_its_timeout(backend):
    starts = [3, 1, 2]
    out = backend.run(searches.echo_sum, starts, searches.small_mlp, timeout=120.0,
                      search_timeout=60.0)
    assert out == expected(starts)


@pytest.mark.parametrize("how", ["sleep", "stop"])
def test_a_stuck_or_stopped_worker_is_killed_at_its_search_timeout(backend, tmp_path, how):
    if backend.name == "local":
        pytest.skip("the local backend runs searches in the caller's own loop: a search "
                    "that blocks it blocks the caller")
    search = functools.partial(searches.stuck_on_two, pid_dir=str(tmp_path), how=how)
    starts = [1, 2, 3]
    out = backend.run(search, starts, searches.small_mlp, num_procs=3, search_timeout=3.0,
                      return_exceptions=True)
    assert isinstance(out[1], SearchTimeoutError)
    assert "was stopped" in str(out[1])  # by the runner: its worker could not say so
    assert [out[0], out[2]] == [expected(starts)[0], expected(starts)[2]]
    pid = int((tmp_path / "pid").read_text())
    assert not alive(pid), f"the stuck worker (pid {pid}) still runs after the call"


def test_a_stopped_client_is_killed_at_the_runs_timeout(backend, tmp_path):
    if backend.name == "local":
        pytest.skip("the local backend has no worker processes")
    search = functools.partial(searches.stuck_on_two, pid_dir=str(tmp_path), how="stop")
    # Ray's workers can take several seconds to start on a loaded 2-core machine: the
    # stopped one must have started (written its pid) before the run's timeout.
    timeout = 15.0 if backend.name == "ray" else 8.0
    began = time.monotonic()
    out = backend.run(search, [1, 2, 3], searches.small_mlp, num_procs=3, timeout=timeout,
                      return_exceptions=True)
    assert time.monotonic() - began < timeout + HANG_S
    assert isinstance(out[1], SearchTimeoutError)
    assert f"the run's timeout of {timeout} s" in str(out[1])
    pid = int((tmp_path / "pid").read_text())
    assert not alive(pid), f"the stopped worker (pid {pid}) is still there after the call"


def test_bad_deadlines_are_refused_before_anything_starts():
    for name, bad in (("timeout", 0), ("timeout", -1.0), ("search_timeout", True),
                      ("search_timeout", float("nan")), ("timeout", "5")):
        with pytest.raises(ValueError, match=name):
            asr.run_searches(searches.echo_sum, [1], searches.small_mlp, **{name: bad})


def test_a_process_a_stuck_search_started_is_ended_with_its_worker(tmp_path):
    # The worker alone was killed: the search's own process outlived the run.
    search = functools.partial(searches.child_then_wait_on_two, pid_dir=str(tmp_path))
    out = asr.run_searches(search, [1, 2, 3], searches.small_mlp, backend="process",
                           num_procs=3, timeout=8.0, return_exceptions=True)
    assert isinstance(out[1], SearchTimeoutError)
    child = int((tmp_path / "child").read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), f"the search's process (pid {child}) outlived the run"
