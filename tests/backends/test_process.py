"""What only the process backend does; the scenarios every backend shares are in
test_backends.py."""

import asyncio
import os
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import async_search as asr
from async_search.errors import InputSpecError
from tests import odd_arrays
from tests.backends import searches

pytestmark = pytest.mark.timeout(180)


def test_process_clients_coalesce_requests_into_one_message_per_iteration():
    out = asr.run_searches(searches.echo_sum, [5] * 20, searches.small_mlp,
                           backend="process", num_procs=1)
    assert out == searches.baseline(searches.echo_sum, [5] * 20, searches.small_mlp())
    # 20 searches x 5 sequential requests, one message per iteration: 5 batches of 20.
    assert out.stats["batches"] <= 6 and out.stats["mean_batch_size"] >= 16


def test_a_client_process_that_dies_is_reported_and_the_rest_finish():
    with pytest.raises(asr.SearchError) as info:
        asr.run_searches(searches.kill_self_on_two, list(range(6)), searches.small_mlp,
                         backend="process", num_procs=2)
    # Client 0 ran starts 0, 2, 4 and died each time, until start 2 ran alone (halves
    # after the second loss): only it fails; the other starts finished.
    assert sorted(info.value.failures) == [2]
    assert "died with exit code -9" in str(info.value.failures[2])
    assert len(info.value.failures[2].attempts) == 4


def test_an_unpicklable_search_function_is_refused_before_any_process_starts():
    async def nested(start, evaluate):
        return start

    with pytest.raises(TypeError, match="must be picklable"):
        asr.run_searches(nested, [1], searches.small_mlp, backend="process")


class _DoesNotLoad:
    """Pickles, but raises when loaded (in the client process that would run it)."""

    def __reduce__(self):
        return (_refuse_to_load, ())


def _refuse_to_load():
    raise RuntimeError("this start cannot be loaded")


def test_a_start_that_pickles_but_does_not_load_is_refused_by_index_before_any_process():
    with pytest.raises(TypeError, match=r"start 1 .*load again.*cannot be loaded"):
        asr.run_searches(searches.echo_sum, [2, _DoesNotLoad(), 3], searches.small_mlp,
                         backend="process")


async def _big_result(start, evaluate):
    return np.full(1 << 18, float(start))  # 2 MiB per search: a report far above any buffer


def test_a_large_report_reaches_a_stalled_reader_whole_before_the_client_exits():
    """The client must not let its loop end with the report's tail still buffered. A
    server that stalls then (busy, loaded) read a truncated frame and reported a client
    that had exited with code 0 as dead. Here the reader does not read at all until the
    client has had the time to exit: a 4 MiB report, far above any socket buffer, must
    still arrive whole."""
    import multiprocessing
    import pickle

    from async_search.backends.process import client_main
    from async_search.connections import pipe
    from async_search.queues import SocketQueue, socket_queue

    server_end, client_end = pipe(socket_queue)
    results, work = SocketQueue(), SocketQueue()
    child = multiprocessing.get_context("spawn").Process(
        target=client_main, args=(client_end, results, work, None, False, None,
                                  os.getpid()))
    child.start()
    try:
        server_end.close_unused_ends()
        results.reader_only()
        work.writer_only().put((_big_result, [1.0, 2.0]), timeout=10)
        child.join(1.0)  # the stall: an exit now would lose the report's tail
        messages = [results.get(timeout=60)]
        while messages[-1][0] != "done":
            messages.append(results.get(timeout=60))
    finally:
        child.join(60)
    assert child.exitcode == 0
    assert messages[:2] == [("alive", None), ("started", None)]
    report = sorted(o for kind, outcomes in messages if kind == "outcomes"
                    for o in outcomes)
    assert [(k, ok) for k, ok, _ in report] == [(0, True), (1, True)]
    for k, _, payload in report:
        value = pickle.loads(payload)
        assert value.shape == (1 << 18,) and (value == k + 1.0).all()


def _zeros_model():
    """A model with no input spec: it takes object arrays as well."""
    return lambda x: np.zeros((len(x), 1), np.float32)


async def _unpicklable_request(start, evaluate):
    x = np.empty((1, 1), dtype=object)
    if start == 1:  # its own loop iteration, so its own message; a lock cannot pickle
        for _ in range(3):
            await asyncio.sleep(0)
        x[0, 0] = threading.Lock()
    else:
        x[0, 0] = "text"
    return (await evaluate(x)).tolist()


def test_a_request_that_cannot_travel_fails_its_own_search_at_once():
    out = asr.run_searches(_unpicklable_request, [0, 1], _zeros_model, backend="process",
                           num_procs=1, return_exceptions=True)
    assert out[0] == [[0.0]]
    assert isinstance(out[1], InputSpecError) and "cannot be sent" in str(out[1])


# -- odd arrays beside healthy requests (one message per loop iteration) ----------------

_odd_descriptions = st.tuples(st.sampled_from(odd_arrays.KINDS), st.integers(0, 4),
                              st.integers(0, 1000))


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(starts=st.lists(st.tuples(st.lists(_odd_descriptions, min_size=1, max_size=3),
                                 st.lists(st.integers(0, 50), min_size=1, max_size=3)),
                       min_size=8, max_size=16))
def test_an_odd_request_in_a_process_client_harms_no_healthy_batch_mate(starts):
    # Every search makes its requests in one loop iteration, and the searches of a
    # client start together: odd and healthy requests travel in one message.
    out = asr.run_searches(odd_arrays.odd_search, starts, odd_arrays.square_plus_one,
                           backend="process", num_procs=2)
    for (case, seeds), (odd_out, good_out) in zip(starts, out):
        odd_arrays.check_outcomes(case, seeds, odd_out, good_out)


@pytest.mark.parametrize("rows", [1, 4])
def test_a_matrix_beside_healthy_requests_in_one_message(rows):
    starts = [([("matrix", rows, 3)], [0, 1, 2])] + [([("plain", 1, s)], [s]) for s in range(3)]
    out = asr.run_searches(odd_arrays.odd_search, starts, odd_arrays.square_plus_one,
                           backend="process", num_procs=1)
    for (case, seeds), (odd_out, good_out) in zip(starts, out):
        odd_arrays.check_outcomes(case, seeds, odd_out, good_out)


def test_a_thread_a_timed_out_search_left_running_does_not_hold_the_run():
    # The client reports every outcome, then must exit at once: its loop's close and
    # the interpreter's exit would wait 30 s for the thread (10 s a client, in turn).
    import time

    began = time.monotonic()
    out = asr.run_searches(searches.stuck_in_a_thread, [1, 2, 3, 4], searches.small_mlp,
                           backend="process", num_procs=4, search_timeout=1.0,
                           return_exceptions=True)
    assert all(isinstance(r, asr.SearchTimeoutError) for r in out), out
    assert time.monotonic() - began < 9.0


def test_a_run_leaves_no_socket_of_its_clients_to_the_garbage_collector():
    # The serving end's sockets were left open when a client's stream ended: each run
    # warned (ResourceWarning, an error under -W error) as the collector closed them.
    import gc
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        out = asr.run_searches(searches.echo_sum, [1, 2, 3], searches.small_mlp,
                               backend="process", num_procs=2)
        gc.collect()
    assert out == searches.baseline(searches.echo_sum, [1, 2, 3], searches.small_mlp())
    assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def test_clients_past_the_open_file_limit_fail_the_run_naming_the_limit():
    # It was multiprocessing's bare "OSError: [Errno 24] Too many open files" from
    # inside os.pipe, naming neither the limit nor num_procs.
    import subprocess
    import sys

    script = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE,\n"
        "                   (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "import async_search as asr\n"
        "from tests.backends import searches\n"
        "try:\n"
        "    asr.run_searches(searches.echo_sum, list(range(40)), searches.small_mlp,\n"
        "                     backend='process', num_procs=20)\n"
        "except OSError as e:\n"
        "    print(type(e).__name__, e.errno, e)\n"
        # fewer num_procs, as it says, and at once: the failed run's pipes (kept by
        # its traceback until the collector ran) failed this one too
        "out = asr.run_searches(searches.echo_sum, [1, 2, 3, 4, 5, 6],\n"
        "                       searches.small_mlp, backend='process', num_procs=6)\n"
        "print('then', list(out))\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("OSError 24 "), run.stdout
    assert "the open-file limit (ulimit -n) is 64" in run.stdout
    assert "for num_procs=20, or use fewer num_procs" in run.stdout
    assert "\nthen [" in run.stdout, run.stdout + run.stderr[-3000:]


def test_a_full_system_file_table_is_not_called_this_processs_limit():
    import errno

    from async_search.backends.process import _out_of_descriptors

    error = _out_of_descriptors(OSError(errno.ENFILE, "Too many open files in system"), 4)
    assert error.errno == errno.ENFILE
    assert "the system's table of open files is full" in str(error)
    assert "ulimit" not in str(error)
