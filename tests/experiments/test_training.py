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
    assert saved["plot"] == str(tmp_path / "c4.png")  # once the PNG is this run's
    assert os.path.getsize(tmp_path / "c4.png") > 1000
    best = read_checkpoint(tmp_path / "run" / "best").metadata
    assert best["command"] == "python main.py --tiny" and "final_evaluation" in best
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_a_complete_run_resumed_says_so_and_trains_nothing(tmp_path, quick):
    first, _ = train(tmp_path)
    again, lines = train(tmp_path, resume=True)
    assert "already complete (1 of 1 iterations)" in lines[0]
    timing = {"selfplay_s", "samples_per_s", "s_per_1000_samples", "train_s", "eval_s",
              "iteration_s", "accuracy_s"}
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
        # "plot" names no PNG (the one there is an earlier run's)
        assert json.loads((tmp_path / "c4.json").read_text())["plot"] is None


# -- the table and the figure show the move accuracy and the stronger baseline --------------


def record(iteration=1, scores=None, accuracy=None):
    from async_search.training import IterationRecord
    return IterationRecord(
        iteration=iteration, samples=100, buffer_size=100, selfplay_s=1.0,
        samples_per_s=100.0, s_per_1000_samples=10.0, policy_loss=1.9, value_loss=0.9,
        l2_loss=0.01, total_loss=2.8, train_s=1.0, arena_score=0.5, promoted=False,
        best_version=0, scores={"one_ply": 0.25, "uct300": 0.5, "uct1000": 0.125,
                                "policy_vs_random": 0.75} if scores is None else scores,
        elo=0.0, pushed_to=0, eval_s=2.0, iteration_s=4.0,
        accuracy={"net_end": 0.31, "net_middle": 0.42, "mcts_end": 0.93,
                  "mcts_middle": 0.84} if accuracy is None else accuracy, accuracy_s=0.5)


def test_a_row_shows_both_uct_baselines_and_the_four_accuracies_under_their_header():
    header = training.iteration_header().split()
    cells = training.format_iteration(record()).split()
    names = [name for name, _ in training._COLUMNS]
    assert len(cells) == len(names) and len(training.iteration_header()) == len(
        training.format_iteration(record()))
    by_name = dict(zip(names, cells))
    assert (by_name["uct"], by_name["uct1k"]) == ("0.50", "0.12")
    assert [by_name[k] for k in ("net end", "net mid", "mcts end", "mcts mid")] == [
        "0.31", "0.42", "0.93", "0.84"]
    assert by_name["acc s"] == "0.5" and "uct1k" in header


def test_a_row_without_the_figures_shows_nan():
    row = dict(zip([n for n, _ in training._COLUMNS], training.format_iteration(
        record(scores={"uct300": 0.5}, accuracy={})).split()))
    assert (row["uct"], row["uct1k"], row["one-ply"]) == ("0.50", "nan", "nan")
    assert row["net end"] == row["mcts mid"] == "nan"


@pytest.mark.parametrize("scores, rollouts, uct, strong", [
    ({"uct20": 1.0}, (300, 20), "nan", "1.00"),                # only the strong one
    ({"uct2000": 0.1, "uct1000": 0.7}, (2000, 1000), "0.10", "0.70"),  # it has fewer
    ({"uct2000": 0.1}, (2000, 1000), "0.10", "nan"),
    ({"uct300": 0.25}, (300, 300), "0.25", "nan"),  # equal: by the order, as before
])
def test_the_uct_columns_follow_the_runs_rollouts_not_their_order(scores, rollouts, uct,
                                                                  strong):
    row = dict(zip([n for n, _ in training._COLUMNS], training.format_iteration(
        record(scores=scores), *rollouts).split()))
    assert (row["uct"], row["uct1k"]) == (uct, strong)


@pytest.mark.parametrize("accuracy", [None, {}])
def test_the_figure_has_an_accuracy_panel(tmp_path, accuracy):
    fig = training.plot_training([record(1, accuracy=accuracy), record(2, accuracy=accuracy)],
                                 str(tmp_path / "t.png"))
    panel = fig.axes[3]
    assert panel.get_title() == "move accuracy on solved positions"
    labels = panel.get_legend_handles_labels()[1]
    if accuracy is None:
        assert {"net alone, end game", "agent, middle game"} <= set(labels)
    else:
        assert not labels and "not measured" in panel.texts[0].get_text()
    assert os.path.getsize(tmp_path / "t.png") > 1000


def test_the_phase_panel_is_grouped_bars_on_the_iteration_axis(tmp_path, caplog):
    # Seaborn's barplot made the iterations categories, and matplotlib logged an INFO
    # line about it under main.py's training table.
    import logging

    with caplog.at_level(logging.INFO):
        fig = training.plot_training([record(i) for i in (1, 2, 3)], str(tmp_path / "t.png"))
    panel = fig.axes[2]
    assert panel.get_legend_handles_labels()[1] == ["self-play", "training", "evaluation"]
    centres = sorted(round(p.get_x() + p.get_width() / 2, 2) for p in panel.patches)
    assert centres == sorted(round(i + d, 2) for i in (1, 2, 3) for d in (-0.27, 0, 0.27))
    assert not [r for r in caplog.records if r.name.startswith("matplotlib.category")]


def test_the_final_evaluation_plays_the_stronger_uct_when_asked():
    import asyncio
    from async_search.problems import PolicyValueMLP, ConnectFour

    net = PolicyValueMLP(ConnectFour(), hidden_sizes=(8,), seed=0)
    out = asyncio.run(training.evaluate_agent(net, games=2, simulations=2, uct_rollouts=4,
                                              strong_uct_rollouts=8, strong_uct_games=1))
    assert list(out) == ["mcts_vs_one_ply", "mcts_vs_uct4", "mcts_vs_uct8",
                         "net_vs_random"]
    assert sum(out["mcts_vs_uct8"][k] for k in ("wins", "draws", "losses")) == 1
    assert "mcts_vs_uct8" not in asyncio.run(training.evaluate_agent(
        net, games=1, simulations=2, uct_rollouts=4))


@pytest.mark.parametrize("gate", [0.8, 0.0])
def test_the_score_panel_draws_the_configured_gate_and_the_readme_goals(tmp_path, gate):
    fig = training.plot_training([record(1), record(2)], str(tmp_path / "t.png"),
                                 gate_threshold=gate)
    lines = {t.get_text(): t.xy[1] for t in fig.axes[1].texts}
    expected = {"goal vs UCT-1000": 0.90, "goal vs one-ply": 0.99}
    if gate:
        expected["gate (arena)"] = gate
    assert lines == expected


def test_a_goal_is_drawn_only_for_a_match_that_was_played(tmp_path):
    # --strong_uct_games 0 (or --strong_uct_rollouts 500) drew "goal vs UCT-1000" over
    # no UCT-1000 curve
    scores = {"one_ply": 0.25, "uct10": 0.5, "policy_vs_random": 0.75}
    fig = training.plot_training([record(1, scores=scores), record(2, scores=scores)],
                                 str(tmp_path / "t.png"))
    assert {t.get_text() for t in fig.axes[1].texts} == {"goal vs one-ply"}
