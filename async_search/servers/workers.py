"""The device workers of one server: started, added, removed and swapped while serving."""

from __future__ import annotations

import asyncio
import itertools
import queue
from typing import Any, Callable, Hashable, List

from async_search.base import made_from, on_device, replaces_model
from async_search.servers.device import STOP, DeviceThread, Done, InlineDevice


#: ``model_thread="auto"`` runs a batch on the loop while the model's measured time per
#: batch stays below this: under it, handing the batch to a thread and back costs more
#: than the searches would gain by running beside the model.
INLINE_BELOW_S = 200e-6

#: Where a server runs its model: ``thread`` (device threads), ``loop`` (on the event
#: loop), ``auto`` (on the loop while it is fast, else in the thread).
PLACEMENTS = ("thread", "loop", "auto")


def placement_of(model_thread: Any) -> str:
    """``model_thread`` (True, False or "auto") as a placement name.

    Raises:
        ValueError: for anything else.
    """
    if model_thread is True:
        return "thread"
    if model_thread is False:
        return "loop"
    if model_thread == "auto":
        return "auto"
    raise ValueError(f"model_thread must be True, False or 'auto', got {model_thread!r}")


class Workers:
    """The device threads of a server, fed from one job queue (or one inline device).

    Args:
        model: the model every worker starts with (``add`` may give a worker its own).
        version: the model's version, reported with every batch it computes.
        loop: the event loop that results are delivered to.
        placement: ``thread``, ``loop`` (one inline device, no threads) or ``auto``: a
            device thread, but a batch runs on the loop instead while the model's
            measured time per batch (a moving average over every batch, wherever it
            ran) is below ``INLINE_BELOW_S``, nothing is in the thread, there is one
            worker, and the model has no ``load``/``unload`` hooks (which belong to its
            thread).
        on_count: called with the number of device threads each time one starts or
            ends (a server's stats count worker-seconds with it).
    """

    def __init__(self, model: Any, version: Hashable, loop: asyncio.AbstractEventLoop,
                 placement: str = "thread",
                 on_count: Callable[[int], None] | None = None):
        self.version = version
        # Told the threads serving (len(self)) whenever a thread starts or ends: a
        # removal whose waiter was cancelled still ends its thread.
        self._on_count = on_count
        self._model = model
        self._loop = loop
        self.placement = placement
        self._threaded = placement != "loop"
        self._jobs: "queue.SimpleQueue" = queue.SimpleQueue()
        self._threads: List[DeviceThread] = []
        self._inline = None if placement == "thread" else InlineDevice(
            model, version, contain_exits=placement == "auto")
        self._exited: List[asyncio.Future] = []  # removals waiting for a thread to end
        self._ended: List[DeviceThread] = []  # threads that called back on their way out
        #: Threads given a model of their own (add(model=...)), until a swap gives every
        #: thread the new model: never the current model's source.
        self._own_model: set = set()
        self._all_exited: asyncio.Future | None = None  # set when the last one has
        self._stopping = False
        self._batch_s: float | None = None  # moving average of the model's time a batch
        self._in_thread = 0
        self._done: Done | None = None
        self._names = itertools.count()  # a removed thread's name is never reused
        #: Batches run on the loop and in device threads so far.
        self.batches_on_loop = 0
        self.batches_in_thread = 0

    def __len__(self) -> int:
        return len(self._threads) if self._threaded else 1

    @property
    def model(self) -> Any:
        return self._model

    @property
    def threaded(self) -> bool:
        """Whether batches may run in device threads (not only on the loop)."""
        return self._threaded

    @property
    def devices(self) -> List[Any]:
        """Each device thread's device (None: it runs the model it was given)."""
        return [thread.device for thread in self._threads]

    def add(self, model: Any = None, device: Any = None, *, copy: bool = False) -> None:
        """Starts one more device thread, with its own ``model`` (``copy``: a copy of
        the current model, made by the caller), or the current model's copy on
        ``device`` (``base.on_device``), or the current model. A thread with a
        ``device`` gets every later model as its copy on that device."""
        if not self._threaded:
            raise RuntimeError("a server whose model runs on the loop has one device; "
                               "serve with model_thread=True to add workers")
        if self._stopping:
            raise RuntimeError("the workers are stopping: no worker can be added")
        own = model is not None and not copy
        if model is None:
            model = self._model if device is None else on_device(self._model, device)
        thread = DeviceThread(model, self.version, self._jobs, self._loop, self._on_exit,
                              name=f"async_search-device-{next(self._names)}",
                              device=device)
        if own:
            self._own_model.add(thread)
        self._threads.append(thread.start())
        if self._on_count is not None:
            self._on_count(len(self))

    async def remove(self) -> None:
        """Ends one device thread after the batches queued before this call.

        Raises:
            RuntimeError: when it would leave no worker.
        """
        if len(self) - len(self._exited) <= 1:  # removals under way count as done
            raise RuntimeError("cannot remove the last worker of a serving server")
        exited = self._loop.create_future()
        self._exited.append(exited)
        self._jobs.put(STOP)
        await exited  # (the thread is joined once it has ended: see _on_exit)

    @property
    def batch_seconds(self) -> float | None:
        """The model's time per batch, a moving average (None before any batch)."""
        return self._batch_s

    def submit(self, token: Any, batch: Any, done: Done) -> None:
        """Queues ``model(batch)`` for the next free worker; ``done`` gets the result."""
        if not self._threaded:
            self.batches_on_loop += 1
            self._inline.run(token, batch, done)
            return
        if self._inline is None:
            self.batches_in_thread += 1
            self._jobs.put((token, batch, done))
            return
        self._done = done
        average = self._batch_s
        if (average is not None and average < INLINE_BELOW_S and not self._in_thread
                and len(self._threads) == 1
                # A model with load/unload hooks runs in its thread only, loaded there:
                # the thread's own (add_worker(model=...)), not only the first model.
                and not has_hooks(self._threads[0].current[0])):
            self.batches_on_loop += 1
            self._inline.set_model(*self._threads[0].current)  # the thread's model
            self._inline.run(token, batch, self._measured)
        else:
            self.batches_in_thread += 1
            self._in_thread += 1
            self._jobs.put((token, batch, self._from_thread))

    def _from_thread(self, token: Any, outputs: Any, error: BaseException | None,
                     seconds: float, version: Hashable) -> None:
        self._in_thread -= 1
        self._measured(token, outputs, error, seconds, version)

    def _measured(self, token: Any, outputs: Any, error: BaseException | None,
                  seconds: float, version: Hashable) -> None:
        average = self._batch_s
        self._batch_s = seconds if average is None else average + 0.25 * (seconds - average)
        self._done(token, outputs, error, seconds, version)

    def set_model(self, model_or_weights: Any, version: Hashable) -> None:
        """Swaps every worker's model between batches.

        A callable replaces the model (``base.replaces_model``); anything else, and a
        framework's net that the current adapter takes as weights, is passed to the
        current model's ``with_weights``, which returns the new model.
        """
        self.prepare_model(model_or_weights, version)()

    def prepare_model(self, model_or_weights: Any, version: Hashable,
                      ) -> Callable[[], None]:
        """Makes every worker's new model (``set_model``), swapping none: returns the
        swap, to call before anything else changes the workers (no await between).

        Raises:
            what making a new model raises (a model that cannot be placed, weights that
            do not fit); nothing has changed then.
        """
        workers = self._threads if self._threaded else [self._inline]
        # Every new model is made before any worker swaps: if one fails (a model that
        # cannot be placed, weights that do not fit), nothing has changed.
        made: dict = {}  # id(old model) -> its new model: one with_weights per model

        def renewed(old: Any) -> Any:
            if id(old) not in made:
                made[id(old)] = _with_weights(old, model_or_weights)
            return made[id(old)]

        replaced = replaces_model(self._model, model_or_weights)
        if replaced:  # its copy on each device
            devices = [getattr(w, "device", None) for w in workers]
            new_models = [model_or_weights if device is None
                          else on_device(model_or_weights, device) for device in devices]
            placed = [m for m, device in zip(new_models, devices) if device is not None]
            # The model itself while a worker runs it as it is; on a server of device
            # copies only, the first copy (a model no worker runs is not kept).
            current = placed[0] if placed and None not in devices else model_or_weights
        else:
            new_models = [renewed(w.model) for w in workers]
            current = renewed(self._model)
        if not self._threaded and has_hooks(current):
            raise ValueError(HOOKS_ON_LOOP)

        def swap() -> None:
            for worker, model in zip(workers, new_models):
                worker.set_model(model, version)
            self._model = current
            self.version = version
            if replaced:  # every thread runs the new model (or its copy); weights keep
                self._own_model.clear()  # an own model a thread's own, renewed

        return swap

    def stop(self, discard_queued: bool = False) -> List[Any]:
        """Tells every thread to end, without waiting: each ends once the batch it
        computes (and, unless ``discard_queued``, every batch queued before this call) is
        done, calling its model's ``unload`` on its way out. Returns the tokens of the
        batches discarded (never started). Cannot be interrupted (no await)."""
        discarded = []
        if discard_queued:
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not STOP:
                    discarded.append(job[0])
        self._stopping = True
        for _ in self._threads:  # one each (a second call: those above may be discarded)
            self._jobs.put(STOP)
        if not self._loop.is_closed():
            for waiter in self._exited:  # removals: their thread ends with the others
                if not waiter.done():
                    waiter.set_result(None)
        self._exited = []
        return discarded

    @property
    def running(self) -> List[str]:
        """Names of the device threads that have not ended yet."""
        return [thread.name for thread in self._threads]

    def ended(self) -> asyncio.Future:
        """A future (on the loop) that is done once every thread has ended; await it
        after ``stop`` (cancelling the wait stops nothing more: the threads end on their
        own). Then ``join_ended``."""
        if self._all_exited is None:
            self._all_exited = self._loop.create_future()
        if not self._threads and not self._all_exited.done():
            self._all_exited.set_result(None)
        return self._all_exited

    def join_ended(self) -> None:
        """Joins the threads that have ended (only their last steps remained: each
        called back on its way out, after unloading its model)."""
        for thread in self._ended:
            thread.join()
        self._ended = []

    def _on_exit(self, thread: DeviceThread) -> None:
        if thread in self._threads:
            self._threads.remove(thread)
            self._ended.append(thread)
            self._let_go_of(thread)
            # Only its last steps remain: joined then, whether or not its remover still
            # waits (one that stopped waiting kept it in the server for good).
            self._loop.call_soon(self.join_ended)
            if self._on_count is not None:
                self._on_count(len(self))
        if self._exited:
            waiter = self._exited.pop(0)
            if not waiter.done():
                waiter.set_result(None)
        if not self._threads and self._all_exited is not None:
            if not self._all_exited.done():
                self._all_exited.set_result(None)

    def _let_go_of(self, thread: DeviceThread) -> None:
        """Drops what an ended thread's model was kept by: the thread, the loop's
        device (which ran the first thread's model), and the current model when it
        was that thread's copy on its device (another live thread's copy of the current
        model is current then; never a model a thread was given as its own). A removed
        worker's copy (device memory) is freed now, not when the server closes."""
        model, version = thread.current
        thread.set_model(None, version)
        self._own_model.discard(thread)
        if self._inline is not None and self._inline.model is model:
            self._inline.set_model(self._model, self.version)
        if model is self._model and thread.device is not None:
            copies = [t.current[0] for t in self._threads
                      if t.device is not None and t not in self._own_model]
            if copies:
                self._model = copies[0]
                if self._inline is not None:
                    self._inline.set_model(self._model, self.version)


HOOKS_ON_LOOP = ("a model with load/unload hooks is loaded in its device thread: "
                  "serve it with model_thread=True or 'auto', not False")


def has_hooks(model: Any) -> bool:
    return hasattr(model, "load") or hasattr(model, "unload")


def _with_weights(model: Any, weights: Any) -> Any:
    with_weights: Callable[[Any], Any] | None = getattr(model, "with_weights", None)
    if with_weights is None:
        raise TypeError(
            f"update_model got {type(weights).__name__} weights, but the model "
            f"{type(model).__name__} has no with_weights(weights) method: pass a new "
            f"model instead")
    return made_from(model, with_weights(weights), "with_weights")
