"""Request deadlines: the helpers, and the evaluate functions that only await others (a
router, a cache). A server's own deadlines are tested with the server
(test_batching.py), a client's with the client (test_client.py)."""

import asyncio
import threading

import numpy as np
import pytest

import async_search as asr
from async_search.deadlines import check_timeout, expire_after, within_deadline
from async_search.errors import RequestTimeoutError
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)


class Gated:
    """``x + 1``, each batch held until the test opens the gate; records what ran."""

    def __init__(self):
        self.input_spec = asr.TensorSpec((1,), np.float32)
        self.gate = threading.Event()
        self.started = threading.Event()
        self.seen = []

    def __call__(self, x):
        self.started.set()
        assert self.gate.wait(10), "the test never opened the gate"
        self.seen.append(x.copy())
        return x + 1.0


async def test_expire_after_fails_the_future_at_its_deadline_and_not_after_it_is_done():
    loop = asyncio.get_running_loop()
    expired = []
    late, answered = loop.create_future(), loop.create_future()
    expire_after(late, 0.01, lambda: expired.append(1), note="; dropped")
    expire_after(answered, 0.01, lambda: expired.append(2))
    answered.set_result(7)
    with pytest.raises(RequestTimeoutError, match="timeout of 0.01 s; dropped$"):
        await asyncio.wait_for(late, 5)
    assert answered.result() == 7 and expired == [1]
    assert not [h for h in loop._scheduled if not h.cancelled()]


async def test_within_deadline_times_out_only_its_own_deadline():
    async def slow(result, seconds=10.0):
        await asyncio.sleep(seconds)
        return result

    async def raises_timeout():
        raise TimeoutError("the awaitable's own")

    assert await within_deadline(slow(3, 0), 5) == 3
    inner = asyncio.ensure_future(slow(4))
    with pytest.raises(RequestTimeoutError, match="timeout of 0.02 s"):
        await within_deadline(inner, 0.02)
    assert inner.cancelled()  # what it awaited is dropped
    with pytest.raises(TimeoutError, match="the awaitable's own") as info:
        await within_deadline(raises_timeout(), 5)
    assert type(info.value) is TimeoutError
    # The caller cancelled: a cancellation, not a timeout.
    caller = asyncio.ensure_future(within_deadline(slow(5), 5))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    for bad in (0, -1, float("inf"), True, None):
        with pytest.raises(ValueError, match="timeout must be a finite number > 0"):
            check_timeout(bad)


async def test_a_routed_request_past_its_deadline_is_dropped_and_counts_against_its_server():
    model = Gated()
    async with asr.serve(model, max_batch_size=4, pipeline_depth=1) as a:
        router = asr.Router({"a": a})
        first = asyncio.ensure_future(router(np.zeros((1, 1), np.float32)))
        await asyncio.to_thread(model.started.wait, 5)  # the model holds a batch
        # (before any answer, a deadline counts against a server from FIRST_FAIR_S on)
        with pytest.raises(RequestTimeoutError):
            await router(np.full((1, 1), 7, np.float32), timeout=0.15)
        with pytest.raises(RequestTimeoutError):
            await router.with_version(np.full((1, 1), 8, np.float32), timeout=0.15)
        model.gate.set()
        assert (await asyncio.wait_for(first, 10)).tolist() == [[1.0]]
        y, version = await router.with_version(np.ones((1, 1), np.float32), timeout=30)
        stats = router.stats["servers"]["a"]
    assert (y.tolist(), version) == ([[2.0]], 0)
    seen = np.concatenate(model.seen).ravel().tolist()
    assert 7.0 not in seen and 8.0 not in seen  # dropped before the model ran
    # The server kept both past their deadline: two failures (a hung server would trip
    # its breaker), below the threshold of five.
    assert stats["failures"] == 2 and stats["breaker"]["state"] == "closed"
    with pytest.raises(ValueError, match="timeout must be"):
        await router(np.ones((1, 1), np.float32), timeout=-1)


async def test_a_cached_request_past_its_deadline_fails_and_a_later_one_is_sent_again():
    # The deadline goes with what the cache sends (a router behind it counts a hung
    # server's timeouts against it): rows the server discards past it are not kept.
    model = Gated()
    async with asr.serve(model, max_batch_size=4) as evaluate:
        cache = asr.CachedEvaluate(evaluate)
        x = np.full((1, 1), 7, np.float32)
        with pytest.raises(RequestTimeoutError):
            await cache(x, timeout=0.05)  # the model holds its batch
        model.gate.set()
        assert (await cache(x, timeout=30)).tolist() == [[8.0]]  # sent again
        y, version = await cache.with_version(x, timeout=30)  # a hit
        stats = cache.stats
    assert (y.tolist(), version) == ([[8.0]], 0)
    assert stats["hits"] == 1 and len(model.seen) == 2
    with pytest.raises(ValueError, match="timeout must be"):
        await cache(x, timeout=0)


@pytest.mark.parametrize("model_thread", [False, True])
async def test_a_result_that_comes_past_the_deadline_is_a_timeout_not_a_late_answer(
        model_thread):
    # On the loop the result was handed out inside the dispatch task, before the timer
    # could run; from a thread, while a search kept the loop busy past the deadline.
    import time

    def slow(x):
        time.sleep(0.05)
        return x * 2.0

    async with asr.serve(slow, model_thread=model_thread) as evaluate:
        await evaluate(np.ones((1, 1)))
        late = evaluate(np.ones((1, 1)), timeout=0.01)
        if model_thread:
            for _ in range(2):  # the batch reaches the device thread
                await asyncio.sleep(0)
            time.sleep(0.08)  # a search step holds the loop past the deadline
        with pytest.raises(RequestTimeoutError):
            await late
        assert evaluate.stats["timed_out"] == 1
        np.testing.assert_array_equal(await evaluate(np.ones((1, 1)), timeout=5), [[2.0]])


@pytest.mark.parametrize("wrapper", ["router", "cache", "within_deadline"])
async def test_an_answer_computed_on_the_loop_past_the_deadline_is_a_timeout(wrapper):
    # The answer came in the loop iteration of the deadline, before its timer ran: the
    # router handed it out 0.3 s late where the server it wraps raised the timeout.
    import time

    from async_search.models import with_spec
    from async_search.routing.cache import CachedEvaluate
    from async_search.routing.router import Router

    def slow(x):
        time.sleep(0.1)
        return x * 2.0

    evaluate = asr.immediate(with_spec(slow, (1,), np.float64))
    x = np.ones((1, 1))
    if wrapper == "router":
        call = Router({"a": evaluate})(x, timeout=0.02)
    elif wrapper == "cache":
        call = CachedEvaluate(evaluate, fixed_model=True)(x, timeout=0.02)
    else:
        call = within_deadline(evaluate(x), 0.02)
    with pytest.raises(RequestTimeoutError, match="timeout of 0.02 s"):
        await call


@pytest.mark.parametrize("wrapper", ["router", "cache"])
async def test_a_timeout_in_a_task_that_swallowed_a_cancellation_is_still_a_timeout(
        wrapper):
    # The caller's pending cancellations were read as a count from zero: a task that
    # once caught CancelledError (without uncancel) got CancelledError at a deadline.
    from async_search.routing.cache import CachedEvaluate
    from async_search.routing.router import Router

    gate = asyncio.Event()

    async def hung(x):
        await gate.wait()
        return x

    hung.version, hung.swap_token = 0, object()
    evaluate = Router({"a": hung}) if wrapper == "router" else CachedEvaluate(hung)

    async def caller():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass  # swallowed: the task's count stays at 1
        with pytest.raises(RequestTimeoutError):
            await evaluate(np.ones((1, 1), np.float32), timeout=0.02)
        return "timed out"

    task = asyncio.ensure_future(caller())
    await asyncio.sleep(0)
    task.cancel()
    assert await asyncio.wait_for(task, 5) == "timed out"
    gate.set()
