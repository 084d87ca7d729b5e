"""The experiments of ``main.py``: which runs make up each, and running them in turn.

- ``default_runs``: the synchronous baseline, async in one process, the process backend
  with 1 and 2 clients, the Ray backend with 1 and 2 clients.
- ``continuous_runs``: continuous A* with batches up to 1024, searches in a worker
  process and the server here (and the baseline).
- ``multi_server_runs``: Ray with several servers and client processes (and the
  baseline).

``run_experiment`` runs them on one workload, checks every run's results against the
reference (the baseline, or the first run without it), reports each run through a
callback as it finishes, and saves the figures (JSON) and the plot (PNG).
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from typing import Callable, List, Optional, Sequence, Tuple

from async_search.experiments.config import ModelConfig, RunSpec, SearchConfig
from async_search.experiments.plots import plot_runs
from async_search.experiments.progress import progress_bar
from async_search.experiments.report import save_json
from async_search.experiments.runs import RunReport, run_one
from async_search.experiments.workloads import Workload, make_workload, trained_name


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A workload and the runs that place it."""

    title: str
    """What the plot and the JSON call it."""
    search: SearchConfig
    """What each search does."""
    model: ModelConfig
    """The network."""
    runs: Tuple[RunSpec, ...]
    """The runs, in order; a baseline, if any, comes first and is the reference."""

    def __post_init__(self) -> None:
        # Each part checked itself when made; what is left is how they fit together.
        if not self.runs:
            raise ValueError("an experiment needs at least one run")
        if self.model.trained:
            trained_name(self.search.search, self.search.puzzle_size)


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    """What ``run_experiment`` produced."""

    reports: Tuple[RunReport, ...]
    """One per run that finished, in order."""
    failures: Tuple[Tuple[str, str], ...]
    """``(run name, error)`` for each run that raised."""
    json_path: Optional[str]
    """Where the figures were saved."""
    png_path: Optional[str]
    """Where the plot was saved."""

    @property
    def ok(self) -> bool:
        """True when every run finished with results equal to the reference's."""
        return not self.failures and all(r.matches_baseline is not False
                                         for r in self.reports)


def default_runs(*, max_batch_size: int = 256, use_uvloop: bool = False,
                 skip_sync: bool = False,
                 backends: Sequence[str] = ("local", "process", "ray"),
                 clients: Sequence[int] = (1, 2)) -> Tuple[RunSpec, ...]:
    """The default comparison: baseline, one process, processes and Ray with 1, 2 clients."""
    common = dict(max_batch_size=max_batch_size, use_uvloop=use_uvloop)
    runs: List[RunSpec] = []
    if not skip_sync:
        runs.append(RunSpec("sync", "baseline (no batching)", None, **common))
    if "local" in backends:
        runs.append(RunSpec("async", "async, one process", "local", **common))
    for backend, group in (("process", "multiprocessing"), ("ray", "ray")):
        if backend in backends:
            runs += [RunSpec(f"{backend} x{n}", group, backend, num_procs=n, **common)
                     for n in clients]
    return tuple(runs)


def continuous_runs(*, max_batch_size: int = 1024, use_uvloop: bool = False,
                    skip_sync: bool = False) -> Tuple[RunSpec, ...]:
    """Continuous A*: the baseline, then one worker process served from here."""
    runs = [] if skip_sync else [RunSpec("sync", "baseline (no batching)", None,
                                         use_uvloop=use_uvloop)]
    runs.append(RunSpec("continuous", "continuous, worker process", "process",
                        num_procs=1, max_batch_size=max_batch_size, use_uvloop=use_uvloop))
    return tuple(runs)


def _count(n: int, noun: str) -> str:
    """``"1 server"``, ``"2 servers"``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def multi_server_runs(*, num_procs: int = 2, num_servers: int = 2,
                      total_gpu_frac: Optional[float] = 0.6, max_batch_size: int = 256,
                      use_uvloop: bool = False, skip_sync: bool = False,
                      address: Optional[str] = None) -> Tuple[RunSpec, ...]:
    """Ray with ``num_servers`` servers and ``num_procs`` clients (and the baseline)."""
    runs = [] if skip_sync else [RunSpec("sync", "baseline (no batching)", None,
                                         use_uvloop=use_uvloop)]
    runs.append(RunSpec(f"ray {_count(num_procs, 'client')}, "
                        f"{_count(num_servers, 'server')}",
                        "ray, multi-server",
                        "ray", num_procs=num_procs, num_servers=num_servers,
                        max_batch_size=max_batch_size, use_uvloop=use_uvloop,
                        total_gpu_frac=total_gpu_frac, address=address))
    return tuple(runs)


def json_path_for(save_path: str) -> str:
    """The JSON file beside a plot: ``results/results.png`` -> ``results/results.json``."""
    return os.path.splitext(save_path)[0] + ".json"


def run_experiment(experiment: Experiment, *, save_path: Optional[str] = None,
                   show_progress: bool = True,
                   on_report: Optional[Callable[[RunReport], None]] = None,
                   on_failure: Optional[Callable[[str, str], None]] = None,
                   command: Optional[str] = None,
                   workload: Optional[Workload] = None) -> ExperimentResult:
    """Runs every run of ``experiment`` in turn; saves the plot and JSON at the end.

    A run that raises is recorded in ``failures`` (and passed to ``on_failure``) and the
    others still run; a run whose results differ from the reference's is reported with
    ``matches_baseline=False``.

    Args:
        experiment: what to run.
        save_path: the PNG to write; the JSON goes beside it. None saves nothing.
        show_progress: a tqdm bar over model evaluations during each run.
        on_report: called with each run's report as it finishes.
        on_failure: called with ``(run name, error text)`` when a run raises.
        command: the command line, recorded in the JSON.
        workload: ``make_workload`` of the experiment, when the caller made it already
            (its starts are not built twice: a large scramble costs seconds).
    """
    if workload is None:
        workload = make_workload(experiment.search, experiment.model)
    workload.model_factory()  # build and trace the net here, before any clock starts
    reports: List[RunReport] = []
    failures: List[Tuple[str, str]] = []
    reference = None
    for spec in experiment.runs:
        try:
            with progress_bar(spec.name, workload.expected_elements,
                              enabled=show_progress) as update:
                results, report = run_one(spec, workload, update, reference)
        except Exception as e:  # keep the other runs: report this one and go on
            error = "".join(traceback.format_exception_only(type(e), e)).strip()
            failures.append((spec.name, error))
            if on_failure is not None:
                on_failure(spec.name, error)
            continue
        if reference is None:
            reference = results
        reports.append(report)
        if on_report is not None:
            on_report(report)
    json_path = png_path = None
    if save_path and reports:  # the figures first: a plot that fails loses none of them

        def save(plot: Optional[str]) -> str:
            return save_json(
                json_path_for(save_path), title=experiment.title, command=command,
                params={"search": dataclasses.asdict(experiment.search),
                        "model": dataclasses.asdict(experiment.model),
                        "runs": [dataclasses.asdict(s) for s in experiment.runs],
                        "workload": workload.describe()},
                reports=reports,
                extra={"plot": plot, "failures": [list(f) for f in failures]})

        # "plot" names the PNG once it is this run's: a stop (or a failure) while it is
        # drawn leaves null there, not the name of an earlier run's picture.
        json_path = save(None)
        plot = plot_runs(reports, save_path, title=experiment.title,
                         subtitle=workload.describe())
        import matplotlib.pyplot as plt
        plt.close(plot)
        png_path = save_path
        save(png_path)
    return ExperimentResult(tuple(reports), tuple(failures), json_path, png_path)
