"""Device threads: run the model off the event loop, one batch after another.

Each DeviceThread owns one device and one model instance. The threads of a server take
batches from one shared job queue, so a free thread takes the next batch (work
stealing). A model may define ``load()`` and ``unload()``: each thread calls them around
its use of that model (acquire and release the device), on start, on stop and on a swap;
threads that share one model object call them once each.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, Callable, Hashable, Tuple

from async_search.errors import deliverable


#: Called on the event loop with (token, outputs or None, error or None, seconds, version).
Done = Callable[[Any, Any, BaseException | None, float, Hashable], None]

#: Put on the job queue to end the one thread that takes it.
STOP = object()


class DeviceThread:
    """A thread that runs ``model(batch)`` for the jobs it takes from a shared queue.

    A job is ``(token, batch, done)``; the result goes back to the event loop with
    ``call_soon_threadsafe(done, token, outputs, error, seconds, version)``, so the loop
    is woken by the result itself, never by polling. ``set_model`` swaps the model
    between two batches; the version reported with each batch is the one that ran it.
    """

    def __init__(self, model: Any, version: Hashable, jobs: "queue.SimpleQueue",
                 loop: asyncio.AbstractEventLoop, on_exit: Callable[["DeviceThread"], None],
                 name: str = "async_search-device", device: Any = None):
        self._current = (model, version)  # replaced whole, read whole: no lock needed
        #: The device this thread's model lives on (None: wherever the model is).
        self.device = device
        self._jobs = jobs
        self._loop = loop
        self._on_exit = on_exit
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def model(self) -> Any:
        return self._current[0]

    @property
    def name(self) -> str:
        return self._thread.name

    @property
    def current(self) -> Tuple[Any, Hashable]:
        """``(model, version)`` that the next batch this thread starts runs on."""
        return self._current

    def set_model(self, model: Any, version: Hashable) -> None:
        """Use ``model`` (as ``version``) from the next batch this thread starts."""
        self._current = (model, version)

    def start(self) -> "DeviceThread":
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        jobs, loop = self._jobs, self._loop
        loaded = None
        try:
            while True:
                job = jobs.get()
                if job is STOP:
                    return
                token, batch, done = job
                model, version = self._current
                start = time.perf_counter()
                try:
                    if model is not loaded:
                        # Loaded only once load returns: one that raised fails its
                        # batch and is tried again at the next, never run unloaded
                        # (nor unloaded at the end); an unload that raised lets go.
                        previous, loaded = loaded, None
                        _call_hook(previous, "unload")
                        _call_hook(model, "load")
                        loaded = model
                    outputs, error = model(batch), None
                except BaseException as e:  # noqa: BLE001 - handed to the requests it fails
                    # StopIteration, CancelledError, SystemExit...: wrapped so that the
                    # batch's futures can carry them (set_exception refuses some).
                    outputs, error = None, deliverable(e)
                seconds = time.perf_counter() - start
                try:
                    loop.call_soon_threadsafe(done, token, outputs, error, seconds, version)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    return
                # Handed to the loop: hold nothing of this batch while waiting for the
                # next (an idle server would keep its inputs and outputs alive, and
                # an error's traceback the model's frames), nor a model swapped out.
                job = token = batch = done = model = outputs = error = None
        finally:
            try:
                _call_hook(loaded, "unload")
            except Exception as e:  # noqa: BLE001 - to the loop, not a thread traceback
                _report(loop, f"{self._thread.name}: the model's unload raised", e)
            finally:  # even when unload raises, the server learns the thread is gone
                try:
                    loop.call_soon_threadsafe(self._on_exit, self)
                except RuntimeError:
                    pass


def _report(loop: asyncio.AbstractEventLoop, message: str, error: BaseException) -> None:
    """Hands ``error`` to the loop's exception handler (logged there, as asyncio does
    for a callback), from a device thread; nothing when the loop is closed."""
    try:
        loop.call_soon_threadsafe(loop.call_exception_handler,
                                  {"message": message, "exception": error})
    except RuntimeError:
        pass


def _call_hook(model: Any, name: str) -> None:
    hook = getattr(model, name, None)
    if hook is not None:
        hook()


class InlineDevice:
    """Runs the model on the event loop itself, for models that take microseconds.

    It saves the thread handoff (tens of microseconds per batch), but searches stand
    still while the model runs; it is the only device of its server.
    """

    def __init__(self, model: Any, version: Hashable, contain_exits: bool = False):
        self._current = (model, version)
        # Standing in for a device thread (model_thread="auto"): a SystemExit or
        # GeneratorExit the model raises fails its batch, as it would in the thread.
        self._contain_exits = contain_exits

    @property
    def model(self) -> Any:
        return self._current[0]

    def set_model(self, model: Any, version: Hashable) -> None:
        self._current = (model, version)

    def run(self, token: Any, batch: Any, done: Done) -> None:
        """Runs ``model(batch)`` now and calls ``done`` with the result."""
        model, version = self._current
        start = time.perf_counter()
        try:
            outputs, error = model(batch), None
        except (Exception, asyncio.CancelledError, GeneratorExit) as e:  # noqa: BLE001
            # A CancelledError or GeneratorExit raised by the model is an error of this
            # batch, not a cancellation or closing of the serving task (nothing can
            # cancel or close a plain call; the serving task took a GeneratorExit for
            # its loop's closing and left every request waiting); KeyboardInterrupt and
            # SystemExit go on up and crash the server.
            outputs, error = None, deliverable(e)
        except BaseException as e:
            # On the main thread a KeyboardInterrupt is Ctrl-C's and a SystemExit may be
            # a signal handler's: they stop the program. On a loop in another thread (a
            # Ray actor's), where no signal handler runs, they are the model's own and
            # fail its batch, as in a device thread: raised there, they ended the loop's
            # thread and left every client waiting.
            if threading.current_thread() is threading.main_thread() and (
                    not self._contain_exits or isinstance(e, KeyboardInterrupt)):
                raise
            outputs, error = None, deliverable(e)
        done(token, outputs, error, time.perf_counter() - start, version)
