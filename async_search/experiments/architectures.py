"""The inference-architecture experiment: self-play through pipe, queue and client.

For each topology (see ``topologies``), the parent starts every process, waits until all
are ready (servers have built their model), then times the clients from the start signal
until the last one has its samples. Start-up is reported apart and not counted. Every
wait is bounded by ``TopologyConfig.timeout_s``; a process that fails or dies stops the
run with its error, and every process is ended on the way out.

Printed per topology: the positions played and the time they took, cache hit rate, mean
batch size. Every slot plays whole games until it holds its quota, so more positions are
played than asked for (``--num_samples``): the time and the rate are those of the
positions played. The samples (the first ``num_samples`` positions) must be the same
whatever the topology (the nets are row-independent and the games deterministic);
``ArchitecturesResult.samples_equal`` says whether they were.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import multiprocessing
import queue as queue_lib
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from async_search.experiments.config import ModelConfig
from async_search.experiments.progress import progress_bar
from async_search.experiments.report import save_json
from async_search.experiments.selfplay import SamplesConfig, samples_digest
from async_search.experiments.topologies import (ARCHITECTURES, CACHING, TopologyConfig,
                                                 build)
from async_search.experiments.workloads import build_model
from async_search.process_tree import starting_children
from async_search.queues import close_stream


_DESCRIPTIONS = {
    "pipe": "clients -> pipes -> load balancer -> pipes -> servers",
    "queue": "clients -> request queue -> cache manager -> inference queue -> servers",
    "client": "clients (own cache) -> server, directly",
}


@dataclasses.dataclass(frozen=True)
class ArchitectureReport:
    """Every figure of one topology's run; times in seconds."""

    architecture: str
    """pipe, queue or client."""
    caching: str
    """Where results are cached."""
    num_clients: int
    """Self-play client processes."""
    num_servers: int
    """Inference server processes."""
    samples: int
    """Positions played: each slot plays whole games until it holds its quota, so at
    least ``samples_asked``; ``time_s`` is the time they took."""
    time_s: float
    """From the start signal until the last client had played its games."""
    startup_s: float
    """From starting the processes until all were ready (not in ``time_s``)."""
    lookups: int
    """Elements looked up in the cache(s)."""
    hits: int
    """Lookups answered from the cache."""
    deduplicated: int
    """Lookups that joined an identical element in flight."""
    hit_rate: float
    """hits / lookups."""
    batches: int
    """Model calls, over all servers."""
    elements: int
    """Elements the servers evaluated."""
    mean_batch_size: float
    """elements / batches."""
    model_time_s: float
    """Seconds in the model, summed over servers."""
    digest: str
    """A digest of the samples: equal digests, equal samples."""
    samples_equal: Optional[bool] = None
    """Whether the samples equal the first topology's; None for the first."""
    samples_asked: Optional[int] = None
    """Positions asked for (``SamplesConfig.num_samples``): the samples compared."""

    @property
    def samples_per_s(self) -> float:
        """Positions played per second."""
        return self.samples / self.time_s if self.time_s > 0 else 0.0

    def figures(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        out["samples_per_s"] = self.samples_per_s
        return out


@dataclasses.dataclass(frozen=True)
class ArchitecturesResult:
    """What ``run_architectures`` produced."""

    reports: Tuple[ArchitectureReport, ...]
    failures: Tuple[Tuple[str, str], ...]
    json_path: Optional[str]

    @property
    def samples_equal(self) -> bool:
        return all(r.samples_equal is not False for r in self.reports)

    @property
    def ok(self) -> bool:
        return not self.failures and self.samples_equal


class _Failed(RuntimeError):
    """A process of the topology failed, died, or did not answer in time."""


def _wait_events(events: Any, procs: Dict[str, Any], deadline: float,
                 want: Callable[[], bool], handle: Callable[[tuple], None]) -> None:
    """Handles events until ``want()`` is false; fails on an error, a dead process, or
    the deadline."""
    while want():
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise _Failed("timed out waiting for the processes")
        try:
            event = events.get(timeout=min(remaining, 0.5))
        except queue_lib.Empty:
            for name, p in procs.items():
                if p.exitcode not in (None, 0):
                    raise _Failed(f"{name} died with exit code {p.exitcode}")
            continue
        if event[0] == "error":
            last = event[2].strip().splitlines()[-1]
            raise _Failed(f"{event[1]} failed: {last}")
        handle(event)


def _end(procs, graceful: bool) -> None:
    """Ends every process: waits a little for those that are finishing, kills the rest
    (at once, after a failure: nobody will answer them)."""
    procs = [p for p in procs if p.pid is not None]  # one never started has no end
    if graceful:
        for p in procs:
            p.join(timeout=5)
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=5)


def run_topology(architecture: str, samples: SamplesConfig, topology: TopologyConfig,
                 model: ModelConfig, *, progress: Optional[Callable[[int], None]] = None,
                 on_start: Optional[Callable[[], None]] = None) -> ArchitectureReport:
    """Runs self-play through one topology of real processes; returns its figures.

    ``on_start()`` is called when every process is ready, as the clock starts (a
    progress bar opened then leaves the start-up out of its rate); ``progress(n)``
    after each game, with its positions.

    Raises:
        RuntimeError: naming the process that failed, died, or timed out.
    """
    context = multiprocessing.get_context("spawn")
    events = context.Queue()
    start = context.Event()
    model_factory = functools.partial(build_model, "mcts", 4, model)
    wiring = build(architecture, samples, topology, model_factory, events=events,
                   start=start)
    procs = {spec.name: context.Process(target=spec.target, args=spec.args, name=spec.name,
                                        daemon=True) for spec in wiring.processes}
    roles = {spec.name: spec.role for spec in wiring.processes}
    ready: set = set()
    clients: Dict[str, tuple] = {}
    relays: Dict[str, dict] = {}
    servers: Dict[str, dict] = {}

    def handle(event):
        kind = event[0]
        if kind == "ready":
            ready.add(event[1])
        elif kind == "progress":
            if progress is not None:
                progress(event[1])
        elif kind == "client":
            clients[event[1]] = (event[2], event[3])
        elif kind == "relay":
            relays[event[1]] = event[2]
        elif kind == "server":
            servers[event[1]] = event[2]

    launched = time.perf_counter()
    finished = False
    try:
        with starting_children():  # deaf to Ctrl-C; a stop waits until they have started
            for p in procs.values():
                p.start()
        deadline = time.perf_counter() + topology.timeout_s
        _wait_events(events, procs, deadline, lambda: len(ready) < len(procs), handle)
        t0 = time.perf_counter()
        startup = t0 - launched
        if on_start is not None:
            on_start()
        start.set()
        num_clients = sum(1 for r in roles.values() if r == "client")
        deadline = time.perf_counter() + topology.timeout_s
        _wait_events(events, procs, deadline, lambda: len(clients) < num_clients, handle)
        elapsed = time.perf_counter() - t0
        for q in wiring.close:  # every relay and server reads to the end of its streams
            close_stream(q)
        num_relays = sum(1 for r in roles.values() if r == "relay")
        num_servers = sum(1 for r in roles.values() if r == "server")
        deadline = time.perf_counter() + topology.timeout_s
        _wait_events(events, procs, deadline,
                     lambda: len(relays) < num_relays or len(servers) < num_servers,
                     handle)
        finished = True
    except _Failed as e:
        raise RuntimeError(f"{architecture}: {e}") from None
    finally:
        _end(procs.values(), graceful=finished)

    by_slot: Dict[int, list] = {}
    caches = list(relays.values())
    for slot_samples, cache in clients.values():
        by_slot.update(slot_samples)
        if cache is not None:
            caches.append(cache)
    per_slot = [by_slot[s] for s in sorted(by_slot)]
    positions = sum(len(record.moves) for slot in per_slot for record in slot)
    lookups = sum(c["lookups"] for c in caches)
    hits = sum(c["hits"] for c in caches)
    batches = sum(s["batches"] for s in servers.values())
    elements = sum(s["elements"] for s in servers.values())
    return ArchitectureReport(
        architecture=architecture, caching=CACHING[architecture],
        num_clients=topology.num_clients, num_servers=topology.num_servers,
        samples=positions, samples_asked=samples.num_samples, time_s=elapsed,
        startup_s=startup, lookups=lookups, hits=hits,
        deduplicated=sum(c["deduplicated"] for c in caches),
        hit_rate=hits / lookups if lookups else 0.0, batches=batches, elements=elements,
        mean_batch_size=elements / batches if batches else 0.0,
        model_time_s=sum(s["model_time_s"] for s in servers.values()),
        digest=samples_digest(per_slot, samples.num_samples))


def _run_with_bar(name: str, samples: SamplesConfig, topology: TopologyConfig,
                  model: ModelConfig, show_progress: bool) -> ArchitectureReport:
    """``run_topology`` with a bar over positions played, opened once start-up is over
    (its rate is self-play's). Its total, the positions asked for, is passed by whole
    games: the bar's total follows the count."""
    with contextlib.ExitStack() as stack:
        update: List[Callable[[int], None]] = []

        def on_start() -> None:
            bar = stack.enter_context(progress_bar(name, samples.num_samples,
                                                   enabled=show_progress,
                                                   unit="position"))
            if bar is not None:
                update.append(bar)

        def progress(n: int) -> None:
            for bar in update:
                bar(n)

        return run_topology(name, samples, topology, model, progress=progress,
                            on_start=on_start)


def run_architectures(names: Sequence[str], samples: SamplesConfig,
                      topology: TopologyConfig, model: ModelConfig, *,
                      save_path: Optional[str] = None, show_progress: bool = True,
                      on_report: Optional[Callable[[ArchitectureReport], None]] = None,
                      on_failure: Optional[Callable[[str, str], None]] = None,
                      command: Optional[str] = None) -> ArchitecturesResult:
    """Runs each topology in turn; checks that they all produce the same samples; saves
    the figures as JSON at ``save_path`` with a ``.json`` suffix."""
    for name in names:
        if name not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {', '.join(ARCHITECTURES)}, "
                             f"got {name!r}")
    reports: List[ArchitectureReport] = []
    failures: List[Tuple[str, str]] = []
    for name in names:
        try:
            report = _run_with_bar(name, samples, topology, model, show_progress)
        except Exception as e:
            error = "".join(traceback.format_exception_only(type(e), e)).strip()
            failures.append((name, error))
            if on_failure is not None:
                on_failure(name, error)
            continue
        if reports:
            report = dataclasses.replace(report,
                                         samples_equal=report.digest == reports[0].digest)
        reports.append(report)
        if on_report is not None:
            on_report(report)
    json_path = None
    if save_path and reports:
        import os
        json_path = save_json(
            os.path.splitext(save_path)[0] + ".json",
            title="Inference architectures for self-play", command=command,
            params={"samples": dataclasses.asdict(samples),
                    "topology": dataclasses.asdict(topology),
                    "model": dataclasses.asdict(model)},
            reports=[], extra={"architectures": [r.figures() for r in reports],
                               "failures": [list(f) for f in failures]})
    return ArchitecturesResult(tuple(reports), tuple(failures), json_path)


def format_architecture(r: ArchitectureReport) -> str:
    """The figures of one topology."""
    lines = [
        f"Finished {r.architecture} ({_DESCRIPTIONS[r.architecture]}; cache "
        f"{r.caching}; {r.num_clients} clients, {r.num_servers} servers)",
        f"  Time to play {r.samples} positions{_asked(r)}: {r.time_s:.2f} s   "
        f"({r.samples_per_s:.0f} positions/s; start-up {r.startup_s:.1f} s, not counted)",
        f"  Cache hit rate: {100 * r.hit_rate:.1f} % ({r.hits} of {r.lookups} lookups; "
        f"{r.deduplicated} more merged in flight)",
        f"  Batch info: {r.batches} batches, {r.elements} elements, mean size "
        f"{r.mean_batch_size:.2f}; model time {r.model_time_s:.2f} s",
    ]
    if r.samples_equal is True:
        lines.append("  Samples equal the first topology's: yes")
    elif r.samples_equal is False:
        lines.append("  SAMPLES DIFFER from the first topology's")
    return "\n".join(lines)


def _asked(r: ArchitectureReport) -> str:
    """`` (whole games; 1000 asked for)`` where the positions played are not those asked
    for."""
    if r.samples_asked is None or r.samples_asked == r.samples:
        return ""
    return f" (whole games; {r.samples_asked} asked for)"


_COLUMNS = ("architecture", "caching", "positions", "time (s)", "positions/s",
            "cache hit rate", "mean batch size", "batches", "equal")


def format_architecture_table(reports: Sequence[ArchitectureReport], *,
                              markdown: bool = False) -> str:
    """One row per topology: architecture, caching, positions played, their time and
    rate, hit rate, mean batch size."""
    if not reports:
        return ""
    header = list(_COLUMNS)
    rows = [[r.architecture, r.caching, str(r.samples), f"{r.time_s:.2f}",
             f"{r.samples_per_s:.0f}",
             f"{100 * r.hit_rate:.1f} %", f"{r.mean_batch_size:.2f}", str(r.batches),
             {None: "ref", True: "yes", False: "NO"}[r.samples_equal]] for r in reports]
    if markdown:
        rule = "|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|"
        return "\n".join(["| " + " | ".join(header) + " |", rule]
                         + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])]
                     + [line(row) for row in rows])
