"""Fixtures shared by every test package."""

import os
import shutil
import tempfile

import pytest

# torch.compile's cache (about 2 GB after a few runs) goes to a folder of this session's,
# removed at its end, not to /tmp/torchinductor_<user> where it outlives every run.
# Set at import, before any test compiles; child processes inherit it.
_OWN_INDUCTOR_CACHE = None
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _OWN_INDUCTOR_CACHE = tempfile.mkdtemp(prefix="async-search-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _OWN_INDUCTOR_CACHE


def pytest_sessionfinish(session, exitstatus):
    if _OWN_INDUCTOR_CACHE is not None:
        shutil.rmtree(_OWN_INDUCTOR_CACHE, ignore_errors=True)


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
