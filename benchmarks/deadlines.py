"""How far past its deadline a run of searches returns, on every backend.

    python benchmarks/deadlines.py [--rounds 5] [--no_ray]

Each scenario runs ``run_searches(..., timeout=T)`` on four starts, one of which never
ends, and measures ``overshoot = elapsed - T`` from the call to its return (every other
start has finished long before). Scenarios: ``local`` (the endless search awaits
forever); ``process`` and ``ray`` with the endless search ``awaiting`` (it yields to its
loop), ``blocked`` (``time.sleep`` in the search: its worker cannot answer) and
``stopped`` (its worker stopped by SIGSTOP). The issue's goal: no run waits past its
deadline by more than a second. (A per-search deadline ends the same way: the runner
kills a worker whose searches are still running 0.25 s after theirs.)

Prints one JSON object (per scenario: overshoot min, median, max in seconds over
``--rounds``) and writes it to results/benchmarks/deadlines.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import async_search as asr  # noqa: E402
from async_search.errors import SearchTimeoutError  # noqa: E402
from async_search.files import write_file  # noqa: E402
from tests.backends import searches  # noqa: E402


def one_run(backend: str, how: str, timeout: float) -> float:
    """Seconds past ``timeout`` at which ``run_searches`` returned."""
    with tempfile.TemporaryDirectory() as folder:
        if how == "awaiting":
            search = searches.endless_on_two
        else:
            search = functools.partial(searches.stuck_on_two, pid_dir=folder,
                                       how="sleep" if how == "blocked" else "stop")
        began = time.monotonic()
        out = asr.run_searches(search, [1, 2, 3, 4], searches.small_mlp, backend=backend,
                               num_procs=1 if backend == "local" else 4, timeout=timeout,
                               return_exceptions=True)
        elapsed = time.monotonic() - began
    assert isinstance(out[1], SearchTimeoutError), out
    return elapsed - timeout


def summary(values) -> dict:
    return {"min_s": round(min(values), 3), "median_s": round(statistics.median(values), 3),
            "max_s": round(max(values), 3), "runs": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=6.0,
                        help="the run's timeout for process and Ray (their workers "
                             "start within it); local uses 1 s")
    parser.add_argument("--no_ray", action="store_true")
    parser.add_argument("--out", default="results/benchmarks/deadlines.json")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be an integer >= 1, got {args.rounds}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be more than 0 seconds, got {args.timeout}")
    scenarios = [("local", "awaiting")] + [
        (backend, how) for backend in ("process",) + (() if args.no_ray else ("ray",))
        for how in ("awaiting", "blocked", "stopped")]
    if not args.no_ray:
        from async_search.ray_init import ensure_ray
        ensure_ray()
        one_run("ray", "awaiting", args.timeout)  # Ray's workers started once, untimed
    overshoots = {f"{b}/{h}": [] for b, h in scenarios}
    for _ in range(args.rounds):  # rounds alternate between scenarios: the same load
        for backend, how in scenarios:
            timeout = 1.0 if backend == "local" else args.timeout
            overshoots[f"{backend}/{how}"].append(one_run(backend, how, timeout))
    report = {"rounds": args.rounds, "timeout_s": args.timeout, "cpus": os.cpu_count(),
              "overshoot": {k: summary(v) for k, v in overshoots.items()}}
    text = json.dumps(report, indent=2)
    print(text)
    write_file(args.out, text + "\n")


if __name__ == "__main__":
    main()
