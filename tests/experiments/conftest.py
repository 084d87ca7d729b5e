"""Tiny settings for the experiment tests: the NumPy net, a few short searches."""

import importlib.util

import pytest

from async_search.experiments import ModelConfig, SearchConfig

#: A NumPy net small enough that tests spend their time on the machinery, not the model.
TINY_MODEL = ModelConfig(kind="numpy", trained=False, hidden_sizes=(16,))


def tiny_search(search="astar", **overrides) -> SearchConfig:
    fields = dict(search=search, num_searches=3, gnn_budget=120, batch_size=4,
                  num_rollouts=2, rollout_depth=6, max_in_flight=8, scramble=30)
    fields.update(overrides)
    return SearchConfig(**fields)


def backend_available(name: str) -> bool:
    """Whether the lead's backend module exists (process and Ray arrive later)."""
    module = {"local": "async_search.backends.local",
              "process": "async_search.backends.process",
              "ray": "async_search.backends.ray_backend"}[name]
    return importlib.util.find_spec(module) is not None


def require_backend(name: str) -> None:
    if not backend_available(name):
        pytest.skip(f"the {name} backend is not in this checkout yet")
