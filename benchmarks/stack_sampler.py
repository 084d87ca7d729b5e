"""Where this process's threads spend a run: their Python stacks, sampled from a thread.

For the GPU machines, where neither py-spy nor perf may attach: ``StackSampler`` reads
``sys._current_frames()`` every ``interval_s`` from a thread of its own, for the length
of a ``with`` block, and counts each thread's innermost frame (``self``) and every frame
on its stack (``inclusive``), by thread name. The sampler needs the GIL to take a sample,
so samples fall where the thread holding it lets go (every switch interval at most): a
profile of the Python work, and of the calls that wait in C (a CUDA synchronize, a
``select``), which show as their Python caller. The sampler's thread ends with the block.

    >>> with StackSampler(interval_s=0.001) as sampler:
    ...     _ = sum(i * i for i in range(200_000))
    >>> report = sampler.report(top=3)
    >>> report["samples"] > 0 and "MainThread" in report["threads"]
    True
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any, Counter, Dict


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
    """

    def __init__(self, interval_s: float = 0.01, enabled: bool = True):
        self.interval_s = interval_s
        self.enabled = enabled
        self.samples = 0
        self._self: Dict[str, Counter[str]] = collections.defaultdict(collections.Counter)
        self._inclusive: Dict[str, Counter[str]] = collections.defaultdict(
            collections.Counter)
        self._counts: Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "StackSampler":
        if self.enabled:
            self._thread = threading.Thread(target=self._sample, name="stack-sampler",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _sample(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval_s):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
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
    def sleeper() -> None:
        time.sleep(0.3)

    thread = threading.Thread(target=sleeper, name="sleeper")
    with StackSampler() as sampler:
        thread.start()
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            pass
        thread.join()
    print(sampler.report(top=3))
