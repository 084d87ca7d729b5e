"""Fixtures shared by every test package."""

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray session for every test that asks for it (starting Ray costs
    seconds); shut down after the last test, if it was started here."""
    ray = pytest.importorskip("ray")
    from async_search.ray_init import ensure_ray

    started_here = not ray.is_initialized()
    ensure_ray()
    yield ray
    if started_here:
        ray.shutdown()


#: Test modules that run whole experiments, the notebook or training loops (minutes).
SLOW_MODULES = {"test_main.py", "test_notebook.py", "test_commander.py"}


def pytest_collection_modifyitems(config, items):
    """Marks the slow tests ``slow``: whole experiments, the notebook, training runs, and
    everything on Ray (starting it costs seconds). ``python -m pytest`` runs them all;
    ``python -m pytest -m "not slow"`` is the quick loop while editing."""
    slow = pytest.mark.slow
    for item in items:
        on_ray = "ray_session" in item.fixturenames or "[ray" in item.nodeid or (
            "-ray" in item.nodeid)
        if item.path.name in SLOW_MODULES or on_ray:
            item.add_marker(slow)
