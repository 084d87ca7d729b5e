"""What a run of searches is: the backend, processes, servers and batching, validated."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Sequence

from async_search.errors import SearchError

from async_search.servers.policy import DispatchPolicy
from async_search.servers.stats import BatchRecord
from async_search.servers.workers import placement_of

__all__ = ["RunConfig", "SearchResults", "BACKENDS", "merge_stats", "loop_factory",
           "raise_failures", "finish", "Progress", "max_servers"]

BACKENDS = ("local", "process", "ray")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How ``run_searches`` places searches and servers.

    Attributes:
        backend: ``local`` (everything in this process), ``process`` (searches in
            ``num_procs`` worker processes, servers here) or ``ray`` (searches in Ray
            tasks, servers as Ray actors).
        num_procs: client processes (or Ray tasks) the starts are split over,
            round-robin.
        num_servers: model servers, each with its own model from the factory, taking
            batches from one request stream.
        policy: batch size, delay and pipeline depth of every server.
        use_uvloop: run event loops on uvloop when it is installed.
        address: Ray: the address of an existing cluster; None starts a local one.
        total_gpu_frac: Ray: the fraction of each GPU in use that the servers on it
            share (None: all of it); the servers are spread over every GPU.
        model_thread: where each server's model runs: "auto" (default: a device
            thread, or the server's loop while a batch takes under 200 us), True
            (device threads), False (the loop).
        return_exceptions: a failed start holds its exception in place among the
            results (the others are kept, as with ``asyncio.gather``); False (default)
            raises SearchError naming every failed start.
    """

    backend: str = "local"
    num_procs: int = 1
    num_servers: int = 1
    policy: DispatchPolicy = DispatchPolicy()
    use_uvloop: bool = False
    address: str | None = None
    total_gpu_frac: float | None = None
    model_thread: bool | str = "auto"
    return_exceptions: bool = False

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got "
                             f"{self.backend!r}")
        for name in ("num_procs", "num_servers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        limit = max_servers(self.backend)
        if self.num_servers > limit:
            raise ValueError(f"num_servers={self.num_servers} is more than the {self.backend} "
                             f"backend can start here (at most {limit})")
        if self.total_gpu_frac is not None and not 0 < self.total_gpu_frac <= 1:
            raise ValueError(f"total_gpu_frac must be in (0, 1], got {self.total_gpu_frac!r}")
        if not isinstance(self.return_exceptions, bool):
            raise ValueError(f"return_exceptions must be True or False, got "
                             f"{self.return_exceptions!r}")
        if placement_of(self.model_thread) == "loop" and self.backend != "ray" and (
                self.num_servers > 1):
            raise ValueError("num_servers > 1 needs model_thread=True or 'auto' (the "
                             "servers are device threads of one server)")


def max_servers(backend: str) -> int:
    """How many servers a backend can start on this machine (one thread or actor each;
    more than a few per core only queue behind each other)."""
    return 4 * (os.cpu_count() or 1)


class SearchResults(list):
    """The results of ``run_searches`` in the order of the starts, with ``stats``.

    It is a list, so it compares equal to the list of results; ``stats`` is a dict:
    backend, num_procs, num_servers, wall_time_s, the serving figures summed over the
    servers (batches, elements, mean_batch_size, std_batch_size, model_time_s,
    fraction_in_model: model time over wall time per server), ``servers`` (each
    server's own stats) and ``trace`` (a BatchRecord per batch, ordered by time). The
    Ray backend adds ``startup_s`` (starting the server actors and building their
    models, left out of wall_time_s) and ``servers_died``.
    """

    def __init__(self, results: Sequence[Any], stats: dict):
        super().__init__(results)
        self.stats = stats


def merge_stats(config: RunConfig, wall_time: float, servers: List[dict],
                traces: List[List[BatchRecord]]) -> dict:
    """The run's stats from each server's stats and trace (put on one clock: the
    earliest server's start; perf_counter is one clock for the processes of a machine)."""
    origin = min((s.get("started_at", 0.0) for s in servers), default=0.0)
    trace = sorted((r._replace(finished_s=r.finished_s + s.get("started_at", 0.0) - origin)
                    for s, t in zip(servers, traces) for r in t),
                   key=lambda r: r.finished_s)
    sizes = [r.size for r in trace]
    batches = len(sizes)
    mean = sum(sizes) / batches if batches else 0.0
    std = (sum((s - mean) ** 2 for s in sizes) / batches) ** 0.5 if batches else 0.0
    model_time = sum(s.get("model_time_s", 0.0) for s in servers)
    return {
        "backend": config.backend,
        "num_procs": config.num_procs,
        "num_servers": config.num_servers,
        "wall_time_s": wall_time,
        "batches": batches,
        "elements": sum(sizes),
        "mean_batch_size": mean,
        "std_batch_size": std,
        "model_time_s": model_time,
        "fraction_in_model": (model_time / wall_time / max(len(servers), 1)
                              if wall_time > 0 else 0.0),
        "servers": servers,
        "trace": trace,
    }


#: ``progress(elements)``: called in the calling process as batches complete, with the
#: number of elements evaluated since the last call.
Progress = Callable[[int], None]


def loop_factory(use_uvloop: bool) -> Callable[[], Any] | None:
    """uvloop's loop factory when asked for and installed, else None (asyncio's)."""
    if use_uvloop:
        try:
            import uvloop
            return uvloop.new_event_loop
        except ImportError:
            pass
    return None


def raise_failures(failures: Dict[int, BaseException], total: int) -> None:
    """Raises SearchError naming every failed start, chained to the first failure."""
    if failures:
        first = min(failures)
        raise SearchError(f"{len(failures)} of {total} searches failed; the first, start "
                          f"{first}: {failures[first]!r}; every failed start: "
                          f"{sorted(failures)}", dict(sorted(failures.items()))
                          ) from failures[first]


def finish(results: List[Any], failures: Dict[int, BaseException],
           config: RunConfig) -> List[Any]:
    """The results in the order of the starts: with ``return_exceptions``, each failed
    start holds its exception; else SearchError when any failed (``raise_failures``)."""
    if config.return_exceptions:
        for index, error in failures.items():
            results[index] = error
        return results
    raise_failures(failures, len(results))
    return results
