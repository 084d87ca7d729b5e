"""The --train sliding_puzzle experiment: checkpointed rounds that resume, and its files
written whole (the figures before the plot)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

from async_search.errors import FileWriteError  # noqa: E402
from async_search.experiments import heuristic_training  # noqa: E402
from async_search.experiments.heuristic_training import (HeldOutConfig,  # noqa: E402
                                                         run_heuristic_training)
from async_search.training import DaviConfig  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = DaviConfig(size=4, rounds=2, states_per_round=32, max_scramble=8, train_steps=2,
                    hidden_sizes=(8,), batch_size=16, buffer_capacity=64, seed=1)
HELD_OUT = HeldOutConfig(budget=40, buffer_size=4, max_batch_size=64)


@pytest.fixture
def quick(monkeypatch):
    """Korf's 100 replaced by a canned comparison: these tests are about the files."""
    monkeypatch.setattr(heuristic_training, "compare_heuristics", canned_comparison)


def train(tmp_path, config=CONFIG, resume=False):
    lines = []
    result = run_heuristic_training(config, HELD_OUT, save_dir=str(tmp_path / "run"),
                                    png_path=str(tmp_path / "davi.png"), resume=resume,
                                    show_progress=False, print_fn=lines.append)
    return result, lines


def test_rounds_are_committed_and_resume_continues_with_the_same_rows(tmp_path, quick):
    import dataclasses

    straight, _ = train(tmp_path / "a")
    train(tmp_path / "b", dataclasses.replace(CONFIG, rounds=1))
    resumed, lines = train(tmp_path / "b", resume=True)

    def rows(result):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in result["rounds"]]

    assert rows(resumed) == rows(straight) and len(rows(straight)) == 2
    assert lines[0].split() == ["round", "loss", "mean", "target", "refreshes", "s"]
    again, lines = train(tmp_path / "b", resume=True)
    assert "already complete (2 of 2 rounds)" in lines[0]
    assert rows(again) == rows(straight)
    saved = json.loads((tmp_path / "b" / "davi.json").read_text())
    assert rows(saved) == rows(straight) and os.path.isfile(tmp_path / "b" / "davi.png")


def test_resume_with_nothing_saved_is_refused(tmp_path, quick):
    with pytest.raises(ValueError, match="no saved run"):
        train(tmp_path, resume=True)


def test_the_figures_are_saved_before_the_plot_and_a_failed_plot_loses_none(
        tmp_path, quick, monkeypatch):
    def failing_plot(*args, **kwargs):
        raise FileWriteError("cannot write 'davi.png': injected", 28, "davi.png")

    monkeypatch.setattr(heuristic_training, "plot_heuristic_training", failing_plot)
    with pytest.raises(FileWriteError, match="davi.png"):
        train(tmp_path)
    saved = json.loads((tmp_path / "davi.json").read_text())
    assert len(saved["rounds"]) == 2 and "korf100" in saved and saved["plot"] is None


@pytest.mark.slow  # a child process that imports TensorFlow
@pytest.mark.parametrize("target", ["json", "plot"])
def test_a_full_disk_at_the_json_or_the_plot_names_it_and_keeps_the_previous_file(
        tmp_path, target):
    """The file-size limit is set just before the file is written (the checkpoints and
    the run's state, written earlier, are not the point here)."""
    previous = {"json": b'{"previous": true}\n', "plot": b"\x89PNG previous"}[target]
    name = {"json": "davi.json", "plot": "davi.png"}[target]
    (tmp_path / name).write_bytes(previous)
    patch = {"json": "heuristic_training.write_json = limited(heuristic_training.write_json)",
             "plot": "plots.write_file = limited(plots.write_file)"}[target]
    script = f"""
import resource, signal, sys
sys.path.insert(0, {ROOT!r})
import matplotlib; matplotlib.use("Agg")
from async_search.experiments import heuristic_training, plots
from tests.experiments.test_heuristic_training import CONFIG, HELD_OUT, canned_comparison
heuristic_training.compare_heuristics = canned_comparison

def limited(write):
    def wrapped(*args, **kwargs):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8, 8))
        return write(*args, **kwargs)
    return wrapped

{patch}
try:
    heuristic_training.run_heuristic_training(
        CONFIG, HELD_OUT, save_dir={str(tmp_path / "run")!r},
        png_path={str(tmp_path / "davi.png")!r}, show_progress=False, print_fn=lambda s: 0)
except OSError as e:
    print(type(e).__name__, e.errno, e)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    message = out.stdout.strip().splitlines()[-1]
    assert message.startswith(f"FileWriteError 27 cannot write '{tmp_path / name}'"), message
    assert (tmp_path / name).read_bytes() == previous
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    if target == "plot":  # the figures were saved first
        assert len(json.loads((tmp_path / "davi.json").read_text())["rounds"]) == 2
        # "plot" names no PNG (the one there is an earlier run's)
        assert json.loads((tmp_path / "davi.json").read_text())["plot"] is None


def canned_comparison(model, params, show_progress=True):
    """A canned Korf's 100 comparison, for the child processes above."""
    return {name: {"instances": 1, "solved": 0, "mean_length": None,
                   "mean_optimal_of_solved": None, "optimal_found": 0,
                   "mean_expansions": 1.0, "mean_evaluations": 1.0,
                   "mean_expansions_solved": None, "seconds": 0.0,
                   "per_instance": [{"id": 1, "optimal": 50, "status": "budget_exhausted",
                                     "cost": None, "expansions": 1}]}
            for name in ("manhattan", "learned")}


def test_evaluate_heuristic_runs_the_instances_asked_for_in_korfs_order():
    from async_search import problems

    manhattan = problems.ManhattanHeuristic(problems.SlidingPuzzle(4))
    picked = heuristic_training.evaluate_heuristic(manhattan, HELD_OUT, ids=[7, 3, 99])
    assert [p["id"] for p in picked["per_instance"]] == [3, 7, 99]
    assert [p["optimal"] for p in picked["per_instance"]] == [
        i.optimal for i in problems.korf100() if i.id in (3, 7, 99)]
    first = heuristic_training.evaluate_heuristic(manhattan, HELD_OUT, ids=[7, 3, 99],
                                                  limit=2)
    assert picked["instances"] == 3 and first["instances"] == 2
    assert [p["id"] for p in first["per_instance"]] == [3, 7]


@pytest.mark.parametrize("bad, match", [({"ids": [0]}, "numbered \\[0\\]"),
                                        ({"ids": [101, 3]}, "numbered \\[101\\]"),
                                        ({"ids": ["3"]}, "ids"),
                                        ({"limit": 0}, "limit")])
def test_evaluate_heuristic_refuses_instances_it_does_not_have(bad, match):
    from async_search import problems

    manhattan = problems.ManhattanHeuristic(problems.SlidingPuzzle(4))
    with pytest.raises((ValueError, TypeError), match=match):
        heuristic_training.evaluate_heuristic(manhattan, HELD_OUT, **bad)
