"""Faults on the way back from a search or a model, on the local, process and Ray backends.

Every run is bounded (``asyncio.wait_for``, and a per-test timeout): a run that does not
return counts every one of its requests as hung. Each test tallies what its requests
got (sent, answered exactly, failed clearly, hung, wrong); hung and wrong must be 0.
A clear failure names its start, carries its traceback where it was raised as text, and
says what went wrong.
"""

import asyncio

import pytest

import async_search as asr
from async_search.errors import RemoteError
from tests.faults import faulty
from tests.faults.faulty import clear_remote_failure, names_start, tally_run

pytestmark = pytest.mark.timeout(240)

#: Seconds a run may take before its requests count as hung.
BOUND_S = 60.0


@pytest.fixture(params=["process", "ray"])
def remote_backend(request):
    """The backends whose searches run in other processes."""
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return request.param


@pytest.fixture(params=["local", "process", "ray"])
def backend(request):
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return request.param


def run_bounded(starts, backend, **kwargs):
    """``run_searches`` within BOUND_S: its results, or None when it did not return."""
    async def bounded():
        try:
            return await asyncio.wait_for(asr.run_searches_async(
                faulty.faulty_search, starts, faulty.faulty_model, backend=backend,
                num_procs=2 if backend != "local" else 1, **kwargs), BOUND_S)
        except asyncio.TimeoutError:
            return None

    return asyncio.run(bounded())


def starts_with(faults: dict, count: int = 8):
    """``count`` starts ``("ok", i + 1)``, except ``faults[i] = kind``."""
    return [(faults.get(i, "ok"), float(i + 1)) for i in range(count)]


# -- 1. what cannot travel: exceptions and results ------------------------------------
def test_a_search_raising_an_exception_that_cannot_travel_fails_only_its_start(
        remote_backend):
    starts = starts_with({2: "raise_unpicklable", 5: "raise_unloadable"})
    out = run_bounded(starts, remote_backend, return_exceptions=True)
    tally = tally_run(starts, out, {
        2: lambda e: isinstance(e, RemoteError) and clear_remote_failure(
            e, 2, "UnpicklableError", "holding a lock", "faulty_search"),
        5: lambda e: isinstance(e, RemoteError) and clear_remote_failure(
            e, 5, "UnloadableError", "cannot load", "faulty_search"),
    })
    tally.check(answered=6, failed=2)


def test_a_search_raising_an_exception_that_travels_carries_its_traceback(
        remote_backend):
    starts = starts_with({4: "raise_plain"})
    out = run_bounded(starts, remote_backend, return_exceptions=True)
    tally = tally_run(starts, out, {
        4: lambda e: isinstance(e, ArithmeticError) and clear_remote_failure(
            e, 4, "cursed", "faulty_search")})
    tally.check(answered=7, failed=1)


def test_a_result_that_cannot_travel_fails_its_own_start_only(remote_backend):
    starts = starts_with({3: "return_unpicklable", 6: "return_unloadable"})
    out = run_bounded(starts, remote_backend, return_exceptions=True)
    tally = tally_run(starts, out, {
        3: lambda e: clear_remote_failure(e, 3, "UnpicklableResult", "cannot be sent"),
        6: lambda e: clear_remote_failure(e, 6, "UnloadableResult", "refuses"),
    })
    tally.check(answered=6, failed=2)


def test_a_model_raising_an_exception_that_cannot_travel_fails_its_request_in_bounds(
        remote_backend):
    starts = starts_with({2: "model_unpicklable", 5: "model_unloadable"})
    out = run_bounded(starts, remote_backend, return_exceptions=True)
    # The remote traceback runs from the search down to the model's __call__. A model
    # that raises fails its whole batch with that error (by design), so when the two
    # poisoned requests share a batch both starts get the same one: either is clear.
    def either(index):
        return lambda e: isinstance(e, RemoteError) and (
            clear_remote_failure(e, index, "UnpicklableError", "holding a lock",
                                 "faulty_search", "__call__")
            or clear_remote_failure(e, index, "UnloadableError", "cannot load",
                                    "faulty_search", "__call__"))

    tally = tally_run(starts, out, {2: either(2), 5: either(5)})
    tally.check(answered=6, failed=2)


def test_an_unpicklable_model_error_without_return_exceptions_names_its_start(
        remote_backend):
    starts = starts_with({1: "model_unpicklable"}, count=4)

    async def bounded():
        return await asyncio.wait_for(asr.run_searches_async(
            faulty.faulty_search, starts, faulty.faulty_model, backend=remote_backend,
            num_procs=2), BOUND_S)

    tally = faulty.Tally(sent=len(starts))
    with pytest.raises(asr.SearchError) as info:
        asyncio.run(bounded())
    error = info.value
    assert "start 1" in str(error) and list(error.failures) == [1]
    failure = error.failures[1]
    if isinstance(failure, RemoteError) and clear_remote_failure(failure, 1,
                                                                 "UnpicklableError"):
        tally.failed_clearly += 1
    else:
        tally.wrong += 1
    assert isinstance(error.__cause__, RemoteError)  # chained to it, not a bare TypeError
    tally.answered_exactly = len(starts) - len(error.failures)
    tally.check(answered=3, failed=1)


# -- 12. one failure does not throw away the good results -----------------------------
def test_return_exceptions_keeps_every_good_result(backend):
    faults = {1: "raise_plain", 4: "raise_plain", 6: "raise_plain"}
    if backend != "local":
        faults.update({4: "raise_unpicklable", 6: "return_unloadable"})
    starts = starts_with(faults, count=10)
    out = run_bounded(starts, backend, return_exceptions=True)
    assert out is not None and len(out) == 10

    def failed(i, *words):
        if backend == "local":  # no process boundary: the exception itself
            return lambda e: isinstance(e, BaseException) and all(w in str(e)
                                                                 for w in words)
        return lambda e: clear_remote_failure(e, i, *words)

    tally = tally_run(starts, out, {1: failed(1, "cursed"),
                                    4: failed(4, "cursed" if backend == "local" else
                                              "holding a lock"),
                                    6: failed(6, "cursed" if backend == "local" else
                                              "refuses")})
    tally.check(answered=7, failed=3)
    assert out.stats["backend"] == backend


def test_the_default_search_error_names_every_failed_start(backend):
    faults = {1: "raise_plain", 4: "raise_plain", 6: "raise_plain"}
    if backend != "local":
        faults.update({4: "raise_unpicklable", 6: "return_unpicklable"})
    starts = starts_with(faults, count=8)

    async def bounded():
        return await asyncio.wait_for(asr.run_searches_async(
            faulty.faulty_search, starts, faulty.faulty_model, backend=backend,
            num_procs=1 if backend == "local" else 2), BOUND_S)

    with pytest.raises(asr.SearchError) as info:
        asyncio.run(bounded())
    error = info.value
    # Good starts are not in .failures (they finished; SearchError drops their results).
    tally = faulty.Tally(sent=len(starts))
    for i in range(len(starts)):
        if i in faults:
            named = f"{i}" in str(error).split("every failed start:")[-1]
            clear = backend == "local" or names_start(error.failures.get(i, Exception()), i)
            if i in error.failures and named and clear:
                tally.failed_clearly += 1
            else:
                tally.wrong += 1
        elif i in error.failures:
            tally.wrong += 1
        else:
            tally.answered_exactly += 1
    assert "3 of 8 searches failed" in str(error) and "[1, 4, 6]" in str(error)
    tally.check(answered=5, failed=3)


def test_a_killed_client_process_fails_its_starts_and_the_others_are_kept():
    # Client 0 runs starts 0, 2, 4 and is SIGKILLed by start 2 at every attempt; after
    # the second loss they run again in halves, until start 2 is alone: it fails, and
    # everything else (client 1's starts, and 0 and 4) is answered.
    starts = starts_with({2: "kill"}, count=6)
    out = run_bounded(starts, "process", return_exceptions=True)

    def died(e):
        return isinstance(e, asr.SearchError) and "died with exit code -9" in str(e)

    tally = tally_run(starts, out, {2: died})
    tally.check(answered=5, failed=1)
