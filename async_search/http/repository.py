"""A repository of named models that can be loaded and unloaded while serving.

Each name maps either to a ``ModelSource`` (a factory and serving options: loading
starts a BatchingServer that the repository owns, unloading drains and closes it) or to
an evaluate function that someone else serves (loading and unloading then only make it
available or not: the repository never closes what it did not open). The HTTP front
serves the repository; in-process searches can share the very same evaluate functions,
so that their requests and the network's join the same batches.

Load parameters are bounded: ``num_workers`` (device threads) must lie in
[1, ``max_workers``], by default 4 per usable CPU (``machine.usable_cpus``); a request
beyond that is the caller's error (``LoadParametersError``), not a reason to start
hundreds of threads.

Errors are the repository's own (``errors.RepositoryError``): ``ModelNotFoundError``
for an unknown name or version, ``ModelNotReadyError`` for a model not loaded,
``ModelLoadError`` when a load fails, ``LoadParametersError`` for bad load parameters,
``ModelBusyError`` for a load or unload refused while another is under way. The HTTP
front maps them to statuses (404, 503, 500, 400, 409).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from typing import Any, Callable, Dict, List, Mapping, Tuple

from async_search.base import TensorSpec, input_spec_of, output_spec_of, version_of
from async_search.checks import AsyncWithOnly, check_float, check_int, is_async
from async_search.errors import (CloseTimeoutError, LoadParametersError, ModelBusyError,
                                 ModelLoadError, ModelNotFoundError, ModelNotReadyError,
                                 deliverable)
from async_search.http.kserve import TensorMetadata, model_metadata, quoted, version_label
from async_search.machine import usable_cpus
from async_search.routing.cache import CachedEvaluate
from async_search.servers.batching import BatchingServer
from async_search.servers.policy import DispatchPolicy
from async_search.servers.workers import placement_of

_log = logging.getLogger(__name__)


def default_max_workers() -> int:
    """The default cap on ``num_workers`` in a load request: 4 per CPU."""
    return 4 * usable_cpus()


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """How a repository makes and serves a model when it is loaded.

    Attributes:
        factory: makes the model (``ndarray [n, ...] -> outputs``), called on each load.
        max_batch_size, max_delay, pipeline_depth, num_workers, model_thread: as in
            ``asr.serve``.
        cache_capacity: > 0 puts a ``CachedEvaluate`` of that many elements in front.
        load_on_start: load when the repository starts (else on a load request).
        input_name: the name of the model's input tensor in the protocol.
        output_names: names of its output tensors (default ``output``, or
            ``output_0``, ... for a tuple; dict keys name themselves).

    Example:
        >>> from async_search.models import MLP
        >>> ModelSource(lambda: MLP((16,), output_size=4), max_batch_size=128).num_workers
        1
    """

    factory: Callable[[], Any]
    max_batch_size: int = 256
    max_delay: float | None = None
    pipeline_depth: int = 2
    num_workers: int = 1
    model_thread: bool | str = "auto"
    cache_capacity: int = 0
    load_on_start: bool = True
    input_name: str = "input"
    output_names: Tuple[str, ...] | None = None

    def __post_init__(self):
        if not callable(self.factory):
            raise TypeError(f"factory must be a zero-argument callable that makes the "
                            f"model, got {type(self.factory).__name__}")
        DispatchPolicy(self.max_batch_size, self.max_delay, self.pipeline_depth)
        check_int("num_workers", self.num_workers, minimum=1)
        if self.num_workers > 1 and placement_of(self.model_thread) == "loop":
            raise ValueError("num_workers > 1 needs model_thread=True or 'auto'")
        if not isinstance(self.cache_capacity, int) or self.cache_capacity < 0:
            raise ValueError(f"cache_capacity must be an integer >= 0, got "
                             f"{self.cache_capacity!r}")
        if not isinstance(self.input_name, str) or not self.input_name:
            raise ValueError(f"input_name must be a non-empty string, got "
                             f"{self.input_name!r}")
        if self.output_names is not None:
            # a string would name one output per character
            names = self.output_names
            if isinstance(names, (str, bytes)) or not isinstance(names, (tuple, list)) \
                    or not names or not all(isinstance(n, str) and n for n in names):
                raise ValueError(f"output_names must be a tuple of non-empty strings, "
                                 f"one per output, got {names!r}")
            if len(set(names)) != len(names):
                raise ValueError(f"output_names must differ from each other (a client "
                                 f"asks for an output by name), got {names!r}")
            object.__setattr__(self, "output_names", tuple(names))


def find_spec(evaluate: Any, which: str = "input") -> TensorSpec | None:
    """The input (or output) spec behind an evaluate function, through caches and
    routers: its own ``input_spec``, its model's, or that of what it wraps."""
    spec_of = input_spec_of if which == "input" else output_spec_of
    seen = set()
    while evaluate is not None and id(evaluate) not in seen:
        seen.add(id(evaluate))
        spec = spec_of(evaluate)
        if isinstance(spec, TensorSpec):
            return spec
        model = getattr(evaluate, "model", None)
        spec = spec_of(model) if model is not None else None
        if isinstance(spec, TensorSpec):
            return spec
        inner = getattr(evaluate, "evaluate", None)
        if inner is None:
            servers = getattr(evaluate, "servers", None)
            inner = next(iter(servers.values()), None) if isinstance(servers, Mapping) \
                else None
        evaluate = inner
    return None


class ModelEntry:
    """One named model: what serves it now (None when unloaded) and its signature."""

    def __init__(self, name: str, source: ModelSource | None, evaluate: Any = None):
        self.name = name
        self.source = source
        self.evaluate: Any = evaluate      # what requests go to; None when unloaded
        self.external = evaluate           # served by its owner, when not from a source
        self.server: BatchingServer | None = None  # owned, when made from a source
        self.closer: contextlib.AsyncExitStack | None = None  # closes what it owns
        self.input_name = source.input_name if source else "input"
        self.output_names = source.output_names if source else None
        self.outputs: Tuple[TensorMetadata, ...] = ()  # learned from the first response
        self.lock = asyncio.Lock()
        self.reason = ""  # why the last load failed
        self.doing = ""     # what the change under way does, in words (busy messages)
        self.queued = 0     # loads and unloads waiting for the lock

    @property
    def ready(self) -> bool:
        return self.evaluate is not None

    @property
    def version(self) -> str:
        """The version of the model now serving, as the protocol spells it
        (``kserve.version_label``); empty when unloaded or unknown."""
        return version_label(version_of(self.evaluate)) if self.evaluate is not None \
            else ""

    @property
    def input_spec(self) -> TensorSpec | None:
        return find_spec(self.evaluate, "input")

    @property
    def output_spec(self) -> TensorSpec | None:
        return find_spec(self.evaluate, "output")

    def metadata(self) -> Mapping[str, Any]:
        """The model metadata, as the protocol's JSON spells it (``kserve.model_metadata``):
        what the HTTP and the gRPC fronts answer."""
        spec, out_spec = self.input_spec, self.output_spec
        inputs = [TensorMetadata.of_spec(self.input_name, spec)] if spec else [
            TensorMetadata(self.input_name, "", (-1,))]
        if out_spec is not None:
            name = self.output_names[0] if self.output_names else "output"
            outputs = (TensorMetadata.of_spec(name, out_spec),)
        else:
            outputs = self.outputs
        # "": a function that reports no version has none to list
        versions = [self.version] if self.ready and self.version else []
        return model_metadata(self.name, versions, inputs, outputs)


class ModelRepository(AsyncWithOnly):
    """Named models, loaded and unloaded while serving; owns the servers it starts.

    Use it as an async context manager: on entry it loads every source marked
    ``load_on_start``; on exit it drains and closes the servers it started.

    Args:
        models: name -> ``ModelSource`` (served and owned by the repository) or an
            evaluate function (served by its owner; made available or not).
        max_workers: the most ``num_workers`` a load request may ask for;
            ``default_max_workers()`` (4 per CPU) when None.
        close_timeout: seconds an unload (and the exit) waits for a server to drain
            (None: as long as it takes). Past it, a model still in a batch (one that
            never returns) is left to its device thread, which ends when the model
            returns, and the requests still queued fail with ServerClosedError.
            ``HttpFront`` sets it to its shutdown grace (0 once a second signal ended
            the grace) before its exit closes the repository.

    Example:
        >>> import numpy as np
        >>> from async_search.models import MLP
        >>> async def main():
        ...     async with ModelRepository({"mlp": ModelSource(lambda: MLP((4,)))}) as repo:
        ...         y = await repo.entry("mlp").evaluate(np.zeros((2, 4), np.float32))
        ...         await repo.unload("mlp")
        ...         return y.shape, repo.entry("mlp").ready
        >>> asyncio.run(main())
        ((2, 1), False)
    """

    def __init__(self, models: Mapping[str, ModelSource | Any], *,
                 max_workers: int | None = None, close_timeout: float | None = None):
        if max_workers is None:
            max_workers = default_max_workers()
        if type(max_workers) is not int or max_workers < 1:
            raise ValueError(f"max_workers must be an integer >= 1, got {max_workers!r}")
        self.max_workers = max_workers
        if close_timeout is not None:
            close_timeout = check_float("close_timeout", close_timeout, minimum=0.0)
        self.close_timeout = close_timeout
        self._closed = False  # from aclose: no load starts a server any more
        self._entries: Dict[str, ModelEntry] = {}
        for name, model in models.items():
            if not isinstance(name, str) or not name or "/" in name:
                raise ValueError(f"model names must be non-empty strings without '/', "
                                 f"got {name!r}")
            if isinstance(model, ModelSource):
                if model.num_workers > max_workers:  # as for a load request's
                    raise ValueError(f"model {name!r} asks for num_workers="
                                     f"{model.num_workers}, over max_workers="
                                     f"{max_workers}")
                self._entries[name] = ModelEntry(name, model)
            elif callable(model):
                self._entries[name] = ModelEntry(name, None, model)
            else:
                raise TypeError(f"model {name!r} must be a ModelSource or an evaluate "
                                f"function, got {type(model).__name__}")

    @property
    def names(self) -> List[str]:
        return list(self._entries)

    def entry(self, name: str, version: str | None = None) -> ModelEntry:
        """The entry of ``name``; with ``version`` (as the protocol spells it), only
        while that version is the one serving (or the model is not loaded).

        Raises:
            ModelNotFoundError: for an unknown name, or another version than the one
                serving.
        """
        entry = self._entries.get(name)
        if entry is None:
            raise ModelNotFoundError(f"unknown model {quoted(name)}; served models: "
                                     f"{self.names}")
        if version is not None and entry.ready and version != entry.version:
            raise ModelNotFoundError(f"model {name!r} has no version {quoted(version)}: it "
                                     f"serves version {entry.version!r}")
        return entry

    def serving(self, name: str, version: str | None = None) -> Any:
        """The evaluate function that serves ``name`` (``version``) now.

        Raises:
            ModelNotFoundError: as ``entry``.
            ModelNotReadyError: when the model is not loaded.
        """
        evaluate = self.entry(name, version).evaluate
        if evaluate is None:
            raise ModelNotReadyError(f"model {name!r} is not loaded: load it with POST "
                                     f"/v2/repository/models/{name}/load")
        return evaluate

    async def __aenter__(self) -> "ModelRepository":
        self._closed = False
        try:
            for entry in self._entries.values():
                if entry.source is not None and entry.source.load_on_start:
                    await self.load(entry.name)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Unload every model the repository serves itself. A load under way then
        closes what it started and fails, and later loads are refused (until the
        repository is entered again)."""
        self._closed = True
        for entry in self._entries.values():
            if entry.closer is not None:
                await self.unload(entry.name)

    async def load(self, name: str, parameters: Mapping[str, Any] | None = None, *,
                   wait: bool = True) -> None:
        """Load ``name`` (a no-op when loaded); ``parameters`` may set ``num_workers``
        (an integer in [1, ``max_workers``]).

        Args:
            wait: False: refuse at once (``ModelBusyError``) while another load or
                unload of ``name`` is under way, instead of waiting for it (the HTTP
                front's way: a factory that hangs must not gather requests behind it).

        Raises:
            ModelNotFoundError: for an unknown model.
            ModelNotReadyError: the repository is closed.
            ModelBusyError: ``wait`` is False and a load or unload is under way.
            LoadParametersError: for bad parameters.
            ModelLoadError: when the factory or the server fails to start.
        """
        entry = self.entry(name)
        workers = _load_parameters(parameters, self.max_workers)
        if workers is not None:
            _check_workers(entry, workers)
        async with self._changing(entry, wait, unloading=False):
            if entry.evaluate is None:
                if self._closed:
                    raise ModelNotReadyError(f"model {name!r} cannot be loaded: the "
                                             f"repository is closed")
                if entry.source is None:
                    entry.evaluate = entry.external
                else:
                    await self._start(entry)
            if workers is not None:
                await _set_workers(entry, workers)

    async def unload(self, name: str, *, wait: bool = True) -> None:
        """Stop serving ``name``: new requests are refused at once; those in flight get
        their results (a server the repository started is drained and closed, within
        ``close_timeout``).

        Args:
            wait: as ``load``'s.

        Raises:
            ModelNotFoundError: for an unknown model.
            ModelBusyError: ``wait`` is False and a load or unload is under way.
        """
        entry = self.entry(name)
        async with self._changing(entry, wait, unloading=True):
            closer, server = entry.closer, entry.server
            entry.closer, entry.server, entry.evaluate = None, None, None
            if closer is None:
                return
            await self._close(name, server, closer)

    @contextlib.asynccontextmanager
    async def _changing(self, entry: ModelEntry, wait: bool, unloading: bool):
        """Holds ``entry``'s lock, with its state in the index meanwhile (LOADING,
        UNLOADING; a loaded model whose workers change stays READY). Not ``wait``:
        refused at once while another change holds the lock or waits for it."""
        if not wait and (entry.lock.locked() or entry.queued):
            raise ModelBusyError(f"model {entry.name!r} is "
                                 f"{entry.doing or 'loading or unloading'} now; retry "
                                 f"when that ends (/v2/repository/index shows its state)")
        entry.queued += 1
        try:  # counted until it holds the lock: a release wakes the next one later
            await entry.lock.acquire()
        finally:
            entry.queued -= 1
        try:
            entry.doing = ("unloading" if unloading else "loading"
                           if entry.evaluate is None else "changing its number of workers")
            yield
        finally:
            entry.doing = ""
            entry.lock.release()

    async def _close(self, name: str, server: BatchingServer | None,
                     closer: contextlib.AsyncExitStack) -> None:
        if server is not None and self.close_timeout is not None:
            # Bounded: a model that never returns would hold the unload (and a
            # front's exit, whatever the signals) for good.
            try:
                await server.aclose(timeout=self.close_timeout)
            except CloseTimeoutError as e:
                _log.warning("model %r: %s", name, e)
        await closer.aclose()  # drains the server's requests, then closes it

    async def _start(self, entry: ModelEntry) -> None:
        source = entry.source
        async with contextlib.AsyncExitStack() as stack:
            try:
                model = await _built(source.factory)
                if is_async(model):  # it would fail every request, and load as READY
                    name = getattr(model, "__name__", type(model).__name__)
                    raise TypeError(f"the factory made {name!r}, an async function: a "
                                    f"model is a plain function (the server calls it "
                                    f"in a thread, or on the loop, and awaits nothing)")
                server = await stack.enter_async_context(BatchingServer(
                    model, DispatchPolicy(source.max_batch_size, source.max_delay,
                                          source.pipeline_depth),
                    model_thread=source.model_thread, num_workers=source.num_workers))
                evaluate = CachedEvaluate(server, capacity=source.cache_capacity) if (
                    source.cache_capacity) else server
            except Exception as e:  # the stack closes a server that did start
                entry.reason = f"{type(e).__name__}: {e}"
                raise ModelLoadError(f"loading model {entry.name!r} failed: "
                                     f"{entry.reason}") from e
            closer = stack.pop_all()  # the server outlives this call: unload
        if self._closed:  # closed while the model was built: nothing may outlive it
            await self._close(entry.name, server, closer)
            raise ModelNotReadyError(f"model {entry.name!r} was not loaded: the "
                                     f"repository closed while it loaded")
        entry.closer = closer
        entry.reason = ""
        entry.server = server
        entry.outputs = ()
        entry.evaluate = evaluate

    def index(self) -> List[dict]:
        """Each model's name, version, state (READY or UNAVAILABLE; LOADING or
        UNLOADING while one is under way, as Triton's index says) and reason."""
        return [{"name": e.name, "version": e.version,
                 "state": _STATES.get(e.doing) or ("READY" if e.ready else "UNAVAILABLE"),
                 "reason": e.reason}
                for e in self._entries.values()]


#: The index's state while a change is under way (a loaded model whose workers change
#: stays READY).
_STATES = {"loading": "LOADING", "unloading": "UNLOADING"}


def answered_as_asked(name: str, asked: str | None, label: str) -> None:
    """Refuses an answer to a request that named a version (``asked``) when another
    version computed it (``label``, as the protocol spells it): the model was updated
    while the request waited, and a client that pins a version must not get another's
    outputs. The fronts answer it as they answer a version asked for after the swap.

    Raises:
        ModelNotFoundError: ``asked`` is not None and is not ``label``.

    Example:
        >>> answered_as_asked("m", None, "2"), answered_as_asked("m", "2", "2")
        (None, None)
    """
    if asked is None or label == asked:
        return
    by = (f"version {label!r} answered it" if label else
          "the rows were computed by two versions")
    raise ModelNotFoundError(f"model {name!r} has no version {quoted(asked)} any more: "
                             f"it was updated while the request waited, and {by}")


async def _built(factory: Callable[[], Any]) -> Any:
    """``factory()``, in a thread of its own: the loop keeps answering (health checks,
    inference on the other models, signals) while a model is built, which may take
    seconds. A load cancelled meanwhile leaves the thread to finish and drops its
    model; the thread is a daemon, so a factory that never returns holds no exit (an
    executor's thread is waited for when the interpreter exits)."""
    loop = asyncio.get_running_loop()
    built: asyncio.Future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not built.done():
            if error is None:
                built.set_result(result)
            else:  # StopIteration (an empty iterator's next) cannot go in a future
                built.set_exception(deliverable(error))

    def build() -> None:
        try:
            result, error = factory(), None
        except BaseException as e:  # noqa: BLE001 - the load reports it
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=build, name="async_search-load", daemon=True).start()
    return await built


def _load_parameters(parameters: Mapping[str, Any] | None,
                     max_workers: int) -> int | None:
    if not parameters:
        return None
    if not isinstance(parameters, Mapping):
        raise LoadParametersError(f"load parameters must be a JSON object, got "
                                  f"{type(parameters).__name__}")
    unknown = sorted(str(k)[:40] for k in set(parameters) - {"num_workers"})
    if unknown:
        raise LoadParametersError(f"unknown load parameters {unknown[:10]}: the only "
                                  f"load parameter is num_workers")
    if "num_workers" not in parameters:
        return None
    workers = parameters["num_workers"]
    if type(workers) is not int or not 1 <= workers <= max_workers:
        raise LoadParametersError(f"num_workers must be an integer in [1, {max_workers}] "
                                  f"(the repository's max_workers), got "
                                  f"{repr(workers)[:40]}")
    return workers


def _check_workers(entry: ModelEntry, workers: int) -> None:
    """``num_workers`` refused before anything starts: a model served by its owner is
    not the repository's to change, and a model on the loop has one device."""
    if entry.source is None:
        raise LoadParametersError(f"model {entry.name!r} is served by its owner: its "
                                  f"number of workers is not the repository's to change")
    if workers > 1 and placement_of(entry.source.model_thread) == "loop":
        raise LoadParametersError(f"model {entry.name!r} runs on the loop "
                                  f"(model_thread=False), with one device: num_workers "
                                  f"must be 1, got {workers}")


async def _set_workers(entry: ModelEntry, workers: int) -> None:
    server = entry.server
    if not hasattr(server, "add_worker"):
        raise LoadParametersError(f"model {entry.name!r} cannot change its number of "
                                  f"workers")
    while server.num_workers < workers:
        await server.add_worker()
    while server.num_workers > workers:
        await server.remove_worker()
