"""The --train connect_four experiment: a run that resumes or is already complete, and
its files written whole (the figures before the plot)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

from async_search.errors import FileWriteError  # noqa: E402
from async_search.experiments import training  # noqa: E402
from async_search.training import (CommanderConfig, SelfPlayConfig,  # noqa: E402
                                   read_checkpoint)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = CommanderConfig(
    iterations=1, games_per_iteration=2,
    selfplay=SelfPlayConfig(simulations=4, num_parallel=2, sampling_moves=4),
    train_steps=2, batch_size=16, buffer_capacity=500, hidden_sizes=(8,), arena_games=2,
    eval_games=0, eval_simulations=4, uct_rollouts=4, max_batch_size=64, seed=1,
    backend="local", num_procs=1)


async def canned_evaluation(model, **kwargs):
    """The final evaluation, canned: these tests are about the files."""
    return {"mcts_vs_one_ply": {"wins": 1, "draws": 0, "losses": 0, "score": 1.0}}


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(training, "evaluate_agent", canned_evaluation)


def train(tmp_path, resume=False):
    lines = []
    result = training.run_connect_four_training(
        CONFIG, save_dir=str(tmp_path / "run"), resume=resume,
        png_path=str(tmp_path / "c4.png"), final_games=1, final_simulations=4,
        show_progress=False, command="python main.py --tiny", print_fn=lines.append)
    return result, lines


def test_the_run_saves_its_figures_then_its_plot_and_marks_the_best_net(tmp_path, quick):
    result, lines = train(tmp_path)
    saved = json.loads((tmp_path / "c4.json").read_text())
    assert len(saved["iterations"]) == 1 and saved["command"] == "python main.py --tiny"
    assert os.path.getsize(tmp_path / "c4.png") > 1000
    best = read_checkpoint(tmp_path / "run" / "best").metadata
    assert best["command"] == "python main.py --tiny" and "final_evaluation" in best
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_a_complete_run_resumed_says_so_and_trains_nothing(tmp_path, quick):
    first, _ = train(tmp_path)
    again, lines = train(tmp_path, resume=True)
    assert "already complete (1 of 1 iterations)" in lines[0]
    timing = {"selfplay_s", "samples_per_s", "s_per_1000_samples", "train_s", "eval_s",
              "iteration_s"}
    rows = [[{k: v for k, v in r.items() if k not in timing} for r in result["iterations"]]
            for result in (first, again)]
    assert rows[0] == rows[1]


def test_a_failed_plot_loses_none_of_the_figures(tmp_path, quick, monkeypatch):
    def failing_plot(*args, **kwargs):
        raise FileWriteError("cannot write 'c4.png': injected", 28, "c4.png")

    monkeypatch.setattr(training, "plot_training", failing_plot)
    with pytest.raises(FileWriteError, match="c4.png"):
        train(tmp_path)
    assert len(json.loads((tmp_path / "c4.json").read_text())["iterations"]) == 1


@pytest.mark.slow  # a child process that imports TensorFlow
@pytest.mark.parametrize("target", ["json", "plot"])
def test_a_full_disk_at_the_json_or_the_plot_names_it_and_keeps_the_previous_file(
        tmp_path, target):
    previous = {"json": b'{"previous": true}\n', "plot": b"\x89PNG previous"}[target]
    name = {"json": "c4.json", "plot": "c4.png"}[target]
    (tmp_path / name).write_bytes(previous)
    patch = {"json": "training.write_json = limited(training.write_json)",
             "plot": "plots.write_file = limited(plots.write_file)"}[target]
    script = f"""
import resource, signal, sys
sys.path.insert(0, {ROOT!r})
import matplotlib; matplotlib.use("Agg")
from async_search.experiments import training, plots
from tests.experiments.test_training import CONFIG, canned_evaluation
training.evaluate_agent = canned_evaluation

def limited(write):
    def wrapped(*args, **kwargs):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8, 8))
        return write(*args, **kwargs)
    return wrapped

{patch}
try:
    training.run_connect_four_training(
        CONFIG, save_dir={str(tmp_path / "run")!r}, resume=False,
        png_path={str(tmp_path / "c4.png")!r}, final_games=1, final_simulations=4,
        show_progress=False, print_fn=lambda s: 0)
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
        assert len(json.loads((tmp_path / "c4.json").read_text())["iterations"]) == 1
