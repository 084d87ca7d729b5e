import pytest

from async_search.experiments import ModelParams, RunSpec, SearchParams


@pytest.mark.parametrize("field, value, words", [
    ("search", "dfs", "astar, rollout, mcts, continuous"),
    ("gnn_budget", 0, "gnn_budget must be an integer >= 1, got 0"),
    ("num_searches", -1, "num_searches must be an integer >= 1"),
    ("batch_size", 1.5, "batch_size must be an integer >= 1"),
    ("scramble", -3, "scramble must be an integer >= 0"),
    ("puzzle_size", 9, "puzzle_size must be an integer from 2 to 8"),
])
def test_bad_search_params_name_the_field_and_what_it_accepts(field, value, words):
    with pytest.raises(ValueError, match=words):
        SearchParams(**{field: value}).check()


def test_bad_model_params_are_refused():
    with pytest.raises(ValueError, match="tf, numpy"):
        ModelParams(kind="torch").check()
    with pytest.raises(ValueError, match="hidden_sizes"):
        ModelParams(hidden_sizes=()).check()
    with pytest.raises(ValueError, match="hidden_sizes"):
        ModelParams(hidden_sizes=(8, 0)).check()


def test_run_spec_surfaces_the_backends_own_checks():
    with pytest.raises(ValueError, match="num_servers=10000 is more than"):
        RunSpec("r", "g", "ray", num_servers=10_000).check()
    with pytest.raises(ValueError, match="backend must be None"):
        RunSpec("r", "g", "gpu").check()
    with pytest.raises(ValueError, match="max_batch_size"):
        RunSpec("r", "g", None, max_batch_size=0).check()
    with pytest.raises(ValueError, match="total_gpu_frac"):
        RunSpec("r", "g", "ray", total_gpu_frac=1.5).check()


def test_run_spec_gives_run_searches_its_arguments():
    spec = RunSpec("p", "g", "process", num_procs=2, max_batch_size=64, max_delay=0.001)
    kwargs = spec.check().runner_kwargs()
    assert kwargs["backend"] == "process" and kwargs["num_procs"] == 2
    assert kwargs["max_batch_size"] == 64 and kwargs["max_delay"] == 0.001
    assert not spec.is_baseline and RunSpec("s", "g").is_baseline
