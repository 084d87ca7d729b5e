"""What only the local backend (or run_searches itself) does; the scenarios every backend
shares are in test_backends.py."""

import pytest

import async_search as asr
from tests.backends import searches

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "gpu"}, "backend must be one of local, process, ray, got 'gpu'"),
    ({"num_procs": 0}, "num_procs must be an integer >= 1, got 0"),
    ({"num_servers": 10_000}, "more than the local backend can start"),
    ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1"),
    ({"model_thread": False, "num_servers": 2}, "num_servers > 1 needs model_thread=True"),
    ({"client_waves": 0}, "client_waves must be an integer >= 1, got 0"),
    ({"client_waves": 2.0}, "client_waves must be an integer >= 1"),
    ({"client_waves": 2}, "client_waves is the process and Ray backends'"),
    # "False" ran on uvloop: every other flag is checked
    ({"use_uvloop": "False"}, "use_uvloop must be True or False, got 'False'"),
    # one process per start, all at once: 10**5 starts would fork 10**5 interpreters
    ({"backend": "process", "num_procs": 10**9}, "num_procs=1000000000 is more client "
                                                 "processes than the process backend"),
    # compared bare: a string raised TypeError, and True passed until Ray had started
    ({"backend": "ray", "total_gpu_frac": "0.5"}, "total_gpu_frac must be a finite number"),
    ({"backend": "ray", "total_gpu_frac": True}, "total_gpu_frac must be a finite number"),
    ({"total_gpu_frac": 1.5}, r"total_gpu_frac must be a finite number > 0.0 and <= 1.0"),
])
def test_bad_arguments_fail_before_anything_runs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        asr.run_searches(searches.echo_sum, [1], searches.small_mlp, **kwargs)


def test_numpy_integers_count_as_integers_and_the_stats_hold_plain_ints():
    import json

    import numpy as np

    out = asr.run_searches(searches.echo_sum, [1, 2], searches.small_mlp,
                           num_procs=np.int64(2), num_servers=np.int32(1),
                           retries=np.int64(1))
    assert type(out.stats["num_procs_requested"]) is int
    assert type(out.stats["num_servers"]) is int
    json.dumps({k: out.stats[k] for k in ("num_procs_requested", "num_servers")})


@pytest.mark.parametrize("backend", ["local", "process"])
@pytest.mark.parametrize("args, kwargs, message", [
    ((5, searches.small_mlp), {}, "search_fn must be callable, got int 5"),
    ((searches.echo_sum, "mlp"), {}, "model_factory must be callable, got str 'mlp'"),
    # The model where its factory belongs: each server would call model(), and fail.
    ((searches.echo_sum, searches.small_mlp()), {},
     r"model_factory is called with no arguments.*\(lambda: model\), not the model"),
    ((lambda start: start, searches.small_mlp), {},
     r"search_fn is called with \(start, evaluate\)"),
    ((searches.echo_sum, searches.small_mlp), {"progress": 3}, "progress must be callable"),
    ((searches.echo_sum, searches.small_mlp), {"on_servers": "x"},
     "on_servers must be a callable"),
])
def test_what_cannot_be_called_as_the_run_calls_it_fails_before_anything_runs(
        backend, args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        asr.run_searches(args[0], [1], args[1], backend=backend, num_procs=1, **kwargs)


async def test_run_searches_async_checks_its_callables_too():
    with pytest.raises(TypeError, match="model_factory is called with no arguments"):
        await asr.run_searches_async(searches.echo_sum, [1], searches.small_mlp())


async def test_run_searches_inside_a_running_loop_points_to_the_async_form():
    with pytest.raises(RuntimeError, match="run_searches_async"):
        asr.run_searches(searches.echo_sum, [1], searches.small_mlp)


def test_the_local_backend_reports_the_one_process_it_ran_in_whatever_num_procs_asks():
    # It reported num_procs=5 for a run that started no process.
    out = asr.run_searches(searches.echo_sum, [1, 2], searches.small_mlp,
                           backend="local", num_procs=5)
    assert out == searches.baseline(searches.echo_sum, [1, 2], searches.small_mlp())
    assert (out.stats["num_procs"], out.stats["num_procs_requested"]) == (1, 5)


@pytest.mark.parametrize("deadline", [{"timeout": 1.0}, {"search_timeout": 0.5}])
def test_a_search_that_swallows_its_cancellation_does_not_hold_the_call(deadline):
    # The runner's close waited for it (timeout), and so did asyncio.wait_for
    # (search_timeout): the call never returned.
    import time

    began = time.monotonic()
    results = asr.run_searches(searches.deaf_on_two, [1, 2, 3], searches.small_mlp,
                               return_exceptions=True, **deadline)
    assert time.monotonic() - began < 10
    assert isinstance(results[1], asr.SearchTimeoutError)
    assert [results[0], results[2]] == [asr.run_searches(
        searches.echo_sum, [s], searches.small_mlp)[0] for s in (1, 3)]


@pytest.mark.parametrize("starts", [None, 3])
def test_starts_that_are_no_iterable_are_named(starts):
    with pytest.raises(TypeError, match="^starts must be an iterable of starts"):
        asr.run_searches(searches.echo_sum, starts, searches.small_mlp)
