"""Searches that outlive their worker, and deadlines, for the backends with workers.

The process and Ray backends run each share of the starts in a worker (a client
process, a Ray task). A worker says when its searches start (``Started``), then sends
each search's outcome as it ends, so that what finished is kept whatever happens to the
worker later. ``run_share`` takes a share to the end:

- A worker that dies (its process, its task, its node) is a lost attempt for each start
  it had not reported, and so is a search that failed because every server its worker
  could reach died: those starts run again in a new worker, up to ``retries`` times.
  Searches are deterministic given their start, so a retried search returns what it
  would have. A search that raised is never run again (it would raise again). With
  ``split_lost`` (the process backend), starts lost together a second time run again
  in halves, one after the other (and so on at each loss), so that a start that ends
  every worker it gets (a search that crashes its process) takes few others down with
  it. When the attempts run out, the start fails with WorkerDiedError naming each
  attempt.
- Deadlines: a worker whose searches still run ``search_timeout`` seconds after they
  started, or when the run's ``timeout`` is out, is killed, and each start it had not
  reported fails with SearchTimeoutError (never retried). The worker also bounds each
  of its searches itself (``bounded_search``), so a search that yields to its loop
  ends there and reports in time; the kill is for a worker that is stuck or stopped.

Why the runner retries, and not Ray (``max_retries``): a Ray retry runs the task's whole
share again, with the arguments of the first attempt (a dead server's address among
them), and reports only the last error; the runner keeps what finished, gives a new
attempt the servers alive now, names every attempt when all fail, bounds every attempt
by the run's deadline, and does the same for a process backend's client processes.

Example:
    >>> deadlines = Deadlines.from_config(timeout=None, search_timeout=2.0)
    >>> deadlines.run_left() is None, deadlines.search_s
    (True, 2.0)
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import pickle
import time
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, List, Protocol,
                    Sequence, Tuple, Union)

from async_search.errors import SearchError, SearchTimeoutError, WorkerDiedError, describe


#: Seconds a runner gives a worker's own report past a search's deadline before it
#: kills the worker (the worker's searches end at the deadline and say so themselves),
#: and the time it gives what remains of a run (stopping servers) past the run's one.
GRACE_S = 0.25


@dataclasses.dataclass(frozen=True)
class Deadlines:
    """When a run must end, and how long a search may run.

    Attributes:
        run_at: ``time.monotonic()`` by which the run ends (None: no limit).
        timeout: the run's timeout in seconds, for messages (None: no limit).
        search_s: seconds each attempt of a search may run (None: no limit).
    """

    run_at: float | None = None
    timeout: float | None = None
    search_s: float | None = None

    @classmethod
    def from_config(cls, timeout: float | None, search_timeout: float | None,
                    started: float | None = None) -> "Deadlines":
        """The deadlines of a run that started at ``started`` (``time.monotonic()``;
        None: now)."""
        start = time.monotonic() if started is None else started
        return cls(None if timeout is None else start + timeout, timeout, search_timeout)

    def run_left(self) -> float | None:
        """Seconds until the run's deadline (at least 0), None without one."""
        return None if self.run_at is None else max(0.0, self.run_at - time.monotonic())

    def run_passed(self) -> bool:
        return self.run_at is not None and time.monotonic() >= self.run_at

    def run_timeout_error(self, index: int, what: str = "") -> SearchTimeoutError:
        return SearchTimeoutError(f"start {index} did not finish within the run's timeout "
                                  f"of {self.timeout} s{what}")


@dataclasses.dataclass(frozen=True)
class Started:
    """A worker's first word: its searches start now.

    Attributes:
        where: the worker, for messages (``"client task 2 on node 3ad9df44 (10.0.0.2)"``).
        node: the Ray node it runs on (None elsewhere).
    """

    where: str
    node: str | None = None


#: ``(start index, ok, result or error)``: one search's outcome, as a worker reports it.
Outcome = Tuple[int, bool, Any]


class WorkerLost(Exception):
    """A worker died (its process, task or node): its unreported starts may run again.
    The message says how, starting with "died" (``"died with exit code -9"``)."""


class WorkerBroke(Exception):
    """A worker failed by itself (not a death): its unreported starts fail with this."""


class Worker(Protocol):
    """One attempt at some starts: a client process or a Ray task."""

    name: str
    """The worker in messages (``"client process 3 (pid 4242)"``)."""

    usage: dict | None
    """Once it is done, what goes into its attempt's stats (a client process or Ray
    task: its ``cpu_s`` and ``searching_s``); None where it reports none."""

    def events(self) -> AsyncIterator[Union[Started, List[Outcome]]]:
        """``Started``, then lists of outcomes as searches end; ends when every start is
        reported. Raises WorkerLost when the worker died, WorkerBroke when it failed."""

    async def stop(self, wait_s: float) -> None:
        """Ends the worker: waits up to ``wait_s`` for one that finished to exit, and
        kills it if it has not (or has not finished). Idempotent; never raises."""


#: ``launch(indices, attempt)``: a new worker running the starts ``indices``.
Launch = Callable[[List[int], int], Awaitable[Worker]]


async def run_share(share: Sequence[int], launch: Launch, *, retries: int,
                    deadlines: Deadlines,
                    retryable: Callable[[BaseException], bool] = lambda e: False,
                    record: Callable[[dict], None] | None = None,
                    split_lost: bool = False) -> Dict[int, Tuple[bool, Any]]:
    """Runs the starts ``share`` to the end: each start's ``(ok, result or error)``.

    Args:
        share: the indices of the starts.
        launch: starts a worker for some of them (attempt 0, 1, ...).
        retries: attempts after the first for a start whose worker died.
        deadlines: the run's deadline and the searches' timeout.
        retryable: whether a search's error means that its worker could not serve it
            (every server it could reach died): the start runs again like a lost one.
        record: called with a dict per attempt, for the run's stats: ``attempt``,
            ``starts``, ``worker``, ``node``, ``ended`` (``"finished"``, ``"died ..."``,
            ``"failed: ..."``, ``"timed out: ..."``), and the worker's ``usage`` once
            it finished.
        split_lost: starts lost together a second time run again in halves, one half
            after the other (never more workers at once), and so on at each loss: a
            start that ends every worker it gets takes fewer others down with it.
    """
    outcomes: Dict[int, Tuple[bool, Any]] = {}
    lost: Dict[int, List[str]] = {i: [] for i in share}
    causes: Dict[int, BaseException] = {}
    unfinished: List[int] = []  # out of attempts, or out of time before the next one
    out_of_time: set = set()

    async def run_group(remaining: List[int], attempt: int) -> None:
        while remaining and attempt <= retries:
            if deadlines.run_passed():
                out_of_time.update(remaining)
                break
            remaining = await _attempt(remaining, attempt, launch, deadlines, retryable,
                                       outcomes, lost, causes, record)
            attempt += 1
            if split_lost and attempt >= 2 and len(remaining) > 1 and attempt <= retries:
                # Lost together twice: one of them may end every worker it gets, so
                # the halves run apart and it takes only its own half down with it.
                middle = (len(remaining) + 1) // 2
                await run_group(remaining[:middle], attempt)
                await run_group(remaining[middle:], attempt)
                return
        unfinished.extend(remaining)

    await run_group(list(share), 0)
    for index in sorted(unfinished):
        tried = lost[index]
        if index in out_of_time:
            outcomes[index] = False, deadlines.run_timeout_error(
                index, f" (its lost attempts: {'; '.join(tried)})" if tried else
                " (no attempt began: it passed while the servers started, in "
                "model_factory or Ray's start)")
        elif len(tried) == 1 and index in causes:
            outcomes[index] = False, causes[index]  # one attempt: its own error
        else:
            error = WorkerDiedError(
                f"start {index} did not finish: its worker died "
                f"({len(tried)} attempt{'s' if len(tried) > 1 else ''}): "
                + "; ".join(tried), tuple(tried))
            if index in causes:
                error.__cause__ = causes[index]
            outcomes[index] = False, error
    return outcomes


async def run_shares(shares: Sequence[Awaitable[Any]]) -> List[Any]:
    """Each share's outcome (``run_share`` coroutines), in order. When one raises (an
    error no attempt handles: the machine out of file descriptors, say) or the caller is
    cancelled, the other shares are cancelled, and their workers stopped, before the
    error goes on: nothing of the run outlives the call."""
    tasks = [asyncio.ensure_future(share) for share in shares]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _attempt(indices: List[int], attempt: int, launch: Launch, deadlines: Deadlines,
                   retryable, outcomes: dict, lost: dict, causes: dict,
                   record) -> List[int]:
    """Runs ``indices`` in one worker; the starts to run again."""
    label = f"attempt {attempt + 1}"
    entry = {"attempt": attempt, "starts": list(indices), "worker": None, "node": None,
             "ended": "finished"}
    if record is not None:
        record(entry)
    pending = set(indices)
    again: List[int] = []
    try:
        left = deadlines.run_left()
        worker = await (launch(indices, attempt) if left is None else
                        asyncio.wait_for(launch(indices, attempt), left))
    except asyncio.TimeoutError:
        entry["ended"] = "timed out: the run's timeout, before it started"
        for index in indices:
            outcomes[index] = False, deadlines.run_timeout_error(index)
        return []
    except (WorkerLost, WorkerBroke) as e:  # it could not even start
        return _lost_or_failed(e, label, "the worker", pending, entry, outcomes, lost)
    entry["worker"] = worker.name
    search_at = None  # the searches' deadline, once they have started
    events = worker.events().__aiter__()
    finished = False
    try:
        while True:  # to the worker's last word (its stats come after the outcomes)
            deadline, why = _next_deadline(deadlines, search_at)
            try:
                event = await (events.__anext__() if deadline is None else asyncio.wait_for(
                    events.__anext__(), max(0.0, deadline - time.monotonic())))
            except StopAsyncIteration:
                if not pending:
                    break
                error = WorkerBroke("it ended without reporting every start")
                return again + _lost_or_failed(error, label, worker.name, pending, entry,
                                               outcomes, lost)
            except (asyncio.TimeoutError, WorkerLost, WorkerBroke) as e:
                if not pending:  # every start reported: only what came after is lost
                    break
                if not isinstance(e, asyncio.TimeoutError):
                    return again + _lost_or_failed(e, label, worker.name, pending, entry,
                                                   outcomes, lost)
                entry["ended"] = f"timed out: {why}"
                for index in sorted(pending):
                    outcomes[index] = False, (
                        deadlines.run_timeout_error(index) if why == "the run's timeout"
                        else SearchTimeoutError(
                            f"start {index} did not finish, or was not reported, within "
                            f"its search_timeout of {deadlines.search_s} s ({worker.name} "
                            f"was stopped: a search that holds its loop, with time.sleep "
                            f"or a long call, holds the outcomes of those beside it)"))
                return again
            if isinstance(event, Started):
                entry["worker"], entry["node"] = event.where, event.node
                if deadlines.search_s is not None:
                    search_at = time.monotonic() + deadlines.search_s + GRACE_S
                continue
            for index, ok, value in event:
                if index not in pending:
                    continue
                pending.discard(index)
                if not ok and retryable(value):
                    lost[index].append(f"{label}: {entry['worker']}: its servers died "
                                       f"({describe(value)})")
                    causes[index] = value
                    again.append(index)
                else:
                    outcomes[index] = ok, value
        finished = True
        if again:  # not every start finished here: its servers died under some
            entry["ended"] = (f"finished; its servers died under {len(again)} of its "
                              f"starts")
        entry.update(getattr(worker, "usage", None) or {})  # cpu_s, searching_s
        return again
    finally:
        await worker.stop(_stop_wait(deadlines) if finished else 0.0)


def _next_deadline(deadlines: Deadlines, search_at: float | None):
    """``(monotonic time, what it is)`` of the nearer deadline, or (None, "")."""
    run_at = deadlines.run_at
    if run_at is not None and (search_at is None or run_at <= search_at):
        return run_at, "the run's timeout"
    if search_at is not None:
        return search_at, "search_timeout"
    return None, ""


def _stop_wait(deadlines: Deadlines) -> float:
    """How long a worker that finished may take to exit: a while, within the run."""
    left = deadlines.run_left()
    return 10.0 if left is None else min(10.0, left + GRACE_S)


def _lost_or_failed(error: Exception, label: str, where: str, pending: set, entry: dict,
                    outcomes: dict, lost: dict) -> List[int]:
    """The pending starts of a worker that died (to run again) or failed (they fail)."""
    if isinstance(error, WorkerLost):
        entry["ended"] = str(error)  # "died ..."
        for index in pending:
            lost[index].append(f"{label}: {where} {error}")
        return sorted(pending)
    entry["ended"] = f"failed: {error}"
    for index in sorted(pending):
        outcomes[index] = False, SearchError(
            f"{where} failed ({error}); start {index} did not finish")
    return []


async def bounded_search(search_fn, start: Any, evaluate: Any,
                         search_s: float | None, alone: bool = False) -> Any:
    """``await search_fn(start, evaluate)``, stopped with SearchTimeoutError after
    ``search_s`` seconds (None: never); ``alone``: a SystemExit or KeyboardInterrupt it
    raises fails it alone (``_alone``: in a worker, whose loop it would stop)."""
    search = search_fn(start, evaluate)
    if not inspect.isawaitable(search):
        raise TypeError(f"search_fn(start, evaluate) returned {type(search).__name__}, "
                        f"not an awaitable: search_fn must be an async def (or return "
                        f"a coroutine)")
    if alone:  # inside the timeout: it runs in a task of its own
        search = _alone(search)
    if search_s is None:
        return await search
    # Not asyncio.wait_for: it waits for the cancelled search to end, and one that
    # ignores its cancellation would hold the run for good.
    task = asyncio.ensure_future(search)
    try:
        await asyncio.wait({task}, timeout=search_s)
    except asyncio.CancelledError:
        task.cancel()  # its cleanup runs before the caller resumes (GRACE_S at most)
        task.add_done_callback(_retrieved)  # the caller's cancellation is what goes on
        await asyncio.wait({task}, timeout=GRACE_S)
        raise
    if task.done():
        return task.result()
    task.cancel()  # stopped at its next await; given a moment to end
    await asyncio.wait({task}, timeout=GRACE_S)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: what it raised on its way out is not logged
    raise SearchTimeoutError(f"the search did not finish within its search_timeout of "
                             f"{search_s} s")


def _retrieved(task: asyncio.Task) -> None:
    """Takes what a task abandoned by its caller raised, so that it is not logged."""
    if not task.cancelled():
        task.exception()


async def _alone(search: Awaitable[Any]) -> Any:
    """``await search``, where a SystemExit or KeyboardInterrupt it raises fails it
    alone, as a SearchError (the original its ``__cause__``): raised out of its task, it
    would stop the worker's loop and end every search of the worker."""
    try:
        return await search
    except (SystemExit, KeyboardInterrupt) as e:
        raise SearchError(f"the search raised {describe(e)}, which would have ended its "
                          f"worker and every search in it: it fails alone") from e


def task_outcome(task: asyncio.Task, what: str) -> Tuple[Any, bool]:
    """``(outcome, raised)`` of a done search task: what it returned (an exception it
    returned is a result), or what it raised (CancelledError when it was cancelled).
    An exception that is false (one with ``__len__``) is still what it raised."""
    if task.cancelled():
        return asyncio.CancelledError(f"{what} was cancelled"), True
    error = task.exception()
    if error is not None:
        return error, True
    return task.result(), False


class ClientSearches:
    """A worker's searches: each runs as a task (bounded by ``search_s``), and the
    outcomes of those that ended in one loop iteration go to ``on_outcomes`` together,
    each packed to travel by ``pack(outcome, raised)`` (``(is_result, payload)``: a
    search may return an exception as its result) and reported as
    ``(k, is_result, payload)``, ``k`` its position.

    Example:
        >>> async def search(start, evaluate):
        ...     if start < 0:
        ...         raise ValueError(start)
        ...     return 2 * start
        >>> def pack(outcome, raised):             # (is_result, payload)
        ...     return not raised, outcome
        >>> sent = []
        >>> searches = ClientSearches(search, [1, 2, -1], None, None, pack, sent.append)
        >>> asyncio.run(searches.run())    # every outcome sent by the time it returns
        >>> sent                           # one loop iteration's outcomes, together
        [[(0, True, 2), (1, True, 4), (2, False, ValueError(-1))]]
    """

    def __init__(self, search_fn, starts: Sequence[Any], evaluate: Any,
                 search_s: float | None, pack: Callable[[Any, bool], Tuple[bool, Any]],
                 on_outcomes: Callable[[List[tuple]], None]):
        self._search_fn = search_fn
        self._starts = list(starts)
        self._evaluate = evaluate
        self._search_s = search_s
        self._pack = pack
        self._on_outcomes = on_outcomes
        self._ready: List[tuple] = []
        self._stopping = False  # once set, a cancelled search is not an outcome

    async def run(self) -> None:
        """Runs every search; returns once every outcome was handed over."""
        loop = asyncio.get_running_loop()
        tasks = []
        for k, start in enumerate(self._starts):
            task = loop.create_task(bounded_search(self._search_fn, start, self._evaluate,
                                                   self._search_s, alone=True))
            task.add_done_callback(lambda t, k=k: self._ended(k, t))
            tasks.append(task)
        try:
            if tasks:
                await asyncio.wait(tasks)
        finally:
            self._stopping = True  # searches cancelled from here on are not outcomes
            for task in tasks:
                task.cancel()
        await asyncio.sleep(0)  # the last done callbacks' flush
        self._flush()

    def _ended(self, k: int, task: asyncio.Task) -> None:
        if self._stopping and task.cancelled():
            return  # the worker is stopping: its start was not run out, so not reported
        outcome, raised = task_outcome(task, "the search")
        if not self._ready:
            asyncio.get_running_loop().call_soon(self._flush)
        self._ready.append((k, *self._pack(outcome, raised)))

    def _flush(self) -> None:
        if self._ready:
            ready, self._ready = self._ready, []
            self._on_outcomes(ready)


def check_travels(search_fn, starts: Sequence[Any], backend: str, hint: str = "",
                  dumps: Callable[[Any], bytes] = pickle.dumps,
                  loads: Callable[[bytes], Any] = pickle.loads) -> None:
    """Fails before any worker starts if the searches cannot travel to one: each must
    be dumped and load again (a start that dumps but cannot load would end the worker
    that loads it, and every start it holds, as a worker death).

    Raises:
        TypeError: naming what does not travel (``search_fn`` or ``start i``).
    """
    for what, obj in (("search_fn", search_fn), ("starts", starts)):
        try:
            loads(dumps(obj))
        except Exception as e:
            if what == "starts":
                what = f"start {_first_that_does_not_travel(starts, dumps, loads)}"
            hinted = hint if what == "search_fn" else ""  # a start is no function
            raise TypeError(
                f"{backend} sends {what} to its workers, so it must be picklable and load "
                f"again{' ' + hinted if hinted else ''}: {type(e).__name__}: {e}") from e


def _first_that_does_not_travel(starts: Sequence[Any], dumps, loads) -> int | str:
    for index, start in enumerate(starts):
        try:
            loads(dumps(start))
        except Exception:  # noqa: BLE001 - the one to name
            return index
    return "(the list of starts)"
