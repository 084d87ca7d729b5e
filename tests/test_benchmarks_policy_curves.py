"""benchmarks/policy_curves.py: training runs against their wall time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.policy_curves import ROOT, at_minutes, curves, net_of, run_label


def run_json(policy: str, iteration_s, uct300, elo=None) -> dict:
    rows = [{"iteration": i + 1, "iteration_s": s,
             "scores": {"one_ply": 1.0, "uct300": u, "uct1000": u / 2},
             "elo": 100.0 * (i + 1) if elo is None else elo[i],
             "accuracy": {"net_end": 0.5, "net_middle": 0.6, "mcts_end": 0.9,
                          "mcts_middle": 0.8}}
            for i, (s, u) in enumerate(zip(iteration_s, uct300))]
    return {"command": f"python main.py --train connect_four --policy {policy}",
            "config": {"eval_games": 20, "hidden_sizes": [64],
                       "selfplay": {"policy": policy, "simulations": 16}},
            "iterations": rows,
            "final_evaluation": {"trained": {"mcts_vs_uct300": {"score": 0.5}}}}


def test_curves_turn_scores_against_uct300_into_elo_at_cumulative_minutes():
    c = curves(run_json("puct", [60, 120, 60], [0.5, 0.76, 1.0]), window=2)
    assert c["minutes"] == [1.0, 3.0, 4.0]
    assert c["elo_vs_uct300"][0] == 0.0 and round(c["elo_vs_uct300"][1]) == 200
    # All 20 won: clipped at half a game's doubt (39.5 of 40 halves), not infinite.
    assert c["elo_vs_uct300"][2] == pytest.approx(-400 * __import__("math").log10(
        1 / (1 - 0.5 / 20) - 1), abs=0.1)
    assert c["elo_vs_uct300_rolling"][1] == pytest.approx(
        (c["elo_vs_uct300"][0] + c["elo_vs_uct300"][1]) / 2, abs=0.1)
    assert c["uct1000_score"] == [0.25, 0.38, 0.5]
    assert c["mcts_middle"] == [0.8, 0.8, 0.8]


def test_at_minutes_takes_the_last_iteration_ended_by_then():
    c = curves(run_json("puct", [60, 120, 60], [0.5, 0.5, 0.5]), window=1)
    assert at_minutes(c, 3.5)["iteration"] == 2
    assert at_minutes(c, 4.0)["iteration"] == 3
    assert at_minutes(c, 0.5)["iteration"] == 1  # none ended yet: the first


def test_a_runs_net_is_named_from_its_config_and_older_runs_are_mlps():
    assert net_of({"hidden_sizes": [256, 256]}) == "mlp 256x256"
    assert net_of({"hidden_sizes": [256, 256], "architecture": "residual", "channels": 16,
                   "blocks": 2}) == "residual 16x2"
    run = run_json("puct", [60], [0.5])
    assert run_label("puct", run) == "puct (mlp 64, 16 simulations)"
    assert run_label("mlp 64", run) == "mlp 64 (16 simulations)"


def test_the_script_writes_json_and_figure_at_equal_time(tmp_path):
    pytest.importorskip("matplotlib")  # the plot extra: the script draws the figure
    for name, seconds in (("puct", [60, 60, 60]), ("gumbel", [90, 90, 90])):
        (tmp_path / f"{name}.json").write_text(json.dumps(
            run_json(name, seconds, [0.25, 0.5, 0.75])))
    out = tmp_path / "curves.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/policy_curves.py", "--run", f"puct={tmp_path}/puct.json",
         "--run", f"gumbel={tmp_path}/gumbel.json", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["equal_time_min"] == 3.0
    assert report["runs"]["gumbel"]["at_equal_time"]["iteration"] == 2
    assert report["runs"]["puct"]["at_equal_time"]["iteration"] == 3
    assert report["runs"]["puct"]["net"] == "mlp 64"
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_a_run_given_without_a_name_is_refused(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/policy_curves.py", "--run",
                           str(tmp_path / "x.json")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "NAME=PATH" in done.stderr


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"iterations": []}',
                                  '{"config": {}, "iterations": [{"iteration_s": 1}]}'])
def test_a_file_that_is_not_a_training_run_is_one_line_naming_it(tmp_path, text):
    path = tmp_path / "run.json"
    path.write_text(text)
    done = subprocess.run([sys.executable, "benchmarks/policy_curves.py", "--run",
                           f"a={path}", "--out", str(tmp_path / "o.json")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert str(path) in done.stderr or "run 'a'" in done.stderr
    assert not (tmp_path / "o.json").exists()
