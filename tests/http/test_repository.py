import asyncio
import os
import threading

import numpy as np
import pytest

import async_search as asr
from async_search.errors import (LoadParametersError, ModelLoadError, ModelNotFoundError,
                                 ModelNotReadyError, RepositoryError)
from async_search.http.repository import (ModelRepository, ModelSource,
                                             default_max_workers, find_spec)
from async_search.models import MLP
from async_search.routing.cache import CachedEvaluate
from async_search.routing.router import Router
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)

MODEL = MLP((4,), hidden_sizes=(8,), output_size=2, seed=0)
X = np.ones((3, 4), np.float32)


async def test_sources_are_loaded_on_entry_and_closed_on_exit():
    made = []

    def factory():
        made.append(1)
        return MODEL

    async with ModelRepository({"a": ModelSource(factory),
                                "b": ModelSource(factory, load_on_start=False)}) as repo:
        assert repo.entry("a").ready and not repo.entry("b").ready and len(made) == 1
        server = repo.entry("a").server
        np.testing.assert_array_equal(await repo.entry("a").evaluate(X), MODEL(X))
        await repo.load("b")
        assert repo.entry("b").ready and len(made) == 2
        await repo.load("b")  # loaded: a no-op
        assert len(made) == 2
    assert server._closed and repo.entry("b").server is None


async def test_unload_drains_requests_in_flight():
    gate, started = threading.Event(), threading.Event()

    class Slow:
        input_spec = MODEL.input_spec

        def __call__(self, x):
            started.set()
            assert gate.wait(10)
            return MODEL(x)

    async with ModelRepository({"m": ModelSource(Slow)}) as repo:
        pending = asyncio.ensure_future(repo.entry("m").evaluate(X))
        await wait_until(started.is_set, "the request is in the model")
        unloading = asyncio.ensure_future(repo.unload("m"))
        await wait_until(lambda: not repo.entry("m").ready, "the unload begins")
        for _ in range(10):  # room for an unload that does not wait to finish
            await asyncio.sleep(0)
        assert not unloading.done()  # it waits for the request in the model
        gate.set()
        await asyncio.wait_for(unloading, 10)
        np.testing.assert_array_equal(await pending, MODEL(X))


async def test_an_evaluate_served_elsewhere_is_made_unavailable_not_closed():
    async with asr.serve(MODEL) as evaluate:
        async with ModelRepository({"m": evaluate}) as repo:
            await repo.unload("m")
            assert not repo.entry("m").ready
            await repo.load("m")
            assert repo.entry("m").evaluate is evaluate
        np.testing.assert_array_equal(await evaluate(X), MODEL(X))  # still serving


async def test_load_errors_say_what_went_wrong():
    def broken():
        raise OSError("weights file missing")

    async with ModelRepository({"m": ModelSource(broken, load_on_start=False),
                                "ok": ModelSource(lambda: MODEL)}) as repo:
        with pytest.raises(ModelLoadError, match="loading model 'm' failed: OSError: "
                                                 "weights file missing") as info:
            await repo.load("m")
        assert isinstance(info.value.__cause__, OSError)
        assert repo.index()[0] == {"name": "m", "version": "", "state": "UNAVAILABLE",
                                   "reason": "OSError: weights file missing"}
        with pytest.raises(ModelNotFoundError, match="unknown model 'x'"):
            await repo.load("x")
        with pytest.raises(LoadParametersError, match=r"num_workers must be an integer in "
                                                      r"\[1, \d+\]"):
            await repo.load("ok", {"num_workers": 0})
        await repo.load("ok", {"num_workers": 3})
        assert repo.entry("ok").server.num_workers == 3
        await repo.load("ok", {"num_workers": 1})
        assert repo.entry("ok").server.num_workers == 1


async def test_load_parameters_are_bounded_by_max_workers():
    async with ModelRepository({"m": ModelSource(lambda: MODEL)}, max_workers=3) as repo:
        for workers in (4, 300, 0, None, 2.0, "2", True):
            with pytest.raises(LoadParametersError, match=r"num_workers must be an integer "
                                                          r"in \[1, 3\]"):
                await repo.load("m", {"num_workers": workers})
        with pytest.raises(LoadParametersError, match="unknown load parameters"):
            await repo.load("m", {"num_workers": 2, "threads": 9})
        assert repo.entry("m").server.num_workers == 1
        await repo.load("m", {"num_workers": 3})
        assert repo.entry("m").server.num_workers == 3
    assert ModelRepository({}).max_workers == default_max_workers() == 4 * (
        os.cpu_count() or 1)
    with pytest.raises(ValueError, match="max_workers must be an integer >= 1"):
        ModelRepository({}, max_workers=0)


async def test_cache_capacity_puts_a_cache_in_front():
    async with ModelRepository({"m": ModelSource(lambda: MODEL, cache_capacity=10)}) as r:
        evaluate = r.entry("m").evaluate
        assert isinstance(evaluate, CachedEvaluate)
        await evaluate(X)
        assert evaluate.stats["deduplicated"] == 2  # three equal rows, computed once


async def test_specs_are_found_through_caches_and_routers():
    async with asr.serve(MODEL) as a:
        stacked = CachedEvaluate(Router({"a": a}), capacity=4)
        assert find_spec(stacked) == MODEL.input_spec
        assert find_spec(stacked, "output") == MODEL.output_spec
    assert find_spec(lambda x: x) is None


def test_bad_names_and_models_are_refused():
    with pytest.raises(ValueError, match="without '/'"):
        ModelRepository({"a/b": ModelSource(lambda: MODEL)})
    with pytest.raises(TypeError, match="must be a ModelSource or an evaluate function"):
        ModelRepository({"a": 3})
    with pytest.raises(ValueError, match="max_batch_size must be an integer >= 1"):
        ModelSource(lambda: MODEL, max_batch_size=0)


@pytest.mark.parametrize("names, message", [
    ("pv", "a tuple of non-empty strings"),   # was one output per character
    ((), "a tuple of non-empty strings"), (("p", 3), "a tuple of non-empty strings"),
    (("p", ""), "a tuple of non-empty strings"), (("p", "p"), "must differ")])
def test_output_names_that_cannot_name_the_outputs_are_refused(names, message):
    with pytest.raises(ValueError, match=message):
        ModelSource(lambda: MODEL, output_names=names)
    assert ModelSource(lambda: MODEL, output_names=["p", "v"]).output_names == ("p", "v")


def test_worker_counts_are_checked_where_the_source_is_made():
    # num_workers=0 failed only at load, as a ModelLoadError; 100,000 started threads.
    with pytest.raises(ValueError, match="num_workers must be an integer >= 1"):
        ModelSource(lambda: MODEL, num_workers=0)
    with pytest.raises(ValueError, match="needs model_thread=True"):
        ModelSource(lambda: MODEL, num_workers=2, model_thread=False)
    with pytest.raises(ValueError, match="num_workers=9, over max_workers=8"):
        ModelRepository({"m": ModelSource(lambda: MODEL, num_workers=9)}, max_workers=8)


async def test_unknown_names_and_versions_and_unloaded_models_raise_the_repository_errors():
    async with asr.serve(MODEL) as evaluate:
        async with ModelRepository({"m": evaluate,
                                    "later": ModelSource(lambda: MODEL,
                                                         load_on_start=False)}) as repo:
            assert repo.serving("m") is evaluate and repo.serving("m", "0") is evaluate
            assert repo.entry("m").version == "0"  # the server's first version
            with pytest.raises(ModelNotFoundError, match="unknown model 'x'"):
                repo.serving("x")
            with pytest.raises(ModelNotFoundError, match=r"model 'm' has no version '7': "
                                                         r"it serves version '0'"):
                repo.entry("m", "7")
            with pytest.raises(ModelNotReadyError, match="model 'later' is not loaded"):
                repo.serving("later")
            await repo.unload("m")
            with pytest.raises(ModelNotReadyError):
                repo.serving("m")
            for error in (ModelNotFoundError, ModelNotReadyError, ModelLoadError,
                          LoadParametersError):
                assert issubclass(error, RepositoryError)


async def test_a_function_that_reports_no_version_has_an_empty_protocol_version():
    async def plain(x):
        return MODEL(x)

    async with ModelRepository({"p": plain}) as repo:
        assert repo.entry("p").version == ""
        assert repo.index() == [{"name": "p", "version": "", "state": "READY",
                                 "reason": ""}]



async def test_a_model_is_built_off_the_loop_which_keeps_answering():
    # The factory ran on the loop: health checks, inference and signals waited for it.
    import time

    building = []

    def slow_factory():
        building.append(threading.current_thread())
        time.sleep(0.6)
        return MODEL

    gaps, last = [], time.monotonic()

    async def ticker():
        nonlocal last
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticking = asyncio.ensure_future(ticker())
    try:
        async with ModelRepository({"slow": ModelSource(slow_factory,
                                                        load_on_start=False)}) as repo:
            await repo.load("slow")
            assert repo.entry("slow").ready
    finally:
        ticking.cancel()
    assert gaps and max(gaps) < 0.3, max(gaps)
    assert not [t for t in threading.enumerate() if t.name.startswith("async_search-load")]
    assert building and all(t.daemon for t in building)  # a hung factory holds no exit


async def test_close_timeout_bounds_an_unload_whose_model_never_returns():
    import time

    release = threading.Event()
    started = threading.Event()

    def stuck(x):
        started.set()
        release.wait(30)
        return x

    source = ModelSource(lambda: asr.models.with_spec(stuck, (16,), np.float32),
                         model_thread=True)
    try:
        async with ModelRepository({"stuck": source}, close_timeout=0.3) as repo:
            request = asyncio.ensure_future(
                repo.entry("stuck").evaluate(np.zeros((1, 16), np.float32)))
            await asyncio.wait_for(asyncio.to_thread(started.wait, 10), 15)
            began = time.monotonic()
            await asyncio.wait_for(repo.unload("stuck"), 10)
            assert time.monotonic() - began < 3
            with pytest.raises(asr.ServerClosedError):
                await asyncio.wait_for(request, 5)
    finally:
        release.set()
    with pytest.raises(ValueError, match="close_timeout"):
        ModelRepository({}, close_timeout=-1)


async def test_a_factory_raising_stopiteration_fails_its_load():
    # An empty iterator's next() in a factory: the future refused StopIteration, and
    # the load (the repository's start, with load_on_start) waited for good.
    def factory():
        return next(iter(()))

    with pytest.raises(ModelLoadError, match="StopIteration"):
        await asyncio.wait_for(
            ModelRepository({"m": ModelSource(factory)}).__aenter__(), 10)


def gated_factory(gate: threading.Event, model=MODEL):
    """A factory that returns ``model`` once ``gate`` is set (a slow or hung build)."""
    def factory():
        gate.wait(30)
        return model
    return factory


async def test_a_load_that_ends_after_the_repository_closed_closes_what_it_started():
    # aclose skipped a model whose load was under way: its server and device thread
    # outlived the repository, and a load after the close was served too.
    gate = threading.Event()
    repo = ModelRepository({"m": ModelSource(gated_factory(gate), load_on_start=False,
                                             model_thread=True)})
    try:
        async with repo:
            loading = asyncio.ensure_future(repo.load("m"))
            await wait_until(lambda: repo.index()[0]["state"] == "LOADING", "loading")
    finally:
        gate.set()
    with pytest.raises(ModelNotReadyError, match="closed while it loaded"):
        await asyncio.wait_for(loading, 10)
    entry = repo.entry("m")
    assert not entry.ready and entry.server is None and entry.closer is None
    with pytest.raises(ModelNotReadyError, match="the repository is closed"):
        await repo.load("m")
    await wait_until(lambda: not [t for t in threading.enumerate()
                                  if t.name.startswith("async_search-device")],
                     "no device thread left")
    async with repo:  # entered again, it loads again
        await repo.load("m")
        assert repo.entry("m").ready


async def test_a_load_or_unload_under_way_refuses_another_at_once_when_told_not_to_wait():
    gate = threading.Event()
    async with ModelRepository({"m": ModelSource(gated_factory(gate),
                                                 load_on_start=False)}) as repo:
        try:
            loading = asyncio.ensure_future(repo.load("m"))
            await wait_until(lambda: repo.index()[0]["state"] == "LOADING", "loading")
            for change in (repo.load("m", wait=False), repo.unload("m", wait=False)):
                with pytest.raises(asr.ModelBusyError, match="model 'm' is loading now; "
                                                             "retry when that ends"):
                    await asyncio.wait_for(change, 1)
            waiting = asyncio.ensure_future(repo.unload("m"))  # waits, as before
            await asyncio.sleep(0.05)
            assert not waiting.done()
        finally:
            gate.set()
        await asyncio.wait_for(loading, 10)
        await asyncio.wait_for(waiting, 10)
        assert repo.index()[0]["state"] == "UNAVAILABLE" and not repo.entry("m").ready


async def test_num_workers_a_model_cannot_take_is_refused_before_it_loads():
    async with asr.serve(MODEL, model_thread=True) as external:
        async with ModelRepository({
                "loop": ModelSource(lambda: MODEL, model_thread=False,
                                    load_on_start=False),
                "ext": external}) as repo:
            with pytest.raises(LoadParametersError, match="runs on the loop"):
                await repo.load("loop", {"num_workers": 3})
            assert not repo.entry("loop").ready  # nothing loaded
            await repo.load("loop", {"num_workers": 1})
            assert repo.entry("loop").ready
            with pytest.raises(LoadParametersError, match="served by its owner"):
                await repo.load("ext", {"num_workers": 3})
        assert external.num_workers == 1  # the owner's server, as it was


async def test_a_factory_that_makes_an_async_function_fails_its_load():
    async def model(x):
        return x

    async with ModelRepository({"m": ModelSource(lambda: model,
                                                 load_on_start=False)}) as repo:
        with pytest.raises(ModelLoadError, match="'model', an async function: a model "
                                                 "is a plain function"):
            await repo.load("m")
        assert not repo.entry("m").ready


async def test_a_change_queued_behind_another_keeps_refusing_those_told_not_to_wait():
    # Between one change's release of the lock and the queued one's start, the lock
    # looked free: a load told not to wait queued behind a factory that never returned.
    gate = threading.Event()
    async with ModelRepository({"m": ModelSource(gated_factory(gate),
                                                 load_on_start=False)}) as repo:
        loop = asyncio.get_running_loop()
        release, ask = loop.create_future(), loop.create_future()

        async def holder():  # a change under way, ended when the test says
            async with repo._changing(repo.entry("m"), True, unloading=True):
                await release

        async def told_not_to_wait():
            await ask
            await repo.load("m", wait=False)

        held = asyncio.ensure_future(holder())
        await asyncio.sleep(0)
        queued = asyncio.ensure_future(repo.load("m"))  # its factory hangs
        refused = asyncio.ensure_future(told_not_to_wait())
        await asyncio.sleep(0.01)
        try:
            release.set_result(None)  # the holder lets go, the queued load is next
            ask.set_result(None)      # and a request comes in that very step
            with pytest.raises(asr.ModelBusyError, match="model 'm' is"):
                await asyncio.wait_for(refused, 2)
        finally:
            gate.set()
        await asyncio.wait_for(asyncio.gather(held, queued), 10)
        assert repo.entry("m").ready


async def test_a_loaded_model_whose_workers_change_stays_ready_in_the_index():
    # A load that only changed num_workers showed LOADING while the model answered,
    # and an unload meanwhile was told the model was loading.
    gate, started = threading.Event(), threading.Semaphore(0)

    def blocking(x):
        started.release()
        gate.wait(30)
        return MODEL(x)

    model = asr.models.with_spec(blocking, (4,), np.float32)
    async with ModelRepository({"m": ModelSource(lambda: model, model_thread=True,
                                                 num_workers=2, max_batch_size=1)}) as repo:
        evaluate = repo.entry("m").evaluate
        try:
            busy = [asyncio.ensure_future(evaluate(X[i:i + 1])) for i in range(2)]
            for _ in range(2):  # both workers in a batch
                assert await asyncio.to_thread(started.acquire, True, 10)
            resizing = asyncio.ensure_future(repo.load("m", {"num_workers": 1}))
            await wait_until(lambda: repo.entry("m").doing, "the change under way")
            assert repo.index()[0]["state"] == "READY" and repo.entry("m").ready
            with pytest.raises(asr.ModelBusyError,
                               match="model 'm' is changing its number of workers now"):
                await repo.unload("m", wait=False)
        finally:
            gate.set()
        await asyncio.wait_for(asyncio.gather(resizing, *busy), 10)
        assert repo.entry("m").server.num_workers == 1
