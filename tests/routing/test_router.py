import asyncio
import itertools

import numpy as np
import pytest

import async_search as asr
from async_search.errors import InputSpecError, ModelOutputError, ServerDiedError
from async_search.models import MLP
from async_search.routing.breaker import BreakerPolicy, BreakerState, CircuitOpenError
from async_search.routing.cache import CachedEvaluate
from async_search.routing.router import Router
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeServer:
    """Doubles its input; records each request; may fail or wait on a gate."""

    def __init__(self, outputs="array"):
        self.requests = []
        self.failing = False
        self.gate: asyncio.Event | None = None
        self.version = 0
        self.outputs = outputs

    async def __call__(self, x):
        self.requests.append(x.copy())
        if self.gate is not None:
            await self.gate.wait()
        if self.failing:
            raise RuntimeError("the device is gone")
        if self.outputs == "tuple":
            return x * 2, x.sum(axis=1)
        if self.outputs == "dict":
            return {"double": x * 2, "sum": x.sum(axis=1)}
        return x * 2

    @property
    def elements(self):
        return sum(len(r) for r in self.requests)


def elements(n, seed=0, width=3):
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


# -- policies -------------------------------------------------------------------------
async def test_round_robin_takes_turns():
    servers = {n: FakeServer() for n in "abc"}
    router = Router(servers, policy="round_robin")
    for i in range(9):
        x = elements(2, seed=i)
        np.testing.assert_array_equal(await router(x), x * 2)
    assert [len(s.requests) for s in servers.values()] == [3, 3, 3]


async def test_round_robin_turns_go_on_past_a_failing_server():
    # A request's failover to the next server takes no turn: before, every request
    # tried the failing server first (its retry took the good server's turn).
    servers = {n: FakeServer() for n in "abc"}
    servers["a"].failing = True
    router = Router(servers, policy="round_robin",
                    breaker=BreakerPolicy(failure_threshold=100))
    for i in range(6):
        x = elements(1, seed=i)
        np.testing.assert_array_equal(await router(x), x * 2)
    # turns a b c a b c: the two of a fail over to b
    assert [len(s.requests) for s in servers.values()] == [2, 4, 2]


async def test_least_outstanding_sends_to_the_server_that_is_free():
    servers = {n: FakeServer() for n in "ab"}
    for s in servers.values():
        s.gate = asyncio.Event()
    router = Router(servers, policy="least_outstanding")
    stuck = [asyncio.ensure_future(router(elements(1, seed=i))) for i in range(10)]
    await asyncio.sleep(0)
    assert router.outstanding == {"a": 5, "b": 5}
    servers["b"].gate.set()
    await wait_until(lambda: router.outstanding["b"] == 0, "b's requests answered")
    assert router.outstanding == {"a": 5, "b": 0}
    for i in range(6):  # every new request goes to b, whose queue is empty
        await asyncio.wait_for(router(elements(1, seed=100 + i)), 5)
    assert len(servers["b"].requests) == 11 and len(servers["a"].requests) == 5
    servers["a"].gate.set()
    await asyncio.wait_for(asyncio.gather(*stuck), 5)


@pytest.mark.parametrize("outputs", ["array", "tuple", "dict"])
async def test_consistent_hash_sends_each_element_to_its_server_and_keeps_order(outputs):
    servers = {n: FakeServer(outputs) for n in "abc"}
    router = Router(servers, policy="consistent_hash")
    x = elements(64, seed=3)
    y = await router(x)
    expected = FakeServer(outputs)
    want = await expected(x)
    if outputs == "array":
        np.testing.assert_array_equal(y, want)
    elif outputs == "tuple":
        for a, b in zip(y, want):
            np.testing.assert_array_equal(a, b)
    else:
        assert set(y) == set(want)
        for k in want:
            np.testing.assert_array_equal(y[k], want[k])
    home = {}
    for name, s in servers.items():
        for r in s.requests:
            for row in r:
                home[row.tobytes()] = name
    assert len(set(home.values())) == 3  # 64 elements spread over all three
    for i in range(0, 64, 7):  # asked alone, later, an element goes to the same server
        before = {n: len(s.requests) for n, s in servers.items()}
        await router(x[i:i + 1])
        went = [n for n, s in servers.items() if len(s.requests) > before[n]]
        assert went == [home[x[i].tobytes()]]


async def test_consistent_hash_keeps_elements_home_when_a_server_joins():
    servers = {n: FakeServer() for n in "abcd"}
    router = Router(servers, policy="consistent_hash")
    x = elements(400, seed=4)
    await router(x)
    placed = {row.tobytes(): name for name, s in servers.items()
              for row in s.requests[0]}
    servers["e"] = FakeServer()
    router.add_server("e", servers["e"])
    for s in servers.values():
        s.requests.clear()
    await router(x)
    moved = [name for name, s in servers.items() for r in s.requests for row in r
             if placed[row.tobytes()] != name]
    assert 0.08 < len(moved) / 400 < 0.32  # about 1/5
    assert set(moved) == {"e"}


# -- breakers and failover ------------------------------------------------------------
async def test_a_server_that_raises_opens_its_breaker_and_traffic_moves_to_the_others():
    clock = Clock()
    servers = {n: FakeServer() for n in "abc"}
    servers["b"].failing = True
    router = Router(servers, policy="round_robin", clock=clock,
                    breaker=BreakerPolicy(failure_threshold=3, success_threshold=2,
                                          reset_timeout=30))
    for i in range(60):
        x = elements(1, seed=i)
        np.testing.assert_array_equal(await router(x), x * 2)  # failover: none fails
    assert len(servers["b"].requests) == 3
    assert router.breakers["b"].state is BreakerState.OPEN
    assert len(servers["a"].requests) + len(servers["c"].requests) == 60
    assert router.stats["servers"]["b"]["failures"] == 3
    # After the timeout one probe goes to b; healthy again, it closes after 2 successes.
    servers["b"].failing = False
    clock.now = 30.0
    for i in range(12):
        await router(elements(1, seed=i))
    assert router.breakers["b"].state is BreakerState.CLOSED
    assert len(servers["b"].requests) > 3 + 2


async def test_when_every_breaker_is_open_callers_get_an_error_at_once():
    servers = {n: FakeServer() for n in "ab"}
    for s in servers.values():
        s.failing = True
    router = Router(servers, clock=Clock(), breaker=BreakerPolicy(failure_threshold=2))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="the device is gone"):
            await router(elements(1))
    assert all(b.state is BreakerState.OPEN for b in router.breakers.values())
    calls = sum(len(s.requests) for s in servers.values())
    for s in servers.values():  # a call that reached a server would wait forever
        s.gate = asyncio.Event()
    with pytest.raises(CircuitOpenError, match=r"no server's circuit breaker admits a "
                                               r"request now \(a: open, b: open\)"):
        await asyncio.wait_for(router(elements(1)), 5)
    assert sum(len(s.requests) for s in servers.values()) == calls
    assert router.stats["rejected"] == 1


async def test_without_failover_the_server_error_reaches_the_caller():
    servers = {n: FakeServer() for n in "ab"}
    servers["a"].failing = True
    router = Router(servers, failover=False)
    with pytest.raises(RuntimeError, match="the device is gone"):
        await router(elements(1))
    assert len(servers["b"].requests) == 0


async def test_plain_functions_whose_server_died_fail_over_to_a_live_one():
    alive = {"a": True, "b": False, "c": True}
    calls = {n: 0 for n in alive}

    def server(name):
        async def evaluate(x):  # a client of a server elsewhere, as a plain function
            calls[name] += 1
            await asyncio.sleep(0)
            if not alive[name]:
                raise ServerDiedError(f"server {name} died")
            return x * 2
        return evaluate

    router = Router({n: server(n) for n in alive}, policy="least_outstanding",
                    clock=Clock(), breaker=BreakerPolicy(failure_threshold=2))
    xs = [elements(2, seed=i) for i in range(30)]
    ys = await asyncio.gather(*(router(x) for x in xs))  # concurrent: b gets some
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, x * 2)
    assert router.breakers["b"].state is BreakerState.OPEN
    assert router.stats["servers"]["b"]["failures"] == calls["b"] >= 2
    alive["a"] = alive["c"] = False
    with pytest.raises(ServerDiedError, match="died"):
        await router(elements(1))


async def test_a_split_request_holds_its_parts_and_cancels_them_when_one_fails():
    servers = {n: FakeServer() for n in "abc"}
    for s in servers.values():
        s.gate = asyncio.Event()
    router = Router(servers, policy="consistent_hash", failover=False)
    x = elements(64, seed=5)
    call = asyncio.ensure_future(router(x))
    await wait_until(lambda: sum(len(s.requests) for s in servers.values()) == 3,
                     "each server got its part")
    assert router.stats["parts_in_flight"] == 3  # one task per server, referenced
    servers["a"].failing = True
    servers["a"].gate.set()
    with pytest.raises(RuntimeError, match="the device is gone"):
        await asyncio.wait_for(call, 5)
    await wait_until(lambda: router.stats["parts_in_flight"] == 0,
                     "b's and c's parts cancelled")
    assert router.outstanding == {"a": 0, "b": 0, "c": 0}
    assert [br.state for br in router.breakers.values()] == [BreakerState.CLOSED] * 3


async def test_a_cancelled_caller_cancels_every_part_of_its_request():
    servers = {n: FakeServer() for n in "ab"}
    for s in servers.values():
        s.gate = asyncio.Event()
    router = Router(servers, policy="consistent_hash")
    call = asyncio.ensure_future(router(elements(32, seed=6)))
    await wait_until(lambda: router.stats["parts_in_flight"] == 2, "both parts sent")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await wait_until(lambda: router.stats["parts_in_flight"] == 0, "both parts cancelled")
    assert router.outstanding == {"a": 0, "b": 0}
    assert all(s["failures"] == 0 for s in router.stats["servers"].values())


async def test_a_bad_request_is_not_held_against_the_server():
    model = MLP((3,), output_size=1)
    async with asr.serve(model) as a, asr.serve(model) as b:
        router = Router({"a": a, "b": b}, breaker=BreakerPolicy(failure_threshold=1))
        with pytest.raises(InputSpecError, match=r"expected \[n, 3\] float32"):
            await router(np.zeros((2, 4), np.float32))
        assert all(br.state is BreakerState.CLOSED for br in router.breakers.values())
        x = elements(5)
        np.testing.assert_array_equal(await router(x), model(x))


async def test_removed_server_gets_no_new_requests():
    servers = {n: FakeServer() for n in "ab"}
    router = Router(servers, policy="consistent_hash")
    router.remove_server("a")
    await router(elements(50))
    assert servers["a"].requests == [] and servers["b"].elements == 50
    assert router.outstanding == {"b": 0} and list(router.stats["servers"]) == ["b"]
    with pytest.raises(ValueError, match="already routed to"):
        router.add_server("b", FakeServer())
    with pytest.raises(ValueError, match="unknown routing policy 'random'"):
        Router(servers, policy="random")


async def test_a_server_added_under_a_removed_name_starts_with_counters_of_its_own():
    # The old server's requests in flight are not the new one's load, and its late
    # failures are not the new one's failures.
    old_a, b = FakeServer(), FakeServer()
    old_a.gate, b.gate = asyncio.Event(), asyncio.Event()
    router = Router({"a": old_a}, policy="least_outstanding",
                    breaker=BreakerPolicy(failure_threshold=5))
    calls = [asyncio.ensure_future(router(elements(1, seed=i))) for i in range(3)]
    await wait_until(lambda: len(old_a.requests) == 3, "the old a holds 3 requests")
    router.add_server("b", b)
    calls.append(asyncio.ensure_future(router(elements(1, seed=3))))
    await wait_until(lambda: len(b.requests) == 1, "b holds 1 request")
    router.remove_server("a")
    new_a = FakeServer()
    router.add_server("a", new_a)
    assert router.outstanding == {"b": 1, "a": 0}
    assert router.stats["servers"]["a"]["outstanding"] == 0
    x = elements(1, seed=4)  # to the idle new a, not to b, busy with 1 request
    np.testing.assert_array_equal(await asyncio.wait_for(router(x), 5), x * 2)
    old_a.failing = True  # the old a fails its 3 requests late; they fail over to b
    old_a.gate.set()
    b.gate.set()
    await asyncio.wait_for(asyncio.gather(*calls), 5)
    assert len(b.requests) == 1 + 3 and len(new_a.requests) == 1
    a = router.stats["servers"]["a"]
    assert (a["requests"], a["failures"], a["outstanding"]) == (1, 0, 0)
    assert a["breaker"]["failures"] == 0 and router.outstanding == {"b": 0, "a": 0}


# -- what servers answer --------------------------------------------------------------
class WrongAnswer(FakeServer):
    """Answers a request with something else than one row per element."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    async def __call__(self, x):
        self.requests.append(x.copy())
        if self.answer == "one row":
            return x[:1] * 2
        if self.answer == "a 0-d array":
            return np.array(1.0, np.float32)
        if self.answer == "a tuple of other rows":
            return x * 2, x[:1].sum(axis=1)
        return None


@pytest.mark.parametrize("answer", ["one row", "a 0-d array", "a tuple of other rows",
                                    "None"])
async def test_an_answer_of_other_rows_fails_and_counts_against_its_server(answer):
    # A part of k elements answered by one row was broadcast into all k places:
    # callers got other elements' rows.
    good, bad = FakeServer(), WrongAnswer(answer)
    router = Router({"a": good, "b": bad}, policy="consistent_hash", failover=False)
    x = elements(64, seed=8)
    with pytest.raises(ModelOutputError, match="server 'b' answered a request of"):
        await asyncio.wait_for(router(x), 5)
    assert good.requests and bad.requests  # the request was split over both
    stats = router.stats["servers"]
    assert (stats["b"]["failures"], stats["b"]["breaker"]["failures"]) == (1, 1)
    assert (stats["a"]["failures"], stats["a"]["breaker"]["failures"]) == (0, 0)
    # With failover, b's part goes to a: the caller gets every element's own row.
    router = Router({"a": good, "b": bad}, policy="consistent_hash")
    np.testing.assert_array_equal(await asyncio.wait_for(router(x), 5), x * 2)
    assert router.stats["servers"]["b"]["failures"] == 1
    # A request not split is checked too.
    with pytest.raises(ModelOutputError, match="server 'b' answered a request of 3"):
        await asyncio.wait_for(Router({"b": bad})(x[:3]), 5)


def part_of(kind):
    """A server's answer ``x[:, :1] + 0.25`` in float32, or changed by ``kind``."""
    async def evaluate(x):
        y = x[:, :1] + np.float32(0.25)
        if kind == "float64":
            return y.astype(np.float64)
        if kind == "float64 past float32's range":
            return y.astype(np.float64) * 1e40
        if kind == "int8":
            return y.astype(np.int8)
        if kind == "[n, 2]":
            return np.repeat(y, 2, axis=1)
        if kind == "tuple":
            return y, y
        return y
    return evaluate


@pytest.mark.parametrize("kind, error", [
    ("float64", None),  # float32 keeps the values: cast, as the serving core does
    ("float64 past float32's range", "holds values past float32's range"),
    ("int8", r"expected an array \[n, 1\] float32, got an array \[n, 1\] int8"),
    ("[n, 2]", r"got an array \[n, 2\] float32"),
    ("tuple", "got a tuple of 2 outputs")])
async def test_the_parts_of_a_split_request_are_made_to_fit_the_first_or_fail(kind, error):
    # They were assembled in the first part's dtype (int8 truncated floats, 1e40 became
    # inf) or failed with numpy's broadcast error.
    router = Router({"a": part_of("float32"), "b": part_of(kind)},
                    policy="consistent_hash")
    x = elements(64, seed=9)
    if error is None:
        y = await asyncio.wait_for(router(x), 5)
        assert y.dtype == np.float32
        np.testing.assert_array_equal(y, x[:, :1] + np.float32(0.25))
        return
    with pytest.raises(ModelOutputError, match="server 'b''s part: .*" + error):
        await asyncio.wait_for(router(x), 5)
    # Nothing tells which server is wrong: no breaker counts it.
    assert all(s["failures"] == 0 for s in router.stats["servers"].values())


# -- versions -------------------------------------------------------------------------
V0 = MLP((6,), hidden_sizes=(16,), output_size=2, seed=10)
V1 = MLP((6,), hidden_sizes=(16,), output_size=2, seed=11)


@pytest.mark.parametrize("stack", ["server", "cache", "router", "cache_over_router"])
async def test_model_update_in_the_middle_of_64_searches_fails_nothing(stack):
    """64 searches run; the model is swapped while they run. No request fails, and
    every request made after the swap gets the new version and the new model's rows
    (from the server, or from the cache, which must not keep the old model's)."""
    pool = np.random.default_rng(7).standard_normal((40, 6)).astype(np.float32)
    swapped = asyncio.Event()
    results = []  # (made after the swap, x, y, version)

    async with asr.serve(V0, max_batch_size=32) as a, asr.serve(V0, max_batch_size=32) as b:
        if stack == "server":
            evaluate, update = a, a.update_model
        elif stack == "cache":
            evaluate, update = CachedEvaluate(a, capacity=1000), a.update_model
        else:
            router = Router({"a": a, "b": b}, policy="consistent_hash")
            evaluate = router if stack == "router" else CachedEvaluate(router,
                                                                       capacity=1000)
            update = router.update_model

        async def search(seed):
            rng = np.random.default_rng(seed)
            for _ in range(30):  # elements repeat across searches: cache hits and joins
                x = pool[rng.integers(0, len(pool), rng.integers(1, 4))]
                after = swapped.is_set()
                y, version = await evaluate.with_version(x)
                results.append((after, x, y, version))
                if len(results) == 64 * 10:  # the trainer's update lands mid-run
                    update(V1, 1)
                    swapped.set()

        await asyncio.wait_for(asyncio.gather(*(search(s) for s in range(64))), 30)
    assert len(results) == 64 * 30
    after = [(x, y, v) for late, x, y, v in results if late]
    assert len(after) > 64 * 10
    for x, y, version in after:  # made after the swap: new version, new model's rows
        assert version == 1
        np.testing.assert_array_equal(y, V1(x))
    for late, x, y, version in results:
        # Made before the swap: computed by either model, row by row (a request split
        # across batches during the swap may hold rows of both).
        assert version in (0, 1, None)
        by_row = (y == V0(x)).all(axis=1) | (y == V1(x)).all(axis=1)
        assert by_row.all()
    assert any(v == 0 for _, _, _, v in results)


async def test_router_reports_the_version_and_swaps_every_server():
    async with asr.serve(V0) as a, asr.serve(V0) as b:
        router = Router({"a": a, "b": b}, policy="consistent_hash")
        assert router.version == 0
        router.update_model(V1, "v1")
        assert router.version == "v1" and a.version == b.version == "v1"
        x = elements(20, width=6)
        y, version = await router.with_version(x)
        assert version == "v1"
        np.testing.assert_array_equal(y, V1(x))
        a.update_model(V0, "v0")
        assert router.version is None  # the servers disagree


async def test_servers_that_report_no_version_give_an_unknown_version():
    async def plain(x):
        return x * 2

    router = Router({"a": plain, "b": plain})
    x = elements(3)
    y, version = await router.with_version(x)
    np.testing.assert_array_equal(y, x * 2)
    assert version is None and router.version is None


class RaisesOnEvery17thBatch:
    """A model that doubles its input and raises on one batch in 17."""

    def __init__(self):
        self.batches = 0

    def __call__(self, x):
        self.batches += 1
        if self.batches % 17 == 0:
            raise RuntimeError(f"batch {self.batches} failed")
        return x * 2


async def test_a_failed_batch_counts_as_one_failure_so_rare_failures_open_no_breaker():
    # Before, a failed batch of 8 requests counted 8 failures and opened its breaker
    # for 30 s; with a model that raises on 1 batch in 17 and 64 callers, 199,411 of
    # 200,000 requests got CircuitOpenError. Scaled down: 64 callers, 2 servers.
    clock = Clock()
    models = [RaisesOnEvery17thBatch(), RaisesOnEvery17thBatch()]
    outcomes = {"exact": 0, "circuit_open": 0, "model_raised": 0, "other": 0}
    async with asr.serve(models[0], max_batch_size=8) as a, \
            asr.serve(models[1], max_batch_size=8) as b:
        router = Router({"a": a, "b": b}, policy="least_outstanding", clock=clock)

        async def caller(seed):
            for i in range(40):
                x = elements(1, seed=seed * 100 + i)
                try:
                    y = await router(x)
                except CircuitOpenError:
                    outcomes["circuit_open"] += 1
                    continue
                except RuntimeError as e:  # failed over, and failed there too
                    outcomes["model_raised" if "failed" in str(e) else "other"] += 1
                    continue
                except Exception:
                    outcomes["other"] += 1
                    continue
                outcomes["exact" if np.array_equal(y, x * 2) else "other"] += 1

        await asyncio.wait_for(asyncio.gather(*(caller(s) for s in range(64))), 50)
    failed_batches = sum(m.batches // 17 for m in models)
    assert failed_batches >= 4  # the scenario happened: batches failed on both paths
    # Failover answers nearly every request of a failed batch (a few fail on both
    # servers); none is turned away by a breaker.
    assert outcomes["circuit_open"] == outcomes["other"] == 0
    assert outcomes["exact"] + outcomes["model_raised"] == 64 * 40
    assert outcomes["exact"] >= 0.95 * 64 * 40
    assert all(breaker.opened == 0 for breaker in router.breakers.values())
    failures = sum(s["failures"] for s in router.stats["servers"].values())
    assert failures > failed_batches  # batches of several requests failed, each once


# -- what a cache in front of a router needs ------------------------------------------
async def test_a_cache_refuses_a_router_whose_server_labels_answers_without_a_token():
    async with asr.serve(V0) as a:
        labelled = FakeServer()  # has a version label, but nothing says when it swaps
        with pytest.raises(TypeError, match="server 'b' .* reports no swap_token"):
            CachedEvaluate(Router({"a": a, "b": labelled}))


async def test_a_cache_refuses_a_router_of_servers_that_report_no_version():
    async def plain(x):
        return x * 2

    with pytest.raises(TypeError, match="no server of the router reports a model version"):
        CachedEvaluate(Router({"a": plain, "b": plain}))
    cached = CachedEvaluate(Router({"a": plain}), fixed_model=True)  # said to be fixed
    x = elements(2)
    for _ in range(2):
        np.testing.assert_array_equal(await cached(x), x * 2)
    assert cached.stats["hits"] == 2


async def test_a_router_does_not_know_its_models_while_a_server_does_not():
    class NotYet(FakeServer):  # a client before its server's first word
        swap_token = None

    async with asr.serve(V0) as a:
        waiting = NotYet()
        router = Router({"a": a, "b": waiting})
        assert router.swap_token is None
        cached = CachedEvaluate(router, capacity=100)
        x = elements(2, width=6)
        for _ in range(3):  # unknown: every request goes around the table
            await cached(x)
        assert cached.stats["hits"] == 0
        router.remove_server("b")
        assert router.swap_token == (a.swap_token,)
        await cached(x)
        await cached(x)
        assert cached.stats["hits"] == 2


async def test_a_server_removed_before_a_split_requests_parts_start_fails_over():
    # remove_server runs after routing chose the servers, before the parts' first step
    servers = {n: FakeServer() for n in "ab"}
    router = Router(servers, policy="consistent_hash")
    x = elements(16)
    call = asyncio.ensure_future(router(x))

    async def remove():
        router.remove_server("b")

    removing = asyncio.ensure_future(remove())
    y = await asyncio.wait_for(call, 5)
    await removing
    np.testing.assert_array_equal(y, await FakeServer()(x))
    assert servers["a"].elements == 16 and not router._tasks


async def test_a_server_that_keeps_requests_past_their_deadline_trips_its_breaker():
    # The deadline's cancellation released the server's permit: a hung server never
    # failed, and every other request went to it and timed out, for good.
    async def hung(x):
        await asyncio.Event().wait()

    async def good(x):
        return x[:, :1] + 1

    router = Router({"hung": hung, "good": good}, policy="round_robin",
                    breaker=BreakerPolicy(failure_threshold=2))
    timeouts = 0
    for _ in range(20):
        try:
            await router(np.zeros((1, 2)), timeout=0.02)
        except TimeoutError:
            timeouts += 1
    stats = router.stats["servers"]["hung"]
    # The first timeout came before any server had answered, from a deadline shorter
    # than FIRST_FAIR_S: not counted; the next two were (the good server answers in
    # microseconds).
    assert timeouts == 3 and stats["failures"] == 2
    assert stats["breaker"]["state"] == "open"


async def test_a_deadline_shorter_than_a_servers_usual_answer_is_the_callers_doing():
    # (and the silence of a server whose every request was cut short by its caller)
    # Ten requests with a deadline of a microsecond opened every healthy server's
    # breaker: a caller's deadline is the caller's choice, as its bad input is.
    async def usual(x):
        await asyncio.sleep(0.01)
        return x[:, :1]

    router = Router({"a": usual, "b": usual}, breaker=BreakerPolicy(failure_threshold=1))
    for _ in range(4):
        await router(np.zeros((1, 2)))
    for _ in range(10):
        with pytest.raises(TimeoutError):
            await router(np.zeros((1, 2)), timeout=1e-3)
        await asyncio.sleep(0.02)  # idle between: a server owing nothing is not silent
    assert [s["failures"] for s in router.stats["servers"].values()] == [0, 0]
    assert (await router(np.ones((1, 2)))).tolist() == [[1.0]]


async def test_a_server_that_hangs_opens_its_breaker_under_deadlines_near_its_usual():
    # Timeouts counted only when a request had twice the server's usual answer time:
    # with deadlines shorter than that, a hung server kept its share of the traffic.
    hung = asyncio.Event()

    async def usually_slow(x):
        if hung.is_set():
            await asyncio.Event().wait()
        await asyncio.sleep(0.03)
        return x[:, :1]

    async def quick(x):
        return x[:, :1]

    router = Router({"slow": usually_slow, "quick": quick}, policy="round_robin",
                    breaker=BreakerPolicy(failure_threshold=2))
    for _ in range(10):
        await router(np.zeros((1, 2)))
    hung.set()
    timeouts = 0
    for _ in range(40):
        try:
            await router(np.zeros((1, 2)), timeout=0.05)
        except TimeoutError:
            timeouts += 1
    assert router.stats["servers"]["slow"]["breaker"]["state"] == "open"
    assert timeouts <= 8


async def test_a_model_given_as_a_server_is_named_as_such():
    model = MLP((4,))
    router = Router({"a": model})
    with pytest.raises(TypeError, match="a model\\?\\); wrap a model with asr.immediate"):
        await router(np.zeros((2, 4), np.float32))


async def test_update_model_checks_every_server_before_any_swaps():
    # The servers before the one without update_model had swapped already.
    async def plain(x):
        return np.zeros((len(x), 1), np.float32)

    async with asr.serve(MLP((4,))) as served:
        router = Router({"a": served, "z": plain})
        with pytest.raises(TypeError, match="'z'.*no server was updated"):
            router.update_model(MLP((4,)), version=5)
        assert served.version == 0


@pytest.mark.parametrize("refusal", ["closed", "another input spec"])
async def test_a_server_that_refuses_the_update_leaves_every_server_on_its_model(refusal):
    # The servers before it had swapped already: the router then alternated between
    # two models' answers (and a cache in front stopped caching).
    import contextlib
    from async_search.models import with_spec

    x = np.zeros((1, 4), np.float32)
    async with contextlib.AsyncExitStack() as stack:
        a, b, c = [await stack.enter_async_context(asr.serve(MLP((4,), seed=0)))
                   for _ in range(3)]
        router = Router({"a": a, "b": b, "c": c})
        expected = await router(x)
        if refusal == "closed":
            await b.aclose()
            new, match = MLP((4,), seed=1), "server 'b' refused the update, so no server"
        else:
            new = with_spec(lambda x: x[:, :1], (3,), np.float32)
            match = "server 'a' refused the update, so no server was updated: update_model"
        with pytest.raises((RuntimeError, ValueError), match=match):
            router.update_model(new, version=1)
        assert (a.version, c.version) == (0, 0)
        for _ in range(6):
            np.testing.assert_array_equal(await router(x), expected)


async def test_a_router_routing_to_a_router_swaps_none_until_every_server_has_checked():
    # The inner router had no prepare_update: the outer one swapped its other servers,
    # then the inner update raised "no server was updated" while one had.
    async with asr.serve(MLP((4,), seed=0)) as a, asr.serve(MLP((4,), seed=0)) as b:
        outer = Router({"a": a, "inner": Router({"b": b})})
        await b.aclose()
        with pytest.raises(RuntimeError, match="server 'inner' refused the update.*'b'"):
            outer.update_model(MLP((4,), seed=1), version=1)
        assert a.version == 0
    async with asr.serve(MLP((4,), seed=0)) as a, asr.serve(MLP((4,), seed=0)) as b:
        outer = Router({"a": a, "inner": Router({"b": b})})
        outer.update_model(MLP((4,), seed=1), version=1)
        assert (a.version, b.version) == (1, 1)


async def test_a_server_whose_update_model_must_be_awaited_is_refused_before_any_swap():
    # Called and never awaited: the server stayed on its model, with only a
    # RuntimeWarning ("coroutine ... was never awaited") to say so.
    class Remote:
        async def __call__(self, x):
            return np.zeros((len(x), 1), np.float32)

        async def update_model(self, model, version):
            pass

    async with asr.serve(MLP((4,))) as served:
        router = Router({"a": served, "r": Remote()})
        with pytest.raises(TypeError, match="'r'.*it is async.*no server was updated"):
            router.update_model(MLP((4,)), version=1)
        assert served.version == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(servers=[("a", None)]), "servers must be a mapping"),
    (dict(policy="RoundRobin"), "unknown routing policy"),
    (dict(policy=None), "policy must be one of"),
    (dict(breaker={"failure_threshold": 1}), "breaker must be a BreakerPolicy instance"),
    (dict(clock=0.0), "clock must be callable"),
    (dict(is_failure=None), "is_failure must be callable"),
    (dict(failover="no"), "failover must be True or False"),
])
def test_bad_router_arguments_are_refused_where_they_are_given(kwargs, message):
    # Each got as far as a request (or the first failure), to fail inside the routing.
    from async_search.routing.router import RoundRobin

    async def server(x):
        return x

    arguments = {"servers": {"a": server}, **kwargs}
    with pytest.raises((TypeError, ValueError), match=message):
        Router(arguments.pop("servers"), **arguments)
    with pytest.raises(TypeError, match="got the class RoundRobin"):
        Router({"a": server}, policy=RoundRobin)


async def test_a_refused_update_keeps_the_errors_type_and_attributes():
    # It was rebuilt from its message alone: a status of 413 came back as 400, and a
    # type that takes other arguments was raised from itself.
    class Refusal(ValueError):
        def __init__(self, message, status=400):
            super().__init__(message)
            self.status = status

    class Pair(Exception):
        def __init__(self, code, why):
            super().__init__(code, why)

    for error, check in ((Refusal("too big", status=413), lambda e: e.status == 413),
                         (Pair(7, "bad"), lambda e: e.__cause__ is not e)):
        class Refusing:
            version, swap_token = 0, object()

            async def __call__(self, x):
                return x

            def prepare_update(self, model, version, error=error):
                raise error

        router = Router({"a": Refusing()})
        with pytest.raises(type(error)) as info:
            router.update_model(MLP((4,)), version=1)
        assert check(info.value)
        assert "server 'a' refused the update" in str(info.value) + " ".join(
            getattr(info.value, "__notes__", []))


async def test_a_cancelled_error_a_server_raises_is_its_failure_not_the_callers():
    # It reached the caller as if the caller had been cancelled, with no failover and
    # nothing counted against the server.
    async def cancels(x):
        raise asyncio.CancelledError()

    async def good(x):
        return x[:, :1]

    router = Router({"c": cancels, "g": good}, policy="round_robin")
    for _ in range(4):
        assert (await asyncio.wait_for(router(np.ones((1, 2))), 5)).shape == (1, 1)
    stats = router.stats["servers"]["c"]
    assert stats["failures"] == stats["requests"] >= 2 and stats["outstanding"] == 0


@pytest.mark.parametrize("policy", ["round_robin", "least_outstanding", "consistent_hash"])
async def test_names_that_numpy_strings_would_change_route_every_element(policy):
    """A name ending in NUL came back from NumPy's string array without it: the router
    looked for a server it did not have and failed over to the same choice until a
    RecursionError."""
    a, b = FakeServer(), FakeServer()
    router = Router({"x": a, "y\x00": b}, policy=policy)
    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    for _ in range(4):
        np.testing.assert_array_equal(await router(x), x * 2)
        np.testing.assert_array_equal(await router(x[:1]), x[:1] * 2)
    assert a.requests and b.requests


@pytest.mark.parametrize("name", [0, 1.5, None, ("a",), b"a"])
def test_a_server_name_that_is_not_a_str_is_refused_when_added(name):
    with pytest.raises(TypeError, match="a server's name must be a str"):
        Router({name: FakeServer()})
    router = Router({"a": FakeServer()})
    with pytest.raises(TypeError, match="a server's name must be a str"):
        router.add_server(name, FakeServer())
    assert list(router.servers) == ["a"]


class MadeUpPolicy:
    """Chooses what it is told: a name not routed to, or too few names."""

    def __init__(self, choice):
        self.choice = choice

    def assign(self, x, candidates, servers, outstanding):
        return self.choice(x, candidates)


@pytest.mark.parametrize("choice, match", [
    (lambda x, c: "nobody", "chose 'nobody', which is not among"),
    (lambda x, c: ["nobody"] * len(x), "chose 'nobody', which is not among"),
    (lambda x, c: [c[0]] * (len(x) - 1), "chose servers for 3 elements of a request of 4"),
    (lambda x, c: None, "returned NoneType None: it must return a server's name"),
    (lambda x, c: 1, "returned int 1: it must return a server's name"),
    (lambda x, c: [[c[0]]] * len(x), r"chose \['a'\], which is not among"),
    (lambda x, c: np.zeros((len(x), 2), int), r"chose array\(\[0, 0\]\), which is not"),
    (lambda x, c: [c[0], None, c[0], c[0]], "chose None, which is not among")])
async def test_a_policy_that_chooses_no_candidate_gets_a_clear_error(choice, match):
    router = Router({"a": FakeServer(), "b": FakeServer()}, policy=MadeUpPolicy(choice))
    with pytest.raises(RuntimeError, match=match):
        await asyncio.wait_for(router(np.zeros((4, 3), np.float32)), 10)


async def test_a_policys_numpy_names_are_named_as_the_strings_they_are():
    """A policy answering with a NumPy array of names: errors named np.str_('b')."""
    class ByArray:
        def assign(self, x, candidates, servers, outstanding):
            return np.asarray(candidates)[np.arange(len(x)) % len(candidates)]

    class NoRows(FakeServer):
        async def __call__(self, x):
            return np.zeros((0, 3), np.float32)

    router = Router({"a": FakeServer(), "b": NoRows()}, policy=ByArray(), failover=False)
    with pytest.raises(ModelOutputError, match=r"server 'b' answered") as raised:
        await asyncio.wait_for(router(np.zeros((4, 3), np.float32)), 10)
    assert "np.str_" not in str(raised.value)
    good = Router({"a": FakeServer(), "b": FakeServer()}, policy=ByArray())
    x = elements(5)
    np.testing.assert_array_equal(await good(x), x * 2)


class Alternate:
    """Element i to ``order[i % len(order)]``."""

    def __init__(self, order):
        self.order = order

    def assign(self, x, candidates, servers, outstanding):
        return [self.order[i % len(self.order)] for i in range(len(x))]


class Float64Server(FakeServer):
    async def __call__(self, x):
        return (await super().__call__(x)).astype(np.float64)


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
async def test_a_split_requests_parts_fit_the_first_servers_by_name_whoever_took_row_0(
        order):
    """Grouped by first appearance, the parts were fitted to whichever server took the
    first row: the same pair of servers gave float32 or float64 by the request."""
    router = Router({"a": FakeServer(), "b": Float64Server()}, policy=Alternate(order))
    x = elements(6)
    y = await router(x)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x * 2)


async def test_a_policy_whose_choices_never_end_gets_an_error_not_a_hang():
    class Endless:
        def assign(self, x, candidates, servers, outstanding):
            return itertools.cycle(candidates)

    router = Router({"a": FakeServer(), "b": FakeServer()}, policy=Endless())
    with pytest.raises(RuntimeError, match="more than 4 elements of a request of 4"):
        await asyncio.wait_for(router(np.zeros((4, 3), np.float32)), 10)


async def test_a_policys_single_numpy_name_is_named_as_its_string():
    class Last:
        def assign(self, x, candidates, servers, outstanding):
            return np.asarray(candidates)[-1]

    class NoRows(FakeServer):
        async def __call__(self, x):
            return np.zeros((0, 3), np.float32)

    router = Router({"a": FakeServer(), "b": NoRows()}, policy=Last(), failover=False)
    with pytest.raises(ModelOutputError, match=r"server 'b' answered"):
        await asyncio.wait_for(router(np.zeros((4, 3), np.float32)), 10)


async def test_a_policy_naming_servers_by_a_str_enum_routes_to_them():
    """str() of a str Enum member is its class and member name, not the string it
    equals: the router looked for 'Server.b' and failed over without end."""
    import enum

    class Server(str, enum.Enum):
        A = "a"
        B = "b"

    class ByEnum:
        def __init__(self, split):
            self.split = split

        def assign(self, x, candidates, servers, outstanding):
            if not self.split:
                return Server.B
            return [Server.A if i % 2 else Server.B for i in range(len(x))]

    for split in (False, True):
        a, b = FakeServer(), FakeServer()
        router = Router({"a": a, "b": b}, policy=ByEnum(split))
        x = elements(4)
        np.testing.assert_array_equal(await asyncio.wait_for(router(x), 10), x * 2)
        assert len(b.requests) == 1 and len(a.requests) == int(split)
