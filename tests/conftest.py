"""Fixtures shared by every test package."""

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray session for every test that asks for it (starting Ray costs
    seconds); shut down after the last test, if it was started here."""
    ray = pytest.importorskip("ray")
    from async_search.backends.ray_backend import ensure_ray

    started_here = not ray.is_initialized()
    ensure_ray()
    yield ray
    if started_here:
        ray.shutdown()
