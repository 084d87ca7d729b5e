"""Seaborn figures of runs: batch-size distributions and cumulative time per group.

One column per group of runs (the baseline, one process, worker processes, Ray). The top
row shows how batch sizes are distributed (percent of each run's batches); the bottom
row shows cumulative time against elements evaluated: total time solid, time in the
model dashed, one colour per run, the same colour in both rows; its legend says how many
searches each run solved and their mean path length. Bottom panels share
their axes, so the groups compare at a glance.
"""

from __future__ import annotations

import os
import textwrap
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from async_search.experiments.runs import RunReport
from async_search.extras import import_extra
from async_search.files import write_file


def batch_frame(reports: Sequence[RunReport]):
    """A pandas DataFrame with a row per batch: run, group, batch size, elements
    evaluated so far, total and model time so far (seconds)."""
    import pandas as pd

    frames = []
    for r in reports:
        if not r.trace:
            continue
        sizes = np.array([b.size for b in r.trace])
        frames.append(pd.DataFrame({
            "run": r.name, "group": r.group, "batch size": sizes,
            "elements evaluated": np.cumsum(sizes),
            "total time (s)": np.array([b.finished_s for b in r.trace]),
            "model time (s)": np.cumsum([b.model_s for b in r.trace]),
        }))
    columns = ["run", "group", "batch size", "elements evaluated", "total time (s)",
               "model time (s)"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def _thousands(x: float, _pos: Any = None) -> str:
    return f"{x / 1000:g}k" if abs(x) >= 1000 else f"{x:g}"


def _run_label_parts(r: RunReport) -> Tuple[str, str]:
    """The label (``RunReport.label``, with its colon) and what the run solved, as in
    ``sync:`` and `` 8/8 solved, mean path 63.2``; the bare label and nothing for
    searches without a goal (MCTS)."""
    if "solved" not in r.summary:
        return r.label, ""
    tail = f" {r.summary['solved']}/{r.summary.get('searches', 0)} solved"
    if r.summary.get("mean_path_length") is not None:
        tail += f", mean path {r.summary['mean_path_length']:.1f}"
    return f"{r.label}:", tail


#: The characters of a legend line that fit the width of a panel, in the small font:
#: the histograms' legends (framed, with a patch) and the time legends (a short line).
HISTOGRAM_LINE, TIME_LINE = 34, 40


def _fit(head: str, tail: str = "", width: int = TIME_LINE) -> str:
    """``head + tail``, or, where that is wider than ``width`` characters, the tail on
    lines of its own (both wrapped)."""
    if len(head) + len(tail) <= width:
        return head + tail
    lines = textwrap.wrap(head, width) + textwrap.wrap(tail.strip(), width)
    return "\n".join(lines)


#: Characters of the 12-point title per inch of figure that fit within its edges: about
#: 11 of DejaVu Sans (the default) on average, fewer of capitals and wide letters.
TITLE_CHARS_PER_INCH = 10


def title_lines(title: str, subtitle: str, width_in: float) -> str:
    """The title and the subtitle below it, each wrapped to a figure ``width_in`` inches
    wide, so that neither is cut at the figure's edges."""
    width = max(20, int(TITLE_CHARS_PER_INCH * width_in))
    lines = textwrap.wrap(title, width) if title else []
    lines += textwrap.wrap(subtitle, width) if subtitle else []
    return "\n".join(lines)


def _groups(reports: Sequence[RunReport]) -> Dict[str, List[RunReport]]:
    groups: Dict[str, List[RunReport]] = {}
    for r in reports:
        groups.setdefault(r.group, []).append(r)
    return groups


def plot_runs(reports: Sequence[RunReport], path: Optional[str] = None, *,
              title: str = "", subtitle: str = "") -> Any:
    """Draws the runs; saves the figure to ``path`` when given. Returns the figure.

    Example:
        The figure of ``main.py``, from the ``RunReport`` of each run (see
        ``run_one``):

        ```python
        fig = plot_runs(reports, "results/results.png", title="15-puzzle A*")
        ```
    """
    plt = import_extra("matplotlib.pyplot", "plot_runs")
    sns = import_extra("seaborn", "plot_runs")
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    sns.set_theme(style="whitegrid", context="notebook")
    groups = _groups(reports)
    names = [r.name for r in reports]
    palette = dict(zip(names, sns.color_palette("colorblind", max(len(names), 1))))
    frame = batch_frame(reports)
    columns = max(len(groups), 1)
    time_labels = {r.name: _fit(*_run_label_parts(r)) for r in reports}
    # Room below for the time legends: one line per run label line, and two more.
    legend_lines = max((sum(time_labels[r.name].count("\n") + 1 for r in runs) + 2
                        for runs in groups.values()), default=2)
    fig, axes = plt.subplots(2, columns, figsize=(4.3 * columns, 8.2 + 0.2 * legend_lines),
                             squeeze=False, gridspec_kw={"height_ratios": [1, 1.15]})
    bottom = axes[1, 0]
    for j, (group, runs) in enumerate(groups.items()):
        top, low = axes[0, j], axes[1, j]
        if j:
            low.sharex(bottom)
            low.sharey(bottom)
        data = frame[frame["group"] == group]
        if len(data):
            # The legend names each run with its mean batch size.
            labels = {r.name: _fit(r.label, f" (mean {r.mean_batch_size:.1f})",
                                   HISTOGRAM_LINE)
                      for r in runs}
            sizes = data["batch size"]
            span = int(sizes.max() - sizes.min()) + 1
            sns.histplot(data=data.assign(run=data["run"].map(labels)), x="batch size",
                         hue="run", stat="percent", common_norm=False,
                         discrete=span <= 40, bins="auto" if span <= 40 else 40,
                         element="step", alpha=0.35,
                         palette={labels[r.name]: palette[r.name] for r in runs}, ax=top)
            if top.get_legend() is not None:
                sns.move_legend(top, "upper center", ncol=1, frameon=True)
            top.set_ylim(0, top.get_ylim()[1] * 1.3)  # headroom: the legend sits above
            legend = top.get_legend()
            if legend is not None:
                legend.set_title(None)
                for text in legend.get_texts():
                    text.set_fontsize("small")
        top.set_title(group, fontweight="bold")
        top.set_xlabel("batch size (elements)")
        top.set_ylabel("batches (%)" if j == 0 else "")
        for r in runs:
            d = data[data["run"] == r.name]
            if not len(d):
                continue
            x = np.concatenate([[0], d["elements evaluated"].to_numpy()])
            colour = palette[r.name]
            low.plot(x, np.concatenate([[0], d["total time (s)"].to_numpy()]),
                     color=colour, lw=2, label=r.name)
            low.plot(x, np.concatenate([[0], d["model time (s)"].to_numpy()]),
                     color=colour, lw=2, ls="--")
        low.set_xlabel("elements evaluated")
        low.set_ylabel("cumulative time (s)" if j == 0 else "")
        handles = [Line2D([], [], color=palette[r.name], lw=2, label=time_labels[r.name])
                   for r in runs]
        handles += [Line2D([], [], color="0.3", lw=2, label="total time"),
                    Line2D([], [], color="0.3", lw=2, ls="--", label="model time")]
        # Below the axes, not on them: a run's curve may climb anywhere in the panel.
        low.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                   fontsize="small", frameon=False)
        low.xaxis.set_major_formatter(FuncFormatter(_thousands))
    if title or subtitle:
        fig.suptitle(title_lines(title, subtitle, fig.get_figwidth()), fontsize=12)
    finish_figure(fig, path)
    return fig


def finish_figure(fig: Any, path: Optional[str], *, title: str = "",
                  close: bool = False) -> None:
    """Lays the figure out and saves it to ``path`` (folders made) when given, atomically
    (``files.write_file``: a failed save leaves the previous image whole and raises
    ``FileWriteError`` naming it); with ``close``, frees it (pyplot keeps every open
    figure otherwise). The image format is the path's extension (PNG without one)."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path:
        kind = os.path.splitext(path)[1][1:].lower() or "png"
        write_file(path, lambda f: fig.savefig(f, format=kind, dpi=110))
    if close:
        import matplotlib.pyplot as plt
        plt.close(fig)
