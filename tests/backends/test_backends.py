"""What every backend must do alike: each scenario runs on local, process and Ray (the
``backend`` fixture, tests/backends/conftest.py). Results are always compared with the
sequential baseline (one search after another on ``immediate(model)``), in the order of
the starts."""

import threading
import time

import pytest

import async_search as asr
from async_search.errors import InputSpecError
from tests.backends import searches

pytestmark = pytest.mark.timeout(180)


def test_results_equal_the_sequential_baseline_in_order(backend):
    starts = searches.starts(12)
    expected = searches.baseline(searches.astar, starts, searches.mlp_heuristic())
    out = backend.run(searches.astar, starts, searches.mlp_heuristic, max_batch_size=64)
    assert isinstance(out, asr.SearchResults) and out == expected
    assert out.stats["backend"] == backend.name
    assert out.stats["num_procs"] == backend.num_procs
    assert out.stats["elements"] == sum(r.evaluations for r in out)
    assert out.stats["mean_batch_size"] > 1


def test_results_keep_the_order_of_the_starts_however_they_are_split(backend):
    """One client, an uneven split, and more clients than starts: starts 0..6 give
    different results, each in its own place."""
    starts = [6, 1, 5, 2, 4, 3, 0]
    expected = searches.baseline(searches.echo_sum, starts, searches.small_mlp())
    assert len(set(expected)) == len(starts)
    for num_procs in (1, 3, 9):
        out = backend.run(searches.echo_sum, starts, searches.small_mlp,
                          num_procs=num_procs)
        assert out == expected, num_procs
        assert out.stats["elements"] == sum(starts)


def test_each_finished_client_reports_its_cpu_and_wall_seconds_while_searching(backend):
    # A client that computes uses its CPU all the time (in a Ray worker, Ray's own
    # threads add a little); one that waits on its round trips uses little of it.
    out = backend.run(searches.spin_or_wait, [("spin", 0.4), ("wait", 0.4)],
                      searches.small_mlp)
    assert out == [0.4, 0.4]
    if backend.name == "local":  # one process: no clients to tell apart
        assert "clients" not in out.stats
        return
    spin, wait = sorted(out.stats["clients"], key=lambda a: a["starts"])
    assert spin["ended"] == wait["ended"] == "finished"
    for attempt in (spin, wait):
        assert attempt["searching_s"] >= 0.4 and attempt["cpu_s"] >= 0.0
        # Its searches' start and end on the perf_counter clock, searching_s apart;
        # on this machine, after the servers started and before the call returned.
        assert attempt["ended_at"] - attempt["began_at"] == pytest.approx(
            attempt["searching_s"], abs=1e-3)
        assert min(s["started_at"] for s in out.stats["servers"]) < attempt["began_at"]
        assert attempt["ended_at"] < time.perf_counter()
    assert spin["cpu_s"] >= 0.35  # its 0.4 s of computing
    assert wait["cpu_s"] < 0.25 < wait["searching_s"]


@pytest.mark.parametrize("waves", [2, 3])
def test_client_waves_send_each_iterations_requests_in_that_many_messages(backend, waves):
    if backend.name == "local":  # no clients, no messages
        with pytest.raises(ValueError, match="client_waves"):
            backend.run(searches.echo_sum, [5], searches.small_mlp, client_waves=waves)
        return
    # One client of 20 searches x 5 sequential requests: waves of ceil(20 / waves)
    # requests, each its own message (a request to the server), where one wave sends 5.
    out = backend.run(searches.echo_sum, [5] * 20, searches.small_mlp, num_procs=1,
                      client_waves=waves)
    assert out == searches.baseline(searches.echo_sum, [5] * 20, searches.small_mlp())
    assert sum(s["requests"] for s in out.stats["servers"]) == 5 * waves


def test_several_servers_share_the_stream(backend):
    starts = [6] * 12 + list(range(12))
    out = backend.run(searches.echo_sum, starts, searches.small_mlp, num_servers=2,
                      max_batch_size=4)
    assert out == searches.baseline(searches.echo_sum, starts, searches.small_mlp())
    assert out.stats["num_servers"] == 2
    servers = out.stats["servers"]
    if backend.name == "ray":  # an actor each
        assert len(servers) == 2
    else:  # the device workers of one server in this process
        assert len(servers) == 1 and servers[0]["workers"] == 2
    assert max(record.size for record in out.stats["trace"]) <= 4
    # On the searches' clock: every batch within the run's wall time (Ray's actors
    # start one after another; a clock from the first one's start ran past it).
    assert all(0 <= record.finished_s <= out.stats["wall_time_s"]
               for record in out.stats["trace"])


def test_the_fraction_in_the_model_is_per_device_worker_and_at_most_one(backend):
    # Two workers computing all the time add up to twice the wall time of model time.
    out = backend.run(searches.echo_sum, [8] * 16, searches.sleepy, num_servers=2,
                      max_batch_size=2, model_thread=True)
    assert 0.1 < out.stats["fraction_in_model"] <= 1.0


def test_a_model_stuck_in_a_batch_does_not_hold_a_run_whose_searches_timed_out(backend):
    # Ray's servers are actors in processes of their own (killed with the run): a model
    # that sleeps there. Here, a model released once the run returned.
    release = threading.Event()
    began = time.monotonic()
    factory = (searches.sleeps_on_13 if backend.name == "ray"
               else lambda: searches.StuckOn13(release))
    try:
        out = backend.run(searches.one_request, [1, 13, 2], factory, search_timeout=1.0,
                          return_exceptions=True, model_thread=True)
        elapsed = time.monotonic() - began
    finally:
        release.set()  # the model's thread ends
    assert out[0] == 2.0 and out[2] == 4.0, out
    assert isinstance(out[1], asr.SearchTimeoutError), out
    assert elapsed < 8.0  # it drained the stuck batch: 60 s


def test_progress_reports_every_element_evaluated(backend):
    seen = []
    out = backend.run(searches.echo_sum, [3, 4, 5], searches.small_mlp,
                      progress=seen.append)
    assert out == searches.baseline(searches.echo_sum, [3, 4, 5], searches.small_mlp())
    assert all(count > 0 for count in seen)
    assert sum(seen) == out.stats["elements"] == 12


def test_a_failing_search_is_reported_with_its_start_index(backend):
    with pytest.raises(asr.SearchError,
                       match="1 of 5 searches failed; the first, start 3") as info:
        backend.run(searches.fails_on_three, list(range(5)), searches.small_mlp)
    assert list(info.value.failures) == [3]
    failure = info.value.failures[3]
    assert isinstance(failure, ArithmeticError) and "start 3 is cursed" in str(failure)


def test_with_return_exceptions_a_failed_start_holds_its_exception_in_place(backend):
    out = backend.run(searches.fails_on_three, list(range(6)), searches.small_mlp,
                      return_exceptions=True)
    assert len(out) == 6
    assert out[:3] == [0, 1, 2] and out[4:] == [4, 5]
    assert isinstance(out[3], ArithmeticError) and "start 3 is cursed" in str(out[3])


def test_an_exception_a_search_returns_is_its_result_not_a_failure(backend):
    out = backend.run(searches.returns_an_exception, [1, 2], searches.small_mlp)
    assert [type(r) for r in out] == [ValueError, ValueError]
    assert [str(r) for r in out] == ["a value, not a failure: 1", "a value, not a failure: 2"]


def test_a_raised_exception_that_is_false_fails_its_start_alone(backend):
    out = backend.run(searches.raises_a_false_exception, [0, 1, 2], searches.small_mlp,
                      return_exceptions=True)
    assert out[0] == 0 and out[2] == 2
    assert isinstance(out[1], searches.NoProblems) or "no problems, still raised" in str(
        out[1]), repr(out[1])
    with pytest.raises(asr.SearchError, match="1 of 3 searches failed; the first, start 1"):
        backend.run(searches.raises_a_false_exception, [0, 1, 2], searches.small_mlp)


def test_a_bad_request_fails_only_the_search_that_made_it(backend):
    starts = list(range(5))
    out = backend.run(searches.wrong_shape_on_two, starts, searches.small_mlp,
                      return_exceptions=True)
    expected = searches.baseline(searches.echo_sum, starts, searches.small_mlp())
    assert out[:2] == expected[:2] and out[3:] == expected[3:]
    error = out[2]
    assert isinstance(error, InputSpecError), repr(error)
    assert "expected [n, 3] float32" in str(error) and "given [1, 4] float32" in str(error)
    with pytest.raises(asr.SearchError, match="1 of 5 searches failed; the first, start 2"):
        backend.run(searches.wrong_shape_on_two, starts, searches.small_mlp)


def test_a_batch_the_model_fails_fails_only_the_searches_with_rows_in_it(backend):
    # One row a batch: only the poisoned search's batches fail. A client sends the
    # requests of one loop iteration as one message, which the server cuts into
    # batches: the message's other requests still get their rows.
    starts = [0, 1, 2, -5, 4, 5, 6, 7, 8]
    out = backend.run(searches.rows_of_start, starts, searches.raises_on_negative,
                      max_batch_size=1, return_exceptions=True)
    assert isinstance(out[3], ArithmeticError), repr(out[3])
    assert "a negative input" in str(out[3])
    expected = [[2.0 * s] * (abs(s) % 3 + 1) for s in starts]
    assert out[:3] + out[4:] == expected[:3] + expected[4:]


@pytest.mark.parametrize("max_batch_size", [1, 1024])
def test_a_request_that_check_values_refuses_fails_alone_with_its_own_error(
        backend, max_batch_size):
    # Every search makes its request at once: in a process or Ray client they travel
    # in one message, which the server checks by halves; with batches of one row the
    # poisoned request fails in the model beside them, with the model's error.
    starts = [0, 1, -2, 4, -5, 6] + ([99] if max_batch_size == 1 else [])
    out = backend.run(searches.rows_of_start, starts, searches.RefusesNegative,
                      max_batch_size=max_batch_size, return_exceptions=True)
    for i in (2, 4):
        assert isinstance(out[i], InputSpecError), repr(out[i])
        assert "negative values are not taken" in str(out[i])
    if max_batch_size == 1:
        assert isinstance(out[6], ArithmeticError) and "a poisoned input" in str(out[6])
    expected = [[2.0 * s] * (abs(s) % 3 + 1) for s in starts]
    assert [out[i] for i in (0, 1, 3, 5)] == [expected[i] for i in (0, 1, 3, 5)]


@pytest.mark.parametrize("search_timeout", [None, 60.0])  # wait_for: a task of its own
def test_a_search_that_exits_fails_alone_in_a_worker(backend, search_timeout):
    if backend.name == "local":
        pytest.skip("in this process, SystemExit ends the run as it ends the program")
    starts = list(range(6))
    out = backend.run(searches.exits_on_zero, starts, searches.small_mlp, num_procs=2,
                      search_timeout=search_timeout, return_exceptions=True)
    for index, cause in ((0, "SystemExit: 3"), (1, "KeyboardInterrupt")):
        assert isinstance(out[index], asr.SearchError), repr(out[index])
        assert f"the search raised {cause}" in str(out[index])
        assert "it fails alone" in str(out[index])
    expected = searches.baseline(searches.echo_sum, starts, searches.small_mlp())
    assert out[2:] == expected[2:]
    assert len(out.stats["clients"]) == 2  # nothing was retried


def test_evaluate_with_version_works_inside_a_search(backend):
    starts = [1, 3, 2]
    out = backend.run(searches.outputs_and_version, starts, searches.version_model)
    # Nothing was pushed: every row comes from version 0, and says so.
    assert out == [([[0.0]] * n, 0) for n in starts]


def test_an_empty_list_of_starts_returns_an_empty_result(backend):
    out = backend.run(searches.echo_sum, [], searches.small_mlp)
    assert isinstance(out, asr.SearchResults) and out == []
    assert out.stats["backend"] == backend.name and out.stats["elements"] == 0


def test_the_model_on_the_servers_loop_gives_the_same_results(backend):
    starts = list(range(1, 12))
    out = backend.run(searches.echo_sum, starts, searches.small_mlp, model_thread=False)
    assert out == searches.baseline(searches.echo_sum, starts, searches.small_mlp())


async def test_run_searches_async_gives_the_same_results(backend):
    starts = [2, 3, 4]
    out = await backend.run_async(searches.echo_sum, starts, searches.small_mlp)
    assert out == await searches.sequential(searches.echo_sum, starts,
                                            searches.small_mlp())
    assert out.stats["backend"] == backend.name





async def test_every_answer_is_computed_for_its_own_request_and_only_once(backend):
    """A long stream of requests, several messages of a client in flight at once: every
    search gets its own answers, and the servers compute each requested row once."""
    starts = list(range(16))
    # A run takes seconds; the bound stops a run whose answers were lost.
    out = await backend.run_async(searches.own_answers, starts, searches.sum_model,
                                  num_servers=2, max_batch_size=8, timeout=60)
    assert out == await searches.sequential(searches.own_answers, starts,
                                            searches.sum_model())
    assert all(wrong == 0 for wrong, _ in out)
    assert out.stats["elements"] == sum(rows for _, rows in out)


def test_a_model_factory_that_raises_gives_its_own_exception(backend):
    with pytest.raises(RuntimeError, match="no model for you") as raised:
        backend.run(searches.echo_sum, [1, 2], searches.raises_when_made)
    assert not isinstance(raised.value, asr.ServerDiedError)  # nothing died
    # Its own words first (Ray's wrapper began with its header and traceback).
    assert str(raised.value).startswith("no model for you")


def test_servers_of_models_that_take_different_inputs_are_refused(backend):
    # Each server took its own model: the requests routed to a server whose model took
    # other rows failed there (InputSpecError, as if the caller's rows were wrong).
    with pytest.raises(ValueError, match=r"\[n, 4\] float32.*\[n, 3\] float32|"
                                         r"\[n, 3\] float32.*\[n, 4\] float32"):
        backend.run(searches.echo_sum, [1, 2, 3, 4], searches.inputs_differ, num_servers=2)


def test_a_start_that_pickles_but_does_not_load_is_refused_by_index(backend):
    if backend.name == "local":
        pytest.skip("the local backend sends nothing to another process")
    with pytest.raises(TypeError, match=r"start 1 .*load again.*cannot be loaded"):
        backend.run(searches.echo_sum, [2, searches.DoesNotLoad(), 3], searches.small_mlp)


def test_building_the_models_is_start_up_not_the_searches_wall_time(backend):
    """local and process counted the model factory's seconds in wall_time_s, Ray did
    not: a slow-to-build net made the same searches look slower there, and diluted
    their fraction_in_model."""
    began = time.perf_counter()
    out = backend.run(searches.echo_sum, [1, 2], searches.slow_to_build, num_servers=2)
    call_s = time.perf_counter() - began
    assert out == searches.baseline(searches.echo_sum, [1, 2], searches.small_mlp())
    stats = out.stats
    # Two models, one after the other here; Ray's actors build theirs at once.
    built_s = searches.BUILD_S * (1 if backend.name == "ray" else 2)
    assert stats["startup_s"] >= built_s
    assert stats["wall_time_s"] + stats["startup_s"] <= call_s
    # the batches on the searches' clock, within their wall time
    assert all(0 <= r.finished_s <= stats["wall_time_s"] for r in stats["trace"])
