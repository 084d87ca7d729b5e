"""Fixtures shared by the fault tests."""

import pytest


@pytest.fixture(scope="package")
def ray_session():
    """One Ray session for every fault test that asks for it (starting Ray costs
    seconds); shut down after the last test of this package, if it was started here."""
    ray = pytest.importorskip("ray")
    from async_search.backends.ray_backend import ensure_ray

    started_here = not ray.is_initialized()
    ensure_ray()
    yield ray
    if started_here:
        ray.shutdown()
