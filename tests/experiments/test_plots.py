import os
import subprocess
import sys

import pytest

matplotlib = pytest.importorskip("matplotlib")  # the plot extra
matplotlib.use("Agg")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from async_search.experiments import RunReport, plot_runs  # noqa: E402
from async_search.experiments.plots import batch_frame  # noqa: E402
from async_search.servers.stats import BatchRecord  # noqa: E402


def run(name, group, sizes, summary=None):
    trace = tuple(BatchRecord(0.01 * (i + 1), s, 0.004) for i, s in enumerate(sizes))
    return RunReport(name=name, group=group, backend="local", num_procs=1, num_servers=1,
                     search_time_s=0.1, elapsed_s=0.1, model_time_s=0.05,
                     fraction_in_model=0.5, batches=len(sizes), elements=sum(sizes),
                     mean_batch_size=sum(sizes) / len(sizes), std_batch_size=1.0,
                     matches_baseline=None, trace=trace, summary=summary or {})


def test_batch_frame_accumulates_elements_and_model_time():
    frame = batch_frame([run("a", "g", [3, 4, 5])])
    assert frame["elements evaluated"].tolist() == [3, 7, 12]
    assert frame["model time (s)"].round(6).tolist() == [0.004, 0.008, 0.012]


def test_plot_has_a_column_per_group_and_is_saved(tmp_path):
    reports = [run("sync", "baseline", [8, 9, 7] * 20), run("p1", "procs", [60, 64] * 5),
               run("p2", "procs", [30, 34] * 10)]
    path = tmp_path / "sub" / "plot.png"
    fig = plot_runs(reports, str(path), title="t", subtitle="workload")
    assert path.stat().st_size > 10_000
    axes = fig.get_axes()
    assert len(axes) == 4  # 2 groups x (distribution, cumulative time)
    assert [a.get_title() for a in axes[:2]] == ["baseline", "procs"]
    procs_time = axes[3]
    assert len(procs_time.get_lines()) == 4  # total and model time of both runs
    labels = [t.get_text() for t in procs_time.get_legend().get_texts()]
    assert labels == ["p1", "p2", "total time", "model time"]
    top_labels = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert top_labels == ["p1 (mean 62.0)", "p2 (mean 32.0)"]
    matplotlib.pyplot.close(fig)


def test_the_time_legend_says_what_each_run_solved(tmp_path):
    solved = {"searches": 8, "solved": 8, "mean_path_length": 63.25}
    none = {"searches": 8, "solved": 0, "mean_path_length": None}
    fig = plot_runs([run("p1", "procs", [60, 64] * 5, solved),
                     run("p2", "procs", [30, 34] * 10, none)])
    labels = [t.get_text() for t in fig.get_axes()[1].get_legend().get_texts()]
    assert labels[:2] == ["p1: 8/8 solved, mean path 63.2", "p2: 0/8 solved"]
    matplotlib.pyplot.close(fig)


def test_both_legends_say_how_many_clients_started_where_fewer_did_than_asked():
    import dataclasses

    fewer = dataclasses.replace(run("ray 200 clients", "ray", [6, 8] * 5), backend="ray",
                                num_procs=8, num_procs_requested=200)
    fig = plot_runs([fewer])
    texts = [[t.get_text() for t in ax.get_legend().get_texts()]
             for ax in fig.get_axes() if ax.get_legend() is not None]
    assert ["ray 200 clients (8 started)\n(mean 7.0)"] in texts  # the batch sizes
    assert any("ray 200 clients (8 started)" in labels for labels in texts)  # the times
    matplotlib.pyplot.close(fig)


def test_legends_of_long_run_names_stay_within_their_panels_and_off_the_curves():
    solved = {"searches": 8, "solved": 8, "mean_path_length": 55.0}
    name = "ray 2 clients, 2 servers"
    fig = plot_runs([run("process x1", "baseline", [8, 9, 7] * 20, solved),
                     run(name, "ray, multi-server", [10, 20, 30] * 20, solved)])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.get_axes():
        box, legend = ax.get_window_extent(renderer), ax.get_legend()
        inside = legend.get_window_extent(renderer)
        assert box.x0 - 1 <= inside.x0 and inside.x1 <= box.x1 + 1, ax.get_title()
    top, low = fig.get_axes()[1], fig.get_axes()[3]
    fits = fig.get_axes()[2].get_legend().get_texts()[0].get_text()
    assert fits == "process x1: 8/8 solved, mean path 55.0"  # one line where it fits
    below = low.get_legend().get_window_extent(renderer)
    assert below.y1 <= low.get_window_extent(renderer).y0  # under the axes, not on them
    assert fig.bbox.contains(below.x0, below.y0)  # and still in the figure
    texts = [t.get_text() for t in low.get_legend().get_texts()]
    assert texts[0] == f"{name}:\n8/8 solved, mean path 55.0"  # the name line first
    assert [t.get_text() for t in top.get_legend().get_texts()] == [f"{name}\n(mean 20.0)"]
    matplotlib.pyplot.close(fig)


def test_the_image_format_is_the_paths_extension(tmp_path):
    fig = plot_runs([run("a", "g", [3, 4])], str(tmp_path / "p.svg"))
    matplotlib.pyplot.close(fig)
    assert (tmp_path / "p.svg").read_bytes().lstrip().startswith(b"<?xml")
    assert os.listdir(tmp_path) == ["p.svg"]


def test_a_full_disk_while_the_plot_is_saved_keeps_the_previous_image(tmp_path):
    path = tmp_path / "plot.png"
    fig = plot_runs([run("a", "g", [3, 4])], str(path))
    matplotlib.pyplot.close(fig)
    previous = path.read_bytes()
    script = f"""
import resource, signal, sys
sys.path.insert(0, {ROOT!r})
import matplotlib; matplotlib.use("Agg")
from tests.experiments.test_plots import run
from async_search.experiments import plot_runs
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    plot_runs([run("b", "g", [5, 6, 7] * 9)], {str(path)!r}, title="after")
except OSError as e:
    print(type(e).__name__, e.errno, e)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"FileWriteError 27 cannot write '{path}'"), out.stdout
    assert path.read_bytes() == previous and os.listdir(tmp_path) == ["plot.png"]


def test_the_title_of_a_one_column_figure_stays_within_its_edges():
    """One group (``--backends local --skip_sync``) makes a figure 4.3 in wide: its title
    and the workload line below it are wrapped to that width, not cut at both edges, and
    stay above the panels."""
    fig = plot_runs([run("async", "async, one process", [30] * 40)],
                    title="MCTS on Connect Four: baseline vs batched serving",
                    subtitle="8 mcts searches on Connect Four, budget 20000 evaluations "
                             "each, 4 leaves per round; trained tf net, seed 0")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    assert 0 <= title.x0 and title.x1 <= fig.bbox.width, (title, fig.bbox)
    assert title.y1 <= fig.bbox.height
    assert title.y0 >= fig.get_axes()[0].get_tightbbox(renderer).y1  # above the panel
    text = fig._suptitle.get_text()
    assert text.replace("\n", " ") == ("MCTS on Connect Four: baseline vs batched serving "
                                       "8 mcts searches on Connect Four, budget 20000 "
                                       "evaluations each, 4 leaves per round; trained tf "
                                       "net, seed 0")
    matplotlib.pyplot.close(fig)
