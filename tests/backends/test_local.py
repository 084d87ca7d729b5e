import pytest

import async_search as asr
from tests.backends import searches

pytestmark = pytest.mark.timeout(120)


def test_local_results_equal_the_sequential_baseline_in_order():
    starts = searches.starts(12)
    expected = searches.baseline(searches.astar, starts, searches.mlp_heuristic())
    out = asr.run_searches(searches.astar, starts, searches.mlp_heuristic,
                           max_batch_size=64)
    assert out == expected
    assert out.stats["backend"] == "local" and out.stats["mean_batch_size"] > 1
    assert out.stats["elements"] == sum(r.evaluations for r in out)


def test_several_local_servers_share_the_stream():
    starts = list(range(1, 40))
    out = asr.run_searches(searches.echo_sum, starts, searches.small_mlp, num_servers=3,
                           max_batch_size=4)
    assert out == searches.baseline(searches.echo_sum, starts, searches.small_mlp())
    assert out.stats["servers"][0]["workers"] == 3


def test_progress_reports_every_element_evaluated():
    seen = []
    out = asr.run_searches(searches.echo_sum, [3, 4, 5], searches.small_mlp,
                           progress=seen.append)
    assert sum(seen) == out.stats["elements"] == 12


def test_a_failing_search_is_reported_with_its_start_index():
    with pytest.raises(asr.SearchError, match="1 of 5 searches failed; the first, start 3") as info:
        asr.run_searches(searches.fails_on_three, list(range(5)), searches.small_mlp)
    assert list(info.value.failures) == [3]
    assert isinstance(info.value.failures[3], ArithmeticError)


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "gpu"}, "backend must be one of local, process, ray, got 'gpu'"),
    ({"num_procs": 0}, "num_procs must be an integer >= 1, got 0"),
    ({"num_servers": 10_000}, "more than the local backend can start"),
    ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1"),
])
def test_bad_arguments_fail_before_anything_runs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        asr.run_searches(searches.echo_sum, [1], searches.small_mlp, **kwargs)


async def test_run_searches_inside_a_running_loop_points_to_the_async_form():
    with pytest.raises(RuntimeError, match="run_searches_async"):
        asr.run_searches(searches.echo_sum, [1], searches.small_mlp)
    out = await asr.run_searches_async(searches.echo_sum, [2, 3], searches.small_mlp)
    assert out == await searches.sequential(searches.echo_sum, [2, 3], searches.small_mlp())


def test_model_on_the_servers_loop_gives_the_same_results():
    starts = list(range(1, 20))
    out = asr.run_searches(searches.echo_sum, starts, searches.small_mlp, model_thread=False)
    assert out == searches.baseline(searches.echo_sum, starts, searches.small_mlp())
    with pytest.raises(ValueError, match="num_servers > 1 needs model_thread=True"):
        asr.run_searches(searches.echo_sum, starts, searches.small_mlp, model_thread=False,
                         num_servers=2)
