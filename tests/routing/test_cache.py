import asyncio

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import async_search as asr
from async_search.errors import InputSpecError, ModelOutputError
from async_search.models import MLP, with_spec
from async_search.routing.cache import CachedEvaluate
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)

MODEL = MLP((4,), hidden_sizes=(8,), output_size=2, seed=3)


class Recorder:
    """An evaluate function over MODEL that records requests; may wait on a gate."""

    def __init__(self, outputs="array", version=0):
        self.requests = []
        self.gate: asyncio.Event | None = None
        self.version = version  # a swap: a new swap_token too
        self.failing = None
        self.outputs = outputs
        self.version_at_finish = False
        self.reports_finish_version = False

    async def with_version(self, x):
        sent = self.version
        self.requests.append(x.copy())
        if self.gate is not None:
            await self.gate.wait()
        if self.failing is not None:
            raise self.failing
        # Computed by the version current when sent, or when finished; reported as the
        # version when finished with reports_finish_version (as a request split across
        # batches during a swap is: partly computed by the old model).
        computed = self.version if self.version_at_finish else sent
        reported = self.version if self.reports_finish_version else computed
        y = MODEL(x) + computed
        if self.outputs == "tuple":
            return (y, y.sum(axis=1)), reported
        if self.outputs == "dict":
            return {"policy": y, "value": y.sum(axis=1)}, reported
        return y, reported

    async def __call__(self, x):
        return (await self.with_version(x))[0]

    @property
    def version(self):
        return self._version

    @version.setter
    def version(self, version):
        self._version = version
        self.swap_token = object()

    @property
    def elements(self):
        return sum(len(r) for r in self.requests)


async def settle():
    """Lets every task that is ready run until it waits (a few loop iterations)."""
    for _ in range(5):
        await asyncio.sleep(0)


def pool(n=10, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


async def test_hits_are_served_from_the_table_and_misses_sent_as_one_request():
    inner = Recorder()
    cached = CachedEvaluate(inner, capacity=100)
    xs = pool()
    np.testing.assert_array_equal(await cached(xs[:6]), MODEL(xs[:6]))
    y = await cached(xs[[5, 7, 0, 8, 5]])  # 5 and 0 are cached; 7, 8 are sent once
    np.testing.assert_array_equal(y, MODEL(xs[[5, 7, 0, 8, 5]]))
    assert [len(r) for r in inner.requests] == [6, 2]
    np.testing.assert_array_equal(inner.requests[1], xs[[7, 8]])
    stats = cached.stats
    assert (stats["hits"], stats["misses"], stats["deduplicated"]) == (3, 8, 0)
    assert stats["hit_rate"] == pytest.approx(3 / 11)
    assert stats["entries"] == 8


async def test_identical_elements_in_flight_are_computed_once():
    inner = Recorder()
    inner.gate = asyncio.Event()
    cached = CachedEvaluate(inner, capacity=100)
    xs = pool()
    first = asyncio.ensure_future(cached(xs[:4]))
    await wait_until(lambda: len(inner.requests) == 1, "the first request is sent")
    second = asyncio.ensure_future(cached(xs[[3, 2, 9, 9]]))  # 3, 2 are in flight
    await wait_until(lambda: len(inner.requests) == 2, "the second request is sent")
    assert [len(r) for r in inner.requests] == [4, 1]  # only 9 is sent, once
    inner.gate.set()
    y1, y2 = await asyncio.wait_for(asyncio.gather(first, second), 5)
    np.testing.assert_array_equal(y1, MODEL(xs[:4]))
    np.testing.assert_array_equal(y2, MODEL(xs[[3, 2, 9, 9]]))
    assert cached.stats["deduplicated"] == 3


@pytest.mark.parametrize("outputs", ["tuple", "dict"])
async def test_tuple_and_dict_outputs_are_assembled_in_order(outputs):
    cached = CachedEvaluate(Recorder(outputs), capacity=100)
    xs = pool()
    await cached(xs[:3])
    y = await cached(xs[[2, 4, 0]])
    want = MODEL(xs[[2, 4, 0]])
    if outputs == "tuple":
        np.testing.assert_array_equal(y[0], want)
        np.testing.assert_array_equal(y[1], want.sum(axis=1))
    else:
        np.testing.assert_array_equal(y["policy"], want)
        np.testing.assert_array_equal(y["value"], want.sum(axis=1))


async def test_least_recently_used_elements_are_evicted_first():
    inner = Recorder()
    cached = CachedEvaluate(inner, capacity=3)
    xs = pool()
    await cached(xs[:3])       # table: 0 1 2
    await cached(xs[[0]])      # 0 is used: 1 is now the oldest
    await cached(xs[[5]])      # evicts 1
    assert cached.stats["evictions"] == 1 and len(cached) == 3
    sent = inner.elements
    await cached(xs[[0, 2, 5]])
    assert inner.elements == sent  # all hits
    await cached(xs[[1]])
    assert inner.elements == sent + 1


async def test_changing_the_returned_outputs_does_not_change_the_table():
    cached = CachedEvaluate(Recorder(), capacity=10)
    xs = pool()
    y = await cached(xs[:2])
    y[:] = 0
    z = await cached(xs[:2])
    z[:] = 1
    np.testing.assert_array_equal(await cached(xs[:2]), MODEL(xs[:2]))


async def test_no_result_of_an_old_version_is_served_after_a_swap():
    inner = Recorder()
    cached = CachedEvaluate(inner, capacity=100)
    xs = pool()
    await cached(xs[:5])
    inner.version = 1
    y, version = await cached.with_version(xs[:5])
    assert version == 1
    np.testing.assert_array_equal(y, MODEL(xs[:5]) + 1)
    assert cached.stats["invalidations"] == 1


async def test_a_result_that_lands_after_a_swap_is_not_stored():
    inner = Recorder()
    inner.gate = asyncio.Event()
    cached = CachedEvaluate(inner, capacity=100)
    xs = pool()
    pending = asyncio.ensure_future(cached(xs[:2]))  # computed by version 0 ...
    await wait_until(lambda: len(inner.requests) == 1, "the first request is sent")
    inner.version = 1                                # ... which is then replaced
    late = asyncio.ensure_future(cached(xs[:2]))     # must not join the old request
    await wait_until(lambda: len(inner.requests) == 2, "the late request is sent")
    inner.gate.set()
    old, new = await asyncio.wait_for(asyncio.gather(pending, late), 5)
    np.testing.assert_array_equal(old, MODEL(xs[:2]))
    np.testing.assert_array_equal(new, MODEL(xs[:2]) + 1)
    np.testing.assert_array_equal(await cached(xs[:2]), MODEL(xs[:2]) + 1)


async def test_parts_of_different_versions_are_looked_up_again():
    inner = Recorder()
    cached = CachedEvaluate(inner, capacity=100)
    xs = pool()
    await cached(xs[:1])  # element 0 cached under version 0
    inner.gate = asyncio.Event()
    inner.version_at_finish = True  # like a request dispatched after a swap
    mixed = asyncio.ensure_future(cached.with_version(xs[:2]))  # hit 0, send 1
    await wait_until(lambda: len(inner.requests) == 2, "the miss is sent")
    inner.version = 1
    inner.gate.set()
    y, version = await asyncio.wait_for(mixed, 5)
    assert version == 1
    np.testing.assert_array_equal(y, MODEL(xs[:2]) + 1)  # not a v0 row beside a v1 row
    assert cached.stats["retries"] == 1


async def test_a_result_sent_before_a_swap_is_not_stored_whatever_version_it_reports():
    inner = Recorder()
    inner.gate = asyncio.Event()
    inner.reports_finish_version = True
    cached = CachedEvaluate(inner, capacity=100)
    xs = pool()
    pending = asyncio.ensure_future(cached(xs[:2]))
    await wait_until(lambda: len(inner.requests) == 1, "the request is sent")
    inner.version = 1
    inner.gate.set()
    await asyncio.wait_for(pending, 5)  # old rows that say "version 1"
    inner.reports_finish_version = False
    inner.gate = None
    np.testing.assert_array_equal(await cached(xs[:2]), MODEL(xs[:2]) + 1)
    assert inner.elements == 4


async def test_a_failure_reaches_every_caller_waiting_on_it_and_is_not_stored():
    inner = Recorder()
    inner.gate = asyncio.Event()
    inner.failing = RuntimeError("model exploded")
    cached = CachedEvaluate(inner, capacity=100)
    xs = pool()
    a = asyncio.ensure_future(cached(xs[:2]))
    await wait_until(lambda: len(inner.requests) == 1, "a's request is sent")
    b = asyncio.ensure_future(cached(xs[1:3]))  # joins a's element 1, sends element 2
    await wait_until(lambda: len(inner.requests) == 2, "b's miss is sent")
    inner.gate.set()
    results = await asyncio.wait_for(asyncio.gather(a, b, return_exceptions=True), 5)
    assert all(isinstance(r, RuntimeError) for r in results)
    inner.failing = None
    np.testing.assert_array_equal(await cached(xs[:3]), MODEL(xs[:3]))
    assert len(inner.requests) == 3


@pytest.mark.parametrize("answer", ["one row", "a 0-d array", "None"])
async def test_an_answer_of_other_rows_fails_every_caller_of_that_request(answer):
    # It went back to the sender as it came, failed a joiner with an IndexError or a
    # TypeError, and raised in a done callback (logged, "Exception in callback").
    gate = asyncio.Event()

    async def wrong(x):
        await gate.wait()
        return {"one row": MODEL(x)[:1], "a 0-d array": np.array(1.0, np.float32),
                "None": None}[answer]

    raised_in_callbacks = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: raised_in_callbacks.append(context))
    try:
        cached = CachedEvaluate(wrong, capacity=10, fixed_model=True)
        xs = pool(3)
        sender = asyncio.ensure_future(cached(xs))  # every element missed, sent
        await wait_until(lambda: len(cached._pending) == 3, "the sender's request")
        joiner = asyncio.ensure_future(cached(xs[1:2]))  # joins the sender's request
        await settle()
        gate.set()
        results = await asyncio.wait_for(
            asyncio.gather(sender, joiner, return_exceptions=True), 5)
        await settle()  # the done callbacks have run
    finally:
        loop.set_exception_handler(None)
    for result in results:
        assert isinstance(result, ModelOutputError), result
        assert "answered a request of 3 elements wrongly" in str(result)
    assert raised_in_callbacks == [] and len(cached) == 0
    assert cached.stats["deduplicated"] == 1  # the joiner did join


class RefusesNegative:
    """``x + 1``; its check_values refuses negative values."""

    input_spec = asr.TensorSpec((1,), np.float32)

    def __call__(self, x):
        return x + 1.0

    def check_values(self, x):
        if (x < 0).any():
            raise InputSpecError("negative values are not taken")


async def test_a_caller_who_joined_a_row_of_a_refused_request_is_answered():
    async with asr.serve(RefusesNegative()) as evaluate:
        cached = CachedEvaluate(evaluate, capacity=100)
        a = asyncio.ensure_future(cached(np.array([[5.0], [-1.0]], np.float32)))
        await asyncio.sleep(0)  # a's rows are in flight
        b = asyncio.ensure_future(cached(np.array([[5.0], [7.0]], np.float32)))
        ra, rb = await asyncio.wait_for(asyncio.gather(a, b, return_exceptions=True), 5)
        assert isinstance(ra, InputSpecError) and "negative" in str(ra)
        np.testing.assert_array_equal(rb, [[6.0], [8.0]])
        assert cached.stats["retries"] == 1
        # A caller whose own row is refused fails, however it joined.
        c = asyncio.ensure_future(cached(np.array([[9.0], [-2.0]], np.float32)))
        await asyncio.sleep(0)
        d = asyncio.ensure_future(cached(np.array([[-2.0]], np.float32)))
        rc, rd = await asyncio.wait_for(asyncio.gather(c, d, return_exceptions=True), 5)
        assert isinstance(rc, InputSpecError) and isinstance(rd, InputSpecError)


async def test_a_cancelled_caller_leaves_the_joined_caller_its_result():
    inner = Recorder()
    inner.gate = asyncio.Event()
    cached = CachedEvaluate(inner, capacity=100)
    xs = pool()
    first = asyncio.ensure_future(cached(xs[:2]))
    await wait_until(lambda: len(inner.requests) == 1, "the first request is sent")
    second = asyncio.ensure_future(cached(xs[:2]))
    await settle()  # second joins the first's request (nothing to observe: no send)
    first.cancel()
    await settle()
    inner.gate.set()
    np.testing.assert_array_equal(await asyncio.wait_for(second, 5), MODEL(xs[:2]))
    assert len(inner.requests) == 1


async def test_bad_requests_reach_the_server_and_fail_as_there():
    async with asr.serve(MODEL) as evaluate:
        cached = CachedEvaluate(evaluate, capacity=10)
        np.testing.assert_array_equal(await cached(pool()[:2]), MODEL(pool()[:2]))
        # Same bytes as a cached float32 element, as int32: must not be a hit.
        with pytest.raises(InputSpecError, match=r"expected \[n, 4\] float32"):
            await cached(pool()[:1].view(np.int32))
        with pytest.raises(InputSpecError, match="must be a NumPy array"):
            await cached([[1.0, 2.0, 3.0, 4.0]])


async def test_a_central_cache_in_front_of_a_server_serves_many_searches():
    async with asr.serve(MODEL, max_batch_size=64) as evaluate:
        cached = CachedEvaluate(evaluate, capacity=1000)
        xs = pool(20)

        async def search(seed):
            rng = np.random.default_rng(seed)
            for _ in range(20):
                idx = rng.integers(0, 20, 3)
                np.testing.assert_array_equal(await cached(xs[idx]), MODEL(xs[idx]))

        await asyncio.wait_for(asyncio.gather(*(search(s) for s in range(32))), 20)
        assert evaluate.stats["elements"] == 20  # each distinct element computed once
        assert cached.stats["hit_rate"] > 0.9


async def test_a_sender_changing_its_outputs_does_not_change_a_joiners():
    inner = Recorder()
    inner.gate = asyncio.Event()
    cached = CachedEvaluate(inner, capacity=0)
    xs = pool()

    async def sender():
        y = await cached(xs[:2])
        y[:] = -1  # its own outputs: it may
        return y

    first = asyncio.ensure_future(sender())
    await wait_until(lambda: len(inner.requests) == 1, "the sender's request is sent")
    second = asyncio.ensure_future(cached(xs[:2]))
    await settle()
    inner.gate.set()
    _, joined = await asyncio.wait_for(asyncio.gather(first, second), 5)
    np.testing.assert_array_equal(joined, MODEL(xs[:2]))


async def test_capacity_zero_only_merges_elements_in_flight():
    inner = Recorder()
    cached = CachedEvaluate(inner, capacity=0)
    xs = pool()
    await asyncio.gather(cached(xs[:3]), cached(xs[:3]))
    await cached(xs[:3])
    assert [len(r) for r in inner.requests] == [3, 3]
    assert len(cached) == 0
    with pytest.raises(ValueError, match="capacity must be an integer >= 0"):
        CachedEvaluate(inner, capacity=-1)
    # A NumPy integer is an integer, as everywhere else (it was refused), kept as int.
    assert type(CachedEvaluate(inner, capacity=np.int64(5)).capacity) is int


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=6), min_size=1,
                max_size=12),
       st.integers(0, 6))
def test_outputs_always_equal_the_models(requests, capacity):
    xs = pool(8, seed=5)

    async def run():
        inner = Recorder()
        cached = CachedEvaluate(inner, capacity=capacity)
        ys = await asyncio.gather(*(cached(xs[r]) for r in requests))
        for r, y in zip(requests, ys):
            np.testing.assert_array_equal(y, MODEL(xs[r]))
        assert inner.elements <= sum(map(len, requests))
        assert len(cached) <= capacity
        # Concurrent requests send each distinct element once.
        assert inner.elements == len({i for r in requests for i in r})

    asyncio.run(run())


# -- what the wrapped function must report ------------------------------------------------
class LabelsWithoutToken:
    """The shape of a process client before: answers labelled 0, no version, no token."""

    async def with_version(self, x):
        return MODEL(x), 0

    async def __call__(self, x):
        return MODEL(x)


async def plain(x):
    return MODEL(x)


@pytest.mark.parametrize("evaluate, missing", [
    (plain, "no version and no swap_token"),
    (LabelsWithoutToken(), "no version and no swap_token"),
    (lambda x: x, "no version and no swap_token"),
])
def test_a_function_that_cannot_say_which_model_answers_is_refused(evaluate, missing):
    with pytest.raises(TypeError, match=f"must know which model answers .*{missing}.*"
                                        f"fixed_model=True"):
        CachedEvaluate(evaluate)


def test_an_object_with_a_version_but_no_swap_token_is_refused():
    class VersionOnly:
        version = 3

        async def __call__(self, x):
            return MODEL(x)

    with pytest.raises(TypeError, match="reports no swap_token"):
        CachedEvaluate(VersionOnly())
    with pytest.raises(TypeError, match="fixed_model must be True or False"):
        CachedEvaluate(plain, fixed_model=1)


async def test_a_fixed_model_is_cached_without_versions():
    calls = []

    async def counted(x):
        calls.append(len(x))
        return MODEL(x)

    cached = CachedEvaluate(counted, capacity=10, fixed_model=True)
    xs = pool()
    for _ in range(3):
        np.testing.assert_array_equal(await cached(xs[:3]), MODEL(xs[:3]))
    y, version = await cached.with_version(xs[:3])
    assert calls == [3] and version is None and cached.version is None
    assert cached.stats["hits"] == 9


class Unknown(Recorder):
    """A function that does not know its version yet (a client before its server's
    first word): swap_token None."""

    def __init__(self):
        super().__init__()
        self.swap_token = None

    def learn(self, version):
        self.version = version  # renews the token: now known


async def test_while_the_version_is_unknown_every_request_goes_straight_through():
    inner = Unknown()
    inner.gate = asyncio.Event()
    cached = CachedEvaluate(inner, capacity=100)
    xs = pool()
    first = asyncio.ensure_future(cached(xs[:2]))
    await wait_until(lambda: len(inner.requests) == 1, "the first request is sent")
    second = asyncio.ensure_future(cached(xs[:2]))  # no join: nothing vouches for it
    await wait_until(lambda: len(inner.requests) == 2, "the second request is sent")
    inner.gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    await cached(xs[:2])
    assert len(inner.requests) == 3 and len(cached) == 0  # nothing stored, no hit
    inner.learn(0)
    await cached(xs[:2])
    await cached(xs[:2])
    assert len(inner.requests) == 4 and cached.stats["hits"] == 2


class LabelsNone(Recorder):
    """Reports a version and a token, but labels every answer None (unknown)."""

    async def with_version(self, x):
        return (await super().with_version(x))[0], None


async def test_results_labelled_with_an_unknown_version_are_never_stored():
    inner = LabelsNone()
    cached = CachedEvaluate(inner, capacity=100)
    xs = pool()
    for _ in range(3):
        np.testing.assert_array_equal(await cached(xs[:2]), MODEL(xs[:2]))
    assert len(inner.requests) == 3 and cached.stats["hits"] == 0


async def test_a_cache_reports_a_new_swap_token_at_each_swap_so_caches_stack():
    inner = Recorder()
    inner_cache = CachedEvaluate(inner, capacity=100)
    outer = CachedEvaluate(inner_cache, capacity=100)
    xs = pool()
    token = outer.evaluate.swap_token
    np.testing.assert_array_equal(await outer(xs[:2]), MODEL(xs[:2]))
    assert inner_cache.swap_token is token  # no swap: the same generation
    inner.version = 0  # the same label, a new model
    assert inner_cache.swap_token is not token
    np.testing.assert_array_equal(await outer(xs[:2]), MODEL(xs[:2]))
    assert outer.stats["invalidations"] == 1 and len(inner.requests) == 2


async def test_outputs_of_one_value_per_element_are_cached_and_repeated():
    # A value head answers [n]: hits, repeated elements and mixed requests stack it back
    async def values(x):
        return x.sum(axis=1)

    cached = CachedEvaluate(values, capacity=10, fixed_model=True)
    xs = pool(4)
    np.testing.assert_array_equal(await cached(xs[:2]), xs[:2].sum(axis=1))
    for request in (xs[:2], xs[[1, 1, 0]], xs[[3, 0, 3]]):  # hits, repeats, a mix
        y = await asyncio.wait_for(cached(request), 5)
        assert y.shape == (len(request),) and y.dtype == np.float32
        np.testing.assert_array_equal(y, request.sum(axis=1))


async def test_a_caller_who_left_and_reused_its_array_does_not_change_what_is_stored():
    gate = asyncio.Event()

    async def slow(x):
        await gate.wait()
        return MODEL(x)

    cached = CachedEvaluate(slow, capacity=10, fixed_model=True)
    x = pool(2)
    original = x.copy()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(cached(x), 0.05)  # it left; the request goes on
    x[:] = 100.0  # and it reuses its buffer
    gate.set()
    await wait_until(lambda: not cached._tasks, "the request to land")
    np.testing.assert_array_equal(await cached(original), MODEL(original))


async def test_a_request_nobody_waits_for_any_more_is_not_joined():
    # The server lost the first request: later requests for its element are sent
    # afresh once its callers have left, instead of waiting on it for good.
    lost = asyncio.Event()

    async def loses_the_first(x):
        if not lost.is_set():
            lost.set()
            await asyncio.Event().wait()
        return MODEL(x)

    cached = CachedEvaluate(loses_the_first, capacity=10, fixed_model=True)
    x = pool(1)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(cached(x), 0.05)
    np.testing.assert_array_equal(await asyncio.wait_for(cached(x), 5), MODEL(x))
    mixed = np.concatenate([x, pool(1, seed=1)])
    np.testing.assert_array_equal(await asyncio.wait_for(cached(mixed), 5), MODEL(mixed))
    for task in list(cached._tasks):  # the lost one
        task.cancel()


async def test_a_model_cached_where_an_evaluate_belongs_is_named_as_such():
    model = MLP((4,), hidden_sizes=(8,), output_size=1, seed=0)
    cache = CachedEvaluate(model, fixed_model=True)
    with pytest.raises(TypeError, match=r"wrap a model with asr\.immediate\(model\)"):
        await asyncio.wait_for(cache(np.zeros((2, 4), np.float32)), 10)


async def test_evaluate_with_version_names_a_model_passed_for_evaluate():
    from async_search.base import evaluate_with_version
    model = MLP((4,), hidden_sizes=(8,), output_size=1, seed=0)
    with pytest.raises(TypeError, match=r"evaluate must return an awaitable"):
        await evaluate_with_version(model, np.zeros((2, 4), np.float32))


async def test_object_arrays_go_past_the_table_and_each_row_gets_its_own_answer():
    # An object array's bytes are its objects' addresses: a new string at a freed
    # address got the old one's cached length, and a list that grew kept its old one.
    def lengths(x):
        return np.array([[len(v)] for v in x[:, 0]], np.int64)

    async with asr.serve(lengths) as served:
        cached = CachedEvaluate(served, capacity=100)
        for i in range(50):
            x = np.empty((1, 1), object)
            x[0, 0] = "x" * (i % 7 + 1) + str(i)
            assert (await cached(x))[0, 0] == len(x[0, 0])
            del x
        grows = np.empty((1, 1), object)
        grows[0, 0] = [1, 2]
        assert (await cached(grows))[0, 0] == 2
        grows[0, 0].append(3)
        assert (await cached(grows))[0, 0] == 3
        stats = cached.stats
    assert stats["entries"] == 0 and stats["requests"] == stats["bypassed"] == 52


async def test_requests_past_the_table_are_counted_as_bypassed():
    # They were missing from every count: 13 elements computed, 3 reported.
    async def f(x):
        return np.asarray(x, np.float64).reshape(len(x), -1)[:, :1]

    cached = CachedEvaluate(f, fixed_model=True)
    await cached(np.ones((2, 2), np.float32))
    await cached(np.ones((3, 2), ">f4"))       # the other byte order
    await cached(np.ones((4, 3), np.float32))  # another element shape
    await cached(np.ones((5, 2), np.float64))  # another dtype
    stats = cached.stats
    assert stats["requests"] == 4 and stats["bypassed"] == 12 and stats["misses"] == 1


async def test_a_model_swapped_away_and_back_under_one_label_is_a_new_generation():
    # A request sent under A was computed by B (swapped in, version 0), and the server
    # swapped back to A (version 0) while B computed: B's row was stored as A's, and
    # served from then on.
    import threading

    class Constant:
        def __init__(self, value):
            self.value, self.started, self.gate = value, threading.Event(), None

        def __call__(self, x):
            if self.gate is not None and x[0, 0] != 1.0:
                self.started.set()
                self.gate.wait(10)
            return np.full((len(x), 1), self.value, np.float32)

    a, b = Constant(1.0), Constant(2.0)
    a.gate, b.gate = threading.Event(), threading.Event()
    async with asr.serve(a, model_thread=True, pipeline_depth=1) as served:
        cached = CachedEvaluate(served, capacity=100)
        x = np.zeros((1, 4), np.float32)
        await cached(np.ones((1, 4), np.float32))  # the table's generation: A, 0
        hold = asyncio.ensure_future(served(np.full((1, 4), 9, np.float32)))
        await asyncio.wait_for(asyncio.to_thread(a.started.wait, 10), 15)
        first = asyncio.ensure_future(cached(x))   # sent under A, queued behind hold
        for _ in range(5):
            await asyncio.sleep(0)
        served.update_model(b, version=0)
        a.gate.set()                               # x's batch now runs on B
        await asyncio.wait_for(asyncio.to_thread(b.started.wait, 10), 15)
        served.update_model(a, version=0)          # back to A while B computes
        b.gate.set()
        await asyncio.wait_for(hold, 10)
        assert (await asyncio.wait_for(first, 10))[0, 0] == 2.0  # B computed it
        assert (await cached(x))[0, 0] == 1.0      # A's, not B's stored row


async def test_a_cached_row_holds_its_own_bytes_not_its_whole_requests_outputs():
    # Each entry was a view of its request's whole outputs: a row still in the table
    # kept them all alive (capacity rows held capacity requests' outputs).
    import tracemalloc

    async def wide(x):
        return np.repeat(x[:, :1], 256, axis=1)  # 1 KiB a row

    cache = CachedEvaluate(wide, capacity=150, fixed_model=True)
    firsts = []
    tracemalloc.start()
    try:
        for i in range(50):
            x = np.arange(i * 100, (i + 1) * 100, dtype=np.float32)[:, None].repeat(2, 1)
            await cache(x)
            firsts.append(x[:1])
            await cache(np.concatenate(firsts))  # one row of each request stays
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(cache) == 150 and cache.stats["hits"] == 50 * 51 // 2
    # 150 rows of 1 KiB (and bookkeeping), not 50 requests' 100 rows of 1 KiB each.
    assert held < 1 << 20, held


async def test_a_callers_deadline_goes_with_what_the_cache_sends_so_a_hung_server_trips():
    # The cache's deadline bounded its own wait only: the router behind it never saw
    # one, the hung server's breaker never opened (half the requests timed out for
    # good), and the cache kept a task per timed-out request.
    from async_search.errors import RequestTimeoutError
    from async_search.routing.breaker import BreakerPolicy
    from async_search.routing.router import Router

    async def good(x):
        await asyncio.sleep(0.001)
        return x * 2

    async def hung(x):
        await asyncio.Event().wait()

    router = Router({"a": good, "b": hung},
                    breaker=BreakerPolicy(failure_threshold=2, reset_timeout=60))
    cached = CachedEvaluate(router, fixed_model=True)
    timed_out = 0
    for i in range(12):
        try:
            await asyncio.wait_for(cached(np.full((1, 3), i, np.float32), timeout=0.1), 10)
        except RequestTimeoutError:
            timed_out += 1
    assert timed_out == 2 and router.breakers["b"].state.value == "open"
    assert router.outstanding["b"] == 0 and not cached._tasks


async def test_a_caller_joining_a_request_that_ran_out_of_its_senders_time_gets_its_rows():
    # The sender's deadline goes with the request: the caller who joined it, with time
    # left, must not get the sender's RequestTimeoutError.
    import threading

    from async_search.errors import RequestTimeoutError

    gate = threading.Event()

    def slow(x):
        gate.wait(10)
        return x * 2

    async with asr.serve(with_spec(slow, (3,), np.float32), model_thread=True) as served:
        cached = CachedEvaluate(served)
        x = np.ones((1, 3), np.float32)
        busy = asyncio.ensure_future(served(np.zeros((1, 3), np.float32)))  # holds the model
        await asyncio.sleep(0.05)
        sender = asyncio.ensure_future(cached(x, timeout=0.1))
        await asyncio.sleep(0)
        joiner = asyncio.ensure_future(cached(x))
        with pytest.raises(RequestTimeoutError):
            await asyncio.wait_for(sender, 10)
        gate.set()
        np.testing.assert_array_equal(await asyncio.wait_for(joiner, 10), x * 2)
        await asyncio.wait_for(busy, 10)
