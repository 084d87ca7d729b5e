"""Running one placement of a workload, and what a run reports.

``run_one`` runs a ``RunSpec`` on a ``Workload``: the synchronous baseline (every search
in turn, every request its own model call through ``asr.immediate``), or one call of
``asr.run_searches``. It returns the results and a ``RunReport`` holding every figure
that is printed, plotted and saved, and the batch trace for the plots.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import async_search as asr
from async_search.event_loops import loop_factory
from async_search.experiments.config import RunSpec
from async_search.experiments.workloads import Workload, summarize
from async_search.servers.stats import BatchRecord


#: ``progress(n)``: n more elements were evaluated.
Progress = Callable[[int], None]


@dataclasses.dataclass(frozen=True)
class RunReport:
    """Every figure of one run; times in seconds."""

    name: str
    """The run's name (``process x2``)."""
    group: str
    """The plot panel it belongs to."""
    backend: str
    """``sync`` for the baseline, else the backend of ``run_searches``."""
    num_procs: int
    """Client processes (Ray tasks)."""
    num_servers: int
    """Model servers."""
    search_time_s: float
    """Wall time of the searches, as the runner measured it (from the first model call
    it could make to the last result: building the models is left out on every
    backend; for Ray and processes, starting the clients is in)."""
    elapsed_s: float
    """Wall time of the whole call, measured around it (starting Ray, and building
    the models, included; the synchronous baseline builds its model before its clock
    starts)."""
    model_time_s: float
    """Seconds spent in the model, summed over servers."""
    fraction_in_model: float
    """Model time over search time, per server (0..1)."""
    batches: int
    """Model calls."""
    elements: int
    """Elements evaluated."""
    mean_batch_size: float
    """Elements per batch."""
    std_batch_size: float
    """Standard deviation of the batch size."""
    matches_baseline: Optional[bool]
    """Whether the results equal the reference run's; None for the reference."""
    mismatch: str = ""
    """When they do not: which search differs, and how."""
    num_procs_requested: Optional[int] = None
    """The client processes asked for (``num_procs`` counts those started: no more than
    the searches); None for the baseline."""
    summary: Dict[str, Any] = dataclasses.field(default_factory=dict)
    """What the searches found (``workloads.summarize``)."""
    trace: Tuple[BatchRecord, ...] = ()
    """One record per batch, by finishing time (for the plots; not saved)."""

    @property
    def label(self) -> str:
        """The name, and how many client processes started where fewer did than the
        name asks for (no more start than there are searches)."""
        requested = self.num_procs_requested
        if requested is None or self.backend in ("sync", "local") or \
                self.num_procs == requested:
            return self.name
        return f"{self.name} ({self.num_procs} started)"

    def figures(self) -> Dict[str, Any]:
        """Every printed figure, JSON-ready (the trace left out)."""
        out = dataclasses.asdict(self)
        del out["trace"]
        return out


async def _sequential(workload: Workload, model: Any, progress: Optional[Progress],
                      ) -> Tuple[List[Any], float, List[BatchRecord], dict]:
    on_batch = (lambda record: progress(record.size)) if progress is not None else None
    # It keeps the stats and the trace itself: every model call, for the plots.
    ev = asr.immediate(model, on_batch=on_batch, trace_size=None)
    start = time.perf_counter()
    results = []
    for s in workload.starts:
        results.append(await workload.search_fn(s, ev))
    wall = time.perf_counter() - start
    return results, wall, ev.trace, ev.stats


def run_baseline(spec: RunSpec, workload: Workload, progress: Optional[Progress] = None,
                 ) -> Tuple[List[Any], RunReport]:
    """The synchronous baseline: each search in turn, each request one model call."""
    model = workload.model_factory()  # built and traced before the clock starts
    t0 = time.perf_counter()
    with asyncio.Runner(loop_factory=loop_factory(spec.use_uvloop)) as runner:
        results, wall, trace, stats = runner.run(_sequential(workload, model, progress))
    elapsed = time.perf_counter() - t0
    report = RunReport(
        name=spec.name, group=spec.group, backend="sync", num_procs=1, num_servers=1,
        search_time_s=wall, elapsed_s=elapsed, model_time_s=stats["model_time_s"],
        fraction_in_model=stats["model_time_s"] / wall if wall > 0 else 0.0,
        batches=stats["batches"], elements=stats["elements"],
        mean_batch_size=stats["mean_batch_size"], std_batch_size=stats["std_batch_size"],
        matches_baseline=None, summary=summarize(results),
        trace=tuple(trace))
    return results, report


def run_one(spec: RunSpec, workload: Workload, progress: Optional[Progress] = None,
            reference: Optional[Sequence[Any]] = None) -> Tuple[List[Any], RunReport]:
    """Runs ``workload`` as ``spec`` says; compares the results with ``reference``.

    Raises:
        SearchError: when a search (or a client process) failed.
    """
    if spec.is_baseline:
        results, report = run_baseline(spec, workload, progress)
    else:
        t0 = time.perf_counter()
        out = asr.run_searches(workload.search_fn, workload.starts, workload.model_factory,
                               progress=progress, **spec.runner_kwargs())
        elapsed = time.perf_counter() - t0
        s = out.stats
        results = list(out)
        report = RunReport(
            name=spec.name, group=spec.group, backend=s["backend"],
            num_procs=s["num_procs"], num_servers=s["num_servers"],
            num_procs_requested=s.get("num_procs_requested", spec.num_procs),
            search_time_s=s["wall_time_s"], elapsed_s=elapsed,
            model_time_s=s["model_time_s"], fraction_in_model=s["fraction_in_model"],
            batches=s["batches"], elements=s["elements"],
            mean_batch_size=s["mean_batch_size"], std_batch_size=s["std_batch_size"],
            matches_baseline=None, summary=summarize(results), trace=tuple(s["trace"]))
    if reference is not None:
        mismatch = compare_results(reference, results)
        report = dataclasses.replace(report, matches_baseline=not mismatch,
                                     mismatch=mismatch)
    return results, report


def compare_results(reference: Sequence[Any], results: Sequence[Any]) -> str:
    """'' when the results are equal, else a sentence naming the first difference."""
    if len(reference) != len(results):
        return f"{len(results)} results where the reference has {len(reference)}"
    for i, (a, b) in enumerate(zip(reference, results)):
        if a != b:
            return (f"search {i} of {len(results)} differs: reference "
                    f"{_brief(a)}, this run {_brief(b)}")
    return ""


def _brief(result: Any) -> str:
    fields = ("status", "cost", "action", "evaluations", "nodes_expanded", "requests")
    parts = []
    for f in fields:
        if hasattr(result, f):
            value = getattr(result, f)
            parts.append(f"{f}={getattr(value, 'value', value)}")
    return "(" + ", ".join(parts) + ")" if parts else repr(result)[:120]
