"""benchmarks/stack_sampler.py: where a run's threads are, sampled from a thread."""

import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from stack_sampler import StackSampler  # noqa: E402


def waits_in_a_known_place(event: threading.Event) -> None:
    event.wait(10)


def spins(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_samples_find_each_thread_where_it_is():
    release = threading.Event()
    waiter = threading.Thread(target=waits_in_a_known_place, args=(release,),
                              name="the-waiter")
    waiter.start()
    try:
        with StackSampler(interval_s=0.001) as sampler:
            spins(0.2)
    finally:
        release.set()
        waiter.join(10)
    report = sampler.report(top=50)
    assert report["samples"] >= 5
    waiting = report["threads"]["the-waiter"]
    assert waiting["inclusive"]["waits_in_a_known_place (test_benchmarks_stack_sampler.py)"] \
        == 1.0
    main = report["threads"]["MainThread"]
    assert main["inclusive"]["spins (test_benchmarks_stack_sampler.py)"] >= 0.9
    assert any(line.startswith("spins (") for line in main["self"])
    assert "stack-sampler" not in report["threads"]  # never samples itself


def test_its_thread_ends_with_the_block_and_disabled_it_starts_none():
    before = {t.name for t in threading.enumerate()}
    with StackSampler(interval_s=0.001) as sampler:
        assert "stack-sampler" in {t.name for t in threading.enumerate()}
    assert {t.name for t in threading.enumerate()} == before
    assert sampler.report()["samples"] >= 0
    with StackSampler(enabled=False) as off:
        assert "stack-sampler" not in {t.name for t in threading.enumerate()}
    assert off.report() is None


def test_a_recursive_function_counts_once_a_sample():
    def down(k: int) -> None:
        if k:
            down(k - 1)
        else:
            spins(0.1)

    with StackSampler(interval_s=0.001) as sampler:
        down(20)
    main = sampler.report(top=50)["threads"]["MainThread"]
    assert main["inclusive"]["down (test_benchmarks_stack_sampler.py)"] <= 1.0
