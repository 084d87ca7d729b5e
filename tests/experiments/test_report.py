import json
import os
import subprocess
import sys

import pytest

from async_search.errors import FileWriteError
from async_search.experiments import RunReport, format_report, format_table, save_json
from async_search.servers.stats import BatchRecord

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def report(name="async", backend="local", time_s=2.0, matches=True, **kw):
    fields = dict(name=name, group="g", backend=backend, num_procs=1, num_servers=1,
                  search_time_s=time_s, elapsed_s=time_s + 1, model_time_s=1.5,
                  fraction_in_model=0.75, batches=10, elements=640, mean_batch_size=64.0,
                  std_batch_size=3.5, matches_baseline=matches,
                  summary={"searches": 2, "solved": 1, "mean_path_length": 52.0,
                           "goal_found": 1, "budget_exhausted": 1, "evaluations": 640},
                  trace=(BatchRecord(0.1, 64, 0.01),))
    fields.update(kw)
    return RunReport(**fields)


def test_a_report_prints_every_figure_in_the_prototypes_layout():
    text = format_report(report())
    for line in ("Finished async", "Total search time: 2.00 s", "Total model time : 1.50 s",
                 "Fraction in model: 75.00 %", "num_batches:  10", "num elements: 640",
                 "size mean:    64.00", "size std:     3.50",
                 "Results: 2 searches: 1 solved (mean path 52.0 moves), 1 budget_exhausted",
                 "equal the reference run's: yes", "start-up included"):
        assert line in text, line


def test_a_mismatch_is_shouted():
    text = format_report(report(matches=False, mismatch="search 0 of 2 differs: ..."))
    assert "RESULTS DIFFER from the reference run's: search 0 of 2 differs" in text


def test_the_table_has_a_row_per_run_and_speedups_against_the_first():
    reports = [report("sync", "sync", 4.0, None), report("async", time_s=2.0),
               report("bad", time_s=8.0, matches=False)]
    lines = format_table(reports).splitlines()
    assert len(lines) == 2 + 3
    assert lines[0].split()[:6] == ["run", "solved", "mean", "path", "search", "s"]
    assert lines[2].endswith("1.00x    ref") and lines[3].endswith("2.00x    yes")
    assert lines[4].endswith("0.50x     NO")
    md = format_table(reports, markdown=True).splitlines()
    assert md[0].startswith("| run | solved | mean path |") and md[1].startswith("|---|")
    assert md[3].startswith("| async | 1/2 | 52.0 | 2.00 |")


def test_a_run_that_started_fewer_clients_than_its_name_asks_says_so():
    """``--num_procs 200`` over 8 searches starts 8 clients: the row says 8."""
    fewer = report("ray 200 clients, 2 servers", "ray", num_procs=8, num_procs_requested=200)
    table = format_table([fewer, report("ray 2 clients", "ray", num_procs=2,
                                        num_procs_requested=2)])
    assert "ray 200 clients, 2 servers (8 started)" in table
    assert "ray 2 clients " in table and "(2 started)" not in table
    text = format_report(fewer)
    assert text.startswith("Finished ray 200 clients, 2 servers (8 started) (ray backend, "
                           "8 client processes, 1 server)")


def test_the_table_and_report_show_solved_searches_and_their_mean_path_length():
    none_solved = report(summary={"searches": 8, "solved": 0, "mean_path_length": None,
                                  "budget_exhausted": 8})
    mcts = report(summary={"searches": 8, "actions": [3] * 8, "evaluations": 64})
    rows = format_table([report(), none_solved, mcts], markdown=True).splitlines()[2:]
    assert [r.split(" | ")[1:3] for r in rows] == [["1/2", "52.0"], ["0/8", "-"],
                                                  ["-", "-"]]
    assert "Results: 8 searches: 0 solved, 8 budget_exhausted" in format_report(none_solved)
    assert "Results: 8 searches: actions 3 3 3" in format_report(mcts)


def test_save_json_writes_every_printed_figure(tmp_path):
    path = save_json(str(tmp_path / "deep" / "r.json"), title="t", command="python main.py",
                     params={"a": (1, 2)}, reports=[report()], extra={"plot": "r.png"})
    data = json.loads(open(path).read())
    assert data["title"] == "t" and data["plot"] == "r.png" and data["params"]["a"] == [1, 2]
    run = data["runs"][0]
    for key in ("search_time_s", "model_time_s", "fraction_in_model", "batches",
                "elements", "mean_batch_size", "std_batch_size", "matches_baseline"):
        assert key in run
    assert "trace" not in run
    assert data["environment"]["cpu_count"] >= 1


def full_disk(code: str, limit: int = 8) -> str:
    """Runs ``code`` in a child whose files may not grow past ``limit`` bytes (SIGXFSZ
    ignored: a write fails with EFBIG, as on a full disk); returns the error it printed."""
    pytest.importorskip("matplotlib")  # the plot extra: the child uses its Agg backend
    script = ("import resource, signal, sys\n"
              f"sys.path.insert(0, {ROOT!r})\n"
              "import matplotlib; matplotlib.use('Agg')\n"
              + code.strip() + "\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
              "try:\n    write()\n"
              "except OSError as e:\n    print(type(e).__name__, e.errno, e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_a_full_disk_while_the_figures_are_saved_keeps_the_previous_file(tmp_path):
    path = tmp_path / "r.json"
    save_json(str(path), title="before", command=None, params={}, reports=[report()])
    previous = path.read_bytes()
    out = full_disk(f"""
from tests.experiments.test_report import report
from async_search.experiments import save_json
def write():
    save_json({str(path)!r}, title="after", command=None, params={{}}, reports=[report()])
""")
    assert out.startswith(f"FileWriteError 27 cannot write '{path}'"), out
    assert "File too large" in out
    assert path.read_bytes() == previous and os.listdir(tmp_path) == ["r.json"]


def test_the_figures_are_saved_before_the_plot(tmp_path, monkeypatch):
    from async_search.experiments import suites
    from tests.experiments.conftest import TINY_MODEL, tiny_search

    def failing_plot(*args, **kwargs):
        raise FileWriteError("cannot write 'r.png': injected", 28, "r.png")

    monkeypatch.setattr(suites, "plot_runs", failing_plot)
    experiment = suites.Experiment("t", tiny_search(), TINY_MODEL,
                                   suites.default_runs(backends=["local"], skip_sync=True))
    with pytest.raises(FileWriteError, match="r.png"):
        suites.run_experiment(experiment, save_path=str(tmp_path / "r.png"),
                              show_progress=False)
    data = json.loads((tmp_path / "r.json").read_text())
    # The plot failed: the JSON names none (not a picture that is not its own).
    assert len(data["runs"]) == 1 and data["plot"] is None
