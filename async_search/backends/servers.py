"""The model servers of a run, as ``on_servers`` sees them: push new weights to all.

``run_searches(..., on_servers=callback)`` calls ``callback(servers)`` in the calling
process as soon as the run's servers serve. ``servers`` is a ``ModelServers``: ``await
servers.update_model(weights, version)`` swaps the model of every server of the run
(local and process: every device worker of the one server here; Ray: every live server
actor) and returns once each has swapped, so that every request made after it returns
is computed by the new model. A training loop pushes each iteration this way while the
searches go on.

Example:
    >>> import numpy as np
    >>> from async_search import run_searches
    >>> from async_search.base import evaluate_with_version
    >>> from async_search.models import MLP
    >>> async def search(start, evaluate):     # runs until the new model answers
    ...     while True:
    ...         x = np.full((1, 4), start, np.float32)
    ...         _, version = await evaluate_with_version(evaluate, x)
    ...         if version == 1:
    ...             return version
    ...         await asyncio.sleep(0.001)
    >>> async def trainer(servers):            # a training loop pushes each iteration
    ...     await servers.update_model(MLP((4,)), 1)
    >>> run_searches(search, [1.0, 2.0], lambda: MLP((4,)), on_servers=trainer)
    [1, 1]
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Awaitable, Callable, Hashable


#: ``push(model_or_weights, version)``: swaps the model of every server of a run and
#: returns once each has swapped.
Push = Callable[[Any, Hashable], Awaitable[None]]

#: ``on_servers(servers)``: called once, in the calling process, when a run's servers
#: serve. A coroutine (or any awaitable) it returns runs as a task beside the searches.
OnServers = Callable[["ModelServers"], Any]


class ModelServers:
    """Every model server of one run of searches; usable while the run lasts.

    Args:
        push: swaps the model of every server; returns once each has swapped.
        version: the version the servers start with (the model's ``version``, or 0).
        num_servers: how many servers the run started.
        backend: ``local``, ``process`` or ``ray``.
    """

    def __init__(self, push: Push, version: Hashable, num_servers: int, backend: str):
        self._push = push
        self._version = version
        self._num_servers = num_servers
        self._backend = backend
        self._lock = asyncio.Lock()  # pushes reach every server in the order made
        self._closed = False

    @property
    def version(self) -> Hashable:
        """The version last pushed (before any push: the servers' first version)."""
        return self._version

    @property
    def num_servers(self) -> int:
        """How many servers the run started (those that died since included)."""
        return self._num_servers

    @property
    def backend(self) -> str:
        return self._backend

    @property
    def closed(self) -> bool:
        """True once the run has ended: its servers are gone."""
        return self._closed

    async def update_model(self, model_or_weights: Any, version: Hashable) -> None:
        """Swaps the model of every server; returns once every server has swapped.

        A callable becomes the model; anything else is passed to each server's current
        model's ``with_weights(weights)``. Every request made after this returns is
        computed by the new model and reports ``version`` (``evaluate.with_version``);
        a request made before may be computed by either. Pushes made concurrently are
        applied one after another, in the order they were made. Ray: servers that died
        are skipped (their requests go to the survivors, which have swapped).

        Raises:
            RuntimeError: when the run has ended (its servers are gone).
            Exception: what a server's swap raised (e.g. a TypeError for weights whose
                model has no ``with_weights``); servers that swapped keep the new model.
        """
        self._require_open()
        async with self._lock:
            self._require_open()
            await self._push(model_or_weights, version)
            self._version = version

    def close(self) -> None:
        """Makes every later ``update_model`` raise (the run's servers are stopping)."""
        self._closed = True

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError(
                f"the {self._backend} run these servers belonged to has ended: "
                f"ModelServers.update_model works only while run_searches runs (push from "
                f"the on_servers callback, or from a task it starts)")

    def __repr__(self) -> str:
        state = "closed" if self._closed else "serving"
        return (f"ModelServers(backend={self._backend!r}, num_servers={self._num_servers}, "
                f"version={self._version!r}, {state})")


class ServersHook:
    """A runner's side of ``on_servers``: hands it the servers, runs and ends its task.

    A runner calls ``serving(...)`` once its servers serve and ``await finish()`` before
    they stop (on every path). An error from the callback's task is kept in ``error``
    and reported through ``on_error`` (``run_searches_async`` cancels the run with it).
    """

    def __init__(self, on_servers: OnServers):
        if not callable(on_servers):
            raise TypeError(f"on_servers must be a callable taking the run's ModelServers, "
                            f"got {type(on_servers).__name__}")
        self._on_servers = on_servers
        self.servers: ModelServers | None = None
        self.error: BaseException | None = None
        self.on_error: Callable[[], None] | None = None
        self._task: asyncio.Future | None = None

    def serving(self, push: Push, version: Hashable, num_servers: int, backend: str) -> None:
        """Calls ``on_servers`` with a new handle (what it raises, the runner raises);
        an awaitable it returns is run as a task."""
        self.servers = ModelServers(push, version, num_servers, backend)
        result = self._on_servers(self.servers)
        if inspect.isawaitable(result):
            self._task = asyncio.ensure_future(result)
            self._task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Future) -> None:
        if task.cancelled() or task.exception() is None or self.error is not None:
            return
        self.error = task.exception()
        if self.on_error is not None:
            self.on_error()

    async def finish(self) -> None:
        """Cancels the callback's task if it still runs, waits for it to end, and closes
        the handle. Idempotent."""
        task = self._task
        try:
            if task is not None and not task.done():
                task.cancel()
                await asyncio.wait({task})
        finally:
            if self.servers is not None:
                self.servers.close()
