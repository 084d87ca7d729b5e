"""``python main.py`` end to end on tiny flags, and its refusals of bad flags."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--model=numpy", "--hidden_sizes=16", "--num_searches=3", "--gnn_budget=150",
        "--noprogress"]

pytestmark = pytest.mark.timeout(180)


def main_py(*args, timeout=150):
    return subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_default_experiment_on_tiny_flags_prints_checks_and_saves(tmp_path):
    save = tmp_path / "out" / "results.png"
    run = main_py(*TINY, "--backends=local,process", f"--save_path={save}")
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    for name in ("sync", "async", "process x1", "process x2"):
        assert f"Finished {name} (" in out
    assert out.count("Results equal the reference run's: yes") == 3
    for figure in ("Total search time:", "Total model time :", "Fraction in model:",
                   "num_batches:", "num elements:", "size mean:", "size std:"):
        assert out.count(figure) == 4, figure
    assert "speed-up" in out and f"Saved the plot to {save}" in out
    assert save.stat().st_size > 10_000
    data = json.loads(save.with_suffix(".json").read_text())
    assert [r["name"] for r in data["runs"]] == ["sync", "async", "process x1", "process x2"]
    assert all(r["matches_baseline"] in (None, True) for r in data["runs"])
    assert "--gnn_budget=150" in data["command"]


def test_continuous_and_architecture_experiments_on_tiny_flags(tmp_path):
    run = main_py("--continuous", "--model=numpy", "--hidden_sizes=16", "--gnn_budget=300",
                  "--max_in_flight=16", "--noprogress", f"--save_path={tmp_path}/c.png")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Finished continuous (process backend, 1 client process" in run.stdout
    assert "Fraction in model:" in run.stdout and (tmp_path / "c.json").exists()
    run = main_py("--architecture=client", "--model=numpy", "--hidden_sizes=16",
                  "--num_samples=20", "--simulations=8", "--games_per_client=2",
                  "--num_procs=1", "--num_servers=1", "--noprogress",
                  f"--save_path={tmp_path}/a.png")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Time to process 20 samples" in run.stdout
    header = [line for line in run.stdout.splitlines() if line.startswith("architecture")]
    assert header and "cache hit rate" in header[0] and "mean batch size" in header[0]
    assert json.loads((tmp_path / "a.json").read_text())["architectures"][0]["samples"] == 20


@pytest.mark.parametrize("args, names", [
    (["--search=dfs"], "--search"),
    (["--gnn_budget=0"], "--gnn_budget must be an integer >= 1"),
    (["--num_servers=100000"], "--num_servers=100000 is more than"),
    (["--model=torch"], "--model"),
    (["--architecture=ring"], "--architecture"),
    (["--continuous", "--search=mcts"], "--continuous"),
    (["--no_such_flag"], "no_such_flag"),
    (["stray"], "unexpected arguments"),
])
def test_bad_flags_are_one_line_and_exit_status_2(tmp_path, args, names):
    save = tmp_path / "never.png"
    run = main_py(*args, f"--save_path={save}", timeout=60)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("main.py: error: ")
    assert names in lines[0]
    assert run.stdout == "" and not save.exists()  # nothing ran


def test_flags_build_the_experiments_they_name(monkeypatch):
    monkeypatch.syspath_prepend(ROOT)
    import main

    def parse(*args):
        main.FLAGS.unparse_flags()
        main.FLAGS(["main.py", *args])

    try:
        parse()
        exp = main.build_experiment()
        assert [r.name for r in exp.runs] == ["sync", "async", "process x1", "process x2",
                                              "ray x1", "ray x2"]
        assert exp.model.kind == "tf" and exp.search.search == "astar"
        assert all(r.use_uvloop == main.FLAGS.uvloop for r in exp.runs)
        parse("--multi_server", "--num_servers=3", "--num_procs=4", "--total_gpu_frac=0.5",
              "--skip_sync", "--search=mcts")
        (ray,) = main.build_experiment().runs
        assert (ray.backend, ray.num_servers, ray.num_procs, ray.total_gpu_frac) == (
            "ray", 3, 4, 0.5)
        assert main.save_path("multi_server").endswith(os.path.join("results",
                                                                    "multi_server.png"))
        parse("--continuous", "--max_delay=0.001")
        exp = main.build_experiment()
        assert exp.search.search == "continuous" and exp.search.num_searches == 1
        assert exp.runs[-1].max_batch_size == 1024
        assert all(r.max_delay == 0.001 for r in exp.runs)
        parse("--save_path=/tmp/x.png", "--continuous")
        assert main.save_path("continuous") == "/tmp/x.png"
    finally:
        main.FLAGS.unparse_flags()
