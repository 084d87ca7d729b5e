import asyncio

import numpy as np
import pytest

import async_search as asr
from async_search.errors import InputSpecError
from async_search.models import MLP
from async_search.servers.stats import BatchRecord

pytestmark = pytest.mark.timeout(60)

MODEL = MLP((4,), hidden_sizes=(8,), output_size=2, seed=0)


def x(n):
    return np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)


async def test_immediate_keeps_the_stats_of_a_batching_server():
    ev = asr.immediate(MODEL)
    for n in (1, 3, 3):
        np.testing.assert_array_equal(await ev(x(n)), MODEL(x(n)))
    async with asr.serve(MODEL) as server:
        await server(x(2))
        assert set(ev.stats) == set(server.stats)
    stats = ev.stats
    assert stats["batches"] == stats["requests"] == 3 and stats["elements"] == 7
    assert stats["batch_size_histogram"] == {1: 1, 3: 2}
    assert stats["reasons"] == {"idle": 3}
    assert stats["queue_wait_max_s"] == 0.0 and stats["failed_batches"] == 0
    assert stats["workers"] == 1 and stats["version"] == 0
    assert stats["mean_batch_size"] == pytest.approx(7 / 3)


async def test_immediate_traces_every_call_and_reports_it_to_on_batch():
    seen = []
    ev = asr.immediate(MODEL, on_batch=seen.append)
    for n in (2, 5):
        await ev(x(n))
    assert [r.size for r in ev.trace] == [2, 5] and seen == ev.trace
    assert all(isinstance(r, BatchRecord) and r.model_s >= 0 for r in ev.trace)
    assert ev.trace[0].finished_s <= ev.trace[1].finished_s
    assert sum(r.model_s for r in ev.trace) == pytest.approx(ev.stats["model_time_s"])


async def test_a_model_that_raises_counts_a_failed_batch_and_a_bad_request_none():
    def broken(batch):
        raise FloatingPointError("overflow")

    broken.input_spec = MODEL.input_spec
    ev = asr.immediate(broken)
    with pytest.raises(FloatingPointError):
        await ev(x(2))
    with pytest.raises(InputSpecError):
        await ev(np.zeros((2, 5), np.float32))
    assert ev.stats["batches"] == 1 and ev.stats["failed_batches"] == 1
    assert [r.size for r in ev.trace] == [2]


@pytest.mark.parametrize("outputs", [
    lambda b: MODEL(b)[:1],                      # too few rows
    lambda b: np.concatenate([MODEL(b)] * 2),    # too many
    lambda b: (MODEL(b), MODEL(b)[:1]),          # heads that disagree
    lambda b: np.float32(0.5),                   # no batch dimension
])
async def test_outputs_without_one_row_per_element_fail_as_a_servers_do(outputs):
    def wrong(batch):
        return outputs(batch)

    wrong.input_spec = MODEL.input_spec
    ev = asr.immediate(wrong)
    with pytest.raises(asr.ModelOutputError) as immediate_error:
        await ev(x(3))
    async with asr.serve(wrong) as server:
        with pytest.raises(asr.ModelOutputError) as served_error:
            await server(x(3))
    assert type(immediate_error.value) is type(served_error.value)
    assert ev.stats["batches"] == ev.stats["failed_batches"] == 1


async def test_immediate_reports_versions_as_a_server_does():
    class Versioned:
        version = "v3"

        def __call__(self, batch):
            return batch * 2

    y, version = await asr.immediate(Versioned()).with_version(x(1))
    assert version == "v3" and np.array_equal(y, x(1) * 2)
    assert asr.immediate(MODEL).version == 0
    with pytest.raises(TypeError, match="on_batch must be callable"):
        asr.immediate(MODEL, on_batch=3)


async def test_immediate_keeps_the_latest_trace_size_calls():
    assert asr.immediate(MODEL)._stats.trace.maxlen == 10_000  # the servers' default
    ev = asr.immediate(MODEL, trace_size=2)
    for n in (1, 2, 3):
        await ev(x(n))
    assert [r.size for r in ev.trace] == [2, 3] and ev.stats["batches"] == 3
    with pytest.raises(ValueError, match="trace_size must be an integer >= 0"):
        asr.immediate(MODEL, trace_size=-1)


async def test_immediate_takes_a_timeout_and_discards_outputs_that_come_past_it():
    import time

    from async_search.errors import RequestTimeoutError

    def slow(batch):
        time.sleep(0.05)
        return batch

    slow.input_spec = MODEL.input_spec
    ev = asr.immediate(slow)
    assert (await ev(x(1), timeout=30)).shape == (1, 4)
    assert (await ev.with_version(x(1), timeout=30))[1] == 0
    with pytest.raises(RequestTimeoutError, match="past the request's timeout of 0.01 s"):
        await ev(x(1), timeout=0.01)
    with pytest.raises(ValueError, match="timeout must be a finite number > 0"):
        await ev(x(1), timeout=0)
    assert ev.stats["timed_out"] == 1 and ev.stats["batches"] == 3


class ChangingOutputs:
    """Returns ``first(y)`` on its first call and ``later(y)`` after, for y = x * 2."""

    def __init__(self, first, later, output_spec=None):
        self.input_spec = asr.TensorSpec((4,), np.float32)
        if output_spec is not None:
            self.output_spec = output_spec
        self.first, self.later, self.calls = first, later, 0

    def __call__(self, x):
        self.calls += 1
        y = x[:, :1] * 2.0
        return (self.first if self.calls == 1 else self.later)(y)


async def served_and_immediate(model_maker, sizes=(2, 2)):
    """What serve and immediate make of the same calls, one request at a time: each
    call's outputs or the name of its error."""
    async def calls(evaluate):
        out = []
        for n in sizes:
            try:
                out.append(await evaluate(x(n)))
            except Exception as e:
                out.append(type(e).__name__ + ": " + str(e).split(":")[0])
        return out
    async with asr.serve(model_maker(), model_thread=False) as served:
        by_server = await calls(served)
    return by_server, await calls(asr.immediate(model_maker()))


def assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        if isinstance(u, str) or isinstance(v, str):
            assert u == v
        else:
            assert type(u) is type(v) and u.dtype == v.dtype
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("later", [
    lambda y: y[:, 0],                 # [n, 1], then [n]
    lambda y: (y,),                    # an array, then a tuple
    lambda y: y.astype(np.int64),      # float32, then int64: another kind
])
async def test_outputs_that_change_structure_fail_as_a_servers_do(later):
    # immediate took them all, while serve failed them: the same search ran under one
    # and failed under the other.
    by_server, by_immediate = await served_and_immediate(
        lambda: ChangingOutputs(lambda y: y, later))
    assert isinstance(by_immediate[1], str) and by_immediate[1].startswith(
        "ModelOutputError")
    assert_same(by_server, by_immediate)


async def test_a_dtype_of_the_same_kind_is_cast_to_the_first_calls_as_a_server_does():
    by_server, by_immediate = await served_and_immediate(
        lambda: ChangingOutputs(lambda y: y, lambda y: y.astype(np.float64)))
    assert by_immediate[1].dtype == np.float32
    assert_same(by_server, by_immediate)


async def test_outputs_must_keep_a_declared_output_spec_from_the_first_call():
    spec = asr.TensorSpec((1,), np.float32)
    by_server, by_immediate = await served_and_immediate(
        lambda: ChangingOutputs(lambda y: y[:, 0], lambda y: y[:, 0], output_spec=spec))
    assert by_immediate[0].startswith("ModelOutputError")
    assert_same(by_server, by_immediate)


async def test_a_zero_row_call_gets_the_empty_output_of_the_known_structure():
    by_server, by_immediate = await served_and_immediate(
        lambda: ChangingOutputs(lambda y: y, lambda y: y[:0, 0]), sizes=(2, 0))
    assert by_immediate[1].shape == (0, 1) and by_immediate[1].dtype == np.float32
    assert_same(by_server, by_immediate)


async def test_outputs_that_are_not_arrays_fail_as_a_servers_do():
    class NotAnArray:
        def __init__(self, y):
            self.y = y

        def __len__(self):
            return len(self.y)
    by_server, by_immediate = await served_and_immediate(
        lambda: ChangingOutputs(NotAnArray, NotAnArray), sizes=(2,))
    assert by_immediate[0].startswith("ModelOutputError")
    assert_same(by_server, by_immediate)


@pytest.mark.parametrize("raised", [asyncio.CancelledError, StopIteration,
                                    GeneratorExit])
async def test_immediate_wraps_what_cannot_reach_a_caller_as_a_server_does(raised):
    # A CancelledError read as the search's own cancellation (its task reported itself
    # cancelled); a StopIteration became "coroutine raised StopIteration".
    from async_search.errors import ModelRaisedError

    def model(x):
        raise raised()

    async def search(evaluate):
        return await evaluate(np.ones((1, 2)))

    task = asyncio.ensure_future(search(asr.immediate(model)))
    with pytest.raises(ModelRaisedError, match=raised.__name__):
        await task
    assert not task.cancelled()


async def test_a_search_over_immediate_can_be_cancelled_while_it_runs():
    # It never let the loop run: Ctrl-C or SIGTERM (a cancellation of the main task)
    # landed only once the whole search was done.
    import time

    evaluate = asr.immediate(lambda x: x * 2)
    calls = []

    async def endless_search():
        while True:
            await evaluate(np.ones((1, 2)))
            calls.append(time.perf_counter())

    task = asyncio.ensure_future(endless_search())
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, task.cancel)  # a timer: runs only where the loop gets a turn
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert calls and calls[-1] - calls[0] < 2.0


async def test_a_deadline_around_many_searches_over_immediate_lands_in_time():
    # Each search ready in the loop's pass ran its own 50 ms before it yielded: a
    # deadline around 40 searches landed 40 x 50 ms = 2 s late (4 s on asyncio).
    import time

    def slow_model(x):
        time.sleep(0.001)
        return x * 2

    evaluate = asr.immediate(slow_model)

    async def endless_search():
        while True:
            await evaluate(np.ones((1, 2)))

    began = time.perf_counter()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await asyncio.gather(*(endless_search() for _ in range(40)))
    assert time.perf_counter() - began < 1.0


async def test_immediate_calls_the_models_check_values_as_a_server_does():
    # It never called it: a value the model would compute wrongly went through.
    class Refuses:
        def check_values(self, x):
            if (x < 0).any():
                raise InputSpecError("negative values are refused")

        def __call__(self, x):
            return x * 2

    evaluate = asr.immediate(Refuses())
    assert (await evaluate(np.ones((1, 2)))).tolist() == [[2.0, 2.0]]
    with pytest.raises(InputSpecError, match="negative values are refused"):
        await evaluate(-np.ones((1, 2)))


async def test_an_async_model_is_refused_with_a_hint_and_no_warning(recwarn):
    async def model(x):  # an async def where a plain function belongs
        return x

    with pytest.raises(asr.ModelOutputError, match="not an async one"):
        await asr.immediate(model)(np.ones((1, 2)))
    async with asr.serve(model) as evaluate:
        with pytest.raises(asr.ModelOutputError, match="not an async one"):
            await evaluate(np.ones((1, 2)))
    import gc
    gc.collect()
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


async def test_a_zero_row_request_is_counted_as_a_server_counts_it():
    # immediate called the model on it and counted a batch of 0; serve counts the
    # request, calls nothing and answers the empty outputs.
    calls = []

    def model(x):
        calls.append(len(x))
        return x * 2

    evaluate = asr.immediate(model)
    await evaluate(np.ones((2, 3), np.float32))
    empty = await evaluate(np.zeros((0, 3), np.float32))
    assert empty.shape == (0, 3) and calls == [2]
    async with asr.serve(model) as served:
        await served(np.ones((2, 3), np.float32))
        await served(np.zeros((0, 3), np.float32))
    for stats in (evaluate.stats, served.stats):
        assert (stats["requests"], stats["batches"], stats["elements"]) == (2, 1, 2)
