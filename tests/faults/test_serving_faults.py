"""Faults of the serving path, counted request by request.

Each test sends requests whose rows carry unique ids (column 0), waits for all of them
once (bounded), and counts them: sent, answered (exactly ``model(x)`` row-wise, dtype
included), failed (with the error the fault should give), hung (not done in the wait)
and wrong (anything else: another caller's rows, another error, a cancellation). Every
test asserts hung == 0 and wrong == 0, then what is specific to its fault.
"""

import asyncio
import collections
import threading

import numpy as np
import pytest

import async_search as asr
from async_search.batchers import CostBatcher
from async_search.errors import (ModelOutputError, ModelRaisedError, ServerClosedError,
                                 ServerCrashedError)
from async_search.models import with_spec
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)

WAIT_S = 5.0  # the bound on every wait: a request not done by then has hung
THREADED = pytest.mark.parametrize("model_thread", [True, False],
                                   ids=["model_thread", "model_on_loop"])


def reference(x):
    """What the models of these tests compute, row by row."""
    return x * 2.0 + 1.0


def tree(x):
    """A policy-value model's outputs: a tuple."""
    return reference(x), x.sum(axis=1)


def named(x):
    """The same as a dict."""
    return {"policy": reference(x), "value": x.sum(axis=1)}


class Requests:
    """Makes requests ``[n, 2] float32`` whose column 0 holds ids unique to the test."""

    def __init__(self):
        self.next_id = 1
        self.rng = np.random.default_rng(0)

    def make(self, sizes, poisoned=False):
        out = []
        for n in sizes:
            x = np.empty((n, 2), np.float32)
            ids = np.arange(self.next_id, self.next_id + n)
            x[:, 0] = -ids if poisoned else ids
            x[:, 1] = self.rng.integers(-100, 100, n)
            self.next_id += n
            out.append(x)
        return out


class Recording:
    """``ok(x)`` for every batch, except batches holding a poisoned row (a negative id):
    those get ``fault(x)`` (which raises or returns odd outputs) and their ids are kept.
    ``gate``, when given and closed, holds every batch after ``block`` is set."""

    def __init__(self, ok, fault, gate=None):
        self.ok, self.fault, self.gate = ok, fault, gate
        self.bad_ids = set()
        self.bad_batches = 0
        self.block = False
        self.started = threading.Event()

    def __call__(self, x):
        if self.block:
            self.started.set()
            assert self.gate.wait(10), "the test never opened the gate"
        if (x[:, 0] < 0).any():
            self.bad_ids.update(np.abs(x[:, 0]).astype(int).tolist())
            self.bad_batches += 1
            return self.fault(x)
        return self.ok(x)


def same(a, b) -> bool:
    """Equal outputs: the same structure, shapes, dtypes and values."""
    if isinstance(b, np.ndarray):
        return (type(a) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape
                and np.array_equal(a, b))
    if isinstance(b, tuple):
        return type(a) is tuple and len(a) == len(b) and all(map(same, a, b))
    return (type(a) is dict and a.keys() == b.keys()
            and all(same(a[k], b[k]) for k in b))


def send(evaluate, xs):
    """Calls ``evaluate`` on each request in this loop iteration: (x, future) pairs,
    or (x, exception) for a call that raised at once."""
    sent = []
    for x in xs:
        try:
            sent.append((x, evaluate(x)))
        except Exception as e:  # noqa: BLE001 - counted by ``tally``
            sent.append((x, e))
    return sent


async def settle(sent):
    """Waits (once, bounded) for every future of ``sent``."""
    futures = [f for _, f in sent if isinstance(f, asyncio.Future)]
    if futures:
        await asyncio.wait(futures, timeout=WAIT_S)


def tally(sent, expected, errors):
    """Counts of sent, answered, failed, hung and wrong, and per request what it got:
    ``(x, "answered" | "failed" | ..., error)``."""
    counts = collections.Counter(sent=0, answered=0, failed=0, hung=0, wrong=0)
    outcomes = []
    for x, fut in sent:
        counts["sent"] += 1
        error = None
        if isinstance(fut, BaseException):
            error, kind = fut, None
        elif not fut.done():
            fut.cancel()
            kind = "hung"
        elif fut.cancelled():
            kind = "wrong"
        else:
            error = fut.exception()
            kind = None
        if kind is None:
            if error is None:
                kind = "answered" if same(fut.result(), expected(x)) else "wrong"
            else:
                kind = "failed" if isinstance(error, errors) else "wrong"
        counts[kind] += 1
        outcomes.append((x, kind, error))
    return counts, outcomes


async def round_trip(evaluate, xs, expected=reference, errors=()):
    sent = send(evaluate, xs)
    await settle(sent)
    return tally(sent, expected, errors)


def ids_of(x):
    return set(np.abs(x[:, 0]).astype(int).tolist())


def assert_only_bad_batches_failed(outcomes, bad_ids):
    """A request fails exactly when some row of it was in a batch that went wrong."""
    for x, kind, error in outcomes:
        touched = bool(ids_of(x) & bad_ids)
        assert kind == ("failed" if touched else "answered"), (kind, error, touched)


# -- A. whatever kills the serving coroutine ------------------------------------------

class BrokenBatcher(CostBatcher):
    """A batcher with a bug: ``extend`` raises for a poisoned request (the server has
    priced every request already, so only a broken batcher can fail here)."""

    def __init__(self, max_cost, error):
        super().__init__(max_cost, lambda x: np.ones(len(x)))
        self.error = error

    def extend(self, xs, tags=None, prices=None):
        if any((x[:, 0] < 0).any() for x in xs):
            raise self.error
        super().extend(xs, tags, prices)


@THREADED
@pytest.mark.parametrize("where", ["dispatch_task", "call"])
async def test_a_batcher_that_raises_crashes_the_server_failing_every_pending_request(
        model_thread, where):
    """A batcher that raises kills the serving coroutine (in the dispatch task, or in
    ``evaluate`` itself while a batch waits for ``max_delay``): every queued and
    in-flight request fails with ServerCrashedError, later calls raise at once, leaving
    the context raises it."""
    poison = ZeroDivisionError("a bug in the batcher")
    make = Requests()
    gate = threading.Event()
    model = Recording(reference, reference, gate)
    max_delay = 30.0 if where == "call" else None  # only full batches leave early
    crashed = (ServerCrashedError,)
    with pytest.raises(ServerCrashedError) as at_exit:
        async with asr.serve(with_spec(model, (2,), np.float32), max_delay=max_delay,
                             batcher=BrokenBatcher(4, poison),
                             model_thread=model_thread) as evaluate:
            before, _ = await round_trip(evaluate, make.make([4, 2, 2]))  # full batches
            assert before == dict(sent=3, answered=3, failed=0, hung=0, wrong=0)

            pending = []
            if model_thread:  # a batch the model holds while the server crashes
                model.block = True
                pending += send(evaluate, make.make([4]))
                assert await asyncio.to_thread(model.started.wait, WAIT_S)
            if where == "call":
                pending += send(evaluate, make.make([1]))  # waits for company
                await wait_until(lambda: evaluate._full is not None,
                                 "the batch waits for max_delay")
                pending += send(evaluate, make.make([1], poisoned=True))  # extend raises
                pending += send(evaluate, make.make([1, 3]))
            else:
                pending += send(evaluate, make.make([1, 3]) + make.make([1], poisoned=True)
                                + make.make([2, 5]))
            await settle(pending)
            gate.set()
            counts, outcomes = tally(pending, reference, crashed)
            assert counts["hung"] == 0 and counts["wrong"] == 0, counts
            assert counts["failed"] == counts["sent"] > 0
            for _, _, error in outcomes:
                assert error.__cause__ is poison

            # Closed: a new call raises at once, nothing is queued.
            with pytest.raises(ServerCrashedError, match="ZeroDivisionError") as later:
                evaluate(make.make([1])[0])
            assert isinstance(later.value, ServerClosedError)
            assert later.value.__cause__ is poison
            assert evaluate._task.done()
    assert at_exit.value.__cause__ is poison


@THREADED
@pytest.mark.parametrize("where", ["idle", "waiting_for_delay", "between_batches"])
async def test_cost_fn_that_raises_fails_that_request_alone(model_thread, where):
    """A CostBatcher's cost_fn that raises for one request (or gives a wrong number of
    costs) fails that request alone, when it is made, with its own error noted as the
    batcher's: nothing of it is queued, every other request is answered, and the
    server serves on (it used to crash the server: ServerCrashedError for all)."""
    poison = ZeroDivisionError("no cost for a negative id")

    def cost(x):
        if (x[:, 0] < 0).any():
            raise poison
        if (x[:, 1] == 999).any():
            return np.ones(len(x) + 1)  # a wrong number of costs
        return np.ones(len(x))

    make = Requests()
    model = Recording(reference, reference)
    max_delay = 30.0 if where == "waiting_for_delay" else None
    async with asr.serve(with_spec(model, (2,), np.float32), max_delay=max_delay,
                         batcher=CostBatcher(8, cost),
                         model_thread=model_thread) as evaluate:
        # 199 healthy requests of 400 elements: full batches, none waits for max_delay
        healthy = make.make([1, 2, 3] * 66 + [4])
        poisoned = make.make([1, 2], poisoned=True)
        odd = make.make([2])
        odd[0][:, 1] = 999
        if where == "waiting_for_delay":
            first = send(evaluate, healthy[:1])
            await wait_until(lambda: evaluate._full is not None,
                             "a batch waits for max_delay")
            sent = first + send(evaluate, healthy[1:100] + poisoned + odd + healthy[100:])
        elif where == "between_batches":
            sent = send(evaluate, healthy[:100])
            await asyncio.sleep(0)  # the first batches leave
            sent += send(evaluate, poisoned[:1] + healthy[100:] + odd + poisoned[1:])
        else:
            sent = send(evaluate, poisoned + odd + healthy)
        await settle(sent)
        counts, outcomes = tally(sent, reference, (ZeroDivisionError, ValueError))
        assert counts == dict(sent=202, answered=199, failed=3, hung=0, wrong=0), counts
        for x, kind, error in outcomes:
            if kind == "failed":
                assert error is poison or "one cost per element" in str(error)
                assert any("CostBatcher" in note and "was not queued" in note
                           for note in error.__notes__)
        assert not model.bad_ids  # no poisoned row reached the model
        assert evaluate.stats["batches"] > 0 and not evaluate._task.done()
        after, _ = await round_trip(evaluate, make.make([3, 5]))
        assert after == dict(sent=2, answered=2, failed=0, hung=0, wrong=0)


@THREADED
@pytest.mark.parametrize("fault", [StopIteration, asyncio.CancelledError, SystemExit],
                         ids=["StopIteration", "CancelledError", "SystemExit"])
async def test_model_raising_what_a_future_cannot_carry_fails_only_its_batch(
        model_thread, fault):
    """StopIteration (which set_exception refuses), a CancelledError raised by the model
    (not a cancellation of anyone) and SystemExit fail their batch alone with
    ModelRaisedError; the server serves on."""
    if fault is SystemExit and not model_thread:
        pytest.skip("SystemExit on the loop stops the program, as it should")

    def raising(x):
        raise fault("raised by the model")

    make = Requests()
    model = Recording(reference, raising)
    async with asr.serve(with_spec(model, (2,), np.float32), max_batch_size=8,
                         model_thread=model_thread) as evaluate:
        before, _ = await round_trip(evaluate, make.make([1, 3, 2, 5]))
        assert before == dict(sent=4, answered=4, failed=0, hung=0, wrong=0)

        alone, _ = await round_trip(evaluate, make.make([2], poisoned=True),
                                    errors=ModelRaisedError)
        assert alone == dict(sent=1, answered=0, failed=1, hung=0, wrong=0)

        xs = make.make([1, 2, 3, 1, 4]) + make.make([2], poisoned=True) + make.make(
            [3, 1, 6, 2, 2, 1])
        counts, outcomes = await round_trip(evaluate, xs, errors=ModelRaisedError)
        assert counts["hung"] == 0 and counts["wrong"] == 0, counts
        assert counts["failed"] >= 1 and counts["answered"] >= 1, counts
        assert_only_bad_batches_failed(outcomes, model.bad_ids)
        for _, kind, error in outcomes:
            if kind == "failed":
                assert isinstance(error.__cause__, fault)
                assert type(error.__cause__).__name__ in str(error)

        after, _ = await round_trip(evaluate, make.make([2, 2]))
        assert after == dict(sent=2, answered=2, failed=0, hung=0, wrong=0)
        assert evaluate.stats["failed_batches"] == model.bad_batches


# -- B. outputs that change structure between batches ---------------------------------

ODD_OUTPUTS = {
    # name: (what the model returns normally, what it returns for a bad batch); a wrong
    # row count is test_batching's test_model_with_wrong_outputs_fails_the_batch...
    "array_then_tuple": (reference, lambda x: (reference(x), reference(x))),
    "array_then_wider": (reference, lambda x: np.repeat(reference(x), 2, axis=1)),
    "array_then_int": (reference, lambda x: reference(x).astype(np.int64)),
    "tuple_then_array": (tree, reference),
    "tuple_then_three": (tree, lambda x: (*tree(x), x[:, 0])),
    "tuple_then_swapped": (tree, lambda x: tree(x)[::-1]),
    "dict_then_other_keys": (named, lambda x: {"policy": reference(x), "v": x[:, 0]}),
}


@THREADED
@pytest.mark.parametrize("case", list(ODD_OUTPUTS))
async def test_outputs_that_change_structure_fail_only_that_batch(model_thread, case):
    """A batch whose outputs are not what the first batch's were (kind, tuple length,
    dict keys, trailing shape, dtype kind, rows) fails alone with ModelOutputError
    naming what was expected and what came; no row reaches another caller."""
    ok, odd = ODD_OUTPUTS[case]
    make = Requests()
    model = Recording(ok, odd)
    async with asr.serve(with_spec(model, (2,), np.float32), max_batch_size=8,
                         model_thread=model_thread) as evaluate:
        before, _ = await round_trip(evaluate, make.make([1, 3, 2]), ok)
        assert before == dict(sent=3, answered=3, failed=0, hung=0, wrong=0)

        # Two one-row requests in one batch of 2: a 2-tuple has "2 rows" too.
        pair, outcomes = await round_trip(
            evaluate, make.make([1], poisoned=True) + make.make([1]), ok, ModelOutputError)
        assert pair == dict(sent=2, answered=0, failed=2, hung=0, wrong=0)
        message = str(outcomes[0][2])
        assert "expected" in message and "got" in message, message

        xs = make.make([2, 1, 3]) + make.make([1], poisoned=True) + make.make(
            [4, 2, 1, 5, 3])
        counts, outcomes = await round_trip(evaluate, xs, ok, ModelOutputError)
        assert counts["hung"] == 0 and counts["wrong"] == 0, counts
        assert_only_bad_batches_failed(outcomes, model.bad_ids)

        after, _ = await round_trip(evaluate, make.make([3, 3]), ok)
        assert after == dict(sent=2, answered=2, failed=0, hung=0, wrong=0)


@THREADED
@pytest.mark.parametrize("declared", [True, False], ids=["output_spec", "first_batch"])
async def test_float64_outputs_of_a_float32_model_are_cast_to_float32(model_thread,
                                                                       declared):
    """The documented choice: a dtype of the same kind is cast to the expected one
    (declared by output_spec, or the first batch's), so callers get float32 always."""
    make = Requests()
    model = Recording(reference, lambda x: reference(x).astype(np.float64))
    spec = asr.TensorSpec((2,), np.float32) if declared else None
    async with asr.serve(with_spec(model, (2,), np.float32, output_spec=spec),
                         model_thread=model_thread) as evaluate:
        if not declared:
            before, _ = await round_trip(evaluate, make.make([2]))
            assert before["answered"] == 1
        xs = make.make([1, 3]) + make.make([2], poisoned=True) + make.make([1])
        counts, _ = await round_trip(evaluate, xs)
        assert counts == dict(sent=4, answered=4, failed=0, hung=0, wrong=0)
        assert model.bad_batches >= 1


@THREADED
async def test_declared_output_spec_is_expected_from_the_first_batch_on(model_thread):
    make = Requests()
    model = Recording(reference, lambda x: (reference(x), reference(x)))
    spec = asr.TensorSpec((2,), np.float32)
    async with asr.serve(with_spec(model, (2,), np.float32, output_spec=spec),
                         model_thread=model_thread) as evaluate:
        first, outcomes = await round_trip(
            evaluate, make.make([1], poisoned=True) + make.make([1]), reference,
            ModelOutputError)
        assert first == dict(sent=2, answered=0, failed=2, hung=0, wrong=0)
        assert "declared output spec" in str(outcomes[0][2])
        after, _ = await round_trip(evaluate, make.make([2, 1]))
        assert after == dict(sent=2, answered=2, failed=0, hung=0, wrong=0)


# -- C. nothing outlives its request -------------------------------------------------

@THREADED
async def test_failed_batches_leave_no_piece_of_split_requests_behind(model_thread):
    """A third of the batches fail while 300 requests are split across batches: each
    request is answered exactly or fails whole, and the pieces the router held for the
    failed ones are all dropped."""
    calls = [0]

    def flaky(x):
        calls[0] += 1
        if calls[0] % 3 == 0:
            raise ArithmeticError(f"batch {calls[0]} failed")
        return reference(x)

    make = Requests()
    rng = np.random.default_rng(1)
    async with asr.serve(with_spec(flaky, (2,), np.float32), max_batch_size=8,
                         model_thread=model_thread) as evaluate:
        totals = collections.Counter()
        for _ in range(10):  # bursts of 30: many batches in flight, many splits
            counts, _ = await round_trip(
                evaluate, make.make(rng.integers(5, 14, 30).tolist()),
                errors=ArithmeticError)
            totals.update(counts)
        held = evaluate._responses.held
        # A batch left with nothing but the rest of a request that failed meanwhile
        # may still be in the model: it ends, delivering nothing.
        await wait_until(lambda: not evaluate._flying, "every batch came back")
    assert totals["sent"] == 300
    assert totals["hung"] == 0 and totals["wrong"] == 0, totals
    assert totals["failed"] > 0 and totals["answered"] > 0, totals
    assert held == 0
