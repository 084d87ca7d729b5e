"""The experiments that ``main.py`` runs: workloads, runs, reports, plots.

Apart from the library (which prints nothing and reports progress through callbacks),
this package owns progress bars, printed reports, JSON figures and seaborn plots.

Example:
    >>> from async_search.experiments import (Experiment, ModelConfig, SearchConfig,
    ...                                       default_runs, run_experiment)
    >>> exp = Experiment("demo", SearchConfig(num_searches=2, gnn_budget=50),
    ...                  ModelConfig(kind="numpy"),
    ...                  default_runs(backends=("local",)))
    >>> result = run_experiment(exp, show_progress=False)
    >>> [r.name for r in result.reports], result.ok
    (['sync', 'async'], True)
"""

from async_search.experiments.config import MODELS, SEARCHES, ModelConfig, RunSpec, SearchConfig
from async_search.experiments.plots import plot_runs
from async_search.experiments.report import format_report, format_table, save_json
from async_search.experiments.runs import RunReport, compare_results, run_one
from async_search.experiments.suites import (Experiment, ExperimentResult, continuous_runs,
                                             default_runs, json_path_for,
                                             multi_server_runs, run_experiment)
from async_search.experiments.workloads import Workload, make_workload, summarize

__all__ = [
    "SEARCHES", "MODELS", "SearchConfig", "ModelConfig", "RunSpec",
    "Workload", "make_workload", "summarize",
    "RunReport", "run_one", "compare_results",
    "format_report", "format_table", "save_json", "plot_runs",
    "Experiment", "ExperimentResult", "default_runs", "continuous_runs",
    "multi_server_runs", "run_experiment", "json_path_for",
]
