"""Text and JSON reports of runs: one block per run, a summary table, the saved figures."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from typing import Any, Dict, List, Optional, Sequence

from async_search.machine import usable_cpus
from async_search.experiments.runs import RunReport
from async_search.files import write_json


def _s(seconds: float) -> str:
    """Seconds with two decimals, three below one second."""
    return f"{seconds:.2f}" if seconds >= 1 else f"{seconds:.3f}"


def _placement(r: RunReport) -> str:
    if r.backend == "sync":
        return "synchronous baseline: one search after another, no batching"
    procs = f"{r.num_procs} client process{'es' if r.num_procs != 1 else ''}"
    servers = f"{r.num_servers} server{'s' if r.num_servers != 1 else ''}"
    if r.backend == "local":
        return f"every search in one event loop, {servers}"
    return f"{r.backend} backend, {procs}, {servers}"


def _found(summary: Dict[str, Any]) -> str:
    """``8 searches: 8 solved (mean path 63.2 moves)``, then the other statuses."""
    n = summary.get("searches", 0)
    parts = []
    if "solved" in summary:
        solved = f"{summary['solved']} solved"
        if summary.get("mean_path_length") is not None:
            solved += f" (mean path {summary['mean_path_length']:.1f} moves)"
        parts.append(solved)
    parts += [f"{v} {k}" for k, v in summary.items()
              if k not in ("searches", "evaluations", "actions", "solved",
                           "mean_path_length", "goal_found")]
    if "actions" in summary:
        parts.append("actions " + " ".join(str(a) for a in summary["actions"]))
    return f"{n} search{'es' if n != 1 else ''}: " + ", ".join(parts)


def format_report(r: RunReport) -> str:
    """The figures of one run, in the prototype's layout."""
    lines = [
        f"Finished {r.label} ({_placement(r)})",
        f"  Total search time: {_s(r.search_time_s)} s"
        + (f"   (call {_s(r.elapsed_s)} s, start-up included)"
           if r.elapsed_s - r.search_time_s > 0.05 else ""),
        f"  Total model time : {_s(r.model_time_s)} s",
        f"  Fraction in model: {100 * r.fraction_in_model:.2f} %",
        "  Batch info",
        f"    num_batches:  {r.batches}",
        f"    num elements: {r.elements}",
        f"    size mean:    {r.mean_batch_size:.2f}",
        f"    size std:     {r.std_batch_size:.2f}",
        f"  Results: {_found(r.summary)}",
    ]
    if r.matches_baseline is True:
        lines.append("  Results equal the reference run's: yes")
    elif r.matches_baseline is False:
        lines.append(f"  RESULTS DIFFER from the reference run's: {r.mismatch}")
    return "\n".join(lines)


_COLUMNS = ("run", "solved", "mean path", "search s", "call s", "model s", "in model",
            "batches", "elements", "mean batch", "std batch", "speed-up", "equal")


def _solved_cells(summary: Dict[str, Any]) -> List[str]:
    """``8/8`` and the mean path length, or ``-`` for searches without a goal (MCTS)."""
    if "solved" not in summary:
        return ["-", "-"]
    mean = summary.get("mean_path_length")
    return [f"{summary['solved']}/{summary.get('searches', 0)}",
            "-" if mean is None else f"{mean:.1f}"]


def _row(r: RunReport, reference_time: float) -> List[str]:
    equal = {None: "ref", True: "yes", False: "NO"}[r.matches_baseline]
    speedup = reference_time / r.search_time_s if r.search_time_s > 0 else float("nan")
    return [r.label, *_solved_cells(r.summary), _s(r.search_time_s), _s(r.elapsed_s),
            _s(r.model_time_s), f"{100 * r.fraction_in_model:.1f} %", str(r.batches),
            str(r.elements), f"{r.mean_batch_size:.1f}",
            f"{r.std_batch_size:.1f}", f"{speedup:.2f}x", equal]


def format_table(reports: Sequence[RunReport], *, markdown: bool = False) -> str:
    """One row per run; speed-up is the first run's search time over the run's.

    *solved*: searches that reached a goal, of all; *mean path*: the mean length in
    moves of the solved searches' paths (``-`` for MCTS, which has no goal to reach).
    """
    if not reports:
        return ""
    reference_time = reports[0].search_time_s
    rows = [_row(r, reference_time) for r in reports]
    if markdown:
        head = "| " + " | ".join(_COLUMNS) + " |"
        rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(_COLUMNS))) + "|"
        return "\n".join([head, rule] + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(_COLUMNS)]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(_COLUMNS), line(["-" * w for w in widths])]
                     + [line(row) for row in rows])


def environment() -> Dict[str, Any]:
    """Where the figures were measured: machine, Python and library versions."""
    versions = {}
    for name in ("numpy", "tensorflow", "ray", "uvloop"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = getattr(module, "__version__", "?")
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "system": platform.platform(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),  # this process's affinity (taskset, a cpuset)
        "python": platform.python_version(),
        "versions": versions,
    }


def save_json(path: str, *, title: str, command: Optional[str], params: Dict[str, Any],
              reports: Sequence[RunReport], extra: Optional[Dict[str, Any]] = None) -> str:
    """Writes every printed figure to ``path`` (folders made as needed), atomically
    (``files.write_json``): a failed write leaves the previous file whole and raises
    ``FileWriteError`` naming it. Returns ``path``."""
    payload = {
        "title": title,
        "command": command,
        "params": params,
        "environment": environment(),
        "runs": [r.figures() for r in reports],
    }
    if extra:
        payload.update(extra)
    return write_json(path, payload, indent=2, default=_jsonable)


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)
