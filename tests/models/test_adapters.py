"""One suite, every framework: the model contract of NumPy, TensorFlow, PyTorch (eager,
and compiled by TorchScript: ``TorchModel(script=True)``) and JAX.

Each test runs on the same small net built in each framework (``frameworks.py``); a
framework that is not installed is skipped with the reason.
"""

import asyncio
import gc
import subprocess
import sys
import weakref

import numpy as np
import pytest

import async_search as asr
from async_search.base import DeviceModel
from async_search.errors import (DeviceNotFoundError, InputSpecError, ModelNotReadyError,
                                 ModelOutputError)
from async_search.http import ModelRepository, ModelSource
from tests.helpers import failures_in_threads, wait_until, within
from tests.models.frameworks import (ODD_OUTPUTS, SENTINEL, assert_close, inputs,
                                     pad_buffers, params, tolerance, weights)

pytestmark = pytest.mark.timeout(300)

#: Buckets 1, 2, 4, 8, 16.
MAX = 16


@pytest.fixture(params=params())
def framework(request):
    return request.param


@pytest.mark.parametrize("n", [1, 2, 8, 9, 16, 17, 40])
def test_outputs_equal_the_framework_called_directly_within_the_tolerance(framework, n):
    """Bucket edges: one row, a bucket's size, one more, more than the largest bucket."""
    w = weights(0)
    model = framework.make(w, max_batch_size=MAX)
    x = inputs(n, seed=n)
    y = model(x)
    assert y.shape == (n, 3) and y.dtype == np.float32
    assert_close(y, framework.direct(w, x), tolerance(model))
    assert model(x[:0]).shape == (0, 3)


def test_the_tolerance_is_documented_and_holds_across_batch_sizes(framework):
    model = framework.make(weights(0), max_batch_size=MAX)
    tol = tolerance(model)
    assert 0.0 <= tol <= 0.05
    x = inputs(MAX * 2 + 3)
    whole = model(x)
    for size in (1, 3, 7, MAX):
        parts = np.concatenate([model(x[i:i + size]) for i in range(0, len(x), size)])
        assert_close(parts, whole, tol)


def test_padding_never_reaches_a_result(framework):
    if not framework.pads:
        pytest.skip("NumPy models run each batch as it is: nothing to pad")
    model = framework.make(weights(0), max_batch_size=MAX)
    padded = pad_buffers(model)
    for n in (1, 3, 5, 9, 13):
        x = inputs(n, seed=n)
        clean = model(x)
        size = padded.bucket(n)
        assert size > n or n == 1
        for poison in (np.nan, 1e30, -1e30):
            padded.buffer(size)[n:] = poison  # the pad rows the next batch runs with
            poisoned = model(x)
            assert np.isfinite(poisoned).all()
            np.testing.assert_array_equal(poisoned, clean)


async def test_a_wrong_dtype_or_shape_gets_input_spec_error(framework):
    model = framework.make(weights(0), max_batch_size=MAX)
    bad = [np.zeros((2, 5), np.float32), np.zeros((2, 6), np.float64),
           np.zeros((2, 6), np.int64), np.zeros((2, 6, 1), np.float32)]
    async with asr.serve(model, max_batch_size=MAX) as evaluate:
        for x in bad:
            with pytest.raises(InputSpecError, match=r"\[n, 6\] float32"):
                await evaluate(x)
        assert (await within(evaluate(inputs(3)), "a good request")).shape == (3, 3)
    evaluate = asr.immediate(model)
    for x in bad:
        with pytest.raises(InputSpecError):
            await evaluate(x)
    if not framework.pads:
        return  # the NumPy reference model is a plain function: it checks nothing
    # An adapter called directly too: padded into a bucket, a [6] array would broadcast
    # into six equal rows, and a float64 batch be cast.
    for x in bad + [np.zeros(6, np.float32), np.zeros((), np.float32),
                    [[0.0] * 6], np.zeros((2, 6), np.float32).tolist()]:
        with pytest.raises(InputSpecError):
            model(x)
    assert model(inputs(3)).shape == (3, 3)


def test_an_adapter_refuses_a_spec_that_is_not_a_tensor_spec(framework):
    if not framework.pads:
        pytest.skip("the NumPy reference model builds its own spec")
    with pytest.raises(TypeError, match="TensorSpec"):
        framework.make(weights(0), max_batch_size=MAX, spec=(6,))


async def test_an_input_spec_in_the_other_byte_order_is_served(framework):
    # Frameworks take native arrays only: the adapter's spec is native; a request in
    # either order has the same values.
    if not framework.pads:
        pytest.skip("the NumPy reference model builds its own spec")
    w = weights(0)
    other_order = asr.TensorSpec((6,), np.dtype(np.float32).newbyteorder("S"))
    model = framework.make(w, max_batch_size=MAX, spec=other_order)
    assert model.input_spec.dtype == np.float32 and model.input_spec.dtype.isnative
    x = inputs(3)
    assert_close(model(x), framework.direct(w, x), tolerance(model))
    async with asr.serve(model) as evaluate:
        swapped = x.astype(x.dtype.newbyteorder("S"))
        assert_close(await within(evaluate(swapped), "an answer"),
                     framework.direct(w, x), tolerance(model))


async def test_a_raising_net_fails_its_batch_only(framework):
    w = weights(0)
    model = framework.make(w, raising=True, max_batch_size=MAX)
    tol = tolerance(model)
    bad = inputs(2, seed=1)
    bad[1, 0] = SENTINEL
    good = [inputs(3, seed=s) for s in range(6)]
    expected = [framework.direct(w, x) for x in good]
    async with asr.serve(model, max_batch_size=MAX, model_thread=True) as evaluate:
        with pytest.raises(Exception, match="sentinel"):
            await within(evaluate(bad), "the request of the raising batch")
        # The next batches are served, by the same server.
        ys = await within(asyncio.gather(*(evaluate(x) for x in good)), "later batches")
        for y, e in zip(ys, expected):
            assert_close(y, e, tol)
        # Batch-mates of the bad request share its batch, and its fate; nobody else.
        together = await within(asyncio.gather(evaluate(bad), evaluate(good[0]),
                                               return_exceptions=True), "one batch")
        assert all(isinstance(r, Exception) for r in together)
        assert_close(await within(evaluate(good[1]), "after"), expected[1], tol)
        assert evaluate.stats["batches"] >= 3


@pytest.mark.parametrize("kind", list(ODD_OUTPUTS))
async def test_a_net_whose_outputs_do_not_match_its_batch_gets_model_output_error(
        framework, kind):
    """Never the first n rows of whatever came back: a net that returns more or fewer
    rows than it was given, or something that is not its outputs, fails its batch with
    ModelOutputError, called directly or served (a bucket filled, or padded)."""
    if framework.odd is None:
        pytest.skip("NumPy models run as they are: serve checks their outputs")
    model = framework.odd(kind, max_batch_size=MAX)
    for n in (3, 4, MAX + 3):  # padded, filling a bucket, in chunks
        with pytest.raises(ModelOutputError, match="the net returned"):
            model(inputs(n))
    async with asr.serve(model, max_batch_size=MAX, model_thread=True) as evaluate:
        with pytest.raises(ModelOutputError, match="the net returned"):
            await within(evaluate(inputs(3)), "the odd net's batch")
        assert evaluate.stats["failed_batches"] >= 1
    with pytest.raises(ModelOutputError, match="the net returned"):
        await within(asr.immediate(model)(inputs(2)), "immediate")


async def test_no_request_made_after_update_model_sees_the_old_weights(framework):
    old, new = weights(0), weights(1)
    model = framework.make(old, max_batch_size=MAX)
    tol = tolerance(model)
    x = inputs(40)
    expected = {0: framework.direct(old, x), 1: framework.direct(new, x)}
    assert not np.allclose(expected[0], expected[1], rtol=tol, atol=tol)
    updated = False
    served = {"before": 0, "after": 0}
    stop = asyncio.Event()

    async def searcher(k):
        i = 0
        while not stop.is_set():
            start = (k * 5 + i) % 37
            rows = slice(start, start + 3)
            made_after = updated
            y, version = await evaluate.with_version(x[rows])
            if version is None:  # split across the swap: only a request made before
                assert not made_after
            else:
                assert version == 1 or not made_after, "an old answer after the update"
                assert_close(y, expected[version][rows], tol)  # its version's weights
            served["after" if made_after else "before"] += 1
            i += 1

    async with asr.serve(model, max_batch_size=MAX, model_thread=True,
                         num_workers=2) as evaluate:
        tasks = [asyncio.create_task(searcher(k)) for k in range(12)]
        await wait_until(lambda: served["before"] >= 100, "load before the update")
        evaluate.update_model(framework.update(new), 1)
        updated = True
        await wait_until(lambda: served["after"] >= 100, "load after the update",
                         timeout=60)
        stop.set()
        await within(asyncio.gather(*tasks), "the searchers")
        assert evaluate.version == 1


async def test_update_model_takes_the_frameworks_own_net_as_weights(framework):
    # A torch.nn.Module or a Keras model is callable, but not a model of NumPy batches:
    # the adapter copies its weights in, instead of being replaced by it.
    if framework.net is None:
        pytest.skip(f"{framework.name} has no net object apart from its weights")
    model = framework.make(weights(0), max_batch_size=MAX)
    x = inputs(5)
    async with asr.serve(model, max_batch_size=MAX) as evaluate:
        evaluate.update_model(framework.net(weights(1)), 1)
        assert type(evaluate.model) is type(model)
        y, version = await within(evaluate.with_version(x), "an answer")
    assert version == 1
    assert_close(y, framework.direct(weights(1), x), tolerance(model))


async def test_immediate_and_serve_agree_within_the_tolerance(framework):
    model = framework.make(weights(0), max_batch_size=MAX)
    requests = [inputs(1 + s % 5, seed=s) for s in range(40)]
    alone = [await asr.immediate(model)(x) for x in requests]
    async with asr.serve(model, max_batch_size=MAX, model_thread=True) as evaluate:
        batched = await within(asyncio.gather(*(evaluate(x) for x in requests)), "serve")
        assert evaluate.stats["mean_batch_size"] > 1
    for a, b in zip(alone, batched):
        assert_close(b, a, asr.base.batch_tolerance_of(model))


async def test_load_and_unload_through_a_repository(framework):
    """Unloading drops the adapter with its device memory; loading makes a new one."""
    made = []

    def factory():
        made.append(weakref.ref(model := framework.make(weights(0), max_batch_size=MAX)))
        return model

    x = inputs(3)
    async with ModelRepository({"net": ModelSource(factory, max_batch_size=MAX)}) as repo:
        first = await within(repo.serving("net")(x), "served after load")
        await repo.unload("net")
        with pytest.raises(ModelNotReadyError):
            repo.serving("net")
        # (The device thread's last call back to the loop may still be queued.)
        await wait_until(lambda: gc.collect() >= 0 and made[0]() is None,
                         "the unloaded adapter is released")
        await repo.load("net")
        np.testing.assert_array_equal(await within(repo.serving("net")(x), "reloaded"),
                                      first)
    assert len(made) == 2


def test_with_weights_keeps_the_old_model_computing_its_own_weights(framework):
    old, new = weights(0), weights(1)
    model = framework.make(old, max_batch_size=MAX)
    x = inputs(11)
    tol = tolerance(model)
    updated = model.with_weights(framework.update(new))
    for _ in range(2):  # each in turn, on the same net underneath
        assert_close(updated(x), framework.direct(new, x), tol)
        assert_close(model(x), framework.direct(old, x), tol)


def test_two_adapters_made_on_one_net_each_compute_with_their_own_weights(framework):
    # Each adapter had a lock and a record of whose weights were in the net of its own:
    # an update of the served adapter changed a reference adapter made on the same net,
    # and two adapters used from two threads gave rows of neither set of weights.
    if framework.net is None or framework.name == "jax":
        pytest.skip("no net whose tensors adapters share (JAX's params are immutable)")
    from tests.models.frameworks import SPEC
    old, new = weights(0), weights(1)
    net = framework.net(old)
    if framework.name == "tensorflow":
        from async_search.models import TensorFlowModel
        make = lambda size=MAX: TensorFlowModel(net, SPEC, max_batch_size=size)  # noqa: E731
    else:
        from async_search.models import TorchModel
        make = lambda size=MAX: TorchModel(  # noqa: E731
            net, input_spec=SPEC, device="cpu", max_batch_size=size,
            script=framework.name == "torch-script")
    served, reference = make(), make()  # the same options: one runner
    assert served._runner is reference._runner
    updated = served.with_weights(framework.update(new))
    x = inputs(9)
    tol = tolerance(served)
    assert_close(updated(x), framework.direct(new, x), tol)
    assert_close(reference(x), framework.direct(old, x), tol)

    def work(model, w):
        for k in range(40):
            batch = inputs(1 + k % 16, seed=k)
            assert_close(model(batch), framework.direct(w, batch), tol)

    failures = failures_in_threads(work, [(updated, new), (reference, old), (served, old)])
    assert not failures, failures[0]
    # Other options would write the net's tensors their own way: refused while the
    # first adapters are in use, taken once they are gone (garbage included).
    with pytest.raises(ValueError, match="an adapter made on this net with other "
                                         "options is in use"):
        make(4)
    reference(x)  # the net keeps the weights of the adapter that ran last: the old ones
    del served, reference, updated, failures
    assert_close(make(4)(x), framework.direct(old, x), tol)


def scaled(framework, k_dtype=np.int32):
    """The framework's ``x * k + b`` adapter with b = 0.25 and k = 3, its update, and
    rows with the outputs it gives them."""
    if framework.scaled is None:
        pytest.skip("NumPy models have no weights of their own dtypes to stage")
    model, update = framework.scaled(np.full(6, 0.25, np.float32), np.array([3], k_dtype))
    x = inputs(3)
    return model, update, x, x * 3 + np.float32(0.25)


@pytest.mark.parametrize("given", [2 ** 40 + 5, -2 ** 31 - 1, 2 ** 31])
async def test_integer_weights_past_their_dtypes_range_are_refused_not_wrapped(
        framework, given):
    """int64 2**40 + 5 into an int32 weight would become 5: ValueError naming the
    weight, the dtypes and the values given, by with_weights and by update_model; the
    weight staged before it is not taken either."""
    model, update, x, served = scaled(framework)
    bad = update(np.ones(6, np.float32), np.array([given], np.int64))
    with pytest.raises(ValueError, match=rf"int64.*int32.*it holds {given}, outside "
                                         rf"\S*int32's range \(-2147483648 to "
                                         rf"2147483647\).*would change its values"):
        model.with_weights(bad)
    np.testing.assert_allclose(model(x), served, rtol=1e-6)
    async with asr.serve(model, max_batch_size=MAX) as evaluate:
        first = evaluate.version
        with pytest.raises(ValueError, match="would change its values"):
            evaluate.update_model(bad, 1)
        y, version = await within(evaluate.with_version(x), "an answer")
    assert version == first != 1
    np.testing.assert_allclose(y, served, rtol=1e-6)


def test_integer_weights_that_fit_are_taken_whatever_their_integer_dtype(framework):
    model, update, x, _ = scaled(framework)
    for k in (np.array([2 ** 31 - 1], np.int64), np.array([-2 ** 31], np.int64),
              np.array([7], np.uint64), np.array([True])):
        updated = model.with_weights(update(np.zeros(6, np.float32), k))
        np.testing.assert_allclose(updated(x), x * np.float32(k[0]), rtol=1e-6)
    # An unsigned weight takes signed integers that fit, and refuses those that do not.
    model, update, x, _ = scaled(framework, np.uint8)
    np.testing.assert_allclose(model.with_weights(update(np.zeros(6, np.float32),
                                                         np.array([255], np.int64)))(x),
                               x * 255, rtol=1e-6)
    with pytest.raises(ValueError, match=r"it holds -1, outside \S*uint8's range "
                                         r"\(0 to 255\)"):
        model.with_weights(update(np.zeros(6, np.float32), np.array([-1], np.int64)))


def test_float_weights_past_their_dtypes_range_are_refused_not_made_infinite(framework):
    """A finite float64 past float32's range would become inf: refused as a cast that
    changes the values; rounding is not a change, and an infinity given stays one."""
    if not framework.pads:
        pytest.skip("NumPy models compute in the dtype of the weights given")
    old = weights(0)
    model = framework.make(old, max_batch_size=MAX)
    x = inputs(4)
    before = model(x)
    huge = [w.astype(np.float64) for w in weights(1)]
    huge[3][1] = -1e300
    with pytest.raises(ValueError, match=r"float64.*float32.*finite values past "
                                         r"\S*float32's range \(up to 1e\+300 in "
                                         r"magnitude\).*would change its values"):
        model.with_weights(framework.update(huge))
    np.testing.assert_array_equal(model(x), before)
    rounded = [w.astype(np.float64) + 1e-12 for w in weights(1)]
    assert_close(model.with_weights(framework.update(rounded))(x),
                 framework.direct(weights(1), x), tolerance(model))
    infinite = [w.astype(np.float64) for w in weights(1)]
    infinite[3][0] = np.inf
    assert np.isinf(model.with_weights(framework.update(infinite))(x)[:, 0]).all()


def test_threads_share_one_adapter_safely(framework):
    w = weights(0)
    model = framework.make(w, max_batch_size=MAX)
    tol = tolerance(model)
    batches = [inputs(1 + k % 20, seed=k) for k in range(60)]
    expected = [framework.direct(w, x) for x in batches]

    def work(offset):
        for k in range(offset, len(batches), 3):
            assert_close(model(batches[k]), expected[k], tol)

    failures = failures_in_threads(work, [(i,) for i in range(3)])
    assert not failures, failures[0]


def test_a_device_that_does_not_exist_is_refused_at_construction(framework):
    if not framework.missing_device:
        pytest.skip("NumPy models run on the CPU only: no device to name")
    with pytest.raises(DeviceNotFoundError, match="this machine has"):
        framework.make(weights(0), device=framework.missing_device)
    with pytest.raises(DeviceNotFoundError):
        framework.make(weights(0), device="tpu:0")
    if framework.name.startswith("torch"):  # it places tensors, which hold no data to compute on
        with pytest.raises(DeviceNotFoundError, match="holds shapes, not data"):
            framework.make(weights(0), device="meta")
    model = framework.make(weights(0))
    with pytest.raises(DeviceNotFoundError):
        model.on_device(framework.missing_device)


def test_on_device_makes_an_independent_copy(framework):
    if not framework.missing_device:
        pytest.skip("NumPy models have no on_device")
    old, new = weights(0), weights(1)
    model = framework.make(old, max_batch_size=MAX)
    x = inputs(5)
    tol = tolerance(model)
    cpu = {"torch": "cpu", "torch-script": "cpu", "jax": "cpu",
           "tensorflow": "/CPU:0"}[framework.name]
    assert isinstance(model, DeviceModel)  # what serve(devices=[...]) takes
    copy = asr.base.on_device(model, cpu)
    # The copy's tolerance is its own device's default (the model's may be a GPU's)...
    assert copy.batch_tolerance == framework.make(old, max_batch_size=MAX,
                                                  device=cpu).batch_tolerance
    # ...and one given to the model goes with the copy.
    given = framework.make(old, max_batch_size=MAX, batch_tolerance=0.25)
    assert asr.base.on_device(given, cpu).batch_tolerance == 0.25
    model.with_weights(framework.update(new))(x)  # the original's net gets new weights
    assert_close(copy(x), framework.direct(old, x), tol)
    assert_close(model(x), framework.direct(old, x), tol)  # and the old ones back
    staged = model.with_weights(framework.update(new)).on_device(cpu)  # never ran
    assert_close(staged(x), framework.direct(new, x), tol)
    assert_close(model(x), framework.direct(old, x), tol)


def test_the_package_imports_no_framework():
    code = ("import sys, async_search, async_search.models, async_search.connections; "
            "bad = [m for m in ('tensorflow', 'torch', 'jax', 'ray', 'aiohttp', "
            "'matplotlib') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
