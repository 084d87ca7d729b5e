"""Faults in front of servers: a cache that mixes up elements or versions (class 4), and
poison requests that turn circuit breakers against healthy servers (class 6).

Every request is bounded (``asyncio.wait_for``); each test tallies what its requests got
(sent, answered exactly, failed clearly, hung, wrong): hung and wrong must be 0.
"""

import asyncio

import numpy as np
import pytest

import async_search as asr
from async_search.errors import CircuitOpenError, InputSpecError, RemoteError
from async_search.models import with_spec
from async_search.routing.breaker import BreakerPolicy, BreakerState
from async_search.routing.cache import CachedEvaluate
from async_search.routing.router import Router
from tests.faults import faulty
from tests.faults.faulty import Tally
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)

#: Seconds a request may take before it counts as hung.
BOUND_S = 5.0


async def let_through(inner, futures):
    """Opens every gate of ``inner``, including those of requests still on their way
    to it, until ``futures`` are done (each is bounded by BOUND_S)."""
    while not all(f.done() for f in futures):
        for gate in inner.gates:
            gate.set()
        await asyncio.sleep(0)
    await asyncio.gather(*futures)


async def ask(tally: Tally, call, x, want=None, fails_with=None):
    """Sends one request within BOUND_S and counts what it got: ``want`` (the exact
    outputs) or an exception of type ``fails_with``."""
    tally.sent += 1
    try:
        y = await asyncio.wait_for(call(x), BOUND_S)
    except asyncio.TimeoutError:
        tally.hung += 1
        return
    except Exception as e:
        if fails_with is not None and isinstance(e, fails_with):
            tally.failed_clearly += 1
        else:
            tally.wrong += 1
        return
    if want is not None and np.array_equal(np.asarray(y), want) and (
            np.asarray(y).dtype == want.dtype):
        tally.answered_exactly += 1
    else:
        tally.wrong += 1


# -- 4. the cache: elements keyed by dtype and shape, versions by swap ----------------
class GatedEcho:
    """``evaluate(x)``: each element's values as float64, summed; every call waits on
    its own gate (``release(i)`` opens call ``i``). Labelled ``version`` 0."""

    def __init__(self):
        self.version = 0
        self.swap_token = object()  # never swapped
        self.gates = []

    async def __call__(self, x):
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return echo(x)

    def release(self, i):
        self.gates[i].set()


def echo(x):
    """Depends on the values, the dtype and the shape of each element."""
    return x.reshape(len(x), -1).astype(np.float64).sum(axis=1, keepdims=True) * x.ndim


@pytest.mark.parametrize("other", ["dtype", "shape"])
async def test_the_same_bytes_as_another_dtype_or_shape_get_their_own_results(other):
    x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    twin = x.view(np.int32) if other == "dtype" else x.reshape(1, 2, 2)
    assert twin.tobytes() == x.tobytes() and not np.array_equal(echo(twin), echo(x))
    inner = GatedEcho()
    cached = CachedEvaluate(inner, capacity=100)
    tally = Tally()
    # Two concurrent first requests, same bytes: the float32 one lands first.
    first = asyncio.ensure_future(ask(tally, cached, x, echo(x)))
    second = asyncio.ensure_future(ask(tally, cached, twin, echo(twin)))
    # Neither joins the other's request: both reach the model.
    await wait_until(lambda: len(inner.gates) == 2, "both first requests reach the model")
    inner.release(0)
    await first
    inner.release(1)
    await second
    # Then each again, many times, concurrently: hits, or sent (and let through).
    for _ in range(20):
        rounds = [asyncio.ensure_future(ask(tally, cached, v, echo(v)))
                  for v in (x, twin, x)]
        await let_through(inner, rounds)
    tally.check(answered=62, failed=0)


class Weighted:
    """``evaluate(x) == x * weight``, labelled ``version``; a swap changes both."""

    def __init__(self, version):
        self.version = version
        self.swap_token = object()
        self.weight = 1.0
        self.gate = None
        self.requests = 0

    async def with_version(self, x):
        weight, version = self.weight, self.version  # the model it was sent to
        self.requests += 1
        if self.gate is not None:
            await self.gate.wait()
        return x * weight, version

    async def __call__(self, x):
        return (await self.with_version(x))[0]

    def swap(self, version):
        self.version = version
        self.swap_token = object()
        self.weight += 1.0


async def test_a_swap_to_a_label_that_compares_equal_is_still_a_swap():
    inner = Weighted(1)
    cached = CachedEvaluate(inner, capacity=100)
    xs = np.arange(12, dtype=np.float32).reshape(6, 2)
    tally = Tally()
    for label in (1.0, True, np.int64(1), 1):  # each == 1, each a new model
        for x in (xs[:3], xs, xs[3:]):
            await ask(tally, cached, x, x * inner.weight)
        inner.swap(label)
    for x in (xs[:3], xs):
        await ask(tally, cached, x, x * inner.weight)
    tally.check(answered=14, failed=0)
    assert cached.stats["invalidations"] == 4


async def test_a_result_computed_before_an_equal_label_swap_is_not_stored():
    inner = Weighted(1)
    inner.gate = asyncio.Event()
    cached = CachedEvaluate(inner, capacity=100)
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    tally = Tally()
    old = asyncio.ensure_future(ask(tally, cached, x, x * 1.0))  # sent to weight 1
    await wait_until(lambda: inner.requests == 1, "the old request reaches the model")
    inner.swap(1.0)  # equal label, new model, while the old request is in flight
    inner.gate.set()
    await old
    for _ in range(5):
        await ask(tally, cached, x, x * 2.0)
    tally.check(answered=6, failed=0)


class Scale:
    """A model: ``x * factor``; ``version`` is its label."""

    def __init__(self, factor, version=1):
        self.factor = factor
        self.version = version

    def __call__(self, x):
        return x * np.float32(self.factor)


@pytest.mark.parametrize("front", ["server", "router"])
async def test_a_swap_that_keeps_the_label_is_seen_through_a_server_or_a_router(front):
    xs = np.arange(16, dtype=np.float32).reshape(8, 2)
    tally = Tally()
    async with asr.serve(Scale(1.0)) as a, asr.serve(Scale(1.0)) as b:
        servers = [a] if front == "server" else [a, b]
        evaluate = a if front == "server" else Router({"a": a, "b": b})
        cached = CachedEvaluate(evaluate, capacity=100)
        factor = 1.0
        for step in range(4):
            for x in (xs[:4], xs, xs[4:]):
                await ask(tally, cached, x, x * np.float32(factor))
            factor += 1.0
            for server in servers:  # the same label, 1, pushed with new weights
                server.update_model(Scale(factor), version=1)
    tally.check(answered=12, failed=0)


# -- 6. poison: a caller's bad input never counts against a server --------------------
class Counted:
    """Counts the requests that reach a server."""

    def __init__(self, evaluate):
        self.evaluate = evaluate
        self.requests = 0

    async def __call__(self, x):
        self.requests += 1
        return await self.evaluate(x)


POISON = np.full((1, 3), faulty.POISON_VALUE, np.float32)


def healthy(n, seed):
    return np.random.default_rng(seed).uniform(0, 1, (n, 3)).astype(np.float32)


async def test_poison_requests_open_no_breaker_and_healthy_traffic_flows():
    # Declared: every request before the first answered one is poison here, and a spec
    # learnt from requests is taught again until one is answered (requests.py).
    model = with_spec(faulty.FaultyModel(), (3,), np.float32)
    tally = Tally()
    async with asr.serve(model) as a, asr.serve(model) as b, asr.serve(model) as c:
        servers = {"a": Counted(a), "b": Counted(b), "c": Counted(c)}
        router = Router(servers, breaker=BreakerPolicy(failure_threshold=3,
                                                       reset_timeout=30))
        for _ in range(20):  # a handful of poison requests, one at a time
            await ask(tally, router, POISON, fails_with=ValueError)
        # ... each tried on one server only: poison is not spread by failover.
        assert sum(s.requests for s in servers.values()) == 20
        for _ in range(5):  # and bad input of other kinds
            await ask(tally, router, np.zeros((2, 4), np.float32),
                      fails_with=InputSpecError)
        assert all(br.state is BreakerState.CLOSED for br in router.breakers.values())
        xs = [healthy(1 + i % 3, i) for i in range(200)]
        await asyncio.gather(*(ask(tally, router, x, model(x)) for x in xs))
    tally.check(answered=200, failed=25)


class Crashing:
    """A server whose device is gone: every request fails (a server failure)."""

    async def __call__(self, x):
        raise RuntimeError("the device is gone")


async def test_a_failing_server_opens_its_breaker_while_poison_opens_none():
    model = faulty.FaultyModel()
    tally = Tally()
    async with asr.serve(model) as good:
        router = Router({"good": good, "crashing": Crashing()},
                        breaker=BreakerPolicy(failure_threshold=2, reset_timeout=30))
        for i in range(40):  # poison and healthy requests, interleaved
            if i % 4 == 0:
                await ask(tally, router, POISON, fails_with=ValueError)
            else:
                x = healthy(2, i)
                await ask(tally, router, x, model(x))
        states = {n: br.state for n, br in router.breakers.items()}
    assert states == {"good": BreakerState.CLOSED, "crashing": BreakerState.OPEN}
    tally.check(answered=30, failed=10)


class RemoteFailing:
    """A server in another process whose errors arrive as RemoteError (they could not
    travel as themselves): ``kind`` is the remote type."""

    def __init__(self, kind):
        self.kind = kind

    async def __call__(self, x):
        mro = {"ValueError": ("mod.PoisonError", "builtins.ValueError",
                              "builtins.Exception", "builtins.BaseException",
                              "builtins.object"),
               "RuntimeError": ("mod.DeviceLost", "builtins.RuntimeError",
                                "builtins.Exception", "builtins.BaseException",
                                "builtins.object")}[self.kind]
        raise RemoteError(mro[0], "remote failure", "Traceback (most recent call last):",
                          mro)


async def test_remote_caller_errors_do_not_count_and_remote_server_errors_do():
    tally = Tally()
    poisoned = Router({"a": RemoteFailing("ValueError"), "b": RemoteFailing("ValueError")},
                      breaker=BreakerPolicy(failure_threshold=1))
    for _ in range(10):
        await ask(tally, poisoned, POISON, fails_with=RemoteError)
    assert all(br.state is BreakerState.CLOSED for br in poisoned.breakers.values())
    crashed = Router({"a": RemoteFailing("RuntimeError")},
                     breaker=BreakerPolicy(failure_threshold=2))
    for _ in range(2):
        await ask(tally, crashed, POISON, fails_with=RemoteError)
    await ask(tally, crashed, POISON, fails_with=CircuitOpenError)
    assert crashed.breakers["a"].state is BreakerState.OPEN
    tally.check(answered=0, failed=13)
