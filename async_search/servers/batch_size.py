"""``max_batch_size="auto"``: the batch size with the highest measured end-to-end rate.

The fastest batch for the model alone is not the fastest for the searches: with 512
searches in lockstep, one batch of 512 leaves the device idle while the searches expand
and the searches idle while the device computes, where two batches of 256 overlap the
two (AlphaZero.jl's issue #78). So the server measures what it delivers, not what the
model computes: elements answered per second of wall time, batch after batch, at each
batch size it tries.

The rule (``BatchSizeTuner``), over the sizes ``smallest * 2**k`` up to ``largest``:

1. A trial measures one size: it skips the batches that were in flight when the size
   was set (cut under the previous one), then takes ``trial_batches`` batches; the
   rate is their elements over the wall time from the completion before them to the
   last of them.
2. The first round starts at the largest size and goes down, and stops when two sizes
   in a row are slower than the fastest so far by more than ``tolerance`` (a
   fraction): past the peak, or past the cliff where batches get too small to keep
   the device busy. Sizes that would cut none of a trial's batches (at least as large
   as its largest batch) are skipped: they make the same batches, so they share its
   rate. Going down, the round measures the sizes near the best first, so the
   searches run near full speed while it measures: from the smallest size up, a short
   run spent much of its time in batches of 16 to 128 (docs/benchmarks.md,
   "Accelerators": on a fake device of an H200's times, 1024 MCTS searches of one
   second went from 0.71x the best fixed size to 1.02x, medians).
3. The size chosen is the smallest whose rate is within ``tolerance`` of the fastest
   (the same rate with smaller batches answers each request sooner).
4. It is kept for ``hold_batches`` batches; then a round measures it and its two
   neighbours again (the one above only when the batches fill the size), moves to the
   choice among them, and goes on one size further in that direction while the choice
   is at the edge of what the round measured. The load may have changed.

Idle time counts: a pause in the requests during a trial lowers that trial's rate, and
the next round measures again.

A size whose trial answered nothing (every batch failed: out of memory) while a smaller
size answered is not tried again, nor any larger one, until ``RETRY_ROUNDS`` rounds
later (the last of them may try it once more): each round's trial would fail its
requests again, and the memory may have been another process's, for a while.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, List, Optional

from async_search.checks import check_float, check_int

#: Rounds after which sizes that failed (``BatchSizeTuner``) may be tried again.
RETRY_ROUNDS = 10


@dataclasses.dataclass(frozen=True)
class AutoBatchSize:
    """How ``max_batch_size="auto"`` measures and chooses (``"auto"`` is
    ``AutoBatchSize()``).

    Attributes:
        smallest, largest: the range of sizes tried (powers of two times ``smallest``).
        trial_batches: batches measured at each size tried.
        tolerance: how much slower (a fraction) than the fastest a size may be and still
            be chosen for being smaller; and how much slower sizes end the first round.
        hold_batches: batches at a chosen size before the next round.
        clock: seconds, monotonic; ``time.perf_counter`` (a test injects its own).

    Example:
        >>> AutoBatchSize(largest=1024).sizes()[-3:]
        [256, 512, 1024]
    """

    smallest: int = 16
    largest: int = 4096
    trial_batches: int = 16
    tolerance: float = 0.05
    hold_batches: int = 2000
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "smallest", check_int("AutoBatchSize.smallest", self.smallest,
                                         minimum=1))
        set_(self, "largest", check_int("AutoBatchSize.largest", self.largest,
                                        minimum=self.smallest))
        set_(self, "trial_batches", check_int("AutoBatchSize.trial_batches",
                                              self.trial_batches, minimum=1))
        set_(self, "tolerance", check_float("AutoBatchSize.tolerance", self.tolerance,
                                            minimum=0))
        set_(self, "hold_batches", check_int("AutoBatchSize.hold_batches",
                                             self.hold_batches, minimum=1))
        if not callable(self.clock):
            raise ValueError(f"AutoBatchSize.clock must be callable, got {self.clock!r}")

    def sizes(self) -> List[int]:
        """The sizes tried, smallest first."""
        out, size = [], self.smallest
        while size <= self.largest:
            out.append(size)
            size *= 2
        return out


class BatchSizeTuner:
    """Chooses the batch size with the highest measured end-to-end rate (the module's
    rule), fed one answered batch at a time.

    Example:
        >>> tuner = BatchSizeTuner(AutoBatchSize(smallest=64, largest=512,
        ...                                      trial_batches=2))
        >>> tuner.size
        512
        >>> [tuner.record(200, float(t)) for t in range(1, 4)]  # 200 elements a second
        [None, None, 128]
        >>> tuner.rates      # batches of 200: 256 would make the same; 128 cuts them
        {512: 200.0, 256: 200.0}
    """

    def __init__(self, auto: AutoBatchSize):
        self.auto = auto
        self._ladder = auto.sizes()
        self._index = len(self._ladder) - 1  # ladder index batches are cut at
        self._sweeping = True            # the first round: from the largest size down
        self._order = [self._index]      # indices in the order this round measured them
        self._peak = 0                   # the largest batch of the trial
        self._round: Dict[int, float] = {}  # index -> rate measured in this round
        self._filled: Dict[int, bool] = {}  # index -> whether its batches filled it
        self._queue: List[int] = []      # indices this round measures next
        self._skip = 0                   # completions left from before the last change
        self._last: Optional[float] = None  # when the batch before the window finished
        self._elements = self._batches = self._full = 0
        self._held: Optional[int] = None  # batches at the chosen size (None: measuring)
        self._top = len(self._ladder) - 1  # the largest index still tried
        self._retry_in = 0  # rounds left before sizes above _top may be tried again
        #: The rate last measured at each size tried (elements per second).
        self.rates: Dict[int, float] = {}

    @property
    def size(self) -> int:
        """The cap for the batches dispatched now."""
        return self._ladder[self._index]

    @property
    def settled(self) -> bool:
        """True while a chosen size is held; False while a round measures."""
        return self._held is not None

    def record(self, size: int, finished_s: float, in_flight: int = 0,
               answered: Optional[int] = None) -> Optional[int]:
        """A batch of ``size`` elements came back at ``finished_s`` (the clock's
        seconds), ``answered`` of them answered (default all; 0 when it failed: a size
        whose batches fail is worth nothing, however fast); ``in_flight`` batches are
        still out. Returns the new cap when it changes (the ``in_flight`` batches, cut
        under the old one, are not measured), else None."""
        if answered is not None and not 0 <= answered <= size:
            raise ValueError(f"BatchSizeTuner.record: answered must be in [0, size], got "
                             f"{answered!r} of {size!r}")
        if self._held is not None:
            self._held += 1
            if self._held < self.auto.hold_batches:
                return None
            if self._retry_in:
                self._retry_in -= 1
                if not self._retry_in:
                    self._top = len(self._ladder) - 1
            best, last = self._index, self._top
            self._held, self._round, self._filled, self._order = None, {}, {}, []
            self._queue = [i for i in (best - 1, best + 1) if 0 <= i <= last]
            return self._measure(best, finished_s, in_flight)  # the chosen one first
        if self._skip:
            self._skip -= 1
            self._last = finished_s
            return None
        if self._last is None:
            self._last = finished_s  # the first completion opens the window
            return None
        self._elements += size if answered is None else answered
        self._batches += 1
        self._full += size >= self.size
        if size > self._peak:
            self._peak = size
        if self._batches < self.auto.trial_batches:
            return None
        seconds = finished_s - self._last
        rate = self._elements / seconds if seconds > 0 else float("inf")
        self.rates[self.size] = self._round[self._index] = rate
        self._filled[self._index] = self._full * 2 >= self._batches  # mostly full
        if self._sweeping:  # the smallest size that cuts none of these batches: the same
            same = self._smallest_holding(self._peak)
            if same < self._index:
                self.rates[self._ladder[same]] = self._round[same] = rate
        return self._measure(self._next(), finished_s, in_flight)

    def _smallest_holding(self, rows: int) -> int:
        """The index of the smallest size of at least ``rows`` (the largest if none)."""
        for index, size in enumerate(self._ladder):
            if size >= rows:
                return index
        return len(self._ladder) - 1

    def _next(self) -> Optional[int]:
        """The index to measure next in this round, or None when the round is over."""
        index, filled, last = self._index, self._filled[self._index], self._top
        if self._sweeping:
            fastest = max(self._round.values())
            two_slower = len(self._order) >= 2 and all(
                self._slower(i, fastest) for i in self._order[-2:])
            # The next size down that cuts the trial's batches (they never exceed the
            # cap, but a record may say otherwise: never above the size measured).
            below = min(self._smallest_holding(self._peak), index) - 1
            if two_slower or below < 0:
                return None
            return below
        if not filled:  # a larger cap than its batches measures nothing new
            self._queue = [i for i in self._queue if i < index]
        if self._queue:
            return self._queue.pop(0)
        best = self._choice()
        low, high = min(self._round), max(self._round)
        if best == high and self._filled[high] and high < last:
            return high + 1
        if best == low and low > 0:
            return low - 1
        return None

    def _slower(self, index: int, fastest: float) -> bool:
        return self._round[index] * (1.0 + self.auto.tolerance) < fastest

    def _choice(self) -> int:
        """The smallest size measured this round within tolerance of the fastest, of
        those still tried (none above ``_top``)."""
        tried = [i for i in self._round if i <= self._top] or list(self._round)
        fastest = max(self._round[i] for i in tried)
        return min(i for i in tried if not self._slower(i, fastest))

    def _measure(self, index: Optional[int], now: float, in_flight: int) -> Optional[int]:
        """Starts a trial of ``index``, or, when None, holds this round's choice."""
        if index is None:
            self._drop_failing_sizes()  # first: the choice is among the sizes left
            index = self._choice()
            self._sweeping = False
            self._held = 0
        changed = index != self._index
        self._index = index
        self._order.append(index)
        self._skip = in_flight if changed else 0
        self._last = now
        self._elements = self._batches = self._full = self._peak = 0
        return self.size if changed else None

    def _drop_failing_sizes(self) -> None:
        """Lowers the largest size tried below the smallest whose trial in this round
        answered nothing, where a smaller size answered in it."""
        answered = [i for i, rate in self._round.items() if rate]
        if answered:
            failing = [i for i, rate in self._round.items()
                       if rate == 0 and i > min(answered)]
            if failing and min(failing) - 1 < self._top:
                self._top = min(failing) - 1
                self._retry_in = RETRY_ROUNDS

    def report(self) -> dict:
        """What ``stats["auto_batch_size"]`` shows: the size now, whether it is settled,
        the rate last measured at each size tried (elements/s), and the largest size
        still tried (lower than ``AutoBatchSize.largest`` once larger sizes failed)."""
        rates = {size: round(rate, 1) for size, rate in sorted(self.rates.items())}
        return {"size": self.size, "settled": self.settled, "rates": rates,
                "largest": self._ladder[self._top]}
