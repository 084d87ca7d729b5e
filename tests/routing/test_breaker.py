import asyncio

import pytest
from hypothesis import given, settings, strategies as st

from async_search.errors import (InputSpecError, ModelOutputError, ProtocolError,
                                 RemoteError, ServerDiedError)
from async_search.routing.breaker import (BreakerPolicy, BreakerState, CircuitBreaker,
                                          counts_against_server)

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def breaker(k=3, m=2, timeout=10.0, probes=1):
    clock = Clock()
    return CircuitBreaker(BreakerPolicy(failure_threshold=k, success_threshold=m,
                                        reset_timeout=timeout, half_open_probes=probes),
                          clock=clock), clock


def fail(b, times=1):
    for _ in range(times):
        b.record(b.try_acquire(), ok=False)


def test_opens_after_k_consecutive_failures_only():
    b, _ = breaker(k=3)
    fail(b, 2)
    b.record(b.try_acquire(), ok=True)  # a success resets the count
    fail(b, 2)
    assert b.state is BreakerState.CLOSED
    fail(b)
    assert b.state is BreakerState.OPEN
    assert b.try_acquire() is None and not b.available()
    assert b.stats["opened"] == 1 and b.stats["rejected"] == 1


def test_turns_half_open_after_the_timeout_and_closes_after_m_successes():
    b, clock = breaker(k=1, m=2, timeout=10.0)
    fail(b)
    clock.now = 9.99
    assert b.state is BreakerState.OPEN
    clock.now = 10.0
    assert b.state is BreakerState.HALF_OPEN
    first = b.try_acquire()
    assert first is not None
    assert b.try_acquire() is None  # one probe at a time
    b.record(first, ok=True)
    assert b.state is BreakerState.HALF_OPEN
    b.record(b.try_acquire(), ok=True)
    assert b.state is BreakerState.CLOSED


def test_a_failed_probe_opens_it_again_for_a_full_timeout():
    b, clock = breaker(k=1, timeout=5.0)
    fail(b)
    clock.now = 5.0
    b.record(b.try_acquire(), ok=False)
    assert b.state is BreakerState.OPEN
    clock.now = 9.0
    assert b.state is BreakerState.OPEN
    clock.now = 10.0
    assert b.state is BreakerState.HALF_OPEN
    assert b.stats["opened"] == 2


def test_results_admitted_under_an_earlier_state_are_ignored():
    b, clock = breaker(k=2, m=1, timeout=1.0)
    stale = [b.try_acquire() for _ in range(3)]  # sent while closed
    fail(b, 2)
    clock.now = 1.0
    probe = b.try_acquire()
    assert b.state is BreakerState.HALF_OPEN
    b.record(stale[0], ok=False)  # an old failure must not reopen it
    assert b.state is BreakerState.HALF_OPEN
    b.record(probe, ok=True)
    assert b.state is BreakerState.CLOSED
    b.record(stale[1], ok=False)  # nor count against the new closed state
    assert b.stats["consecutive_failures"] == 0


def test_release_frees_a_probe_without_a_verdict():
    b, clock = breaker(k=1, timeout=1.0)
    fail(b)
    clock.now = 1.0
    probe = b.try_acquire()
    assert not b.available()
    b.release(probe)
    assert b.available() and b.state is BreakerState.HALF_OPEN


def test_trip_opens_at_once():
    b, _ = breaker()
    b.trip()
    assert b.state is BreakerState.OPEN


@pytest.mark.parametrize("kwargs, message", [
    ({"failure_threshold": 0}, "failure_threshold must be an integer >= 1, got 0"),
    ({"success_threshold": 1.5}, "success_threshold must be an integer >= 1, got 1.5"),
    ({"reset_timeout": -1}, "reset_timeout must be a number of seconds > 0, got -1"),
    # 0 also timed every probe out at once: the breaker stayed half-open for good
    ({"reset_timeout": 0}, "reset_timeout must be a number of seconds > 0, got 0"),
    ({"half_open_probes": True}, "half_open_probes must be an integer >= 1"),
    ({"failure_threshold": True}, "failure_threshold must be an integer >= 1, got True"),
    ({"reset_timeout": True}, "reset_timeout must be a number of seconds > 0, got True"),
    ({"reset_timeout": float("nan")}, "reset_timeout must be a number of seconds > 0"),
])
def test_bad_policy_names_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        BreakerPolicy(**kwargs)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(["ok", "fail", "release", "tick"]),
                          st.floats(0, 3)), max_size=60))
def test_never_admits_while_open_before_the_timeout(events):
    b, clock = breaker(k=2, m=2, timeout=2.0, probes=2)
    opened_at = None
    for kind, dt in events:
        if kind == "tick":
            clock.now += dt
            continue
        state_before = b._state
        permit = b.try_acquire()
        if state_before is BreakerState.OPEN and clock.now - opened_at < 2.0:
            assert permit is None
        if permit is None:
            continue
        if kind == "release":
            b.release(permit)
        else:
            was = b.opened
            b.record(permit, ok=kind == "ok")
            if b.opened > was:
                opened_at = clock.now
        assert 0 <= b._probes <= 2


@pytest.mark.parametrize("error, counts", [
    (InputSpecError("wrong shape"), False), (ValueError("poison"), False),
    (TypeError("not an array"), False), (asyncio.CancelledError(), False),
    (RemoteError("mod.Poison", "x", "", ("mod.Poison", "builtins.ValueError")), False),
    (RuntimeError("device lost"), True), (ModelOutputError("3 rows for 4"), True),
    (ServerDiedError("actor died"), True), (TimeoutError(), True),
    (RemoteError("mod.Lost", "x", "", ("mod.Lost", "builtins.RuntimeError")), True),
    # A remote server's refusal: the request's content (400, 413, 422) is the caller's;
    # a server whose authentication or routes are wrong (401, 403, 405) is the server's
    # (a ValueError like the others, it never tripped a breaker).
    *((ProtocolError("refused", status=status), status not in (400, 413, 422))
      for status in (400, 401, 403, 405, 409, 413, 422))])
def test_only_server_failures_count_against_a_breaker(error, counts):
    b = CircuitBreaker(BreakerPolicy(failure_threshold=1))
    assert counts_against_server(error) is counts
    assert b.record_error(b.try_acquire(), error) is counts
    assert b.state.value == ("open" if counts else "closed")


# -- one failed call is one failure ---------------------------------------------------
def test_requests_that_failed_together_count_as_one_failure():
    b, _ = breaker(k=2)
    batch = [b.try_acquire() for _ in range(5)]  # five requests, one batch
    error = RuntimeError("the batch failed")
    for permit in batch:
        b.record(permit, ok=False, error=error)
    assert b.state is BreakerState.CLOSED and b.stats["consecutive_failures"] == 1
    assert b.stats["failures"] == 5  # every request is still reported
    b.record(b.try_acquire(), ok=False, error=RuntimeError("another batch failed"))
    assert b.state is BreakerState.OPEN


def test_the_same_error_raised_again_for_a_later_request_counts_again():
    # A client whose connection died re-raises one error object for every call: each
    # call admitted after that error was reported is a failure of its own.
    b, _ = breaker(k=3)
    gone = RuntimeError("the connection is gone")
    for _ in range(3):
        b.record(b.try_acquire(), ok=False, error=gone)
    assert b.state is BreakerState.OPEN


def test_a_success_between_failures_of_one_batch_does_not_make_them_two():
    b, _ = breaker(k=2)
    first, second, other = b.try_acquire(), b.try_acquire(), b.try_acquire()
    error = RuntimeError("one batch")
    b.record(first, ok=False, error=error)
    b.record(other, ok=True)  # another batch's request succeeded meanwhile
    b.record(second, ok=False, error=error)
    assert b.stats["consecutive_failures"] == 0 and b.state is BreakerState.CLOSED


def test_record_error_counts_a_batch_once():
    b = CircuitBreaker(BreakerPolicy(failure_threshold=2))
    permits = [b.try_acquire() for _ in range(4)]
    error = ServerDiedError("actor died")
    assert all(b.record_error(p, error) for p in permits)
    assert b.state is BreakerState.CLOSED


def test_a_probe_out_for_the_timeout_is_lost_and_a_new_one_admitted():
    # A half-open breaker whose probe never comes back (its server dropped it) would
    # otherwise refuse the server for good.
    b, clock = breaker(timeout=10.0)
    fail(b, 3)
    clock.now = 10.0
    lost = b.try_acquire()
    assert lost is not None and b.try_acquire() is None  # the one probe is out
    clock.now = 19.9
    assert b.try_acquire() is None and not b.available()
    clock.now = 20.0
    probe = b.try_acquire()
    assert probe is not None and b.state is BreakerState.HALF_OPEN
    b.record(lost, ok=False)  # the lost one, reported at last: admitted before, ignored
    assert b.state is BreakerState.HALF_OPEN
    b.record(probe, ok=True)
    b.record(b.try_acquire(), ok=True)
    assert b.state is BreakerState.CLOSED


class Payload:
    """Something a failed request's error holds (its data, through its traceback)."""


def test_a_counted_failure_is_let_go_once_no_request_of_its_batch_is_out():
    import gc
    import weakref

    b, _ = breaker(k=5)
    batch = [b.try_acquire() for _ in range(3)]
    error = RuntimeError("the batch failed")
    payload = Payload()
    error.payload = payload
    held = weakref.ref(payload)
    b.record(batch[0], ok=False, error=error)
    b.record(batch[1], ok=False, error=error)
    later = b.try_acquire()  # admitted after the failure was counted
    del error, payload
    gc.collect()
    assert held() is not None  # batch[2] may still fail with it: kept, to count once
    b.release(batch[2])
    gc.collect()
    assert held() is None  # nothing admitted before it is out: let go
    b.record(later, ok=True)
    assert b.stats["consecutive_failures"] == 0


def test_a_failure_with_no_other_request_out_is_not_kept():
    import gc
    import weakref

    b, _ = breaker(k=5)
    error = RuntimeError("alone")
    payload = Payload()
    error.payload = payload
    held = weakref.ref(payload)
    b.record(b.try_acquire(), ok=False, error=error)
    del error, payload
    gc.collect()
    assert held() is None and b.stats["consecutive_failures"] == 1


def test_a_breaker_refuses_a_policy_that_is_no_breaker_policy():
    from async_search.routing.breaker import CircuitBreaker

    with pytest.raises(TypeError, match="policy must be a BreakerPolicy instance"):
        CircuitBreaker({"failure_threshold": 1})
    with pytest.raises(TypeError, match="got the class BreakerPolicy"):
        CircuitBreaker(BreakerPolicy)
    with pytest.raises(TypeError, match="clock must be callable"):
        CircuitBreaker(BreakerPolicy(), clock=0.0)


def test_a_permit_reported_twice_or_never_issued_is_refused():
    # A half-open breaker with one probe admitted two once a permit was reported twice,
    # and permits never issued counted as failures (and could open it).
    from async_search.routing.breaker import CircuitBreaker

    breaker = CircuitBreaker(BreakerPolicy(failure_threshold=1))
    permit = breaker.try_acquire()
    breaker.record(permit, ok=True)
    for report in (lambda: breaker.record(permit, ok=False),
                   lambda: breaker.release(permit),
                   lambda: breaker.record(99, ok=False)):
        with pytest.raises(ValueError, match="reported already"):
            report()
    assert breaker.state is BreakerState.CLOSED and breaker.failures == 0
