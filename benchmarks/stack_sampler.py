"""Where this process's threads spend a run: their Python stacks, sampled from a thread.

For the GPU machines, where neither py-spy nor perf may attach: ``StackSampler`` reads
``sys._current_frames()`` every ``interval_s`` from a thread of its own, for the length
of a ``with`` block, and counts each thread's innermost frame (``self``) and every frame
on its stack (``inclusive``), by thread name. The sampler needs the GIL to take a sample,
so samples fall where the thread holding it lets go (every switch interval at most): a
profile of the Python work, and of the calls that wait in C (a CUDA synchronize, a
``select``), which show as their Python caller. The sampler's thread ends with the block.

A thread that lets go of the GIL often at one place draws the samples there, out of
proportion to its time there: a loop that calls ``time.sleep(0)`` every millisecond
(as ``serve`` does while a batch is in a device thread) showed 100 % of its samples in
it, for 11 % of its time. Entered on the main thread (where the event loop of a run
in one process is), the sampler therefore takes the main thread's stack from a timer
signal instead (``SIGALRM`` every ``interval_s`` of wall time, ``timer=True``): the
handler runs on that thread between two of its bytecodes, so each of its samples is
where its time went (a C call counts for its caller's line once it returns). The other
threads are still read at the moment of the sample.

    >>> with StackSampler(interval_s=0.001) as sampler:
    ...     _ = sum(i * i for i in range(200_000))
    >>> report = sampler.report(top=3)
    >>> report["samples"] > 0 and "MainThread" in report["threads"]
    True
"""

from __future__ import annotations

import collections
import signal
import sys
import threading
import time
from typing import Any, Counter, Dict


#: The shortest interval between samples: a timer signal that comes again before its
#: handler has read the stacks would re-enter it until the stack overflows.
MIN_INTERVAL_S = 0.001


def _function(frame: Any, line: bool = False) -> str:
    """``name (file.py)``, or ``name (file.py:line)`` with ``line``."""
    code = frame.f_code
    at = f":{frame.f_lineno}" if line else ""
    return f"{code.co_name} ({code.co_filename.rsplit('/', 2)[-1]}{at})"


class StackSampler:
    """Samples every thread's stack (but its own) while the ``with`` block runs.

    Args:
        interval_s: seconds between samples. A sample holds the GIL about 90 us (four
            threads 30 frames deep, on the 2-core CI machine): at the default 10 ms,
            under 1 % of the run's time.
        enabled: False makes the block run unsampled (``report`` is then None).
        timer: sample from a timer signal, the main thread's stack as it was
            interrupted (None: when entered on the main thread of a platform with
            ``signal.setitimer``); False: from a thread, every thread alike.
    """

    def __init__(self, interval_s: float = 0.01, enabled: bool = True,
                 timer: bool | None = None):
        if not interval_s >= MIN_INTERVAL_S:  # NaN too
            raise ValueError(f"interval_s must be at least {MIN_INTERVAL_S} s (a sample "
                             f"of a deep stack takes about 0.1 ms), got {interval_s!r}")
        self.interval_s = interval_s
        self.enabled = enabled
        self.timer = timer
        self._previous: Any = None  # the SIGALRM handler before this one
        self._other_timer = (0.0, 0.0)  # the timer before this one's (delay, interval)
        self._entered = 0.0
        self.samples = 0
        self._self: Dict[str, Counter[str]] = collections.defaultdict(collections.Counter)
        self._inclusive: Dict[str, Counter[str]] = collections.defaultdict(
            collections.Counter)
        self._counts: Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "StackSampler":
        if not self.enabled:
            return self
        main = threading.current_thread() is threading.main_thread()
        if self.timer is None:
            self.timer = main and hasattr(signal, "setitimer")
        if self.timer:
            if not main:
                raise RuntimeError("StackSampler(timer=True) is entered on the main "
                                   "thread (signals run there)")
            self._previous = signal.signal(signal.SIGALRM, self._on_timer)
            # Another's timer (pytest-timeout's, say) is put back, less the time spent.
            self._other_timer = signal.setitimer(signal.ITIMER_REAL, self.interval_s,
                                                 self.interval_s)
            self._entered = time.monotonic()
        else:
            self._thread = threading.Thread(target=self._sample, name="stack-sampler",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
            self._previous = None
            delay, interval = self._other_timer
            if delay > 0:  # due during the block: it fires at once
                left = delay - (time.monotonic() - self._entered)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), interval)
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _on_timer(self, signum: int, frame: Any) -> None:
        self._take(threading.get_ident(), frame)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take(threading.get_ident(), None)

    def _take(self, me: int, my_frame: Any) -> None:
        """One sample: every thread's stack; this thread's is ``my_frame`` (the one a
        signal interrupted), or left out when None (the sampler's own thread)."""
        names = {t.ident: t.name for t in threading.enumerate()}
        frames = sys._current_frames()
        if my_frame is None:
            frames.pop(me, None)
        else:
            frames[me] = my_frame
        for ident, frame in frames.items():
            name = names.get(ident, str(ident))
            self._counts[name] += 1
            self._self[name][_function(frame, line=True)] += 1
            seen = set()
            while frame is not None:
                function = _function(frame)
                if function not in seen:  # recursion counts a function once
                    seen.add(function)
                    self._inclusive[name][function] += 1
                frame = frame.f_back
        self.samples += 1

    def report(self, top: int = 12) -> dict | None:
        """Per thread: its samples, and its ``top`` innermost lines and functions on
        the stack, each as a fraction of that thread's samples; None when disabled."""
        if not self.enabled:
            return None
        threads = {}
        for name, count in self._counts.most_common():
            threads[name] = {
                "samples": count,
                "self": {k: round(v / count, 3) for k, v in self._self[name].most_common(top)},
                "inclusive": {k: round(v / count, 3)
                              for k, v in self._inclusive[name].most_common(top)},
            }
        return {"samples": self.samples, "interval_s": self.interval_s, "threads": threads}


if __name__ == "__main__":  # a look at the sampler itself: a busy loop and a sleeper
    import argparse
    import json

    argparse.ArgumentParser(description="A look at the sampler itself: a busy loop "
                            "beside a sleeping thread, sampled for 0.3 s (used as a "
                            "module by benchmarks/gpu.py --sample-stacks).").parse_args()

    def sleeper() -> None:
        time.sleep(0.3)

    thread = threading.Thread(target=sleeper, name="sleeper")
    with StackSampler() as sampler:
        thread.start()
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            pass
        thread.join()
    print(json.dumps(sampler.report(top=3), indent=2))
