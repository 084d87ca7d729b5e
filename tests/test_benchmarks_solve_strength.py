"""benchmarks/solve_strength.py: the same agent with and without proving values."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_script_plays_both_agents_and_writes_the_json(tmp_path):
    out = tmp_path / "solve_strength.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/solve_strength.py", "--games", "2", "--simulations",
         "4", "--uct", "4", "--strong_uct", "8", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(done.stdout) == result
    assert set(result["agents"]) == {"plain", "solve"}
    for agent in result["agents"].values():
        for match in ("mcts_vs_one_ply", "mcts_vs_uct4", "mcts_vs_uct8", "net_vs_random"):
            games = agent[match]
            assert games["wins"] + games["draws"] + games["losses"] == 2
