import asyncio
import collections
import gc
import threading

import numpy as np
import pytest

import async_search as asr
from async_search import rows
from async_search.batchers import BatchSizeBatcher, CostBatcher
from async_search.errors import (InputSpecError, ModelOutputError, ModelRaisedError,
                                 ServerClosedError,
                                 ServerCrashedError)
from async_search.models import MLP, with_spec
from async_search.servers import BatchingServer
from tests.helpers import wait_until, within

pytestmark = pytest.mark.timeout(60)


def doubling(shape=(3,)):
    return with_spec(lambda x: x * 2.0, shape, np.float32)


class GatedModel:
    """A model that blocks in its device thread until the test opens the gate."""

    def __init__(self, shape=(1,)):
        self.input_spec = asr.TensorSpec(shape, np.float32)
        self.gate = threading.Event()
        self.started = threading.Event()
        self.seen = []

    def __call__(self, x):
        self.started.set()
        assert self.gate.wait(10), "the test never opened the gate"
        self.seen.append(x.copy())
        return x + 1.0


async def wait_thread_event(event, timeout=5.0):
    assert await asyncio.to_thread(event.wait, timeout)


async def test_thousand_concurrent_coroutines_get_exactly_model_outputs():
    model = MLP((5,), hidden_sizes=(16,), output_size=3, seed=1)
    rng = np.random.default_rng(0)
    requests = [rng.standard_normal((rng.integers(0, 9), 5)).astype(np.float32)
                for _ in range(1000)]

    async def search(x):
        await asyncio.sleep(0)
        return await evaluate(x)

    async with asr.serve(model, max_batch_size=128) as evaluate:
        results = await asyncio.gather(*(search(x) for x in requests))
        stats = evaluate.stats
    for x, y in zip(requests, results):
        np.testing.assert_array_equal(y, model(x))
        assert y.shape == (len(x), 3)
    assert stats["mean_batch_size"] > 1
    assert stats["elements"] == sum(len(x) for x in requests)


async def test_requests_made_on_consecutive_iterations_share_one_batch():
    async def staggered(i):
        for _ in range(i):
            await asyncio.sleep(0)
        return await evaluate(np.full((1, 3), i, np.float32))

    async with asr.serve(doubling(), max_batch_size=64) as evaluate:
        await asyncio.gather(*(staggered(i) for i in range(10)))
        assert evaluate.stats["batch_size_histogram"] == {10: 1}


@pytest.mark.parametrize("bad, message", [
    (np.zeros((2, 4), np.float32), r"expected \[n, 3\] float32, given \[2, 4\] float32"),
    (np.zeros((2, 3), np.float64), r"expected \[n, 3\] float32, given \[2, 3\] float64"),
    ([[1.0, 2.0, 3.0]], r"must be a NumPy array \[n, 3\] float32, got list"),
    (np.float32(1.0), r"must be a NumPy array"),
    (np.zeros((), np.float32), r"batch dimension"),
])
async def test_bad_request_raises_value_error_and_batch_mates_get_results(bad, message):
    good = np.ones((2, 3), np.float32)
    async with asr.serve(doubling()) as evaluate:
        pending = evaluate(good)
        with pytest.raises(ValueError, match=message) as info:
            evaluate(bad)
        assert isinstance(info.value, InputSpecError)
        np.testing.assert_array_equal(await pending, good * 2)
        assert evaluate.stats["elements"] == 2


async def test_model_without_spec_learns_it_from_the_first_request():
    async with asr.serve(lambda x: x + 1) as evaluate:
        y = await evaluate(np.zeros((2, 4), np.int32))
        assert y.tolist() == [[1] * 4] * 2
        with pytest.raises(InputSpecError, match=r"expected \[n, 4\] int32"):
            evaluate(np.zeros((2, 5), np.int32))


async def test_raising_model_fails_its_batch_and_server_serves_the_next():
    def model(x):
        if (x < 0).any():
            raise ArithmeticError("negative input")
        return x * 2.0

    async with asr.serve(with_spec(model, (1,), np.float32)) as evaluate:
        bad = asyncio.gather(evaluate(np.ones((1, 1), np.float32)),
                             evaluate(-np.ones((1, 1), np.float32)), return_exceptions=True)
        results = await bad
        assert all(isinstance(r, ArithmeticError) for r in results)
        y = await evaluate(np.full((1, 1), 3.0, np.float32))
        assert y.tolist() == [[6.0]]
        assert evaluate.stats["failed_batches"] == 1


PolicyValue = collections.namedtuple("PolicyValue", "policy value")


@pytest.mark.parametrize("kind, delivered", [
    (lambda x: [x, 2 * x], tuple),
    (lambda x: PolicyValue(x, 2 * x), tuple),
    (lambda x: collections.OrderedDict(p=x, v=2 * x), dict),
])
async def test_immediate_and_serve_deliver_a_list_or_a_subclass_as_the_same_plain_kind(
        kind, delivered):
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    alone = await asr.immediate(kind)(x)
    async with asr.serve(kind, max_batch_size=2) as evaluate:  # split over two batches
        served = await within(evaluate(x), "an answer")
        empty = await within(evaluate(x[:0]), "a zero-row answer")
    for out in (alone, served, empty):
        assert type(out) is delivered
    for a, b in zip(rows.leaves(alone), rows.leaves(served)):
        np.testing.assert_array_equal(a, b)


async def test_zero_row_callers_each_get_their_own_container():
    async with asr.serve(lambda x: {"v": x[:, 0], "p": 2 * x}) as evaluate:
        await within(evaluate(np.ones((2, 3))), "the first batch")
        a = await within(evaluate(np.ones((0, 3))), "a zero-row answer")
        a.pop("p")
        b = await within(evaluate(np.ones((0, 3))), "another")
    assert sorted(b) == ["p", "v"]


class _ArrayLike:
    """Rows that are not an ndarray, viewing the batch (as torch.from_numpy's)."""

    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return _ArrayLike(self.x[index])

    def __array__(self, dtype=None, copy=None):
        return self.x


@pytest.mark.parametrize("model, message", [
    (lambda x: x[:-1], "returned 1 rows for a batch of 2 elements"),
    (lambda x: [1, 2], "output 0 is a int, not an array"),
    # a list of rows: sliced along its rows' axis, every caller got values of all
    (lambda x: (x * 10).tolist(), "output 0 is a list; a list of rows is not an output"),
    # an array-like (a tensor from torch.from_numpy, say) may view the server's input
    # buffer, which a later batch reuses under its caller
    (lambda x: (_ArrayLike(x),), "output 0 is a _ArrayLike; convert it with .numpy()"),
    (lambda x: {1, 2}, "must return an ndarray, or a tuple, list or dict"),
    (lambda x: np.array(1.0), "no batch dimension"),
])
async def test_model_with_wrong_outputs_fails_the_batch_with_clear_error(model, message):
    async with asr.serve(with_spec(model, (1,), np.float32)) as evaluate:
        with pytest.raises(ModelOutputError, match=message):
            await evaluate(np.ones((2, 1), np.float32))


async def test_cancelled_request_is_dropped_before_batching():
    model = GatedModel()
    async with asr.serve(model, pipeline_depth=1) as evaluate:
        first = evaluate(np.zeros((1, 1), np.float32))
        await wait_thread_event(model.started)  # the model is busy with the first batch
        kept = evaluate(np.full((1, 1), 1.0, np.float32))
        dropped = asyncio.ensure_future(evaluate(np.full((1, 1), 99.0, np.float32)))
        await asyncio.sleep(0)
        dropped.cancel()
        model.gate.set()
        assert (await first).tolist() == [[1.0]]
        assert (await kept).tolist() == [[2.0]]
    assert dropped.cancelled()
    assert all(99.0 not in batch for batch in model.seen)


async def test_cancelled_request_after_batching_is_discarded_and_mates_served():
    model = GatedModel()
    async with asr.serve(model) as evaluate:
        cancelled = asyncio.ensure_future(evaluate(np.zeros((1, 1), np.float32)))
        mate = evaluate(np.ones((1, 1), np.float32))
        await wait_thread_event(model.started)
        cancelled.cancel()
        model.gate.set()
        assert (await mate).tolist() == [[2.0]]
    assert cancelled.cancelled()


async def test_leaving_the_context_serves_queued_requests():
    model = GatedModel()
    async with asr.serve(model, max_batch_size=2, pipeline_depth=1) as evaluate:
        futures = [evaluate(np.full((1, 1), i, np.float32)) for i in range(5)]
        model.gate.set()
    assert [f.result().item() for f in futures] == [1.0, 2.0, 3.0, 4.0, 5.0]


async def test_leaving_the_context_on_error_fails_queued_requests_clearly():
    model = GatedModel()
    futures = []
    with pytest.raises(KeyError):
        async with asr.serve(model, max_batch_size=1, pipeline_depth=1) as evaluate:
            futures = [evaluate(np.full((1, 1), i, np.float32)) for i in range(3)]
            await wait_thread_event(model.started)
            model.gate.set()
            raise KeyError("body failed")
    assert futures[0].result().item() == 1.0  # it was in the model already
    for fut in futures[1:]:
        assert isinstance(fut.exception(), ServerClosedError)


async def test_evaluate_after_close_raises_server_closed_error():
    async with asr.serve(doubling()) as evaluate:
        pass
    with pytest.raises(ServerClosedError):
        evaluate(np.ones((1, 3), np.float32))


def test_a_server_never_entered_refuses_requests_clearly():
    server = BatchingServer(doubling())
    with pytest.raises(RuntimeError, match="inside its context"):
        server(np.ones((1, 3), np.float32))


async def test_no_thread_or_task_outlives_the_context():
    before = set(threading.enumerate())
    async with asr.serve(doubling()) as evaluate:
        await evaluate(np.ones((1, 3), np.float32))
        assert len(set(threading.enumerate()) - before) == 1
    assert set(threading.enumerate()) - before == set()
    assert evaluate._task.done()


async def test_model_runs_in_a_thread_while_searches_keep_running():
    main_thread = threading.get_ident()
    model_threads = []
    started, gate = threading.Event(), threading.Event()

    def held(x):  # returns once the loop has run ten ticks while it was running
        model_threads.append(threading.get_ident())
        started.set()
        if not gate.wait(10):
            raise TimeoutError("the event loop did not run while the model did")
        return x

    ticks = 0

    async def ticker():
        nonlocal ticks
        await wait_thread_event(started)
        for _ in range(10):
            ticks += 1
            await asyncio.sleep(0)
        gate.set()

    async with asr.serve(with_spec(held, (1,), np.float32)) as evaluate:
        ticking = asyncio.ensure_future(ticker())
        y = await evaluate(np.ones((1, 1), np.float32))
        await ticking
    assert y.tolist() == [[1.0]]
    assert model_threads and main_thread not in model_threads
    assert ticks == 10


async def test_request_larger_than_a_batch_is_split_and_reassembled():
    model = MLP((2,), hidden_sizes=(4,), output_size=2)
    x = np.random.default_rng(3).standard_normal((37, 2)).astype(np.float32)
    async with asr.serve(model, max_batch_size=8) as evaluate:
        small = evaluate(x[:3])
        y = await evaluate(x)
        np.testing.assert_array_equal(y, model(x))
        np.testing.assert_array_equal(await small, model(x[:3]))
        assert max(evaluate.stats["batch_size_histogram"]) == 8


async def test_zero_element_request_resolves_at_once_with_empty_output():
    model = MLP((2,), output_size=4)
    async with asr.serve(model) as evaluate:
        fut = evaluate(np.zeros((0, 2), np.float32))
        assert fut.done() and fut.result().shape == (0, 4)
        assert evaluate.stats["batches"] == 0


async def test_zero_element_request_without_output_spec_still_resolves():
    async with asr.serve(lambda x: x[:, :1]) as evaluate:
        y = await evaluate(np.zeros((0, 3), np.float32))
        assert y.shape == (0, 1)


async def test_tuple_and_dict_outputs_are_split_per_request():
    def policy_value(x):
        return {"policy": x * 2, "value": x.sum(axis=1)}

    async with asr.serve(with_spec(policy_value, (2,), np.float32), max_batch_size=3) as ev:
        xs = [np.full((n, 2), n, np.float32) for n in (1, 2, 4)]
        ys = await asyncio.gather(*(ev(x) for x in xs))
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y["policy"], x * 2)
        np.testing.assert_array_equal(y["value"], x.sum(axis=1))


async def test_max_delay_waits_for_fuller_batches_and_counts_why():
    async def trickle(evaluate):
        futures = []
        for i in range(6):
            futures.append(evaluate(np.full((1, 3), i, np.float32)))
            await asyncio.sleep(0.01)
        return await asyncio.gather(*futures)

    async with asr.serve(doubling(), max_delay=0.2) as evaluate:
        await trickle(evaluate)
        delayed = evaluate.stats
    async with asr.serve(doubling()) as evaluate:
        await trickle(evaluate)
        eager = evaluate.stats
    assert delayed["batches"] < eager["batches"]
    assert delayed["reasons"].get("delay", 0) >= 1
    assert set(eager["reasons"]) == {"idle"}


async def test_full_batch_never_waits_for_max_delay():
    async with asr.serve(doubling(), max_batch_size=4, max_delay=30.0) as evaluate:
        y = await asyncio.wait_for(evaluate(np.ones((4, 3), np.float32)), timeout=5)
        assert y.shape == (4, 3)
        assert evaluate.stats["reasons"] == {"full": 1}


async def test_pipeline_depth_bounds_batches_in_flight():
    model = GatedModel()
    async with asr.serve(model, max_batch_size=1, pipeline_depth=2) as evaluate:
        futures = [evaluate(np.full((1, 1), i, np.float32)) for i in range(5)]
        await wait_thread_event(model.started)
        await wait_until(lambda: evaluate.stats["batches"] >= 2, "a second batch leaves")
        for _ in range(20):  # room for a third batch, which must not leave
            await asyncio.sleep(0)
        assert evaluate.stats["batches"] == 2
        model.gate.set()
        await asyncio.gather(*futures)
        assert evaluate.stats["batches"] == 5


async def test_cost_batcher_bounds_total_cost_per_batch():
    # Each element's first column is its cost; batches may cost at most 10.
    batcher = CostBatcher(10, cost_fn=lambda x: x[:, 0])
    async with asr.serve(with_spec(lambda x: x, (1,), np.float32), batcher=batcher) as ev:
        xs = [np.full((1, 1), c, np.float32) for c in (4, 4, 4, 9, 1)]
        ys = await asyncio.gather(*(ev(x) for x in xs))
        histogram = ev.stats["batch_size_histogram"]
    assert [y.item() for y in ys] == [4, 4, 4, 9, 1]
    assert histogram == {1: 1, 2: 2}


async def test_one_batcher_serves_one_open_server_at_a_time():
    # Two open servers on one batcher took each other's requests: a caller of the first
    # got the second model's answer.
    batcher = BatchSizeBatcher(8)
    one = with_spec(lambda x: x + 1000.0, (1,), np.float32)
    two = with_spec(lambda x: x + 2000.0, (1,), np.float32)
    async with asr.serve(one, batcher=batcher) as first:
        with pytest.raises(ValueError, match="already batches for another open server"):
            async with asr.serve(two, batcher=batcher):
                pass
        assert (await first(np.ones((1, 1), np.float32))).item() == 1001.0
    async with asr.serve(two, batcher=batcher) as second:  # free once the first closed
        assert (await second(np.ones((1, 1), np.float32))).item() == 2001.0


async def test_a_batcher_whose_server_failed_to_open_is_free_for_the_next():
    batcher = BatchSizeBatcher(8)
    with pytest.raises(TypeError):  # a plain function cannot be placed on a device
        async with asr.serve(doubling(), batcher=batcher, devices=["cpu"]):
            pass
    async with asr.serve(doubling(), batcher=batcher) as evaluate:
        assert (await evaluate(np.ones((1, 3), np.float32))).tolist() == [[2.0] * 3]


@pytest.mark.parametrize("batcher", [BatchSizeBatcher, 5, "fifo"])
def test_serve_refuses_what_is_not_a_batcher_when_made(batcher):
    with pytest.raises(TypeError, match="batcher must be a Batcher instance"):
        BatchingServer(doubling(), batcher=batcher)


async def test_stats_report_model_time_and_fractions():
    async with asr.serve(doubling()) as evaluate:
        await evaluate(np.ones((2, 3), np.float32))
        stats = evaluate.stats
    for key in ("batches", "elements", "mean_batch_size", "model_time_s", "wall_time_s",
                "fraction_in_model", "batch_size_histogram", "reasons",
                "queue_wait_mean_s", "queue_wait_max_s"):
        assert key in stats
    assert stats["batches"] == 1 and stats["elements"] == 2
    assert 0 < stats["model_time_s"] <= stats["wall_time_s"]
    assert 0 < stats["fraction_in_model"] <= 1


def test_invalid_policy_arguments_name_the_value():
    with pytest.raises(ValueError, match="max_batch_size must be an integer >= 1, 'auto' "
                                         "or an AutoBatchSize, got 0"):
        asr.servers.DispatchPolicy(max_batch_size=0)
    with pytest.raises(ValueError, match="got 'Auto'"):
        asr.servers.DispatchPolicy(max_batch_size="Auto")
    with pytest.raises(ValueError, match="pipeline_depth"):
        asr.servers.DispatchPolicy(pipeline_depth=0)
    with pytest.raises(ValueError, match="max_delay"):
        asr.servers.DispatchPolicy(max_delay=-1)


@pytest.mark.parametrize("raised", [asyncio.CancelledError, GeneratorExit])
async def test_an_on_batch_that_raises_a_cancellation_is_reported_and_fails_nothing(
        raised):
    # It crashed the server: every later call was a ServerCrashedError.
    reported = []

    def on_batch(record):
        raise raised()

    asyncio.get_running_loop().set_exception_handler(
        lambda loop, context: reported.append(context["exception"]))
    async with asr.serve(lambda x: x * 2, on_batch=on_batch) as evaluate:
        for _ in range(2):
            assert (await within(evaluate(np.ones((1, 1))), "an answer")).tolist() == [
                [2.0]]
    assert len(reported) == 2 and all(isinstance(e, raised) for e in reported)


async def test_a_model_or_on_batch_that_cannot_be_called_is_refused_when_served():
    # Not at the first batch, where every request would fail with "'int' object is not
    # callable" and the server run on.
    with pytest.raises(TypeError, match="the model must be callable, got int 5"):
        async with asr.serve(5):
            pass
    with pytest.raises(TypeError, match="on_batch must be callable or None, got int"):
        async with asr.serve(MLP((2,)), on_batch=5):
            pass
    with pytest.raises(TypeError, match="the model must be callable"):
        asr.immediate(np.zeros(3))


async def test_an_async_on_batch_is_refused_when_served_not_left_unawaited():
    # It was accepted: each batch made a coroutine nothing awaited (one RuntimeWarning),
    # and the hook never ran.
    async def on_batch(record):
        pass

    class Hook:
        async def __call__(self, record):
            pass

    for hook in (on_batch, Hook()):
        with pytest.raises(TypeError, match="on_batch is called on the loop as each "
                                            "batch comes back, and nothing awaits it"):
            async with asr.serve(MLP((2,)), on_batch=hook):
                pass


@pytest.mark.parametrize("served", [True, False])
async def test_an_on_batch_that_raises_is_reported_and_fails_no_request(served):
    reported = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, c: reported.append(c))

    def progress(record):
        raise RuntimeError("the progress bar broke")

    if served:
        async with asr.serve(lambda x: x * 2, on_batch=progress) as evaluate:
            y = await within(evaluate(np.ones((2, 1))), "an answer")
            assert evaluate.stats["failed_batches"] == 0
    else:
        y = await asr.immediate(lambda x: x * 2, on_batch=progress)(np.ones((2, 1)))
    assert y.tolist() == [[2.0], [2.0]]
    assert len(reported) == 1 and "on_batch raised" in reported[0]["message"]
    assert str(reported[0]["exception"]) == "the progress bar broke"


async def test_a_crash_while_delivering_fails_the_batch_instead_of_hanging(monkeypatch):
    from async_search.delivery import ResultDelivery

    def broken(self, popped, outputs, version):
        raise RuntimeError("injected delivery fault")

    monkeypatch.setattr(ResultDelivery, "deliver", broken)
    async with asr.serve(doubling()) as evaluate:
        with pytest.raises(RuntimeError, match="injected delivery fault"):
            await asyncio.wait_for(evaluate(np.ones((1, 3), np.float32)), 5)


async def test_on_batch_and_trace_record_every_batch_in_order():
    seen = []
    async with asr.serve(doubling(), max_batch_size=2, on_batch=seen.append) as evaluate:
        await asyncio.gather(*(evaluate(np.ones((1, 3), np.float32)) for _ in range(5)))
        trace = evaluate.trace
        stats = evaluate.stats
    assert seen == trace and [r.size for r in trace] == [2, 2, 1]
    assert all(r.model_s > 0 for r in trace)
    assert [r.finished_s for r in trace] == sorted(r.finished_s for r in trace)
    assert stats["std_batch_size"] == pytest.approx(np.std([2, 2, 1]))


async def test_call_with_version_queues_at_once_and_pairs_outputs_with_their_version():
    gated = GatedModel()
    async with asr.serve(gated, max_batch_size=2, pipeline_depth=1) as server:
        first = server.call_with_version(np.zeros((2, 1), np.float32))  # 1st batch
        await wait_thread_event(gated.started)
        queued = server.call_with_version(np.zeros((1, 1), np.float32))
        dropped = server.call_with_version(np.full((1, 1), 9, np.float32))
        dropped.cancel()
        server.update_model(doubling((1,)), version="v1")
        after = server.call_with_version(np.ones((1, 1), np.float32))
        gated.gate.set()
        (y0, v0), (y1, v1), (y2, v2) = await asyncio.wait_for(
            asyncio.gather(first, queued, after), 10)
    assert (y0.tolist(), v0) == ([[1.0], [1.0]], 0)  # it ran before the swap
    assert v1 == "v1" and y1.tolist() == [[0.0]]  # queued before, batched after: new
    assert (y2.tolist(), v2) == ([[2.0]], "v1")
    assert server.stats["elements"] == 4  # the cancelled request never ran


async def test_update_model_refuses_a_model_whose_output_spec_does_not_fit():
    model = MLP((2,), output_size=3)
    async with asr.serve(model) as evaluate:
        with pytest.raises(ValueError, match=r"expected an array \[n, 3\] float32, got an "
                                             r"array \[n, 4\] float32"):
            evaluate.update_model(MLP((2,), output_size=4), version=1)
        assert evaluate.version == 0
        y = await evaluate(np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(y, model(np.ones((2, 2), np.float32)))


async def test_devices_given_as_one_name_are_refused_not_read_as_characters():
    with pytest.raises(TypeError, match=r"devices=\['cpu'\] for one"):
        async with asr.serve(MLP((2,)), devices="cpu"):
            pass
    with pytest.raises(TypeError, match="a sequence of devices"):
        async with asr.serve(MLP((2,)), devices=0):
            pass


async def test_update_model_refuses_a_model_that_takes_other_inputs():
    # Requests are checked against the served spec: each would fail in the new model.
    model = MLP((2,), output_size=1)
    async with asr.serve(model) as evaluate:
        for other in (MLP((3,), output_size=1), MLP((2,), output_size=1, dtype=np.float64)):
            with pytest.raises(ValueError, match=r"the new model takes \[n, .*, the "
                                                 r"server's requests are \[n, 2\] float32"):
                evaluate.update_model(other, version=1)
        assert evaluate.version == 0
        evaluate.update_model(MLP((2,), output_size=1, seed=1), version=2)  # the same spec
        y = await evaluate(np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(y, MLP((2,), output_size=1, seed=1)(np.ones((2, 2))))


async def test_a_spec_the_new_model_declares_checks_requests_when_none_was_learnt():
    async with asr.serve(lambda x: x[:, :1]) as evaluate:  # no spec, no request yet
        evaluate.update_model(MLP((2,), output_size=1), version=1)
        assert evaluate.input_spec == asr.TensorSpec((2,), np.float32)
        with pytest.raises(InputSpecError, match=r"expected \[n, 2\] float32"):
            await evaluate(np.ones((1, 3), np.float32))  # not learnt as the spec


async def test_update_model_with_weights_that_are_not_layers_raises_a_type_error():
    async with asr.serve(MLP((2,), output_size=1)) as evaluate:
        with pytest.raises(TypeError, match=r"MLP.with_weights takes a list of \(w, b\)"):
            evaluate.update_model(5, version=1)
        assert evaluate.version == 0


async def test_a_cancelled_dispatch_task_fails_pending_requests_and_closes_the_server():
    model = GatedModel()
    with pytest.raises(ServerCrashedError, match="CancelledError"):
        async with asr.serve(model, max_batch_size=1, pipeline_depth=1) as evaluate:
            in_model = evaluate(np.zeros((1, 1), np.float32))
            await wait_thread_event(model.started)
            queued = evaluate(np.ones((1, 1), np.float32))
            evaluate._task.cancel()
            done, _ = await asyncio.wait([in_model, queued], timeout=5)
            model.gate.set()
            assert len(done) == 2
            for fut in (in_model, queued):
                assert isinstance(fut.exception(), ServerCrashedError)
            with pytest.raises(ServerCrashedError):
                evaluate(np.ones((1, 1), np.float32))


# -- the fast path of a call: requests of the last accepted shape --------------------------
class _Subclass(np.ndarray):
    pass


@pytest.mark.parametrize("bad, message", [
    (np.zeros((2, 3), np.float64), r"given \[2, 3\] float64"),
    (np.zeros((2, 3), np.float32).tolist(), r"got list"),
    (np.zeros((2, 1, 3), np.float32), r"given \[2, 1, 3\]"),
])
async def test_a_request_of_an_accepted_shape_is_still_checked(bad, message):
    async with asr.serve(doubling()) as evaluate:
        await evaluate(np.ones((2, 3), np.float32))  # (2, 3) float32 is now the fast case
        pending = evaluate(np.ones((2, 3), np.float32))  # wakes the server: fast from here
        with pytest.raises(InputSpecError, match=message):
            evaluate(bad)
        sub = np.ones((2, 3), np.float32).view(_Subclass)
        np.testing.assert_array_equal(await evaluate(sub), np.full((2, 3), 2.0))
        swapped = await evaluate(np.full((2, 3), 1.5, ">f4"))  # the same values, converted
        assert swapped.dtype == np.float32 and swapped.tolist() == [[3.0] * 3] * 2
        np.testing.assert_array_equal(await pending, np.full((2, 3), 2.0))
        assert evaluate.stats["elements"] == 8


async def test_repeated_requests_of_one_shape_wake_an_idle_server_each_time():
    async with asr.serve(doubling()) as evaluate:
        for i in range(20):  # the server falls asleep between any two of them
            y = await asyncio.wait_for(evaluate(np.full((1, 3), i, np.float32)), 5)
            assert y.tolist() == [[2.0 * i] * 3]
        assert evaluate.stats["batches"] == 20


async def test_requests_of_one_shape_fill_a_batch_waiting_for_max_delay():
    async with asr.serve(doubling(), max_batch_size=4, max_delay=30.0) as evaluate:
        futures = []
        for i in range(4):  # each comes while the batch waits for company
            futures.append(evaluate(np.full((1, 3), i, np.float32)))
            await asyncio.sleep(0.01)
        ys = await asyncio.wait_for(asyncio.gather(*futures), timeout=5)
        assert [y[0, 0] for y in ys] == [0.0, 2.0, 4.0, 6.0]
        assert evaluate.stats["reasons"] == {"full": 1}


async def test_a_request_of_an_accepted_shape_after_close_or_crash_raises():
    x = np.ones((1, 3), np.float32)
    async with asr.serve(doubling()) as evaluate:
        await evaluate(x)
        pending = evaluate(x)  # wakes the server: a request of x's shape is fast now
        closing = asyncio.ensure_future(evaluate.aclose())
        await asyncio.sleep(0)
        with pytest.raises(ServerClosedError):
            evaluate(x)
        await closing
        assert pending.result().tolist() == [[2.0] * 3]
    with pytest.raises(ServerClosedError):
        evaluate(x)
    with pytest.raises(ServerCrashedError):
        async with asr.serve(doubling()) as evaluate:
            await evaluate(x)
            evaluate._task.cancel()
            await asyncio.sleep(0.01)
            with pytest.raises(ServerCrashedError):
                evaluate(x)


def test_a_model_on_the_loop_raising_a_base_exception_crashes_the_server_quietly():
    # The crash reaches the callers and the block (ServerCrashedError, its cause); the
    # dispatch task's exception used to be logged again as "never retrieved".
    class Stop(BaseException):
        pass

    def model(x):
        raise Stop("out")

    async def main():
        with pytest.raises(ServerCrashedError, match="Stop: out") as raised:
            async with asr.serve(model, model_thread=False) as evaluate:
                with pytest.raises(ServerCrashedError):
                    await asyncio.wait_for(evaluate(np.ones((1, 3), np.float32)), 5)
        assert isinstance(raised.value.__cause__, Stop)

    logged = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _, context: logged.append(context["message"]))
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    gc.collect()  # the finished task is collected: asyncio logs then, if at all
    assert logged == []


async def test_answers_come_in_the_machine_s_byte_order_however_they_were_batched():
    # A request answered by one batch kept the model's '>f4'; split across batches
    # (or from a cache) it came back native: the dtype hung on batch timing.
    def model(x):
        return (x * 2).astype(">f4")

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    declared = with_spec(model, (4,), np.float32, asr.TensorSpec((4,), ">f4"))
    answers = []
    for served in (model, declared):  # a declared '>f4' output cast them back to it
        answers.append(await asr.immediate(served)(x))
        for size in (8, 2):
            async with asr.serve(served, max_batch_size=size) as evaluate:
                answers.append(await evaluate(x))
                cached = asr.CachedEvaluate(evaluate)
                answers += [await cached(x), await cached(x)]  # a miss, then a hit
                empty = await evaluate(x[:0])
                assert empty.dtype == np.float32 and empty.dtype.isnative
    for y in answers:
        assert y.dtype == np.float32 and y.dtype.isnative
        np.testing.assert_array_equal(y, x * 2)


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_a_program_stop_raised_by_a_model_on_a_loop_off_the_main_thread_fails_its_batch(
        stop):
    # A Ray actor's loop runs in a thread, where no signal handler runs: the stop was
    # the model's own, yet it ended that thread's loop and every client waited for good.
    def model(x):
        if (x < 0).any():
            raise stop()
        return x * 2

    outcome = []

    async def main():
        async with asr.serve(model, model_thread=False) as evaluate:
            with pytest.raises(ModelRaisedError) as raised:
                await asyncio.wait_for(evaluate(-np.ones((1, 3), np.float32)), 5)
            assert isinstance(raised.value.__cause__, stop)
            y = await asyncio.wait_for(evaluate(np.ones((1, 3), np.float32)), 5)
            outcome.append(y.tolist())

    thread = threading.Thread(target=lambda: asyncio.run(main()))
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and outcome == [[[2.0, 2.0, 2.0]]]


async def test_a_zero_element_request_after_an_accepted_shape_resolves_at_once():
    async with asr.serve(doubling()) as evaluate:
        await evaluate(np.ones((1, 3), np.float32))
        y = await asyncio.wait_for(evaluate(np.ones((0, 3), np.float32)), 5)
        assert y.shape == (0, 3)
        np.testing.assert_array_equal(await evaluate(np.ones((1, 3), np.float32)),
                                      [[2.0] * 3])


# -- fair batches and priorities ---------------------------------------------------------

async def fair_waits(batcher=None):
    """Batches each one-row request waited for while a 4,000-row request is served in
    batches of 8; and whether the large one was still unfinished after them."""
    model = with_spec(lambda x: x * 2.0, (1,), np.float32)
    large = np.arange(4000, dtype=np.float32).reshape(-1, 1)
    waits = []
    async with asr.serve(model, max_batch_size=8, model_thread=False,
                         batcher=batcher) as evaluate:
        hog = evaluate(large)

        async def small(i):
            for step in range(5):
                before = evaluate.stats["batches"]
                y = await evaluate(np.full((1, 1), 10 * i + step, np.float32))
                assert y.tolist() == [[2.0 * (10 * i + step)]]
                waits.append(evaluate.stats["batches"] - before)

        await asyncio.wait_for(asyncio.gather(*(small(i) for i in range(4))), 30)
        unfinished = not hog.done()
        np.testing.assert_array_equal(await asyncio.wait_for(hog, 30), large * 2.0)
    return waits, unfinished


async def test_a_large_request_does_not_hold_back_the_requests_made_after_it():
    """The default (FairBatcher): a one-row request made beside a 4,000-row one waits at
    most two batches (one of the large request's, then its own), not its 500."""
    waits, unfinished = await fair_waits()
    assert max(waits) <= 2 and unfinished
    fifo, _ = await fair_waits(BatchSizeBatcher(8))  # what the default replaced
    assert max(fifo) >= 400


async def test_requests_at_a_higher_priority_go_in_the_next_batch():
    seen = []

    def recording(x):
        seen.append(x[:, 0].tolist())
        return x + 1.0

    model = with_spec(recording, (1,), np.float32)
    async with asr.serve(model, max_batch_size=4, model_thread=False) as evaluate:
        backlog = [evaluate(np.full((4, 1), i, np.float32)) for i in range(10)]
        lower = evaluate.at_priority(-1)(np.full((1, 1), 7, np.float32))
        urgent = evaluate.at_priority(1)
        assert urgent.priority == 1 and urgent.version == evaluate.version
        first = urgent(np.full((2, 1), -1, np.float32))
        ys = await asyncio.wait_for(asyncio.gather(first, *backlog, lower), 10)
        trace = evaluate.trace
        y, version = await asyncio.wait_for(urgent.with_version(
            np.ones((1, 1), np.float32)), 10)
    # The urgent request went in the first batch, the lower one in the last.
    assert ys[0].tolist() == [[0.0], [0.0]] and (y.tolist(), version) == ([[2.0]], 0)
    assert [y[0, 0] for y in ys[1:]] == [i + 1.0 for i in range(10)] + [8.0]
    assert [record.size for record in trace] == [4] * 10 + [3]
    # Request 0 split with the urgent one: its rest went behind the others, before the
    # lower priority.
    assert seen[0] == [-1.0, -1.0, 0.0, 0.0] and seen[10] == [0.0, 0.0, 7.0]


async def test_at_priority_takes_an_integer_and_needs_the_fair_batcher():
    async with asr.serve(doubling()) as evaluate:
        with pytest.raises(ValueError, match="priority must be an integer, got '1'"):
            evaluate.at_priority("1")
    async with asr.serve(doubling(), batcher=CostBatcher(8, len)) as evaluate:
        with pytest.raises(ValueError, match="FairBatcher.*CostBatcher"):
            evaluate.at_priority(1)


async def test_a_cancelled_large_request_is_not_computed_further():
    model = GatedModel()
    async with asr.serve(model, max_batch_size=4, pipeline_depth=1) as evaluate:
        hog = evaluate(np.zeros((400, 1), np.float32))
        await wait_thread_event(model.started)  # its first batch is in the model
        hog.cancel()
        small = evaluate(np.ones((1, 1), np.float32))
        model.gate.set()
        assert (await asyncio.wait_for(small, 10)).tolist() == [[2.0]]
    assert len(model.seen) <= 3  # not its 100 batches
    assert evaluate._responses.held == 0


# -- the trace: a bounded ring -----------------------------------------------------------

async def test_trace_keeps_the_latest_trace_size_batches():
    one = np.ones((1, 3), np.float32)
    for trace_size, kept in [(3, [3, 4, 5]), (None, [1, 2, 3, 4, 5]), (0, [])]:
        seen = []
        async with asr.serve(doubling(), trace_size=trace_size,
                             on_batch=seen.append) as evaluate:
            for n in range(1, 6):  # batches of 1, 2, ..., 5 elements
                await evaluate(np.repeat(one, n, axis=0))
            trace = evaluate.trace
            stats = evaluate.stats
        assert [record.size for record in trace] == kept
        assert len(seen) == stats["batches"] == 5 and stats["elements"] == 15


def test_trace_size_is_a_count_or_none():
    from async_search.servers.stats import TRACE_SIZE

    assert TRACE_SIZE == 10_000  # what README and serve's docstring say
    for bad in (-1, 2.5, True, "10"):
        with pytest.raises(ValueError, match="trace_size must be an integer >= 0"):
            BatchingServer(doubling(), trace_size=bad)


@pytest.mark.timeout(120)
def test_resident_memory_stays_flat_over_a_million_requests():
    """A million requests through ``serve`` (every tenth a deadline met or passed, a
    priority, with_version, or a split request cancelled): resident memory after the
    warm-up rounds stays within 5 %. The trace used to grow by a record a batch, about
    130 bytes: 29 % more memory over this run."""
    from tests.servers.resident_memory import assert_flat, resident_memory_of

    report = resident_memory_of("serve", 1_000_000)
    assert report["timed_out"] == 20_000 and report["batches"] > 100_000
    assert_flat(report["rss_mib"])


# -- request deadlines -------------------------------------------------------------------

async def test_a_request_past_its_deadline_is_dropped_before_the_model_runs():
    from async_search.errors import RequestTimeoutError

    model = GatedModel()
    async with asr.serve(model, max_batch_size=4, pipeline_depth=1) as evaluate:
        first = evaluate(np.zeros((1, 1), np.float32))
        await wait_thread_event(model.started)  # the model holds the first batch
        late = evaluate(np.full((2, 1), 7, np.float32), timeout=0.05)
        mate = evaluate(np.ones((1, 1), np.float32))  # queued beside it, no deadline
        with pytest.raises(RequestTimeoutError, match="timeout of 0.05 s") as info:
            await asyncio.wait_for(late, 5)
        assert isinstance(info.value, TimeoutError)
        model.gate.set()
        ys = await asyncio.wait_for(asyncio.gather(first, mate), 10)
        stats = evaluate.stats
    assert [y.tolist() for y in ys] == [[[1.0]], [[2.0]]]
    assert 7.0 not in np.concatenate(model.seen)  # never computed
    assert stats["timed_out"] == 1 and stats["elements"] == 2


async def test_a_request_past_its_deadline_when_the_loop_was_busy_is_not_computed():
    # The model on the loop held it past the deadline: the timer had not run when the
    # next batch was taken, and the request went to the model after its deadline.
    import time

    from async_search.errors import RequestTimeoutError

    seen = []

    def model(x):
        seen.append(x[:, 0].tolist())
        time.sleep(0.1)
        return x * 1.0

    async with asr.serve(model, max_batch_size=1, model_thread=False) as evaluate:
        first = asyncio.ensure_future(evaluate(np.full((1, 1), 1.0)))
        late = asyncio.ensure_future(evaluate(np.full((1, 1), 2.0), timeout=0.02))
        got = await within(asyncio.gather(first, late, return_exceptions=True), "both")
    assert isinstance(got[1], RequestTimeoutError) and seen == [[1.0]]


@pytest.mark.parametrize("raised", [GeneratorExit, asyncio.CancelledError, StopIteration])
async def test_a_model_on_the_loop_that_raises_an_odd_exception_fails_its_batch_only(
        raised):
    # A GeneratorExit was taken for the loop's closing: the serving task ended, every
    # request waited forever, and so did the exit.
    def model(x):
        raise raised()

    async with asr.serve(model, model_thread=False) as evaluate:
        for _ in range(2):
            with pytest.raises(ModelRaisedError, match=raised.__name__):
                await within(evaluate(np.ones((1, 2))), "the failure")


async def test_a_model_with_load_hooks_is_refused_on_the_loop():
    # It ran without ever being loaded (and was never unloaded).
    class Hooked:
        def load(self):
            pass

        def __call__(self, x):
            return x

    with pytest.raises(ValueError, match="load/unload hooks is loaded in its device "
                                         "thread"):
        async with asr.serve(Hooked(), model_thread=False):
            pass
    async with asr.serve(lambda x: x, model_thread=False) as evaluate:
        with pytest.raises(ValueError, match="load/unload hooks"):
            evaluate.update_model(Hooked(), 1)
        assert (await within(evaluate(np.ones((1, 1))), "an answer")).tolist() == [[1.0]]


async def test_a_request_whose_batch_is_in_the_model_fails_at_its_deadline():
    from async_search.errors import RequestTimeoutError

    model = GatedModel()
    async with asr.serve(model, max_batch_size=4) as evaluate:
        # (1 s: a loop kept busy by other work may form the batch 50 ms late, and the
        # request would be dropped before the model, not fail in it)
        late = evaluate(np.full((1, 1), 7, np.float32), timeout=1.0)
        mate = evaluate(np.ones((1, 1), np.float32))  # in the same batch
        await wait_thread_event(model.started)
        with pytest.raises(RequestTimeoutError):
            await asyncio.wait_for(late, 5)  # while the model still holds its batch
        model.gate.set()
        assert (await asyncio.wait_for(mate, 10)).tolist() == [[2.0]]
    assert model.seen[0].tolist() == [[7.0], [1.0]]


async def test_a_split_request_past_its_deadline_drops_its_rest():
    from async_search.errors import RequestTimeoutError

    model = GatedModel()
    async with asr.serve(model, max_batch_size=4, pipeline_depth=1) as evaluate:
        large = evaluate(np.zeros((400, 1), np.float32), timeout=0.05)
        await wait_thread_event(model.started)  # its first batch is in the model
        with pytest.raises(RequestTimeoutError):
            await asyncio.wait_for(large, 5)
        model.gate.set()
        after = await asyncio.wait_for(evaluate(np.ones((1, 1), np.float32)), 10)
    assert after.tolist() == [[2.0]]
    assert len(model.seen) <= 3  # not its 100 batches
    assert evaluate._responses.held == 0  # none of its pieces kept


async def test_deadlines_work_at_a_priority_and_with_versions_and_leave_no_timer():
    async with asr.serve(doubling(), max_batch_size=4) as evaluate:
        x = np.ones((1, 3), np.float32)
        urgent = evaluate.at_priority(2)
        ys = await asyncio.wait_for(asyncio.gather(
            evaluate(x, timeout=30), urgent(x, timeout=30),
            evaluate.with_version(x, timeout=30), urgent.with_version(x, timeout=30)), 10)
        loop = asyncio.get_running_loop()
        # Answered in time: each deadline's timer is cancelled (it holds nothing).
        assert not [h for h in loop._scheduled if not h.cancelled()]
        stats = evaluate.stats
    assert ys[0].tolist() == ys[1].tolist() == [[2.0] * 3]
    assert ys[2][1] == ys[3][1] == 0 and stats["timed_out"] == 0


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1"])
async def test_a_timeout_that_is_not_a_positive_number_is_refused_and_nothing_queued(bad):
    async with asr.serve(doubling()) as evaluate:
        x = np.ones((1, 3), np.float32)
        await evaluate(x)  # the fast path is warm
        for call in (evaluate, evaluate.at_priority(1)):
            with pytest.raises(ValueError, match="timeout must be a finite number > 0"):
                call(x, timeout=bad)
        assert not evaluate._staged_xs and evaluate._batcher.empty()


@pytest.mark.parametrize("fast_path", [True, False])
async def test_requests_let_go_of_the_gil_at_a_bounded_rate_while_a_batch_is_in_a_thread(
        monkeypatch, fast_path):
    """A device thread whose batch is done must take the GIL back: while one is in a
    thread, requests let go of it (``time.sleep(0)``) at most every
    ``_LET_THREADS_IN_S`` of the loop's time; with none in flight, never."""
    from async_search.servers import batching

    clock = [100.0]
    sleeps = []
    monkeypatch.setattr(batching, "_perf_counter", lambda: clock[0])
    monkeypatch.setattr(batching, "_sleep", sleeps.append)
    step = batching._LET_THREADS_IN_S * 0.4  # the loop's time between two requests
    model = GatedModel()
    timeout = None if fast_path else 30.0  # a deadline takes the slow path
    async with asr.serve(model, model_thread=True) as evaluate:
        try:
            for _ in range(20):  # nothing in flight yet: no batch, so never
                clock[0] += step
                evaluate(np.ones((1, 1), np.float32), timeout=timeout)
            assert sleeps == []
            await wait_thread_event(model.started)  # the first batch is in the thread
            for _ in range(99):
                clock[0] += step
                evaluate(np.ones((1, 1), np.float32), timeout=timeout)
            # the first at once, then one every third request (1.2 intervals apart)
            assert set(sleeps) == {0}
            assert 32 <= len(sleeps) <= 34
        finally:
            model.gate.set()


async def test_a_call_from_another_threads_loop_is_refused_before_anything_is_queued():
    calls = []

    def model(x):
        calls.append(len(x))
        return x * 2

    async with asr.serve(with_spec(model, (2,), np.float32)) as evaluate:
        x = np.ones((1, 2), np.float32)
        await evaluate(x)  # the fast path learns this shape
        errors = []

        def elsewhere(make_loop):
            async def call():
                return evaluate(x)

            try:
                if make_loop:
                    asyncio.run(call())
                else:
                    evaluate(x)
            except RuntimeError as e:
                errors.append(str(e))

        for make_loop in (True, False):
            thread = threading.Thread(target=elsewhere, args=(make_loop,))
            thread.start()
            thread.join(10)
        assert len(errors) == 2
        assert "another event loop" in errors[0] and "another thread" in errors[1]
        assert all("asyncio.run_coroutine_threadsafe" in e for e in errors)
        # Nothing of theirs was queued; the server serves its own loop on.
        np.testing.assert_array_equal(await within(evaluate(x), "a request"), x * 2)
        assert sum(calls) == 2


def test_a_call_between_runs_of_its_loop_is_served_and_one_while_it_runs_elsewhere_is_not():
    loop = asyncio.new_event_loop()
    x = np.ones((1, 2), np.float32)
    try:
        server = BatchingServer(with_spec(lambda b: b * 2, (2,), np.float32))
        loop.run_until_complete(server.__aenter__())
        loop.run_until_complete(server(x))
        queued = server(x)  # its own thread, its loop stopped: queued for the next run
        np.testing.assert_array_equal(loop.run_until_complete(queued), x * 2)
        runner = threading.Thread(target=loop.run_forever, daemon=True)
        runner.start()
        wait = threading.Event()
        while not loop.is_running():
            wait.wait(0.01)
        with pytest.raises(RuntimeError, match="another thread"):
            server(x)  # the loop runs in the other thread now
        done = asyncio.run_coroutine_threadsafe(server.aclose(), loop)
        done.result(timeout=10)
    finally:
        if loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
            runner.join(10)
        loop.close()


async def test_a_batch_whose_outputs_fail_counts_as_failed_as_immediate_counts_it():
    # ModelOutputError failed the batch's requests but not failed_batches (immediate
    # counted it): the two evaluates disagreed on one model.
    calls = []

    def every_other_short(x):
        calls.append(len(x))
        return x[:-1] if len(calls) % 2 else x  # one row short on odd calls

    async def failures(evaluate):
        failed = 0
        for _ in range(4):
            try:
                await evaluate(np.ones((2, 3), np.float32))
            except asr.ModelOutputError:
                failed += 1
        return failed

    async with asr.serve(every_other_short, max_batch_size=2) as evaluate:
        served = await failures(evaluate)
        assert served == 2 and evaluate.stats["failed_batches"] == 2
    calls.clear()
    immediate = asr.immediate(every_other_short)
    assert await failures(immediate) == 2 and immediate.stats["failed_batches"] == 2


async def test_the_wall_clock_starts_when_the_server_is_entered_not_built():
    import time

    server = BatchingServer(lambda x: x * 2)
    time.sleep(0.3)  # built, not serving yet
    async with server:
        await server(np.ones((1, 2), np.float32))
    assert server.stats["wall_time_s"] < 0.25
