"""What a run of searches returns: the results in the order of the starts, its stats,
and the error that names every failed start."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from async_search.backends.config import RunConfig
from async_search.errors import SearchError
from async_search.servers.stats import BatchRecord


class SearchResults(list):
    """The results of ``run_searches`` in the order of the starts, with ``stats``.

    It is a list, so it compares equal to the list of results; ``stats`` is a dict:
    backend, num_procs, num_servers, wall_time_s, the serving figures summed over the
    servers (batches, elements, mean_batch_size, std_batch_size, model_time_s,
    fraction_in_model: model time over wall time per device worker, at most 1),
    ``servers`` (each server's own stats: a process or Ray client's message, its
    searches' requests of one loop iteration, is one of their ``requests``) and
    ``trace`` (a BatchRecord per batch of
    each server's latest ``trace_size``, 10,000 by default, ordered by time, its
    ``finished_s`` from ``trace_origin``, the ``time.perf_counter`` time the searches'
    clock started; the figures count every batch). The
    process and Ray backends add ``clients``: a dict per attempt (``attempt``, its
    ``starts``, ``worker``, ``node`` on Ray, how it ``ended``; once it finished,
    ``cpu_s`` and ``searching_s``: the client process's CPU (every thread's, Ray's own
    too in a Ray worker) and wall seconds while its searches ran, near equal when its
    CPU is the limit, far apart when it waits on its round trips; ``began_at`` and
    ``ended_at``, the ``time.perf_counter`` times its searches began and ended: the
    clock of the servers' ``started_at`` for a process on their machine). Every
    backend adds ``startup_s``: building the models and starting the servers (the
    server actors on Ray), left out of wall_time_s. The Ray backend adds
    ``servers_died``, ``servers_replaced``, ``server_nodes`` and
    ``server_gpus`` (per server started), ``routers`` and ``transports`` (per client
    task that finished).
    """

    def __init__(self, results: Sequence[Any], stats: dict):
        super().__init__(results)
        self.stats = stats


def merge_stats(config: RunConfig, wall_time: float, servers: List[dict],
                traces: List[List[BatchRecord]], num_clients: int | None = None,
                origin: float | None = None) -> dict:
    """The run's stats from each server's stats and trace, put on one clock: from
    ``origin``, the ``time.perf_counter`` time the searches' clock (``wall_time``)
    started, where given, else from the earliest server's start (perf_counter is one
    clock for the processes of a machine). ``num_procs`` is ``num_clients``, the client
    processes (tasks) the starts were shared among: fewer than ``config.num_procs``
    (``num_procs_requested``) when there are fewer starts; a retry starts another
    (``clients`` has an entry per attempt)."""
    if origin is None:
        origin = min((s.get("started_at", 0.0) for s in servers), default=0.0)
    trace = sorted((r._replace(finished_s=r.finished_s + s.get("started_at", 0.0) - origin)
                    for s, t in zip(servers, traces) for r in t),
                   key=lambda r: r.finished_s)
    # From the servers' counts: the trace keeps the latest batches only (10,000 by
    # default), and figures from it stopped counting there.
    batches = sum(s["batches"] for s in servers)
    elements = sum(s["elements"] for s in servers)
    mean = elements / batches if batches else 0.0
    # Pooled: each server's spread, and its mean's distance from the whole one.
    std = (sum(s["batches"] * (s["std_batch_size"] ** 2
                               + (s["mean_batch_size"] - mean) ** 2)
               for s in servers) / batches) ** 0.5 if batches else 0.0
    model_time = sum(s.get("model_time_s", 0.0) for s in servers)
    # Per device worker: the local and process backends' servers are the workers of
    # one BatchingServer, each adding its model time.
    workers = max(sum(max(s.get("workers", 1), 1) for s in servers), 1)
    return {
        "backend": config.backend,
        "num_procs": config.num_procs if num_clients is None else num_clients,
        "num_procs_requested": config.num_procs,
        "num_servers": config.num_servers,
        "wall_time_s": wall_time,
        "batches": batches,
        "elements": elements,
        "mean_batch_size": mean,
        "std_batch_size": std,
        "model_time_s": model_time,
        "fraction_in_model": model_time / wall_time / workers if wall_time > 0 else 0.0,
        "servers": servers,
        "trace": trace,
        # The trace's zero, a time.perf_counter time (the clients' began_at's clock)
        "trace_origin": origin,
    }


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
