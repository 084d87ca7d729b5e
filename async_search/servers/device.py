"""The device thread: runs the model off the event loop, one batch after another."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, Callable

__all__ = ["DeviceThread", "InlineDevice"]

#: Called on the event loop with (token, outputs or None, exception or None, seconds).
Done = Callable[[Any, Any, BaseException | None, float], None]

_STOP = object()


class DeviceThread:
    """One thread that owns a device: it runs ``model(batch)`` for each submitted batch.

    Results go back to the event loop with ``call_soon_threadsafe``, so the loop is woken
    by the result itself, never by polling. Batches run in the order submitted. Use it
    as a context manager (``start``/``stop``): the thread ends with it.

    Example:
        >>> # inside a coroutine
        >>> # with DeviceThread(model, loop) as device:
        >>> #     device.submit(token, batch, on_done)
    """

    def __init__(self, model: Callable[[Any], Any], loop: asyncio.AbstractEventLoop,
                 name: str = "async_search-device"):
        self.model = model
        self._loop = loop
        self._jobs: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "DeviceThread":
        self._thread.start()
        return self

    def submit(self, token: Any, batch: Any, done: Done) -> None:
        """Run ``model(batch)``; then ``done(token, outputs, error, seconds)`` on the loop."""
        self._jobs.put((token, batch, done))

    def stop(self, timeout: float | None = None) -> None:
        """Finish the batches already submitted, then end the thread."""
        if self._thread.is_alive():
            self._jobs.put(_STOP)
            self._thread.join(timeout)

    def __enter__(self) -> "DeviceThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        jobs, model, loop = self._jobs, self.model, self._loop
        while True:
            job = jobs.get()
            if job is _STOP:
                return
            token, batch, done = job
            start = time.perf_counter()
            try:
                outputs, error = model(batch), None
            except BaseException as e:  # noqa: BLE001 - handed to the requests it fails
                outputs, error = None, e
            seconds = time.perf_counter() - start
            try:
                loop.call_soon_threadsafe(done, token, outputs, error, seconds)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return


class InlineDevice:
    """Runs the model on the event loop itself, with DeviceThread's interface.

    For models that take microseconds, where the thread handoff (tens of microseconds
    per batch) costs more than the model; searches stand still while it runs.
    """

    def __init__(self, model: Callable[[Any], Any], loop: asyncio.AbstractEventLoop):
        self.model = model
        self._loop = loop

    def start(self) -> "InlineDevice":
        return self

    def stop(self, timeout: float | None = None) -> None:
        pass

    def submit(self, token: Any, batch: Any, done: Done) -> None:
        """Runs ``model(batch)`` now and calls ``done`` with the result."""
        start = time.perf_counter()
        try:
            outputs, error = self.model(batch), None
        except Exception as e:  # noqa: BLE001 - handed to the requests it fails
            outputs, error = None, e
        done(token, outputs, error, time.perf_counter() - start)
