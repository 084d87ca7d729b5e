import importlib

import pytest

import async_search.experiments as experiments

MODULES = ["architectures", "params", "plots", "progress", "report",
           "runs", "selfplay", "suites", "topologies", "workloads"]


def test_the_package_exports_what_its_all_names():
    for name in experiments.__all__:
        assert hasattr(experiments, name), name


@pytest.mark.parametrize("module", MODULES)
def test_every_module_exports_what_its_all_names(module):
    mod = importlib.import_module(f"async_search.experiments.{module}")
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert not missing
