"""max_batch_size="auto": the climb to the batch size with the best end-to-end rate.

Times here are known functions of the batch size, fed to the tuner (or read by the
server from an injected clock that the model advances), never measured.
"""

import asyncio
import time

import numpy as np
import pytest

import async_search as asr
from async_search.batchers import FairBatcher
from async_search.models import with_spec
from async_search.servers.batch_size import AutoBatchSize, BatchSizeTuner
from async_search.servers.policy import DispatchPolicy

pytestmark = pytest.mark.timeout(60)

SEARCHES = 512           # searches in lockstep: each asks one element a step
SEARCH_S = 2e-6          # CPU seconds a search spends on a step (on the loop)


def model_s(size):
    """Seconds the model takes on a batch: 200 us + 1.5 us an element."""
    return 200e-6 + 1.5e-6 * size


def lockstep_step_s(cap):
    """Seconds a step of the 512 searches takes end to end with batches of ``cap``: one
    batch for all leaves the device idle while the searches run and the searches idle
    while it computes; two or more batches alternate, the device computing one while
    the searches make the next."""
    groups = -(-SEARCHES // cap)
    size = -(-SEARCHES // groups)
    cpu = SEARCHES * SEARCH_S
    if groups == 1:
        return cpu + model_s(size)
    return max(cpu, groups * model_s(size))


def drive(tuner, step_s, searches=SEARCHES, max_batches=20_000, now=0.0):
    """Feeds the tuner the completions of lockstep steps at its current cap, from
    ``now`` (seconds) on, until it settles; returns the sizes it set."""
    chosen = [tuner.size]
    for _ in range(max_batches):
        if tuner.settled:
            return chosen
        cap = tuner.size
        groups = -(-searches // cap)
        for g in range(groups):
            now += step_s(cap) / groups
            size = min(cap, searches - g * cap)
            new = tuner.record(size, now)
            if new is not None:
                chosen.append(new)
                break
    raise AssertionError("the tuner never settled")


def test_the_first_round_finds_the_fastest_end_to_end_not_the_fastest_alone():
    """512 is the model's fastest batch alone, 256 the fastest end to end: the tuner
    starts at 4096 (whose batches, 512, 512 would make too: it shares their rate),
    goes down to 256, 128 and 64, both slower, and settles on 256."""
    ladder = AutoBatchSize().sizes()
    alone = max(ladder[:6], key=lambda b: b / model_s(b))
    end_to_end = max(ladder, key=lambda b: SEARCHES / lockstep_step_s(b))
    assert (alone, end_to_end) == (512, 256)
    tuner = BatchSizeTuner(AutoBatchSize(trial_batches=8))
    chosen = drive(tuner, lockstep_step_s)
    assert chosen == [4096, 256, 128, 64, 256]
    assert tuner.size == 256 and tuner.settled
    assert tuner.report()["size"] == 256
    assert list(tuner.report()["rates"]) == [64, 128, 256, 512, 4096]
    assert tuner.rates[512] == tuner.rates[4096]


def test_the_first_round_goes_down_past_a_cliff_and_stops_two_sizes_below_the_peak():
    """A model fastest per element at 128 that slows down above it (it spills a cache):
    going down, the round passes the cliff, stops after 64 and 32 are both slower, and
    128 is chosen."""
    tuner = BatchSizeTuner(AutoBatchSize(trial_batches=4))

    def step_s(cap):  # 2048 searches: every batch full
        n = min(cap, 2048)
        return (2048 // n) * (1e-4 + (1e-6 if n <= 128 else 3e-6) * n)

    assert drive(tuner, step_s, searches=2048) == [4096, 1024, 512, 256, 128, 64, 32, 128]


def test_the_smallest_size_within_the_tolerance_of_the_fastest_is_chosen():
    speed = {16: 0.5, 32: 0.8, 64: 0.95, 128: 1.0}  # relative rates; 256 holds 128 too

    def step_s(cap):
        return 1e-3 / speed.get(cap, 1.0)

    lenient = BatchSizeTuner(AutoBatchSize(trial_batches=4, tolerance=0.1))
    assert drive(lenient, step_s, searches=128)[-1] == 64  # 5 % slower: smaller wins
    strict = BatchSizeTuner(AutoBatchSize(trial_batches=4, tolerance=0.01))
    assert drive(strict, step_s, searches=128) == [4096, 64, 32, 128]
    # 4096 makes batches of 128, as 128 does (256 to 2048 are never tried); 32 and 64
    # are both slower: the round stops there.
    assert set(strict.rates) == {4096, 128, 64, 32}


def test_batches_dispatched_before_a_change_are_not_measured():
    tuner = BatchSizeTuner(AutoBatchSize(smallest=64, largest=256, trial_batches=2))
    assert tuner.size == 256
    assert [tuner.record(256, t) for t in (1.0, 2.0)] == [None, None]
    assert tuner.record(256, 3.0, in_flight=2) == 128  # 256 a second at 256
    # The two batches in flight were cut at 256: their (absurd) times do not count.
    assert tuner.record(256, 1000.0) is None and tuner.record(256, 2000.0) is None
    tuner.record(128, 2001.0)
    assert tuner.record(128, 2002.0) == 64  # 128 a second at 128: one slower, on down
    assert tuner.rates == {256: 256.0, 128: 128.0}


def test_a_chosen_size_is_held_then_measured_again_with_its_neighbours():
    tuner = BatchSizeTuner(AutoBatchSize(smallest=32, trial_batches=2, hold_batches=5))
    drive(tuner, lambda cap: 1e-3 / {32: 0.5, 64: 1.0}.get(cap, 0.5), searches=128)
    assert tuner.settled and tuner.size == 64
    for t in range(4):
        assert tuner.record(64, 10.0 + t) is None and tuner.settled
    assert tuner.record(64, 20.0) is None and not tuner.settled  # 64 measured again
    # Now 128 is the fastest: the round measures 64, 32, 128, then goes on to 256.
    chosen = drive(tuner, lambda cap: 1e-3 / {64: 1.0, 128: 2.0}.get(cap, 0.5),
                   searches=512, now=20.0)
    assert chosen == [64, 32, 128, 256, 128] and tuner.size == 128


def test_the_first_round_ends_at_the_smallest_size_whatever_the_records_say():
    """Batches larger than their cap (a record that cannot be: fed by hand) at times
    that do not move: the round still goes down one size at a time and ends at the
    smallest, never at an index outside the sizes. Empty batches: every size makes
    them, so the smallest is chosen at once."""
    for size, times, expected in ((64, [1.0] * 8, [32, 16]),
                                  (0, [float(t) for t in range(8)], [16])):
        tuner = BatchSizeTuner(AutoBatchSize(smallest=16, largest=64, trial_batches=1))
        caps = [tuner.record(size, t) for t in times]
        assert [c for c in caps if c is not None] == expected
        assert tuner.settled and tuner.size == 16
        assert set(tuner.rates) <= {16, 32, 64}


@pytest.mark.parametrize("kwargs, message", [
    (dict(smallest=0), "AutoBatchSize.smallest must be an integer >= 1, got 0"),
    (dict(smallest=64, largest=32), "AutoBatchSize.largest must be an integer >= 64"),
    (dict(trial_batches=True), "AutoBatchSize.trial_batches must be an integer >= 1"),
    (dict(tolerance=-0.1), "AutoBatchSize.tolerance must be a finite number >= 0"),
    (dict(clock=3), "AutoBatchSize.clock must be callable"),
])
def test_auto_batch_size_checks_its_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AutoBatchSize(**kwargs)


def test_auto_is_an_auto_batch_size_in_the_policy():
    assert DispatchPolicy("auto").max_batch_size == AutoBatchSize()
    custom = AutoBatchSize(largest=512)
    assert DispatchPolicy(custom).max_batch_size is custom


# -- the server ------------------------------------------------------------------------

class Clock:
    """Seconds that pass only when the model computes."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


async def test_the_server_settles_on_the_size_its_measured_times_favour():
    """A model whose time per batch is a known function of its size (fastest per
    element at 128, far slower per element above: say it spills a cache), fed by 1024
    searches: the server settles on 128 and cuts every later batch at 128."""
    clock = Clock()

    def timed(x):
        n = len(x)
        clock.now += 1e-4 + (1e-6 * n if n <= 128 else 3e-6 * n)
        return x * 2.0

    auto = AutoBatchSize(trial_batches=4, hold_batches=10_000, clock=clock)
    sizes = []
    async with asr.serve(with_spec(timed, (1,), np.float32), max_batch_size=auto,
                         model_thread=False,
                         on_batch=lambda record: sizes.append(record.size)) as evaluate:
        assert evaluate.max_batch_size == 4096  # the first round starts at the top

        async def search(i):
            x = np.full((1, 1), i, np.float32)
            for _ in range(60):
                assert (await evaluate(x)).item() == 2.0 * i

        await asyncio.wait_for(asyncio.gather(*(search(i) for i in range(1024))), 30)
        stats = evaluate.stats
    assert evaluate.max_batch_size == 128 and stats["auto_batch_size"]["size"] == 128
    report = stats["auto_batch_size"]
    assert report["settled"] and list(report["rates"]) == [32, 64, 128, 256, 512, 1024,
                                                           4096]
    assert max(report["rates"], key=report["rates"].get) == 128
    settled_at = len(sizes) - sizes[::-1].index(32)  # after the last batch of 32
    after = sizes[settled_at:]
    assert max(after) == 128 and after.count(128) >= 0.9 * len(after) and len(after) > 100


async def test_a_batch_that_a_smaller_size_made_full_does_not_wait_out_max_delay():
    """A full batch never waits: while the rest of the requests waited for company
    (max_delay), the tuner cut the size under what was queued, and they waited out the
    whole delay (here a minute) for a request that never came."""
    clock = Clock()

    def timed(x):
        clock.now += 0.1  # every size alike to the tuner: it goes down from 8
        time.sleep(0.02)  # in its thread, while the dispatch task waits for company
        return x * 2.0

    auto = AutoBatchSize(smallest=1, largest=8, trial_batches=1, clock=clock)
    async with asr.serve(with_spec(timed, (1,), np.float32), max_batch_size=auto,
                         max_delay=60.0, pipeline_depth=2, model_thread=True) as evaluate:
        xs = [np.full((1, 1), i, np.float32) for i in range(20)]
        ys = await asyncio.wait_for(asyncio.gather(*map(evaluate, xs)), 10)
        reasons = evaluate.stats["reasons"]
    assert [y.item() for y in ys] == [2.0 * i for i in range(20)]
    assert evaluate.max_batch_size < 8 and reasons.get("delay", 0) == 0, reasons


async def test_a_size_whose_batches_fail_is_worth_nothing_however_fast_they_fail():
    """A model out of memory above 64 rows fails those batches at once (fast, per
    element); below, larger batches cost less an element: the server settles at 64."""
    clock = Clock()

    def out_of_memory_above_64(x):
        n = len(x)
        if n > 64:
            clock.now += 1e-6
            raise MemoryError("out of memory")
        clock.now += 1e-3 + 1e-6 * n
        return x * 2.0

    auto = AutoBatchSize(smallest=8, largest=512, trial_batches=4, hold_batches=10_000,
                         clock=clock)
    async with asr.serve(with_spec(out_of_memory_above_64, (1,), np.float32),
                         max_batch_size=auto, model_thread=False) as evaluate:
        async def search(i):
            x = np.full((1, 1), i, np.float32)
            answered = 0
            for _ in range(40):
                try:
                    await evaluate(x)
                    answered += 1
                except MemoryError:
                    pass
            return answered

        answered = await asyncio.wait_for(asyncio.gather(*(search(i) for i in range(512))),
                                          30)
        report = evaluate.stats["auto_batch_size"]
    assert report["settled"] and report["size"] == 64, report
    assert all(rate == 0 for size, rate in report["rates"].items() if size > 64)
    assert report["rates"][64] > 0
    assert sum(answered) > 0.5 * 512 * 40


def test_sizes_whose_trials_answered_nothing_are_not_tried_again():
    """Out of memory above 64 rows: the first round's trials of 512 to 128 answer
    nothing. Every later round (each 5 batches here) measured 128 again, each trial
    failing its requests again: now 128 is tried again only every RETRY_ROUNDS rounds,
    and nothing above it."""
    from async_search.servers.batch_size import RETRY_ROUNDS

    tuner = BatchSizeTuner(AutoBatchSize(smallest=16, largest=512, trial_batches=2,
                                         hold_batches=5))
    now, caps, failed = 0.0, [], []
    for step in range(1000):
        cap = tuner.size
        caps.append(cap)
        now += 1e-3 + 1e-6 * cap
        answered = 0 if cap > 64 else cap
        failed.append(answered == 0)
        tuner.record(cap, now, answered=answered)
        if step == 20:
            assert tuner.report()["largest"] == 64
    first_round = caps.index(16)
    assert max(caps[first_round:]) == 128  # never 256 or 512 again
    # A trial (2 batches, and the one cut when it starts) every RETRY_ROUNDS rounds of
    # at least 5 + 2 batches: every round's would fail about 280 batches.
    retries = 1 + len(caps) // (RETRY_ROUNDS * 7)
    assert sum(failed[first_round:]) <= 3 * retries, sum(failed[first_round:])


def test_sizes_that_failed_are_tried_again_after_some_rounds():
    """Out of memory above 32 rows for a while (another process held the memory): the
    tuner settles at 32, then, RETRY_ROUNDS rounds on, tries 64 again and climbs."""
    from async_search.servers.batch_size import RETRY_ROUNDS

    tuner = BatchSizeTuner(AutoBatchSize(smallest=16, largest=128, trial_batches=2,
                                         hold_batches=3))
    now, caps = 0.0, []
    for step in range(3000):
        cap = tuner.size
        caps.append(cap)
        now += 1e-3  # a batch takes as long whatever its size: the largest is fastest
        out_of_memory = step < 200 and cap > 32
        tuner.record(cap, now, answered=0 if out_of_memory else cap)
    # Capped while the memory was short, but for a retry (every RETRY_ROUNDS rounds
    # of at least 3 + 2 batches)
    assert sum(cap > 32 for cap in caps[20:200]) <= 3 * (1 + 180 // (RETRY_ROUNDS * 5))
    assert tuner.size == 128 and tuner.report()["largest"] == 128
    assert RETRY_ROUNDS >= 2


def test_a_size_above_one_that_failed_is_not_chosen_in_the_same_round():
    """A re-check round in which 256 failed (for a moment) while 128 and 512 answered:
    512 was chosen and held, above the largest size the tuner said it still tried."""
    tuner = BatchSizeTuner(AutoBatchSize(smallest=16, largest=512, trial_batches=2,
                                         hold_batches=50))
    now = 0.0
    for step in range(2000):
        cap = tuner.size
        now += 1e-3 + 1e-6 * cap + 1e-8 * cap * cap  # 256 the fastest
        tuner.record(cap, now, answered=0 if 49 <= step <= 60 else cap)
        assert tuner.size <= tuner.report()["largest"] or not tuner.settled, step


@pytest.mark.parametrize("answered", [-5, 9])
def test_a_record_answering_more_than_its_batch_or_less_than_none_is_refused(answered):
    # -5: every rate negative, and the choice crashed on an empty sequence
    tuner = BatchSizeTuner(AutoBatchSize(smallest=16, largest=64, trial_batches=2))
    with pytest.raises(ValueError, match="answered must be in"):
        tuner.record(8, 1.0, answered=answered)


def test_sizes_that_fail_below_one_that_answers_stay_tried():
    """Every size failing (a broken model, bad requests) caps nothing; nor does a small
    size failing under a larger one that answers."""
    everything = BatchSizeTuner(AutoBatchSize(smallest=16, largest=256, trial_batches=2,
                                              hold_batches=3))
    small_fails = BatchSizeTuner(AutoBatchSize(smallest=16, largest=256, trial_batches=2,
                                               hold_batches=3))
    for t in range(300):
        everything.record(everything.size, t * 1e-3, answered=0)
        cap = small_fails.size
        small_fails.record(cap, t * 1e-3, answered=0 if cap < 64 else cap)
    assert everything.report()["largest"] == 256
    assert small_fails.report()["largest"] == 256


async def test_auto_refuses_a_batcher_of_its_own():
    with pytest.raises(ValueError, match="pass no batcher"):
        async with asr.serve(lambda x: x, max_batch_size="auto", batcher=FairBatcher(8)):
            pass
