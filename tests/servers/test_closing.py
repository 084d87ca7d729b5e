"""Leaving ``serve`` holds under cancellation and timeouts.

The exit awaits three things: the dispatch task (draining the queue), the batches in the
model, and the device threads (which unload the model on their way out). Each test
interrupts the exit at one of them (cancelled once, or cancelled while the body was
already cancelled, or out of ``aclose(timeout=...)``) and counts what is left: every
request done (answered or failed with ServerClosedError, none hanging), the server
closed, and, once the model returns, no device thread left and ``unload`` called once.
"""

import asyncio
import threading

import numpy as np
import pytest

import async_search as asr
from async_search.errors import CloseTimeoutError, ServerClosedError
from async_search.models import with_spec
from async_search.servers import BatchingServer
from tests.helpers import wait_until, within

pytestmark = pytest.mark.timeout(60)


class Device:
    """A model in a device thread that blocks until the test opens ``compute`` (each
    batch) and ``release`` (its unload), counting loads and unloads."""

    def __init__(self, compute_open=False):
        self.input_spec = asr.TensorSpec((1,), np.float32)
        self.compute = threading.Event()
        self.release = threading.Event()
        self.started = threading.Event()
        if compute_open:
            self.compute.set()
        self.loads = self.unloads = 0

    def load(self):
        self.loads += 1

    def unload(self):
        assert self.release.wait(30), "the test never released unload"
        self.unloads += 1

    def __call__(self, x):
        self.started.set()
        assert self.compute.wait(30), "the test never let the model compute"
        return x + 1.0

    def open(self):
        self.compute.set()
        self.release.set()


def device_threads():
    return [t for t in threading.enumerate() if t.name.startswith("async_search-device")]


def assert_threads_end(before, what):
    """Waits (10 s at most) for the device threads started since ``before`` to end."""
    pause = threading.Event()
    for _ in range(1000):
        if set(device_threads()) <= before:
            break
        pause.wait(0.01)
    assert set(device_threads()) <= before, f"a device thread outlived {what}"


def served_once_then_loop_closed():
    """A server with a device thread, entered and asked once on a loop that is then
    closed, its block never left (a notebook's kernel restarted): (server, model)."""
    model = Device()
    model.open()
    loop = asyncio.new_event_loop()
    try:
        server = BatchingServer(model, model_thread=True)
        loop.run_until_complete(server.__aenter__())
        answered = loop.run_until_complete(server(np.ones((2, 1), np.float32)))
        assert answered.shape == (2, 1)
    finally:
        loop.close()
    return server, model


def what_it_waits_for(server, awaitable):
    """Names an await of the exit by what it waits for."""
    if awaitable is server._task:
        return "dispatch"
    if awaitable is server._slot:
        return "in_flight"
    if awaitable is server._workers._all_exited:
        return "threads"
    return "other"


@pytest.fixture
def cancel_exit_at(monkeypatch):
    """``cancel_exit_at(name)``: the exit cancels itself (as a cancellation from outside
    would land) when it starts to wait for ``name``; returns the awaits it started."""
    seen = []
    original = BatchingServer._until

    def arm(target):
        async def until(self, awaitable, deadline):
            name = what_it_waits_for(self, awaitable)
            seen.append(name)
            if name == target:
                asyncio.current_task().cancel()
            return await original(self, awaitable, deadline)

        monkeypatch.setattr(BatchingServer, "_until", until)
        return seen

    return arm


# Each await of the exit, and the state that makes the exit wait there: how many
# requests are made, and whether the model computes at once (only unload then blocks).
AWAITS = {
    "dispatch": dict(requests=3, compute_open=False),   # 1 in the model, 2 queued
    "in_flight": dict(requests=1, compute_open=False),  # the last batch in the model
    "threads": dict(requests=1, compute_open=True),     # unload still running
}


@pytest.mark.parametrize("times", [1, 2], ids=["cancelled_once", "cancelled_twice"])
@pytest.mark.parametrize("target", list(AWAITS))
async def test_exit_cancelled_at_each_await_fails_everything_and_leaves_no_thread(
        cancel_exit_at, target, times):
    before = set(device_threads())
    setup = AWAITS[target]
    model = Device(compute_open=setup["compute_open"])
    futures, servers = [], []
    in_body = asyncio.Event()

    async def body():
        async with asr.serve(model, max_batch_size=1, pipeline_depth=1,
                             model_thread=True) as evaluate:
            servers.append(evaluate)
            futures.extend(evaluate(np.full((1, 1), i, np.float32))
                           for i in range(setup["requests"]))
            await within(asyncio.to_thread(model.started.wait, 10), "a batch in the model")
            if setup["compute_open"]:
                await within(asyncio.gather(*futures), "the answers")
            seen = cancel_exit_at(target)
            if times == 2:  # the first cancellation lands here, the second in the exit
                in_body.set()
                await asyncio.sleep(3600)
        return seen

    task = asyncio.ensure_future(body())
    if times == 2:
        await within(in_body.wait(), "the body")
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(task, "the interrupted exit")
    server = servers[0]

    # Every request is done at once: answered, or failed with ServerClosedError.
    assert all(fut.done() for fut in futures)
    for fut in futures:
        assert fut.result() is not None if fut.exception() is None else isinstance(
            fut.exception(), ServerClosedError)
    if not setup["compute_open"]:
        assert all(isinstance(fut.exception(), ServerClosedError) for fut in futures)
    with pytest.raises(ServerClosedError):
        server(np.zeros((1, 1), np.float32))
    await wait_until(server._task.done, "the dispatch task ended")
    assert server._task.cancelled() or server._task.exception() is None
    assert server._crashed is None  # an interrupted close is a close, not a crash

    # The thread is still in the model (or its unload): it ends once they return.
    model.open()
    await wait_until(lambda: set(device_threads()) <= before, "no device thread left")
    assert (model.loads, model.unloads) == (1, 1)


async def test_wait_for_on_the_exit_leaves_no_thread_once_the_model_returns():
    """The issue's case: ``wait_for(server.__aexit__(...), 0.5)`` with a batch in flight."""
    before = set(device_threads())
    model = Device()
    server = BatchingServer(model, model_thread=True)
    await server.__aenter__()
    in_model = server(np.zeros((1, 1), np.float32))
    await within(asyncio.to_thread(model.started.wait, 10), "a batch in the model")
    queued = server(np.ones((2, 1), np.float32))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(server.__aexit__(None, None, None), 0.2)
    for fut in (in_model, queued):
        assert isinstance(fut.exception(), ServerClosedError)
    await server.aclose()  # closed already: returns at once
    model.open()
    await wait_until(lambda: set(device_threads()) <= before, "no device thread left")
    assert (model.loads, model.unloads) == (1, 1)


async def test_aclose_timeout_says_what_it_abandoned():
    before = set(device_threads())
    model = Device()
    server = BatchingServer(model, asr.servers.DispatchPolicy(2, pipeline_depth=1),
                            model_thread=True)
    await server.__aenter__()
    in_model = server(np.zeros((2, 1), np.float32))
    await within(asyncio.to_thread(model.started.wait, 10), "a batch in the model")
    queued = [server(np.ones((1, 1), np.float32)) for _ in range(3)]
    with pytest.raises(CloseTimeoutError) as timed_out:
        await server.aclose(timeout=0.05)
    error = timed_out.value
    assert isinstance(error, TimeoutError)
    assert (error.batches_in_model, error.requests_failed) == (1, 4)
    assert error.threads == ("async_search-device-0",)
    message = str(error)
    assert "within 0.05 s" in message and "1 batch" in message and "4 request" in message
    assert "async_search-device-0" in message and "unload" in message
    for fut in [in_model, *queued]:
        assert isinstance(fut.exception(), ServerClosedError)
        assert "did not finish closing within 0.05 s" in str(fut.exception())
    model.open()
    await wait_until(lambda: set(device_threads()) <= before, "no device thread left")
    assert (model.loads, model.unloads) == (1, 1)


async def test_aclose_timeout_counts_only_batches_the_model_was_computing():
    # A batch still queued for the device thread never reached the model: it was
    # counted and worded as "in the model".
    before = set(device_threads())
    model = Device()
    server = BatchingServer(model, asr.servers.DispatchPolicy(2, pipeline_depth=2),
                            model_thread=True)
    await server.__aenter__()
    in_model = server(np.zeros((2, 1), np.float32))
    await within(asyncio.to_thread(model.started.wait, 10), "a batch in the model")
    waiting = server(np.ones((2, 1), np.float32))
    await wait_until(lambda: server.stats["batches"] + server._in_flight >= 2,
                     "a second batch handed to the device thread")
    with pytest.raises(CloseTimeoutError) as timed_out:
        await server.aclose(timeout=0.05)
    error = timed_out.value
    assert (error.batches_in_model, error.requests_failed) == (1, 2)
    assert "1 batch(es) were still in the model and 1 more waited for it" in str(error)
    assert "was in the model" in str(in_model.exception())
    assert "waited for the model, which it never reached" in str(waiting.exception())
    model.open()
    await wait_until(lambda: set(device_threads()) <= before, "no device thread left")


async def test_aclose_with_a_timeout_that_is_met_returns_normally():
    model = Device(compute_open=True)
    model.release.set()
    async with asr.serve(model, model_thread=True) as evaluate:
        y = await within(evaluate(np.zeros((1, 1), np.float32)), "an answer")
        await evaluate.aclose(timeout=10)
    assert y.tolist() == [[1.0]] and (model.loads, model.unloads) == (1, 1)


@pytest.mark.parametrize("drain", [True, False])
async def test_aclose_does_not_wait_out_a_partial_batchs_max_delay(drain):
    async with asr.serve(lambda x: x * 2, max_batch_size=64, max_delay=30.0) as evaluate:
        await within(evaluate(np.ones((64, 1), np.float32)), "a full batch")
        waiting = evaluate(np.ones((1, 1), np.float32))  # waits for company up to 30 s
        await asyncio.sleep(0.05)
        await within(evaluate.aclose(drain=drain), "the close", timeout=5)
    if drain:  # served at once, not after the delay
        assert (await waiting).tolist() == [[2.0]]
    else:
        with pytest.raises(ServerClosedError):
            await waiting


@pytest.mark.parametrize("bad", [-1, "1", True, float("nan")])
async def test_aclose_timeout_must_be_a_number_at_least_zero(bad):
    async with asr.serve(lambda x: x) as evaluate:
        with pytest.raises(ValueError, match="timeout must be a finite number >= 0"):
            await evaluate.aclose(timeout=bad)


async def test_many_cancelled_servers_leave_no_thread_and_unload_each_model():
    """A long-lived program (a notebook, a server) that cancels servers again and again
    leaks nothing: each device thread ends once its model returns."""
    before = set(device_threads())
    models = []
    for _ in range(10):
        model = Device()
        models.append(model)

        servers = []

        async def body():
            async with asr.serve(model, model_thread=True) as evaluate:
                servers.append(evaluate)
                evaluate(np.zeros((1, 1), np.float32))
                await asyncio.sleep(3600)

        task = asyncio.ensure_future(body())
        await within(asyncio.to_thread(model.started.wait, 10), "a batch in the model")
        task.cancel()  # the body: the exit then waits for the batch in the model
        await wait_until(lambda: servers[0]._closing, "the exit started")
        task.cancel()  # the exit
        with pytest.raises(asyncio.CancelledError):
            await within(task, "the twice cancelled exit")
    for model in models:
        model.open()
    await wait_until(lambda: set(device_threads()) <= before, "no device thread left")
    assert [(m.loads, m.unloads) for m in models] == [(1, 1)] * 10


async def test_two_closes_at_once_both_return_once_the_server_is_closed():
    model = Device(compute_open=True)
    model.release.set()
    server = BatchingServer(model, model_thread=True, num_workers=2)
    await server.__aenter__()
    await within(server(np.zeros((1, 1), np.float32)), "an answer")
    await within(asyncio.gather(server.aclose(), server.aclose(timeout=10)), "two closes")
    assert server._closed and not [t for t in device_threads() if t.is_alive()
                                   and t.name in server._workers.running]
    assert server.stats["workers"] == 2  # what it had when it closed
    assert model.loads == model.unloads >= 1  # a worker loads with its first batch


def test_an_exit_closed_with_its_event_loop_still_tells_the_threads_to_end():
    """A notebook kernel or a server that closes its loop while an exit waits for a
    batch: the exit is closed (GeneratorExit), nothing can be resolved any more, and
    the device thread still ends, unloading its model, once the batch returns."""
    before = set(device_threads())
    model = Device()
    loop = asyncio.new_event_loop()
    try:
        server = BatchingServer(model, model_thread=True)
        loop.run_until_complete(server.__aenter__())
        awaited = server(np.zeros((1, 1), np.float32))
        awaited.add_done_callback(lambda fut: None)  # someone awaits it
        loop.run_until_complete(wait_until(model.started.is_set, "a batch in the model"))
        closing = server.aclose()
        task = loop.create_task(closing)
        loop.run_until_complete(wait_until(lambda: server._closer is not None,
                                           "the exit waits for the batch"))
    finally:
        loop.close()
    closing.close()  # what collecting the abandoned task would do
    assert task.done() is False and server._closing
    model.open()
    deadline = threading.Event()
    for _ in range(1000):
        if set(device_threads()) <= before:
            break
        deadline.wait(0.01)
    assert set(device_threads()) <= before, "the device thread outlived its loop"
    assert (model.loads, model.unloads) == (1, 1)


def test_calls_after_the_servers_loop_closed_raise_at_once_and_its_thread_ends():
    """A notebook closes the loop a server was entered in, its block never left: every
    later call raises ServerCrashedError at once (none queued on the closed loop to
    wait forever), and the device thread ends."""
    before = set(device_threads())
    server, model = served_once_then_loop_closed()
    for _ in range(3):
        with pytest.raises(asr.errors.ServerCrashedError, match="event loop was closed"):
            server(np.ones((2, 1), np.float32))
    assert not server._batcher.queued, "a request was queued on the closed loop"
    assert_threads_end(before, "its loop")
    assert (model.loads, model.unloads) == (1, 1)


def test_a_serving_coroutine_collected_after_its_loop_closed_ends_the_device_thread():
    """A kernel interrupted in ``run_until_complete`` closes its loop while a block
    still serves; collecting that block's coroutine leaves the server on a closed loop,
    where its exit raised "Event loop is closed" before it told the thread to end: the
    thread (and on a GPU the model) stayed for good."""
    before = set(device_threads())
    model = Device()
    model.open()

    async def body():
        async with asr.serve(model, model_thread=True) as evaluate:
            await evaluate(np.zeros((3, 1), np.float32))
            await asyncio.Event().wait()  # still serving when the loop stops

    loop = asyncio.new_event_loop()
    try:
        coroutine = body()
        task = loop.create_task(coroutine)
        loop.run_until_complete(wait_until(lambda: model.started.is_set(), "a batch"))
        loop.run_until_complete(asyncio.sleep(0.05))
    finally:
        loop.close()
    coroutine.close()  # what the collector does to the abandoned task's coroutine
    assert not task.done()
    assert_threads_end(before, "its closed loop")
    assert (model.loads, model.unloads) == (1, 1)


def test_a_server_entered_by_hand_on_a_closed_loop_ends_its_thread_when_collected():
    """A notebook's server entered by hand (no block) on a loop closed without
    ``shutdown_asyncgens``: collecting the server closed its dispatch task's coroutine
    (GeneratorExit), which ended quietly and left the device thread and its model."""
    before = set(device_threads())
    model = Device()
    model.open()

    async def enter():
        evaluate = await asr.serve(model, model_thread=True).__aenter__()
        await evaluate(np.zeros((3, 1), np.float32))
        return evaluate

    loop = asyncio.new_event_loop()
    try:
        evaluate = loop.run_until_complete(enter())
    finally:
        loop.close()
    evaluate._task.get_coro().close()  # what the collector does to the dropped task's
    del evaluate                        # coroutine (without the log of a pending task)
    assert_threads_end(before, "the collected server")
    assert (model.loads, model.unloads) == (1, 1)


@pytest.mark.parametrize("change", ["aclose", "add_worker", "remove_worker",
                                    "update_model"])
async def test_changes_from_another_thread_s_loop_are_refused_and_change_nothing(change):
    # aclose from another thread hung for good (and the owner's exit after it); a
    # remove_worker removed the worker, then failed in asyncio's own words.
    def model(x):
        return x * 2

    calls = {"aclose": lambda ev: ev.aclose(), "add_worker": lambda ev: ev.add_worker(),
             "remove_worker": lambda ev: ev.remove_worker(),
             "update_model": lambda ev: _awaited(ev.update_model, lambda x: 3 * x, 1)}
    x = np.ones((2, 1), np.float32)
    async with asr.serve(model, model_thread=True) as evaluate:
        await evaluate.add_worker()
        before = evaluate.num_workers
        outcome = []

        def other_thread():
            try:
                asyncio.run(asyncio.wait_for(calls[change](evaluate), 5))
                outcome.append("done")
            except BaseException as e:  # noqa: BLE001 - the outcome is the test
                outcome.append(e)

        thread = threading.Thread(target=other_thread)
        thread.start()
        await within(asyncio.to_thread(thread.join, 10), "the other thread")
        assert not thread.is_alive()
        (error,) = outcome
        assert isinstance(error, RuntimeError) and f"{change} was called from another " \
            "event loop" in str(error)
        assert evaluate.num_workers == before
        np.testing.assert_array_equal(await within(evaluate(x), "a call after"), x * 2)


async def _awaited(method, *args):
    return method(*args)


async def test_a_call_while_the_server_closes_says_it_is_closing():
    model = Device()
    model.open()
    async with asr.serve(model, model_thread=True) as evaluate:
        model.compute.clear()  # the next batch stays in the model: aclose waits for it
        pending = evaluate(np.zeros((1, 1), np.float32))
        await wait_until(lambda: model.started.is_set(), "the batch in the model")
        closing = asyncio.ensure_future(evaluate.aclose())
        await asyncio.sleep(0.01)
        with pytest.raises(ServerClosedError, match="the server is closing"):
            evaluate(np.zeros((1, 1), np.float32))
        model.compute.set()
        await within(closing, "the close")
        await within(pending, "the batch")
    with pytest.raises(ServerClosedError, match="the server is closed"):
        evaluate(np.zeros((1, 1), np.float32))


def test_a_server_closed_after_its_loop_leaves_none_of_its_requests_in_its_batcher():
    # Its close on a closed loop freed the batcher with that loop's requests still in
    # it: the next server on the batcher computed them and counted them as its own.
    from async_search.batchers import BatchSizeBatcher

    model = Device()
    batcher = BatchSizeBatcher(1)
    loop = asyncio.new_event_loop()
    try:
        server = BatchingServer(model, batcher=batcher, model_thread=True)
        loop.run_until_complete(server.__aenter__())
        for i in range(4):
            server(np.full((1, 1), i, np.float32))
        loop.run_until_complete(wait_until(model.started.is_set, "a batch in the model"))
    finally:
        loop.close()
    model.open()

    async def next_server():
        await server.aclose()  # on the closed loop's server: ends its thread
        assert not batcher.queued
        twice = with_spec(lambda x: x * 2, (1,), np.float32)
        async with BatchingServer(twice, batcher=batcher) as other:
            y = await within(other(np.full((1, 1), 100, np.float32)), "its answer")
            return y, other.stats["batches"]

    y, batches = asyncio.run(next_server())
    assert y.tolist() == [[200.0]] and batches == 1


async def test_a_server_entered_by_hand_serves_after_its_serve_object_is_collected():
    """A notebook keeps ``evaluate = await asr.serve(m).__aenter__()`` across cells:
    the dropped serve(...) object's generator, collected, closed the server ("evaluate
    called after its context was left") while the caller still held it."""
    import gc

    model = with_spec(lambda x: x * 2, (3,), np.float32)
    evaluate = await asr.serve(model).__aenter__()
    try:
        np.testing.assert_array_equal(await evaluate(np.ones((1, 3), np.float32)),
                                      np.full((1, 3), 2, np.float32))
        gc.collect()
        for _ in range(5):
            await asyncio.sleep(0.01)  # the loop runs what the collector scheduled
        np.testing.assert_array_equal(await evaluate(np.ones((1, 3), np.float32)),
                                      np.full((1, 3), 2, np.float32))
    finally:
        await evaluate.aclose()


def test_a_server_kept_past_the_run_it_was_entered_in_says_its_loop_closed():
    """``asyncio.run`` cancels every task of the loop it closes, the dispatch task
    among them: a later call said the server crashed of CancelledError (a bug in the
    serving coroutine), not that its loop was closed."""
    model = with_spec(lambda x: x * 2, (3,), np.float32)
    kept = {}

    async def first_cell():
        kept["evaluate"] = await asr.serve(model).__aenter__()
        return await kept["evaluate"](np.ones((1, 3), np.float32))

    asyncio.run(first_cell())

    async def second_cell():
        return await kept["evaluate"](np.ones((1, 3), np.float32))

    with pytest.raises(asr.errors.ServerCrashedError, match="event loop was closed"):
        asyncio.run(second_cell())


@pytest.mark.parametrize("change", ["update_model", "add_worker", "remove_worker"])
def test_changes_to_a_server_whose_loop_closed_raise_and_start_no_thread(change):
    """Before any call noticed the closed loop, add_worker started a thread and then
    raised a bare RuntimeError, and update_model swapped the model of a server that
    could serve nothing more."""
    before = set(device_threads())
    server, _ = served_once_then_loop_closed()
    calls = {"update_model": lambda: server.update_model(Device(), "v2"),
             "add_worker": lambda: asyncio.run(server.add_worker()),
             "remove_worker": lambda: asyncio.run(server.remove_worker())}
    with pytest.raises(asr.errors.ServerCrashedError, match="event loop was closed"):
        calls[change]()
    assert server.version != "v2"
    assert_threads_end(before, "the loop")


def test_a_server_whose_enter_failed_ends_its_threads_and_says_it_is_not_serving(
        monkeypatch):
    """Its second device thread could not start: the first outlived the failed enter,
    update_model and add_worker were taken, and once its loop closed it said it crashed
    while it served; it never served."""
    from async_search.servers import workers

    before = set(device_threads())
    real_add, adds = workers.Workers.add, []

    def second_add_fails(self, *args, **kwargs):
        adds.append(1)
        if len(adds) == 2:
            raise OSError("can't start new thread")
        return real_add(self, *args, **kwargs)

    monkeypatch.setattr(workers.Workers, "add", second_add_fails)
    model = Device()
    model.open()
    server = BatchingServer(model, model_thread=True, num_workers=2)
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(OSError, match="can't start new thread"):
            loop.run_until_complete(server.__aenter__())
        monkeypatch.setattr(workers.Workers, "add", real_add)
        for call in (lambda: server(np.ones((2, 1), np.float32)),
                     lambda: server.update_model(Device(), "v2"),
                     lambda: loop.run_until_complete(server.add_worker())):
            with pytest.raises(RuntimeError, match="not serving") as raised:
                call()
            assert not isinstance(raised.value, asr.errors.ServerClosedError)
        loop.run_until_complete(server.aclose())  # nothing to close (it raised TypeError)
    finally:
        loop.close()
    with pytest.raises(RuntimeError, match="not serving") as raised:
        server(np.ones((2, 1), np.float32))
    assert not isinstance(raised.value, asr.errors.ServerClosedError)
    assert server.version != "v2"
    assert_threads_end(before, "the failed enter")


async def test_a_serve_entered_a_second_time_says_so_and_a_new_one_serves():
    model = with_spec(lambda x: x * 2, (3,), np.float32)
    server = asr.serve(model)
    async with server as evaluate:
        np.testing.assert_array_equal(await evaluate(np.ones((1, 3), np.float32)),
                                      np.full((1, 3), 2, np.float32))
    with pytest.raises(RuntimeError, match="each `async with` needs a serve"):
        async with server:
            pass
    async with asr.serve(model) as evaluate:  # the way to serve again
        assert (await evaluate(np.ones((2, 3), np.float32))).shape == (2, 3)
