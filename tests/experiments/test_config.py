import dataclasses

import pytest

from async_search.experiments import Experiment, ModelConfig, RunSpec, SearchConfig


@pytest.mark.parametrize("field, value, words", [
    ("search", "dfs", "astar, rollout, mcts, continuous"),
    ("gnn_budget", 0, "gnn_budget must be an integer >= 1, got 0"),
    ("num_searches", -1, "num_searches must be an integer >= 1"),
    ("batch_size", 1.5, "batch_size must be an integer >= 1"),
    ("weight", -0.5, "SearchConfig.weight must be"),
    ("weight", "0.3", "SearchConfig.weight must be"),
    ("scramble", -3, "scramble must be an integer >= 0"),
    ("puzzle_size", 9, "puzzle_size must be an integer from 2 to 8"),
])
def test_a_bad_search_config_names_the_field_and_what_it_accepts(field, value, words):
    with pytest.raises(ValueError, match=words):
        SearchConfig(**{field: value})


def test_a_search_config_is_checked_again_when_replaced():
    with pytest.raises(ValueError, match="num_searches"):
        dataclasses.replace(SearchConfig(), num_searches=0)


def test_bad_model_configs_are_refused():
    with pytest.raises(ValueError, match="tf, numpy"):
        ModelConfig(kind="torch")
    with pytest.raises(ValueError, match="tf, numpy"):
        ModelConfig(kind="pretrained")  # every net is trained unless trained=False
    with pytest.raises(ValueError, match="trained must be True or False"):
        ModelConfig(trained="yes")
    with pytest.raises(ValueError, match="hidden_sizes"):
        ModelConfig(hidden_sizes=())
    with pytest.raises(ValueError, match="hidden_sizes"):
        ModelConfig(hidden_sizes=(8, 0))


def test_the_default_model_is_the_trained_net_and_says_so():
    assert ModelConfig().trained and ModelConfig().describe() == "trained tf net"
    untrained = ModelConfig(kind="numpy", trained=False, hidden_sizes=(32, 16), seed=3)
    assert untrained.describe() == "untrained numpy net 32x16 (seed 3)"


def test_run_spec_surfaces_the_backends_own_checks():
    with pytest.raises(ValueError, match="num_servers=10000 is more than"):
        RunSpec("r", "g", "ray", num_servers=10_000)
    with pytest.raises(ValueError, match="backend must be None"):
        RunSpec("r", "g", "gpu")
    with pytest.raises(ValueError, match="max_batch_size"):
        RunSpec("r", "g", None, max_batch_size=0)
    with pytest.raises(ValueError, match="total_gpu_frac"):
        RunSpec("r", "g", "ray", total_gpu_frac=1.5)


def test_run_spec_gives_run_searches_its_arguments():
    spec = RunSpec("p", "g", "process", num_procs=2, max_batch_size=64, max_delay=0.001)
    kwargs = spec.runner_kwargs()
    assert kwargs["backend"] == "process" and kwargs["num_procs"] == 2
    assert kwargs["max_batch_size"] == 64 and kwargs["max_delay"] == 0.001
    assert not spec.is_baseline and RunSpec("s", "g").is_baseline


def test_an_experiment_needs_a_run_and_a_trained_net_for_its_problem():
    with pytest.raises(ValueError, match="at least one run"):
        Experiment("t", SearchConfig(), ModelConfig(), ())
    with pytest.raises(ValueError, match="trained heuristic is for the 15-puzzle"):
        Experiment("t", SearchConfig(puzzle_size=3), ModelConfig(), (RunSpec("s", "g"),))
    Experiment("t", SearchConfig(puzzle_size=3), ModelConfig(trained=False),
               (RunSpec("s", "g"),))
