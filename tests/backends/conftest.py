"""The ``backend`` fixture: every shared scenario runs once on each backend.

``tests/backends/test_backends.py`` holds the scenarios that must hold on every backend
(results in the order of the starts, failures named by start, progress, several
servers...); the other modules keep what only one backend has (a client process that
dies, an unpicklable search function, a Ray actor killed mid-run).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import pytest

import async_search as asr
from tests.helpers import within

__all__ = ["Backend", "backend", "BACKEND_NAMES"]

#: Every backend ``run_searches`` has, in the order the fixture runs them.
BACKEND_NAMES = ("local", "process", "ray")

#: Bound on one run of ``Backend.run_async``: Ray's first run starts workers (seconds).
RUN_S = 120.0


@dataclasses.dataclass(frozen=True)
class Backend:
    """One backend and the defaults the shared scenarios run it with.

    Attributes:
        name: ``local``, ``process`` or ``ray`` (``run_searches``'s ``backend``).
        num_procs: client processes (or Ray tasks) the starts are split over: 1 for
            local (it has none), 2 elsewhere, so that the split is exercised.
    """

    name: str
    num_procs: int

    def options(self, **kwargs: Any) -> dict:
        """``run_searches``'s keyword arguments: this backend's, updated by ``kwargs``."""
        return {"backend": self.name, "num_procs": self.num_procs, **kwargs}

    def run(self, search_fn: Callable, starts: Sequence[Any], model_factory: Callable,
            **kwargs: Any) -> asr.SearchResults:
        """``asr.run_searches`` on this backend (bounded by the test's timeout)."""
        return asr.run_searches(search_fn, starts, model_factory, **self.options(**kwargs))

    async def run_async(self, search_fn: Callable, starts: Sequence[Any],
                        model_factory: Callable, *, timeout: float = RUN_S,
                        **kwargs: Any) -> asr.SearchResults:
        """``await asr.run_searches_async`` on this backend, bounded by ``timeout``."""
        return await within(
            asr.run_searches_async(search_fn, starts, model_factory,
                                   **self.options(**kwargs)),
            f"run_searches_async on the {self.name} backend", timeout=timeout)


@pytest.fixture(params=[
    "local",
    "process",
    # Starting Ray costs seconds: its runs are slow (tests/conftest.py marks them too).
    pytest.param("ray", marks=pytest.mark.slow),
])
def backend(request) -> Backend:
    """Each backend in turn; Ray's runs share the session's one Ray (``ray_session``)."""
    name = request.param
    if name == "ray":
        request.getfixturevalue("ray_session")  # skips when Ray is not installed
    return Backend(name, num_procs=1 if name == "local" else 2)
