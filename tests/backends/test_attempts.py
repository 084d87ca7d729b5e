"""run_share: retries for starts whose worker died, and deadlines, on scripted workers
(no process, no Ray): each scenario says what a worker reports and when it dies."""

import asyncio
import time

import pytest

from async_search.backends.attempts import (ClientSearches, Deadlines, Started,
                                            WorkerBroke, WorkerLost, bounded_search,
                                            run_share, run_shares)
from async_search.errors import (SearchError, SearchTimeoutError, ServerDiedError,
                                 WorkerDiedError)
from tests.helpers import within

pytestmark = pytest.mark.timeout(60)


class ScriptedWorker:
    """A worker that reports ``script`` for its starts: for each attempt, a list of
    steps: ``("ok", i)`` / ``("err", i, error)`` report start i, ``"die"`` raises
    WorkerLost, ``"break"`` WorkerBroke, ``"hang"`` never says more, ``"start"`` says
    Started."""

    def __init__(self, steps, number):
        self.steps = steps
        self.name = f"worker {number}"
        self.stopped_with = None

    async def events(self):
        for step in self.steps:
            await asyncio.sleep(0)
            if step == "start":
                yield Started(self.name, node=f"node-{self.name}")
            elif step == "die":
                raise WorkerLost("died with exit code -9")
            elif step == "break":
                raise WorkerBroke("its task raised KeyError")
            elif step == "hang":
                await asyncio.sleep(3600)
            elif step[0] == "ok":
                yield [(step[1], True, f"result {step[1]}")]
            else:
                yield [(step[1], False, step[2])]

    async def stop(self, wait_s):
        self.stopped_with = wait_s


class Launcher:
    """``launch`` for run_share: attempt n of a share plays ``scripts[n]`` (reporting only
    the starts it was given)."""

    def __init__(self, scripts):
        self.scripts = scripts
        self.launched = []  # (indices, attempt) per launch
        self.workers = []

    async def __call__(self, indices, attempt):
        self.launched.append((list(indices), attempt))
        steps = [s for s in self.scripts[attempt]
                 if not isinstance(s, tuple) or s[1] in indices]
        worker = ScriptedWorker(steps, len(self.workers))
        self.workers.append(worker)
        return worker


async def run(share, scripts, *, retries=3, deadlines=Deadlines(), split_lost=True,
              **kwargs):
    launcher = Launcher(scripts)
    records = []
    out = await within(run_share(share, launcher, retries=retries, deadlines=deadlines,
                                 record=records.append, split_lost=split_lost, **kwargs),
                       "run_share", timeout=30)
    return out, launcher, records


async def test_a_worker_that_finishes_reports_every_start_once():
    out, launcher, records = await run([0, 2, 4], [["start", ("ok", 0), ("ok", 2),
                                                    ("ok", 4)]])
    assert out == {i: (True, f"result {i}") for i in (0, 2, 4)}
    assert launcher.launched == [([0, 2, 4], 0)]
    assert records == [{"attempt": 0, "starts": [0, 2, 4], "worker": "worker 0",
                        "node": "node-worker 0", "ended": "finished"}]


async def test_only_the_starts_a_dead_worker_had_not_reported_run_again():
    out, launcher, records = await run([0, 2, 4], [
        ["start", ("ok", 2), "die"],
        ["start", ("ok", 0), ("ok", 4)]])
    assert out == {i: (True, f"result {i}") for i in (0, 2, 4)}
    assert launcher.launched == [([0, 2, 4], 0), ([0, 4], 1)]
    assert records[0]["ended"] == "died with exit code -9"
    assert records[1]["ended"] == "finished"


async def test_when_every_attempt_dies_the_error_names_each_one():
    out, launcher, _ = await run([1], [["start", "die"]] * 3, retries=2)
    ok, error = out[1]
    assert not ok and isinstance(error, WorkerDiedError) and isinstance(error, SearchError)
    assert len(launcher.launched) == 3
    assert error.attempts == tuple(f"attempt {n}: worker {n - 1} died with exit code -9"
                                   for n in (1, 2, 3))
    assert "start 1 did not finish: its worker died (3 attempts)" in str(error)


async def test_starts_lost_together_twice_run_again_in_halves_until_the_culprit_is_alone():
    # Start 3 ends every worker it gets; the others would finish in any worker.
    out, launcher, records = await run([0, 1, 2, 3], [
        ["start", "die"],
        ["start", "die"],
        ["start", ("ok", 0), ("ok", 1), ("ok", 2), "die"],
        ["start", "die"]])
    assert {i: out[i] for i in (0, 1, 2)} == {i: (True, f"result {i}") for i in (0, 1, 2)}
    ok, error = out[3]
    assert not ok and isinstance(error, WorkerDiedError) and len(error.attempts) == 4
    assert launcher.launched == [([0, 1, 2, 3], 0), ([0, 1, 2, 3], 1), ([0, 1], 2),
                                 ([2, 3], 2), ([3], 3)]
    assert [r["ended"] for r in records].count("finished") == 1
    # Without split_lost (Ray) they stay together: all fail.
    out, launcher, _ = await run([0, 1, 2, 3], [["start", "die"]] * 4, split_lost=False)
    assert launcher.launched == [([0, 1, 2, 3], n) for n in range(4)]
    assert all(not ok for ok, _ in out.values())


async def test_no_retries_means_one_attempt_and_its_death_named():
    out, launcher, _ = await run([1, 3], [["start", ("ok", 3), "die"]], retries=0)
    assert out[3] == (True, "result 3")
    assert isinstance(out[1][1], WorkerDiedError)
    assert "(1 attempt): attempt 1: worker 0 died with exit code -9" in str(out[1][1])
    assert len(launcher.launched) == 1


async def test_a_search_that_raised_is_not_run_again():
    error = ArithmeticError("cursed")
    out, launcher, _ = await run([0, 1], [["start", ("err", 0, error), ("ok", 1)]])
    assert out == {0: (False, error), 1: (True, "result 1")}
    assert len(launcher.launched) == 1


async def test_a_search_whose_servers_died_runs_again_when_that_is_retryable():
    died = ServerDiedError("server actor 0 died")
    scripts = [["start", ("err", 0, died), ("ok", 1)], ["start", ("ok", 0)]]
    out, launcher, _ = await run([0, 1], scripts,
                                 retryable=lambda e: isinstance(e, ServerDiedError))
    assert out == {0: (True, "result 0"), 1: (True, "result 1")}
    assert launcher.launched == [([0, 1], 0), ([0], 1)]
    # The record of the first attempt says that not every start finished there.
    _, _, records = await run([0, 1], scripts,
                              retryable=lambda e: isinstance(e, ServerDiedError))
    assert [r["ended"] for r in records] == [
        "finished; its servers died under 1 of its starts", "finished"]
    # Without a retry left, the search's own error.
    out, _, _ = await run([0, 1], scripts, retries=0,
                          retryable=lambda e: isinstance(e, ServerDiedError))
    assert out[0] == (False, died)
    # Retried and lost again: each attempt named, the last error as the cause.
    out, _, _ = await run([0], [["start", ("err", 0, died)]] * 2, retries=1,
                          retryable=lambda e: isinstance(e, ServerDiedError))
    error = out[0][1]
    assert isinstance(error, WorkerDiedError) and error.__cause__ is died
    assert "its servers died (ServerDiedError: server actor 0 died)" in error.attempts[0]


async def test_a_worker_that_breaks_fails_its_unreported_starts_without_a_retry():
    out, launcher, records = await run([0, 1], [["start", ("ok", 0), "break"]])
    assert out[0] == (True, "result 0")
    assert isinstance(out[1][1], SearchError) and not isinstance(out[1][1], WorkerDiedError)
    assert "its task raised KeyError" in str(out[1][1])
    assert len(launcher.launched) == 1 and records[0]["ended"].startswith("failed")


async def test_a_worker_still_running_past_the_search_timeout_is_stopped():
    deadlines = Deadlines.from_config(None, 0.2)
    out, launcher, records = await run([0, 1], [["start", ("ok", 0), "hang"]],
                                       deadlines=deadlines)
    assert out[0] == (True, "result 0")
    error = out[1][1]
    assert isinstance(error, SearchTimeoutError) and isinstance(error, TimeoutError)
    assert "within its search_timeout of 0.2 s (worker 0 was stopped: " in str(error)
    assert launcher.workers[0].stopped_with == 0.0  # killed, not waited for
    assert records[0]["ended"] == "timed out: search_timeout"
    assert len(launcher.launched) == 1  # a timeout is not retried


async def test_a_worker_that_never_starts_is_bounded_by_the_run_only():
    deadlines = Deadlines.from_config(0.3, 0.05)
    out, _, records = await run([0], [["hang"]], deadlines=deadlines)
    assert "within the run's timeout of 0.3 s" in str(out[0][1])
    assert records[0]["ended"] == "timed out: the run's timeout"


async def test_the_run_timeout_ends_every_share_and_launches_nothing_after_it():
    deadlines = Deadlines.from_config(0.3, None)
    began = time.monotonic()
    out, launcher, _ = await run([0, 1, 2], [["start", ("ok", 0), "die"],
                                            ["start", "hang"], ["start", "hang"]],
                                 deadlines=deadlines)
    assert time.monotonic() - began < 10  # a bound on a hang, not a timing
    assert out[0] == (True, "result 0")
    for index in (1, 2):
        assert isinstance(out[index][1], SearchTimeoutError)
        assert "the run's timeout of 0.3 s" in str(out[index][1])
    assert len(launcher.launched) == 2  # the retry, then the deadline: no third


async def test_a_launch_that_outlasts_the_run_fails_its_starts_in_time():
    async def slow_launch(indices, attempt):
        await asyncio.sleep(3600)

    out = await within(run_share([4], slow_launch, retries=1,
                                 deadlines=Deadlines.from_config(0.2, None)),
                       "run_share", timeout=30)
    assert isinstance(out[4][1], SearchTimeoutError)


async def test_a_start_whose_retry_would_come_after_the_deadline_names_its_attempts():
    deadlines = Deadlines.from_config(0.3, None)

    class Late(Launcher):
        async def __call__(self, indices, attempt):
            if attempt:
                await asyncio.sleep(0.5)  # past the deadline before it starts
            return await super().__call__(indices, attempt)

    launcher = Late([["start", "die"], ["start", ("ok", 0)]])
    out = await within(run_share([0], launcher, retries=1, deadlines=deadlines),
                       "run_share", timeout=30)
    error = out[0][1]
    assert isinstance(error, SearchTimeoutError)


async def test_bounded_search_stops_a_search_at_its_timeout():
    async def forever(start, evaluate):
        await asyncio.sleep(3600)

    async def quick(start, evaluate):
        return start + 1

    assert await bounded_search(quick, 1, None, 0.1) == 2
    assert await bounded_search(quick, 1, None, None) == 2
    with pytest.raises(SearchTimeoutError, match="search_timeout of 0.05 s"):
        # (not ``within``: it would take this TimeoutError for its own)
        await asyncio.wait_for(bounded_search(forever, 1, None, 0.05), 10)


async def test_a_cancelled_bounded_search_finishes_its_cleanup_before_the_caller_resumes():
    # Without wait_for, the caller resumed while the search still cleaned up.
    log = []

    async def tidy(start, evaluate):
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.02)  # closing what it opened
            log.append("cleaned up")

    task = asyncio.ensure_future(bounded_search(tidy, 1, None, 60.0))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["cleaned up"]


async def test_client_searches_hand_over_outcomes_as_the_searches_end():
    release = asyncio.Event()

    async def search(start, evaluate):
        if start == "late":
            await release.wait()
        if start == "bad":
            raise ValueError("bad start")
        return start

    batches = []
    searches = ClientSearches(search, ["a", "late", "bad"], None, None,
                              lambda o, raised: (not raised, o),
                              batches.append)
    running = asyncio.ensure_future(searches.run())
    while not batches:
        await asyncio.sleep(0.01)
    # The two that ended at once left together, before the third ended.
    assert [(k, ok) for k, ok, _ in batches[0]] == [(0, True), (2, False)]
    release.set()
    await within(running, "ClientSearches.run")
    assert batches[1] == [(1, True, "late")]


async def test_when_one_share_raises_the_others_are_stopped_before_the_error_goes_on():
    stopped = []

    async def long_share():
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.01)  # stopping its worker takes a moment
            stopped.append("long")

    async def failing_share():
        await asyncio.sleep(0.01)
        raise OSError("out of file descriptors")

    with pytest.raises(OSError, match="out of file descriptors"):
        await within(run_shares([long_share(), failing_share()]), "the shares")
    assert stopped == ["long"]  # before run_shares raised, not later
    assert await within(run_shares([asyncio.sleep(0, result=1), asyncio.sleep(0, result=2)]),
                        "plain shares") == [1, 2]
