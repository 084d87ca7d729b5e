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
])
def test_bad_arguments_fail_before_anything_runs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        asr.run_searches(searches.echo_sum, [1], searches.small_mlp, **kwargs)


async def test_run_searches_inside_a_running_loop_points_to_the_async_form():
    with pytest.raises(RuntimeError, match="run_searches_async"):
        asr.run_searches(searches.echo_sum, [1], searches.small_mlp)
