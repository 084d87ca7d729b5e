"""The device workers of one server: started, added, removed and swapped while serving."""

from __future__ import annotations

import asyncio
import queue
from typing import Any, Callable, Hashable, List

from async_search.servers.device import STOP, DeviceThread, Done, InlineDevice

__all__ = ["Workers"]


class Workers:
    """The device threads of a server, fed from one job queue (or one inline device).

    Args:
        model: the model every worker starts with (``add`` may give a worker its own).
        version: the model's version, reported with every batch it computes.
        loop: the event loop that results are delivered to.
        threaded: False runs the model on the loop (one inline device, no threads).
    """

    def __init__(self, model: Any, version: Hashable, loop: asyncio.AbstractEventLoop,
                 threaded: bool = True):
        self.version = version
        self._model = model
        self._loop = loop
        self._threaded = threaded
        self._jobs: "queue.SimpleQueue" = queue.SimpleQueue()
        self._threads: List[DeviceThread] = []
        self._inline = None if threaded else InlineDevice(model, version)
        self._exited: List[asyncio.Future] = []  # removals waiting for a thread to end

    def __len__(self) -> int:
        return len(self._threads) if self._threaded else 1

    @property
    def model(self) -> Any:
        return self._model

    def add(self, model: Any = None) -> None:
        """Starts one more device thread, with its own ``model`` or the current one."""
        if not self._threaded:
            raise RuntimeError("a server whose model runs on the loop has one device; "
                               "serve with model_thread=True to add workers")
        thread = DeviceThread(model if model is not None else self._model, self.version,
                              self._jobs, self._loop, self._on_exit,
                              name=f"async_search-device-{len(self._threads)}")
        self._threads.append(thread.start())

    async def remove(self) -> None:
        """Ends one device thread after the batches queued before this call.

        Raises:
            RuntimeError: when it would leave no worker.
        """
        if len(self) <= 1:
            raise RuntimeError("cannot remove the last worker of a serving server")
        exited = self._loop.create_future()
        self._exited.append(exited)
        self._jobs.put(STOP)
        await exited

    def submit(self, token: Any, batch: Any, done: Done) -> None:
        """Queues ``model(batch)`` for the next free worker; ``done`` gets the result."""
        if self._inline is not None:
            self._inline.run(token, batch, done)
        else:
            self._jobs.put((token, batch, done))

    def set_model(self, model_or_weights: Any, version: Hashable) -> None:
        """Swaps every worker's model between batches.

        A callable replaces the model; anything else is passed to the current model's
        ``with_weights``, which returns the new model.
        """
        devices = self._threads if self._inline is None else [self._inline]
        if callable(model_or_weights):
            new_models = [model_or_weights] * len(devices)
            self._model = model_or_weights
        else:
            new_models = [_with_weights(d.model, model_or_weights) for d in devices]
            self._model = _with_weights(self._model, model_or_weights)
        for device, model in zip(devices, new_models):
            device.set_model(model, version)
        self.version = version

    def stop(self, timeout: float = 30.0) -> None:
        """Ends every thread after the batches already queued."""
        for _ in self._threads:
            self._jobs.put(STOP)
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []

    def _on_exit(self, thread: DeviceThread) -> None:
        if thread in self._threads:
            self._threads.remove(thread)
        if self._exited:
            waiter = self._exited.pop(0)
            if not waiter.done():
                waiter.set_result(None)


def _with_weights(model: Any, weights: Any) -> Any:
    with_weights: Callable[[Any], Any] | None = getattr(model, "with_weights", None)
    if with_weights is None:
        raise TypeError(
            f"update_model got {type(weights).__name__} weights, but the model "
            f"{type(model).__name__} has no with_weights(weights) method: pass a new "
            f"model instead")
    return with_weights(weights)
