"""The request check at every in-process entry point: no array makes a wrong answer.

Every odd request (an ndarray subclass, strides, views, byte orders, dtypes, shapes,
lists, scalars) made beside healthy ones in one loop iteration is answered exactly as
the model answers ``np.asarray(x)`` alone, or refused with InputSpecError; the healthy
ones are exact. The process backend's client is held to the same in
``tests/backends/test_client.py``.
"""

import asyncio
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import async_search as asr
from async_search.base import TensorSpec
from async_search.batchers import CostBatcher
from async_search.errors import InputSpecError
from async_search.models import with_spec
from async_search.requests import RequestChecker, plain_array
from async_search.routing.cache import CachedEvaluate
from async_search.routing.router import Router
from tests import odd_arrays

pytestmark = pytest.mark.timeout(120)

descriptions = st.tuples(st.sampled_from(odd_arrays.KINDS), st.integers(0, 5),
                         st.integers(0, 1000))
cases = st.lists(descriptions, min_size=1, max_size=6)
healthy_seeds = st.lists(st.integers(0, 50), min_size=1, max_size=4)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


# -- the checker ------------------------------------------------------------------------

def test_a_subclass_that_fits_becomes_a_plain_view_of_its_data():
    check = RequestChecker(TensorSpec((2,), np.float32))
    m = np.matrix([[1.0, 2.0]], np.float32)
    x = check(m)
    assert type(x) is np.ndarray and np.shares_memory(x, m)
    masked = np.ma.masked_array(np.ones((3, 2), np.float32), mask=True)
    assert type(check(masked)) is np.ndarray


def test_the_other_byte_order_is_answered_in_the_specs():
    check = RequestChecker(TensorSpec((2,), np.float32))
    x = check(np.array([[1.5, -2.0]], ">f4"))
    assert x.dtype == np.dtype(np.float32) and x.dtype.isnative
    assert x.tolist() == [[1.5, -2.0]]


def test_a_spec_learnt_from_a_byte_swapped_first_request_is_native():
    check = RequestChecker(None)
    x = check(np.array([[1.0]], ">f8"))
    assert check.spec == TensorSpec((1,), np.float64) and x.dtype.isnative
    assert check(np.array([[2.0]])).tolist() == [[2.0]]

def test_a_provisional_spec_is_taught_again_only_when_nothing_of_it_waits():
    class Taken:  # a request's future, as the checker asks of it
        over = False

        def done(self):
            return self.over

    check = RequestChecker(None, relearns=True)
    check(np.array([]))  # a first request the model may refuse: [n] float64
    taken = Taken()
    check.note(taken)
    with pytest.raises(InputSpecError):  # it still waits: the spec holds
        check(np.ones((2, 4), np.float32))
    taken.over = True  # it failed (or its caller gave up): the next one teaches
    check(np.ones((2, 4), np.float32))
    assert check.spec == TensorSpec((4,), np.float32) and not check.settled
    check.settle_by(np.ones((1, 3), np.float32))  # another spec's answer settles nothing
    assert not check.settled
    check.settle_by(np.ones((1, 4), np.float32))  # answered once: it stays
    with pytest.raises(InputSpecError):
        check(np.array([]))
    declared = RequestChecker(TensorSpec((4,), np.float32), relearns=True)
    with pytest.raises(InputSpecError):  # a declared spec is never taught
        declared(np.array([]))
    learnt = RequestChecker(None)  # nor one whose owner does not say what waits
    learnt(np.array([]))
    with pytest.raises(InputSpecError):
        learnt(np.ones((2, 4), np.float32))


@pytest.mark.parametrize("first", [np.array([]), np.ones((1, 3), np.float32),
                                   np.ones((1, 4), np.int64)],
                         ids=["empty", "wrong shape", "wrong dtype"])
def test_a_first_request_the_model_refuses_fails_alone_in_every_entry(first):
    # It fixed the learnt spec: every later (right) request failed with InputSpecError.
    def model(x):
        if x.dtype != np.float32 or x.shape[1:] != (4,):
            raise ValueError("takes [n, 4] float32")
        return x.sum(axis=1)

    good = np.ones((2, 4), np.float32)

    async def main():
        for thread in (True, False):
            async with asr.serve(model, model_thread=thread) as evaluate:
                with pytest.raises(ValueError, match="takes"):
                    await evaluate(first)
                np.testing.assert_array_equal(await evaluate(good), [4.0, 4.0])
                assert evaluate.input_spec == TensorSpec((4,), np.float32)
                with pytest.raises(InputSpecError):  # learnt from an answer: it stays
                    evaluate(first[:, None] if first.ndim == 1 else first)
        evaluate = asr.immediate(model)
        with pytest.raises(ValueError, match="takes"):
            await evaluate(first)
        np.testing.assert_array_equal(await evaluate(good), [4.0, 4.0])
        with pytest.raises(InputSpecError):
            await evaluate(first[:, None] if first.ndim == 1 else first)

    run(main())


@pytest.mark.parametrize("give_up", ["cancelled", "past its deadline"])
def test_a_first_request_its_caller_gave_up_on_fixes_no_spec(give_up):
    # It never reached the model, so no answer ever said the spec was wrong: every
    # later (right) request of every caller failed with InputSpecError.
    def model(x):
        return x.sum(axis=1)

    good = np.ones((2, 4), np.float32)

    async def main():
        for thread in (True, False):
            async with asr.serve(model, model_thread=thread) as evaluate:
                if give_up == "cancelled":
                    evaluate(np.ones((1, 3), np.float32)).cancel()
                else:
                    with pytest.raises(asyncio.TimeoutError):
                        await asyncio.wait_for(evaluate(np.ones((1, 3), np.float32)), 0)
                await asyncio.sleep(0.01)
                assert evaluate.input_spec is None  # never answered: none said
                np.testing.assert_array_equal(await evaluate(good), [4.0, 4.0])
                assert evaluate.input_spec == TensorSpec((4,), np.float32)

    run(main())


def test_a_provisional_spec_meets_updates_prices_failures_and_empty_requests():
    def model(x):
        if x.shape[1:] != (4,):
            raise ValueError("takes [n, 4]")
        return x.sum(axis=1)

    def slow(x):
        time.sleep(0.2)
        return x.reshape(len(x), -1).sum(axis=1)

    def declared(x):
        assert x.shape[1:] == (4,), x.shape
        return x.sum(axis=1)

    async def main():
        # an update declaring another spec while a request of the provisional one
        # waits: refused (it crashed the server, a batch of two shapes forming)
        async with asr.serve(slow, pipeline_depth=1) as evaluate:
            busy = evaluate(np.ones((1, 3), np.float32))
            await asyncio.sleep(0.05)
            queued = evaluate(np.ones((1, 3), np.float32))
            with pytest.raises(ValueError, match="requests are \\[n, 3\\]"):
                evaluate.update_model(with_spec(declared, (4,), np.float32), "v2")
            assert (await busy).tolist() == [3.0] and (await queued).tolist() == [3.0]
        # a first request its batcher's cost refuses is no request of the spec
        async with asr.serve(model, batcher=CostBatcher(100, lambda x: x[:, 1])) as ev:
            with pytest.raises(IndexError):
                ev(np.ones((1, 1), np.float32))
            assert (await ev(np.ones((2, 4), np.float32))).tolist() == [4.0, 4.0]
        # a model that fails every batch keeps no list of every request made
        async with asr.serve(lambda x: 1 / 0) as evaluate:
            for _ in range(1000):
                with pytest.raises(ZeroDivisionError):
                    await evaluate(np.ones((1, 4), np.float32))
            assert len(evaluate._check._waiting) <= 64
        # immediate answers an empty request without its model when the outputs are
        # declared: that settles nothing
        class OutputsDeclared:
            output_spec = TensorSpec((), np.float32)

            def __call__(self, x):
                return model(x)

        ev = asr.immediate(OutputsDeclared())
        assert len(await ev(np.zeros((0, 3)))) == 0
        assert (await ev(np.ones((2, 4), np.float32))).tolist() == [4.0, 4.0]

    run(main())


@pytest.mark.parametrize("bad", [np.zeros((1, 2), np.float64), np.zeros((1, 3), np.float32),
                                 [[1.0, 2.0]], np.float32(1), np.zeros(())])
def test_what_does_not_fit_is_refused_naming_the_spec(bad):
    with pytest.raises(InputSpecError, match=r"\[n, 2\] float32"):
        RequestChecker(TensorSpec((2,), np.float32))(bad)


@pytest.mark.parametrize("spec, expected", [(TensorSpec((3,), np.float32), "[n, 3] float32"),
                                            (TensorSpec((), np.int64), "[n] int64"),
                                            (None, "[n, ...]")])
def test_a_0d_request_is_refused_naming_the_expected_and_the_given_shape(spec, expected):
    # As every other refusal: the spec (when known) and what came instead.
    with pytest.raises(InputSpecError) as caught:
        RequestChecker(spec)(np.array(1.5, np.float32))
    assert str(caught.value) == (f"a request must have a batch dimension: expected "
                                 f"{expected}, given a 0-d float32 array")


def test_a_0d_request_to_a_served_model_is_refused_naming_its_spec():
    model = with_spec(lambda x: x[:, :1] + 0.0, (3,), np.float32)

    async def main():
        async with asr.serve(model) as evaluate:
            with pytest.raises(InputSpecError, match=r"expected \[n, 3\] float32, given "
                                                     r"a 0-d float32 array"):
                await evaluate(np.array(1.0, np.float32))
            return await evaluate(np.ones((2, 3), np.float32))  # the server goes on

    assert run(main()).tolist() == [[1.0], [1.0]]


def test_plain_array_leaves_plain_arrays_and_non_arrays_alone():
    x = np.zeros((1, 2))
    assert plain_array(x) is x
    assert plain_array([1]) == [1]


# -- every in-process entry point -------------------------------------------------------

async def _through_serve(case, seeds):
    async with asr.serve(odd_arrays.square_plus_one(), max_batch_size=8) as evaluate:
        return await odd_arrays.ask_all(evaluate, case, seeds)


async def _through_immediate(case, seeds):
    return await odd_arrays.ask_all(asr.immediate(odd_arrays.square_plus_one()), case, seeds)


async def _through_router(case, seeds):
    model = odd_arrays.square_plus_one()
    async with asr.serve(model, max_batch_size=4) as a, asr.serve(model, max_batch_size=4) as b:
        router = Router({"a": a, "b": b}, policy="consistent_hash")
        return await odd_arrays.ask_all(router, case, seeds)


async def _through_cache(case, seeds):
    async with asr.serve(odd_arrays.square_plus_one(), max_batch_size=8) as evaluate:
        cached = CachedEvaluate(evaluate, capacity=64)
        await cached(odd_arrays.healthy(0))  # the cache's spec is known
        return await odd_arrays.ask_all(cached, case, seeds)


async def _through_unspecified_server(case, seeds):
    # No input spec: the server learns it from the first request, a healthy one.
    model = odd_arrays.square_plus_one_fn
    async with asr.serve(model, max_batch_size=8) as evaluate:
        await evaluate(odd_arrays.healthy(0))
        return await odd_arrays.ask_all(evaluate, case, seeds)


ENTRY_POINTS = {"serve": _through_serve, "immediate": _through_immediate,
                "router": _through_router, "cache": _through_cache,
                "unspecified_serve": _through_unspecified_server}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, seeds=healthy_seeds)
def test_an_odd_request_is_answered_as_its_plain_array_or_refused_and_harms_no_one(
        entry, case, seeds):
    odd_out, good_out = run(ENTRY_POINTS[entry](case, seeds))
    odd_arrays.check_outcomes(case, seeds, odd_out, good_out)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("kind", odd_arrays.KINDS)
def test_each_kind_alone_in_its_batch(entry, kind):
    # Alone in its batch is where a subclass reached the model as itself.
    case = [(kind, 3, 7)]
    odd_out, good_out = run(ENTRY_POINTS[entry](case, []))
    odd_arrays.check_outcomes(case, [], odd_out, good_out)


def test_a_matrix_alone_is_squared_elementwise():
    m = np.matrix(np.arange(1, 17, dtype=np.float32).reshape(4, 4))

    async def main():
        async with asr.serve(odd_arrays.square_plus_one(), max_batch_size=8) as evaluate:
            return await evaluate(m)

    y = run(main())
    assert type(y) is np.ndarray
    assert y[0].tolist() == [2.0, 5.0, 10.0, 17.0]


def test_a_masked_first_request_does_not_change_later_answers_dtype():
    # A server without an output spec learns the output structure from its first batch.
    def model(x):
        return x * x

    masked = np.ma.masked_array(np.arange(8, dtype=np.float32).reshape(2, 4),
                                mask=[[1, 0, 0, 0], [0, 0, 0, 0]])

    async def main():
        async with asr.serve(model, max_batch_size=8) as evaluate:
            first = await evaluate(masked)
            later = await evaluate(np.ones((1, 4), np.float32))
        return first, later

    first, later = run(main())
    assert type(first) is np.ndarray and first.dtype == np.float32
    np.testing.assert_array_equal(first, np.asarray(masked) ** 2)
    assert later.dtype == np.float32 and type(later) is np.ndarray


@pytest.mark.parametrize("outputs", ["matrix", "masked", "tuple_of_masked"])
def test_subclass_outputs_reach_callers_as_plain_arrays(outputs):
    def model(x):
        y = x * 2
        if outputs == "matrix":
            return np.asmatrix(y)
        if outputs == "masked":
            return np.ma.masked_array(y, mask=False)
        return np.ma.masked_array(y, mask=False), y[:, 0]

    x = np.ones((2, 2), np.float32)

    async def main():
        async with asr.serve(model, max_batch_size=8) as evaluate:
            served = await evaluate(x)
        return served, await asr.immediate(model)(x)

    for got in run(main()):
        leaves = got if isinstance(got, tuple) else (got,)
        assert all(type(leaf) is np.ndarray for leaf in leaves)
        np.testing.assert_array_equal(leaves[0], x * 2)


def test_check_values_runs_on_requests_with_rows_and_its_errors_become_input_errors():
    seen = []

    def refuse_negative(x):
        seen.append(len(x))
        if x.min() < 0:  # raises ValueError itself on an empty array
            raise ArithmeticError("negative")

    check = RequestChecker(TensorSpec((2,), np.float32), values=refuse_negative)
    assert check(np.zeros((0, 2), np.float32)).shape == (0, 2)  # nothing to judge
    assert check(np.ones((3, 2), np.float32)).shape == (3, 2)
    with pytest.raises(InputSpecError, match="check_values refused.*ArithmeticError: "
                                             "negative") as info:
        check(-np.ones((1, 2), np.float32))
    assert isinstance(info.value.__cause__, ArithmeticError) and seen == [3, 1]

    def exits(x):
        raise SystemExit(5)  # would end a serving process

    with pytest.raises(InputSpecError, match="SystemExit: 5"):
        RequestChecker(TensorSpec((2,), np.float32), values=exits)(
            np.ones((1, 2), np.float32))


def test_a_request_that_is_no_array_is_named_once_with_or_without_a_spec():
    with pytest.raises(InputSpecError) as without:
        RequestChecker(None)([[1.0, 2.0]])
    assert str(without.value) == "a request must be a NumPy array [n, ...], got list"
    with pytest.raises(InputSpecError) as with_one:
        RequestChecker(TensorSpec((2,), np.float32))((1.0, 2.0))
    assert str(with_one.value) == "a request must be a NumPy array [n, 2] float32, got tuple"
