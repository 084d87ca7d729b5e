"""Circuit breakers: stop sending requests to a server that keeps failing, then probe it.

A breaker is a small state machine with an injected clock, so that tests drive time:

    CLOSED --K consecutive failures--> OPEN --reset_timeout--> HALF_OPEN
    HALF_OPEN --M successes--> CLOSED        HALF_OPEN --one failure--> OPEN

While open, the breaker admits nothing; while half-open it admits a few probe requests
at a time. Every admitted request carries a permit (a number that grows with each
admission), so that a result of a request admitted before the state last moved on is
ignored instead of being counted against the new state.

A failure is one failing *call* to the server, not one failed request: requests that
failed together count once. Requests failed together when they failed with the same
exception object and were all admitted before the first of them was reported: a
server fails every request of a batch with one exception (``BatchingServer``), and a
client of a server in another process fails every request of a message with one
(``CoalescingClient``). Without this, one failed batch of ``K`` requests opened a
breaker at once. The same object raised again for a request admitted after it was
reported (a client that re-raises the error of its dead connection for every call) is
a new failure: it counts again.

What counts as a failure (``counts_against_server``): only what says the *server* is
unwell. A caller's bad input is the caller's failure and never counts, or a handful of
poison requests would open every server's breaker and turn healthy traffic away:

- not counted: ``InputSpecError`` (the request does not fit the model's input spec);
  ``ValueError`` and ``TypeError`` of any kind (the model rejected its input; a request
  batched with a poison one fails with it, and that is no more the server's fault);
  the same raised in another process (a ``RemoteError`` whose ``remote_mro`` names
  ``builtins.ValueError`` or ``builtins.TypeError``); cancellation.
- counted: everything else: timeouts, crashes, a dead or closed server
  (``ServerDiedError``, ``ServerClosedError``), a remote server's ``ProtocolError`` (a
  ValueError) for a status the request's content did not earn (401, 403, 405...: how
  that server is set up), ``ModelOutputError``, ``RuntimeError``,
  ``OSError``, ``MemoryError``, an arithmetic error in the model...
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import time
from typing import Callable, Deque, Set

from async_search.checks import check_callable, check_float, check_instance, check_int
from async_search.errors import InputSpecError, ProtocolError, RemoteError
from async_search.errors import CircuitOpenError  # noqa: F401 - what an open breaker raises


#: Failures remembered to recognise requests that failed together (several batches of
#: one server may fail at about the same time).
_REMEMBERED_FAILURES = 8

#: Exceptions that say the request was bad, not the server (InputSpecError is a
#: ValueError).
CALLER_ERRORS = (InputSpecError, ValueError, TypeError)
_CALLER_ERROR_NAMES = frozenset(f"builtins.{c.__name__}" for c in CALLER_ERRORS
                                if c.__module__ == "builtins")


def is_caller_error(error: BaseException) -> bool:
    """Whether ``error`` is the caller's failure: its input was bad (InputSpecError, or a
    ValueError or TypeError the model raised for it, here or in another process)."""
    if isinstance(error, ProtocolError):  # a ValueError, but 401 or 403 is the server's
        return error.is_callers
    if isinstance(error, CALLER_ERRORS):
        return True
    return isinstance(error, RemoteError) and not _CALLER_ERROR_NAMES.isdisjoint(
        error.remote_mro)


def counts_against_server(error: BaseException) -> bool:
    """Whether a request that failed with ``error`` counts toward its server's breaker:
    every exception except a caller's error (``is_caller_error``) and cancellation.

    Example:
        >>> counts_against_server(ValueError("bad input")), counts_against_server(
        ...     RuntimeError("the device is gone"))
        (False, True)
    """
    return not (isinstance(error, asyncio.CancelledError) or is_caller_error(error))


class BreakerState(str, enum.Enum):
    """Where a circuit breaker stands."""

    CLOSED = "closed"        # requests flow; consecutive failures are counted
    OPEN = "open"            # no request is admitted until the reset timeout passes
    HALF_OPEN = "half_open"  # a few probes are admitted; their outcome decides


@dataclasses.dataclass(frozen=True)
class BreakerPolicy:
    """When a breaker opens and closes.

    Attributes:
        failure_threshold: consecutive failures (K) that open a closed breaker.
        success_threshold: successful probes (M) that close a half-open breaker.
        reset_timeout: seconds an open breaker waits before it turns half-open.
        half_open_probes: requests admitted at once while half-open.

    Example:
        >>> BreakerPolicy(failure_threshold=3, reset_timeout=0.5).success_threshold
        2
    """

    failure_threshold: int = 5
    success_threshold: int = 2
    reset_timeout: float = 30.0
    half_open_probes: int = 1

    def __post_init__(self):
        for name in ("failure_threshold", "success_threshold", "half_open_probes"):
            check_int(name, getattr(self, name), minimum=1)
        try:  # > 0: it also times the probes out (at 0 every probe was lost at once)
            check_float("reset_timeout", self.reset_timeout, minimum=0, strict=True)
        except ValueError:  # the same rule, said with its unit
            raise ValueError(f"reset_timeout must be a number of seconds > 0, got "
                             f"{self.reset_timeout!r}") from None


class CircuitBreaker:
    """The breaker of one server.

    Use: ``permit = breaker.try_acquire()``; None means "do not send". When the request
    ends, report it with ``breaker.record(permit, ok)`` (with ``error=`` the exception
    of a failed one, so that requests that failed together count once), or
    ``breaker.release(permit)`` when its outcome says nothing about the server (the
    caller cancelled, the request itself was bad: ``counts_against_server(error)`` is
    False). ``record_error(permit, error)`` applies that rule.

    Args:
        policy: thresholds and timeout.
        clock: seconds, monotonic; inject a fake one in tests.

    Example:
        >>> now = [0.0]
        >>> b = CircuitBreaker(BreakerPolicy(failure_threshold=2, success_threshold=1,
        ...                                  reset_timeout=10), clock=lambda: now[0])
        >>> for _ in range(2):
        ...     b.record(b.try_acquire(), ok=False)
        >>> b.state.value, b.try_acquire()
        ('open', None)
        >>> now[0] = 10.0
        >>> p = b.try_acquire(); b.state.value
        'half_open'
        >>> b.record(p, ok=True); b.state.value
        'closed'
    """

    def __init__(self, policy: BreakerPolicy = BreakerPolicy(), *,
                 clock: Callable[[], float] = time.monotonic):
        check_instance("policy", policy, BreakerPolicy, "BreakerPolicy(failure_threshold=3)")
        check_callable("clock", clock)
        self.policy = policy
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._admitted = 0     # permits issued so far: the next permit
        self._state_since = 0  # the first permit issued under the current state
        # [error, permits issued when it was counted, requests admitted before it
        # still in flight] of the last failures counted: kept only while a request
        # that may have failed with it is still to be reported (an error holds its
        # traceback, and with it the request's data)
        self._counted: Deque[list] = collections.deque(maxlen=_REMEMBERED_FAILURES)
        self._in_flight = 0  # permits issued and not yet reported
        self._unreported: Set[int] = set()  # those permits
        self._consecutive_failures = 0
        self._probe_successes = 0
        self._probes = 0  # probes in flight while half-open
        self._probed_at = 0.0  # when the last probe was admitted
        self._opened_at = 0.0
        self.opened = 0       # times it opened
        self.successes = 0    # requests reported ok
        self.failures = 0     # requests reported failed
        self.rejected = 0     # try_acquire calls answered None

    @property
    def state(self) -> BreakerState:
        """The state now (an open breaker past its timeout reads half-open)."""
        if self._state is BreakerState.OPEN and (
                self._clock() - self._opened_at >= self.policy.reset_timeout):
            self._move(BreakerState.HALF_OPEN)
        elif self._state is BreakerState.HALF_OPEN and (
                self._probes >= self.policy.half_open_probes) and (
                self._clock() - self._probed_at >= self.policy.reset_timeout):
            # Every probe has been out for reset_timeout: lost (a server that never
            # answers them). Probe afresh rather than refuse the server for good.
            self._move(BreakerState.HALF_OPEN)
        return self._state

    def available(self) -> bool:
        """Whether ``try_acquire`` would admit a request now (takes nothing)."""
        state = self.state
        return state is BreakerState.CLOSED or (
            state is BreakerState.HALF_OPEN and self._probes < self.policy.half_open_probes)

    def try_acquire(self) -> int | None:
        """Admit one request: its permit, or None when the breaker refuses it."""
        state = self.state
        if state is BreakerState.HALF_OPEN:
            if self._probes >= self.policy.half_open_probes:
                self.rejected += 1
                return None
            self._probes += 1
            self._probed_at = self._clock()
        elif state is not BreakerState.CLOSED:
            self.rejected += 1
            return None
        permit = self._admitted
        self._admitted += 1
        self._in_flight += 1
        self._unreported.add(permit)
        return permit

    def record(self, permit: int | None, ok: bool,
               error: BaseException | None = None) -> None:
        """The admitted request ``permit`` ended: ``ok``, or failed through the server.

        Args:
            error: what the failed request raised. A request that failed with the same
                exception object as a failure already counted, and was admitted before
                that one was counted, failed with it (one batch, one message): it
                does not count again.
        """
        self._check_unreported(permit)
        if ok:
            self.successes += 1
        else:
            self.failures += 1
        if permit is None:
            return
        counted_already = not ok and error is not None and any(
            counted is error and permit < issued for counted, issued, _ in self._counted)
        self._reported(permit)
        if permit < self._state_since:
            return  # admitted under an earlier state: says nothing about this one
        if counted_already:  # the same failed call
            if self._state is BreakerState.HALF_OPEN:
                self._probes -= 1
            return
        if not ok and error is not None and self._in_flight:
            self._counted.append([error, self._admitted, self._in_flight])
        if self._state is BreakerState.CLOSED:
            if ok:
                self._consecutive_failures = 0
            else:
                self._consecutive_failures += 1
                if self._consecutive_failures >= self.policy.failure_threshold:
                    self._open()
        elif self._state is BreakerState.HALF_OPEN:
            self._probes -= 1
            if not ok:
                self._open()
            else:
                self._probe_successes += 1
                if self._probe_successes >= self.policy.success_threshold:
                    self._move(BreakerState.CLOSED)

    def record_error(self, permit: int | None, error: BaseException) -> bool:
        """The admitted request failed with ``error``: a failure when it counts against
        the server (``counts_against_server``), else released without a verdict.
        Returns whether it counted."""
        if counts_against_server(error):
            self.record(permit, ok=False, error=error)
            return True
        self.release(permit)
        return False

    def release(self, permit: int | None) -> None:
        """The admitted request ended without a verdict on the server."""
        self._check_unreported(permit)
        if permit is None:
            return
        self._reported(permit)
        if permit >= self._state_since and self._state is BreakerState.HALF_OPEN:
            self._probes -= 1

    def _check_unreported(self, permit: int | None) -> None:
        # A permit reported twice (or never issued) let a half-open breaker admit more
        # probes than its policy's, and could open it on failures never admitted.
        if permit is not None and permit not in self._unreported:
            raise ValueError(f"permit {permit!r} was not issued by this breaker, or was "
                             f"reported already: report each permit once")

    def _reported(self, permit: int) -> None:
        """``permit``'s request is reported: the failures counted after it was admitted
        no longer wait for it, and those no request waits for are let go."""
        self._unreported.discard(permit)
        self._in_flight -= 1
        if self._counted:
            for entry in self._counted:
                if permit < entry[1]:
                    entry[2] -= 1
            if any(entry[2] <= 0 for entry in self._counted):
                self._counted = collections.deque(
                    (entry for entry in self._counted if entry[2] > 0),
                    maxlen=_REMEMBERED_FAILURES)

    def trip(self) -> None:
        """Open the breaker now (an operator or a health check saw the server fail)."""
        self._open()

    @property
    def stats(self) -> dict:
        """state, consecutive_failures, opened, successes, failures, rejected."""
        return {
            "state": self.state.value,
            "consecutive_failures": self._consecutive_failures,
            "opened": self.opened,
            "successes": self.successes,
            "failures": self.failures,
            "rejected": self.rejected,
        }

    def _open(self) -> None:
        self._move(BreakerState.OPEN)
        self._opened_at = self._clock()
        self.opened += 1

    def _move(self, state: BreakerState) -> None:
        self._state = state
        self._state_since = self._admitted
        self._consecutive_failures = 0
        self._probe_successes = 0
        self._probes = 0

    def __repr__(self) -> str:
        return f"CircuitBreaker(state={self.state.value}, policy={self.policy})"
