import asyncio
import gc
import json
import threading
import time
import weakref

import numpy as np
import pytest

import async_search as asr
from async_search.models import MLP, with_spec
from tests.helpers import wait_until, within

pytestmark = pytest.mark.timeout(60)


def _slow(x):
    time.sleep(0.05)  # a batch long enough for the worker-seconds to show
    return x[:, :1] + 0.0


#: A model of 50 ms a batch, for the fraction_in_model tests.
SLOW_MODEL = with_spec(_slow, (3,), np.float32)


class Recording:
    """A model that records which thread ran each batch and its load/unload calls."""

    def __init__(self, offset=0.0, delay=0.0):
        self.input_spec = asr.TensorSpec((1,), np.float32)
        self.offset = offset
        self.delay = delay
        self.events = []
        self.threads = set()
        self._lock = threading.Lock()

    def load(self):
        with self._lock:
            self.events.append(("load", threading.get_ident()))

    def unload(self):
        with self._lock:
            self.events.append(("unload", threading.get_ident()))

    def __call__(self, x):
        with self._lock:
            self.threads.add(threading.get_ident())
        if self.delay:
            threading.Event().wait(self.delay)
        return x + self.offset


async def many_requests(evaluate, count, spacing=0):
    async def one(i):
        for _ in range(spacing * (i % 4)):
            await asyncio.sleep(0)
        return await evaluate(np.full((1, 1), i, np.float32))
    return await asyncio.gather(*(one(i) for i in range(count)))


async def test_each_worker_loads_its_model_before_use_and_unloads_on_stop():
    model = Recording()
    async with asr.serve(model, num_workers=2) as evaluate:
        await many_requests(evaluate, 4)
    loads = [t for e, t in model.events if e == "load"]
    unloads = [t for e, t in model.events if e == "unload"]
    assert sorted(loads) == sorted(unloads) and len(set(loads)) == len(loads)
    assert set(loads) >= model.threads


async def test_an_unload_that_raises_at_the_end_goes_to_the_loops_handler(monkeypatch):
    # It escaped the device thread: "Exception in thread async_search-device-N" and a
    # traceback on stderr, outside the loop's exception handler.
    class UnloadFails:
        def load(self):
            pass

        def unload(self):
            raise RuntimeError("the device is gone")

        def __call__(self, x):
            return x * 2

    escaped, reported = [], []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    asyncio.get_running_loop().set_exception_handler(
        lambda loop, context: reported.append(context))
    async with asr.serve(UnloadFails(), model_thread=True) as evaluate:
        assert (await within(evaluate(np.ones((1, 1))), "an answer")).tolist() == [[2.0]]
    await asyncio.sleep(0)  # the report is handed to the loop
    assert not escaped
    assert [str(c["exception"]) for c in reported] == ["the device is gone"]
    assert "the model's unload raised" in reported[0]["message"]


class LoadsOnSecondTry(Recording):
    """Its first load raises (a device out of memory for a moment); it computes only
    when loaded."""

    def __init__(self):
        super().__init__()
        self.loaded = False

    def load(self):
        super().load()
        if len(self.events) == 1:
            raise RuntimeError("out of memory while loading")
        self.loaded = True

    def unload(self):
        super().unload()
        self.loaded = False

    def __call__(self, x):
        assert self.loaded, "ran without being loaded"
        return super().__call__(x)


async def test_a_load_that_raises_fails_its_batch_and_is_tried_again_never_skipped():
    model = LoadsOnSecondTry()
    async with asr.serve(model, max_batch_size=1, model_thread=True) as evaluate:
        with pytest.raises(RuntimeError, match="out of memory while loading"):
            await within(evaluate(np.zeros((1, 1), np.float32)), "the first batch")
        y = await within(evaluate(np.ones((1, 1), np.float32)), "the second")
    assert y.item() == 1.0
    assert [e for e, _ in model.events] == ["load", "load", "unload"]


async def test_several_workers_share_batches_from_one_queue():
    model = Recording(delay=0.02)
    async with asr.serve(model, max_batch_size=4, num_workers=3) as evaluate:
        ys = await many_requests(evaluate, 48)
        assert evaluate.stats["workers"] == 3
    assert [y.item() for y in ys] == list(range(48))
    assert len(model.threads) == 3


async def test_workers_can_be_added_and_removed_while_serving():
    model = Recording(delay=0.005)
    async with asr.serve(model, max_batch_size=2) as evaluate:
        running = asyncio.ensure_future(many_requests(evaluate, 64, spacing=1))
        await evaluate.add_worker()
        assert evaluate.num_workers == 2
        await asyncio.wait_for(evaluate.remove_worker(), 10)
        assert evaluate.num_workers == 1
        ys = await asyncio.wait_for(running, 20)
        with pytest.raises(RuntimeError, match="last worker"):
            await evaluate.remove_worker()
    assert [y.item() for y in ys] == list(range(64))


async def test_two_removals_at_once_leave_one_worker_that_still_serves():
    async with asr.serve(Recording(), num_workers=2) as evaluate:
        outcomes = await within(asyncio.gather(evaluate.remove_worker(),
                                               evaluate.remove_worker(),
                                               return_exceptions=True), "the removals")
        refused = [o for o in outcomes if isinstance(o, RuntimeError)]
        assert len(refused) == 1 and "last worker" in str(refused[0])
        assert evaluate.num_workers == 1
        y = await within(evaluate(np.ones((1, 1), np.float32)), "an answer")
    assert y.item() == 1.0


async def test_update_model_mid_run_fails_nothing_and_later_results_carry_new_version():
    old, new = Recording(offset=0.0, delay=0.002), Recording(offset=1000.0, delay=0.002)
    async with asr.serve(old) as evaluate:
        assert evaluate.version == 0
        results = []
        swapped = asyncio.Event()

        async def search(i):
            for step in range(20):
                x = np.full((1, 1), i, np.float32)
                asked_after_swap = swapped.is_set()
                y, version = await evaluate.with_version(x)
                results.append((asked_after_swap, y.item() - i, version))
                await asyncio.sleep(0)

        searches = asyncio.ensure_future(asyncio.gather(*(search(i) for i in range(64))))
        await wait_until(lambda: len(results) >= 200, "200 results before the swap",
                         timeout=30)
        evaluate.update_model(new, version=1)
        swapped.set()
        await asyncio.wait_for(searches, 30)
    assert len(results) == 64 * 20
    assert all(offset == (1000.0 if version == 1 else 0.0) for _, offset, version in results)
    assert all(version == 1 for after, _, version in results if after)
    assert {version for _, _, version in results} == {0, 1}


async def test_update_model_with_weights_uses_with_weights():
    model = MLP((2,), hidden_sizes=(3,), output_size=1, seed=0)
    zeros = [(np.zeros_like(w), np.zeros_like(b)) for w, b in model.weights]
    x = np.ones((1, 2), np.float32)
    async with asr.serve(model) as evaluate:
        before = await evaluate(x)
        evaluate.update_model(zeros, version="zeros")
        after, version = await evaluate.with_version(x)
    assert version == "zeros" and after.item() == 0.0 and before.item() != 0.0


async def test_update_model_with_weights_but_no_with_weights_names_the_fix():
    async with asr.serve(with_spec(lambda x: x, (1,), np.float32)) as evaluate:
        with pytest.raises(TypeError, match="pass a new model instead"):
            evaluate.update_model([np.zeros(2)], version=1)


async def test_swapped_model_is_loaded_and_the_old_one_unloaded():
    old, new = Recording(), Recording(offset=5.0)
    async with asr.serve(old) as evaluate:
        await evaluate(np.zeros((1, 1), np.float32))
        evaluate.update_model(new, version=2)
        assert (await evaluate(np.zeros((1, 1), np.float32))).item() == 5.0
        assert [e for e, _ in old.events] == ["load", "unload"]
    assert [e for e, _ in new.events] == ["load", "unload"]


def test_num_workers_must_be_positive_and_threaded():
    with pytest.raises(ValueError, match="num_workers must be an integer >= 1, got 0"):
        asr.servers.BatchingServer(Recording(), num_workers=0)
    with pytest.raises(ValueError, match="model_thread=True"):
        asr.servers.BatchingServer(Recording(), num_workers=2, model_thread=False)


async def test_request_split_across_a_model_swap_reports_no_single_version():
    v0 = MLP((6,), hidden_sizes=(16,), output_size=2, seed=10)
    v1 = MLP((6,), hidden_sizes=(16,), output_size=2, seed=11)
    gate, started = threading.Event(), threading.Event()

    def gated_v0(x):
        started.set()
        assert gate.wait(10)
        return v0(x)

    x = np.random.default_rng(0).standard_normal((6, 6)).astype(np.float32)
    async with asr.serve(with_spec(gated_v0, (6,), np.float32), max_batch_size=4,
                         pipeline_depth=1) as evaluate:
        split = asyncio.ensure_future(evaluate.with_version(x))  # batches of 4 and 2
        assert await asyncio.to_thread(started.wait, 10)  # v0 is running the first
        evaluate.update_model(v1, version=1)
        gate.set()
        y, version = await asyncio.wait_for(split, 10)
        whole, whole_version = await evaluate.with_version(x[:2])
    assert version is None
    np.testing.assert_array_equal(y[:4], v0(x[:4]))
    np.testing.assert_array_equal(y[4:], v1(x[4:]))
    assert whole_version == 1 and np.array_equal(whole, v1(x[:2]))


async def test_queue_wait_of_the_first_batch_is_measured_from_the_start():
    async with asr.serve(with_spec(lambda x: x, (1,), np.float32)) as evaluate:
        await evaluate(np.zeros((2, 1), np.float32))
        stats = evaluate.stats
        # Measured from the start, not from 0: no wait outlasts the server itself.
        assert 0 <= stats["queue_wait_max_s"] <= stats["wall_time_s"]
        assert evaluate.stats["requests"] == 1


# -- model_thread="auto": on the loop while the model is fast, else in the thread --------

class Where:
    """Doubles its input; records the thread of each call; sleeps ``delay`` s a call
    from call ``slow_from`` on."""

    def __init__(self, delay=0.0, slow_from=0):
        self.input_spec = asr.TensorSpec((2,), np.float32)
        self.delay, self.slow_from = delay, slow_from
        self.threads = []

    def __call__(self, x):
        self.threads.append(threading.current_thread().name)
        if self.delay and len(self.threads) > self.slow_from:
            import time
            time.sleep(self.delay)  # stands for a model that computes this long
        return x * 2


async def sequential(evaluate, count, value=1.0):
    out = []
    for i in range(count):
        out.append(await asyncio.wait_for(evaluate(np.full((1, 2), value + i,
                                                           np.float32)), 10))
    return out


async def test_auto_runs_a_fast_model_on_the_loop_after_measuring_it_in_the_thread():
    model = Where()
    async with asr.serve(model) as evaluate:  # model_thread="auto" is the default
        ys = await sequential(evaluate, 20)
        stats = evaluate.stats
    assert [y.tolist() for y in ys] == [[[2 * (1.0 + i)] * 2] for i in range(20)]
    assert model.threads[0].startswith("async_search-device")  # unknown: not on the loop
    assert stats["model_placement"] == "auto"
    assert stats["batches_in_thread"] + stats["batches_on_loop"] == 20
    # Microseconds a batch: on the loop from then on (a preempted call on a loaded
    # machine may send one or two back to the thread).
    assert model.threads.count(threading.main_thread().name) == stats["batches_on_loop"]
    assert stats["batches_on_loop"] >= 15


async def test_auto_keeps_a_slow_model_in_the_thread_and_moves_back_when_it_slows():
    slow = Where(delay=0.002)
    async with asr.serve(slow) as evaluate:
        await sequential(evaluate, 6)
        assert evaluate.stats["batches_on_loop"] == 0
    assert all(t.startswith("async_search-device") for t in slow.threads)
    turning = Where(delay=0.005, slow_from=8)  # fast for 8 calls, then 5 ms a call
    async with asr.serve(turning) as evaluate:
        await sequential(evaluate, 20)
    loop_name = threading.main_thread().name
    assert loop_name in turning.threads[1:8]  # fast: on the loop
    assert turning.threads[-1] != loop_name  # slow again: back in the thread
    assert all(t != loop_name for t in turning.threads[12:])


async def test_auto_never_runs_on_the_loop_a_model_with_hooks_or_with_several_workers():
    hooked = Recording()
    async with asr.serve(hooked) as evaluate:
        for i in range(5):
            await asyncio.wait_for(evaluate(np.full((1, 1), i, np.float32)), 10)
        assert evaluate.stats["batches_on_loop"] == 0
    assert threading.main_thread().ident not in hooked.threads
    two = Where()
    async with asr.serve(two, num_workers=2) as evaluate:
        await sequential(evaluate, 6)
        assert evaluate.stats["batches_on_loop"] == 0


async def test_auto_on_the_loop_runs_the_model_a_swap_installed():
    model = with_spec(lambda x: x * 2.0, (2,), np.float32)
    async with asr.serve(model) as evaluate:
        await sequential(evaluate, 5)
        evaluate.update_model(with_spec(lambda x: x * 3.0, (2,), np.float32), 1)
        y, version = await asyncio.wait_for(
            evaluate.with_version(np.ones((1, 2), np.float32)), 10)
        assert evaluate.stats["batches_on_loop"] >= 1
    assert (y.tolist(), version) == ([[3.0, 3.0]], 1)


@pytest.mark.parametrize("bad", [None, "yes", 1, 0, "thread"])
def test_model_thread_takes_true_false_or_auto(bad):
    with pytest.raises(ValueError, match="model_thread must be True, False or 'auto'"):
        asr.servers.BatchingServer(lambda x: x, model_thread=bad)


async def test_auto_on_the_loop_fails_only_the_batch_whose_model_raised_an_exit():
    """As in the device thread: a SystemExit from the model fails its batch, and the
    server goes on (with model_thread=False it would crash the server, as documented)."""
    calls = []

    def exits_once(x):
        calls.append(threading.current_thread().name)
        if len(calls) == 4:
            raise SystemExit("the model exits")
        return x * 2

    async with asr.serve(with_spec(exits_once, (2,), np.float32)) as evaluate:
        outcomes = []
        for _ in range(6):
            try:
                outcomes.append(await asyncio.wait_for(
                    evaluate(np.ones((1, 2), np.float32)), 10))
            except asr.errors.ModelRaisedError as e:
                outcomes.append(e)
        assert evaluate.stats["batches_on_loop"] >= 1
    assert isinstance(outcomes[3], asr.errors.ModelRaisedError)
    assert isinstance(outcomes[3].__cause__, SystemExit)
    assert all(isinstance(o, np.ndarray) for k, o in enumerate(outcomes) if k != 3)


class Weighed:
    """A model whose every input and output is watched (a weak reference each), and
    whose batch may raise (its traceback would hold the model's frame)."""

    def __init__(self):
        self.input_spec = asr.TensorSpec((1,), np.float32)
        self.refs = []
        self.fail = False

    def __call__(self, x):
        y = np.repeat(x, 1000, axis=1)[:, :1] + 1.0  # a fresh array, of a large base
        self.refs += [weakref.ref(x), weakref.ref(y)]
        if self.fail:
            raise ValueError("this batch fails")
        return y


@pytest.mark.parametrize("fails", [False, True], ids=["answered", "failed"])
async def test_an_idle_device_thread_holds_nothing_of_its_last_batch(fails):
    """Once a batch's result is handed to the loop, the device thread drops its
    inputs, outputs and error: an idle server with large outputs kept one batch of
    them alive until the next batch."""
    import gc

    model = Weighed()
    model.fail = fails
    async with asr.serve(model, model_thread=True) as evaluate:
        try:
            await asyncio.wait_for(evaluate(np.ones((3, 1), np.float32)), 10)
        except ValueError:
            assert fails
        await asyncio.sleep(0)

        def released():
            gc.collect()
            return all(ref() is None for ref in model.refs)

        await wait_until(released, "the last batch's arrays are released")


async def test_fraction_in_model_is_per_device_worker_at_most_one():
    async with asr.serve(SLOW_MODEL, max_batch_size=2,
                         num_workers=3, model_thread=True) as evaluate:
        await asyncio.wait_for(asyncio.gather(
            *(evaluate(np.ones((2, 3), np.float32)) for _ in range(12))), 30)
        stats = evaluate.stats
    # Three threads busy nearly all the time: each about 1, never their sum (about 3).
    assert 0.5 < stats["fraction_in_model"] <= 1.0
    assert stats["fraction_in_model"] == pytest.approx(
        stats["model_time_s"] / stats["wall_time_s"] / 3, rel=0.05)


async def test_fraction_in_model_counts_workers_added_and_removed_while_serving():
    async with asr.serve(SLOW_MODEL, max_batch_size=2,
                         num_workers=3, model_thread=True) as evaluate:
        requests = [np.ones((2, 3), np.float32)] * 12
        await asyncio.wait_for(asyncio.gather(*map(evaluate, requests)), 30)
        await evaluate.remove_worker()
        await evaluate.remove_worker()
        # Three workers were busy, then one is left idle: about 3 x 0.2 s of model
        # time over 3 x 0.2 s of worker time, never over 1.
        assert 0.3 < evaluate.stats["fraction_in_model"] <= 1.0
        await evaluate.add_worker()
        await evaluate.add_worker()
        await asyncio.wait_for(asyncio.gather(*map(evaluate, requests)), 30)
        assert 0.3 < evaluate.stats["fraction_in_model"] <= 1.0


async def test_a_worker_whose_removal_was_cancelled_stops_counting_when_it_ends():
    async with asr.serve(SLOW_MODEL, max_batch_size=2,
                         num_workers=2, model_thread=True) as evaluate:
        busy = [asyncio.ensure_future(evaluate(np.ones((2, 3), np.float32)))
                for _ in range(4)]
        # The batches reach the workers first: from Python 3.12 wait_for starts its
        # coroutine at once, and STOP would be queued ahead of them.
        await asyncio.sleep(0.05)
        with pytest.raises(asyncio.TimeoutError):  # the thread still ends: STOP is queued
            await asyncio.wait_for(evaluate.remove_worker(), 0.01)
        await asyncio.wait_for(asyncio.gather(*busy), 30)
        await wait_until(lambda: evaluate.num_workers == 1, timeout=10)
        began = time.perf_counter()
        while time.perf_counter() - began < 1.0:  # the one worker left, busy throughout
            await asyncio.wait_for(asyncio.gather(
                *[evaluate(np.ones((2, 3), np.float32)) for _ in range(4)]), 30)
        # About 0.9: counting the ended worker's seconds as well would give about 0.5.
        assert evaluate.stats["fraction_in_model"] > 0.7


async def test_ended_threads_whose_removal_was_cancelled_are_not_kept():
    # Each one stayed in the server (its Thread, locks and queue) until it closed: an
    # autoscaler timing out its removals grew without bound.
    def model(x):
        return x[:, :1] + 0.0

    async with asr.serve(with_spec(model, (3,), np.float32), model_thread=True) as evaluate:
        removed = []
        for _ in range(5):
            await evaluate.add_worker()
            removed.append(weakref.ref(evaluate._workers._threads[-1]))
            removal = asyncio.ensure_future(evaluate.remove_worker())
            await asyncio.sleep(0)
            removal.cancel()  # the caller gives up waiting: the thread still ends
            await asyncio.gather(removal, return_exceptions=True)
            await wait_until(lambda: evaluate.num_workers == 1, timeout=10)
        await wait_until(lambda: not evaluate._workers._ended, timeout=10)
        gc.collect()
        kept = [ref() for ref in removed if ref() is not None]
        assert all(thread in evaluate._workers._threads for thread in kept)
        assert len(kept) <= 1  # (the one worker left may be the last one added)


async def test_stats_stay_as_they_were_at_close_when_a_thread_ends_later():
    release = threading.Event()

    def model(x):
        if x[0, 0]:
            release.wait(10)  # stuck until released, after the close
        else:
            time.sleep(0.05)
        return x[:, :1] + 0.0

    async with asr.serve(with_spec(model, (3,), np.float32), model_thread=True) as evaluate:
        await asyncio.wait_for(evaluate(np.zeros((1, 3), np.float32)), 10)
        pending = asyncio.ensure_future(evaluate(np.ones((1, 3), np.float32)))
        await asyncio.sleep(0.05)
        with pytest.raises(asr.CloseTimeoutError):  # the batch is left in its thread
            await evaluate.aclose(timeout=0.05)
        closed = evaluate.stats
        assert closed["fraction_in_model"] > 0
        await asyncio.sleep(0.3)
        release.set()  # the thread ends now, 0.3 s after the close
        await asyncio.gather(pending, return_exceptions=True)
        await wait_until(lambda: not evaluate._workers.running, timeout=10)  # ended
        assert evaluate.stats["fraction_in_model"] == closed["fraction_in_model"]


async def test_auto_never_runs_on_the_loop_a_workers_own_model_with_hooks():
    # add_worker(model=hooked), then the first worker removed: the hooked model ran on
    # the loop, never loaded, because only the first model's hooks were looked at.
    hooked = Recording()
    async with asr.serve(with_spec(lambda x: x + 0.0, (1,), np.float32)) as evaluate:
        for i in range(300):  # a fast model: its batches go to the loop (on a busy
            # machine, once its measured average has come below the bound)
            await asyncio.wait_for(evaluate(np.full((1, 1), i, np.float32)), 10)
            if evaluate.stats["batches_on_loop"]:
                break
        assert evaluate.stats["batches_on_loop"] > 0
        await evaluate.add_worker(model=hooked)
        # The removal goes to the thread waiting longest at the queue (its waiters wake
        # in order), the first one, once the new thread waits too: on a busy machine the
        # new thread, only now reaching the queue, took it first and was removed,
        # leaving the fast model, which rightly ran on the loop (seen once in CI).
        await asyncio.sleep(0.3)
        await evaluate.remove_worker()
        on_loop = evaluate.stats["batches_on_loop"]
        for i in range(6):
            await asyncio.wait_for(evaluate(np.full((1, 1), i, np.float32)), 10)
        assert evaluate.stats["batches_on_loop"] == on_loop
    assert hooked.threads and threading.main_thread().ident not in hooked.threads
    assert [event for event, _ in hooked.events] == ["load", "unload"]


async def test_a_worker_added_after_a_removal_never_takes_a_running_threads_name():
    async with asr.serve(lambda x: x, model_thread=True, num_workers=2) as evaluate:
        await evaluate.remove_worker()
        await evaluate.add_worker()
        # (the removed thread may still be ending: only the names must differ)
        names = [t.name for t in threading.enumerate() if t.name.startswith("async_search")]
        assert len(names) == len(set(names)) and len(evaluate._workers.running) == 2


class _Placed:
    """``x * k``, plus 1000 on a device: tells a copy from the model itself."""

    def __init__(self, k, device=None):
        self.k, self.device = k, device

    def __call__(self, x):
        return x * self.k + (0 if self.device is None else 1000)

    def on_device(self, device):
        return type(self)(self.k, device)

    def with_weights(self, weights):
        return type(self)(self.k, self.device)


async def test_a_removed_workers_model_copy_is_let_go_of_when_it_ends():
    # Each removed thread stayed in a list, holding its copy (device memory), until the
    # server closed: an autoscaler's add and remove grew it without bound.
    copies = []

    class Copies(_Placed):
        def on_device(self, device):
            copies.append(weakref.ref(copy := Copies(self.k, device)))
            return copy

    async with asr.serve(Copies(1), model_thread=True) as evaluate:
        for i in range(5):
            await evaluate.add_worker(device=f"device-{i}")
            await within(evaluate(np.ones((2, 1))), "an answer")
            await evaluate.remove_worker()
        gc.collect()
        assert evaluate.num_workers == 1  # the first thread, or the last copy's
        alive = [copy.device for copy in (ref() for ref in copies) if copy is not None]
        assert alive == [d for d in evaluate.stats.get("devices", [None]) if d]


async def test_an_update_keeps_the_model_itself_current_beside_a_device_copy():
    # The device copy became the current model: a plain add_worker ran it (and on a
    # server of device copies, one whose worker was removed stayed current).
    async with asr.serve(_Placed(1), model_thread=True) as evaluate:
        await evaluate.add_worker(device="gpu-1")
        evaluate.update_model(_Placed(2), "v2")
        assert evaluate.model.device is None and evaluate.model.k == 2
        await evaluate.add_worker()
        assert evaluate.stats["devices"] == [None, "gpu-1", None]
    async with asr.serve(_Placed(1), devices=["a", "b"]) as evaluate:
        await evaluate.remove_worker()
        (left,) = evaluate.stats["devices"]
        assert evaluate.model.device == left  # the copy of the worker still serving
        evaluate.update_model(_Placed(3), 3)
        assert (await within(evaluate(np.ones((1, 1))), "an answer")).tolist() == [[1003.0]]


async def test_a_workers_own_model_never_becomes_the_servers_model():
    # When the thread running the current model's device copy ended, the next live
    # thread's model became current, though it was a model given to add_worker as that
    # thread's own: a plain add_worker then ran it.
    gate = threading.Event()

    class Own(_Placed):
        def __call__(self, x):
            gate.wait(10)
            return x * 0 - 1

    async with asr.serve(_Placed(1), devices=["d0"]) as evaluate:
        await evaluate.add_worker(model=Own(5), device="own")
        # (weights renew each model as it is: the Own thread's stays its own)
        evaluate.update_model({"w": 1}, "v2")
        held = None
        for _ in range(50):  # until the Own thread holds a batch
            request = asyncio.ensure_future(evaluate(np.ones((1, 1))))
            done, _ = await asyncio.wait({request}, timeout=0.2)
            if not done:
                held = request
                break
        assert held is not None, "the Own thread never took a batch"
        await within(evaluate.remove_worker(), "the d0 thread to end")
        assert not isinstance(evaluate.model, Own)
        gate.set()
        assert (await within(held, "the held answer")).tolist() == [[-1.0]]


@pytest.mark.parametrize("model, error, message", [
    (5, TypeError, "add_worker's model must be callable, got int 5"),
    (with_spec(lambda x: x[:, :1], (5,), np.float32), ValueError,
     r"add_worker: the new model takes \[n, 5\] float32, the server's requests are "
     r"\[n, 4\] float32"),
])
async def test_a_worker_model_that_could_not_serve_the_requests_is_refused(
        model, error, message):
    # add_worker took any model: a number (or a net of other rows) then failed the
    # batches its thread happened to take, some requests of a caller and not others.
    served = with_spec(lambda x: x[:, :1] * 2, (4,), np.float32)
    async with asr.serve(served, model_thread=True) as evaluate:
        with pytest.raises(error, match=message):
            await evaluate.add_worker(model)
        assert evaluate.num_workers == 1
        ys = await within(asyncio.gather(*(evaluate(np.ones((1, 4), np.float32))
                                           for _ in range(20))), "answers")
    assert [y.item() for y in ys] == [2.0] * 20


def test_a_numpy_num_workers_is_kept_as_a_python_int():
    # It was kept as given: before the server was entered, its stats held an np.int64,
    # which json.dumps refuses.
    from async_search.servers import BatchingServer, DispatchPolicy

    server = BatchingServer(MLP((4,)), DispatchPolicy(), num_workers=np.int64(2))
    assert type(server.num_workers) is int
    json.dumps(server.stats)


async def test_a_thread_that_cannot_start_names_num_workers_and_leaves_none(monkeypatch):
    # num_workers=10**6: Python's "can't start new thread" named no argument.
    from async_search.servers import device

    real_start, started = device.DeviceThread.start, []

    def start(thread):
        if len(started) == 2:
            raise RuntimeError("can't start new thread")
        started.append(thread)
        return real_start(thread)

    monkeypatch.setattr(device.DeviceThread, "start", start)
    before = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="can't start new thread") as raised:
        async with asr.serve(MLP((4,)), num_workers=5, model_thread=True):
            pass
    assert "device thread 3 of 5: num_workers or devices" in str(raised.value.__notes__)
    await wait_until(lambda: set(threading.enumerate()) == before, "the threads to end")
