import json

from async_search.experiments import RunReport, format_report, format_table, save_json
from async_search.servers.stats import BatchRecord


def report(name="async", backend="local", time_s=2.0, matches=True, **kw):
    fields = dict(name=name, group="g", backend=backend, num_procs=1, num_servers=1,
                  search_time_s=time_s, elapsed_s=time_s + 1, model_time_s=1.5,
                  fraction_in_model=0.75, batches=10, elements=640, mean_batch_size=64.0,
                  std_batch_size=3.5, matches_baseline=matches,
                  summary={"searches": 2, "budget_exhausted": 2, "evaluations": 640},
                  trace=(BatchRecord(0.1, 64, 0.01),))
    fields.update(kw)
    return RunReport(**fields)


def test_a_report_prints_every_figure_in_the_prototypes_layout():
    text = format_report(report())
    for line in ("Finished async", "Total search time: 2.00 s", "Total model time : 1.50 s",
                 "Fraction in model: 75.00 %", "num_batches:  10", "num elements: 640",
                 "size mean:    64.00", "size std:     3.50", "2 budget_exhausted",
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
    assert lines[0].split()[:3] == ["run", "search", "s"]
    assert lines[2].endswith("1.00x    ref") and lines[3].endswith("2.00x    yes")
    assert lines[4].endswith("0.50x     NO")
    md = format_table(reports, markdown=True).splitlines()
    assert md[0].startswith("| run |") and md[1].startswith("|---|")
    assert md[3].startswith("| async | 2.00 |")


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
