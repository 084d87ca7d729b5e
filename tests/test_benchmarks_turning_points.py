"""benchmarks/turning_points.py: agents against UCT, and where their games turned."""

import json
import os
import subprocess
import sys

from async_search.problems.checkpoints import save_checkpoint
from async_search.problems.nets import NetConfig, initial_weights
from benchmarks.turning_points import summarise
from tests.training.test_turns import HANDED_BACK, record_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESIDUAL = NetConfig("policy_value", "connect_four", architecture="residual", channels=4,
                     blocks=1, value_hidden=8, features="threats", value_planes=2)


def run_script(*args):
    return subprocess.run([sys.executable, "benchmarks/turning_points.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})


def test_the_summary_counts_each_sides_mistakes_by_ply():
    # The same game twice: the agent first (it lost: handed a win, it let go), and
    # second (it won: it let a win go, UCT handed it back).
    summary = summarise([record_of(HANDED_BACK, True), record_of(HANDED_BACK, False)],
                        from_ply=34)
    assert (summary["wins"], summary["draws"], summary["losses"]) == (1, 0, 1)
    assert summary["score"] == 0.5 and summary["distinct_games"] == 1
    assert summary["agent_mistakes_per_game"] == 1.0
    first, second = summary["sides"]["agent_first"], summary["sides"]["agent_second"]
    assert first["value_at_from_ply"] == {"lost": 1}
    assert first["agent_mistakes_by_ply"] == {36: 1}
    assert first["uct_mistakes_by_ply"] == {35: 1}
    assert first["losses_from_a_won_or_drawn_position"] == 0   # it was lost at ply 34
    assert second["value_at_from_ply"] == {"won": 1}
    assert second["agent_mistakes_by_ply"] == {35: 1}
    assert second["uct_mistakes_by_ply"] == {36: 1}
    assert second["losses_from_a_won_or_drawn_position"] == 0  # it won in the end


def test_a_loss_from_a_won_position_by_the_agents_mistake_is_counted():
    summary = summarise([record_of(HANDED_BACK, True)], from_ply=36)
    assert summary["sides"]["agent_first"]["value_at_from_ply"] == {"won": 1}
    assert summary["sides"]["agent_first"]["losses_from_a_won_or_drawn_position"] == 1


def test_games_over_before_from_ply_are_counted_apart():
    summary = summarise([record_of(HANDED_BACK, True)], from_ply=37)
    assert summary["sides"]["agent_first"]["value_at_from_ply"] == {"lost": 1}
    summary = summarise([record_of(HANDED_BACK, True)], from_ply=38)   # its last move
    assert summary["sides"]["agent_first"]["value_at_from_ply"] == {
        "over before from_ply": 1}


def test_the_script_plays_each_net_and_writes_the_json(tmp_path):
    checkpoint = save_checkpoint(tmp_path / "res", initial_weights(RESIDUAL, 3), RESIDUAL)
    out = tmp_path / "turning_points.json"
    done = run_script("--nets", "shipped", checkpoint, "--games", "2", "--seeds", "1",
                      "--rollouts", "4", "--simulations", "4", "--from_ply", "20",
                      "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(done.stdout) == result
    assert list(result["nets"]) == ["shipped", checkpoint]
    for net in result["nets"].values():
        assert net["games"] == net["wins"] + net["draws"] + net["losses"] == 2
        assert net["sides"]["agent_first"]["games"] == net["sides"]["agent_second"][
            "games"] == 1


def test_bad_arguments_are_refused_in_one_line():
    for args, match in [(["--games", "0"], "--games"),
                        (["--from_ply", "-1"], "--from_ply"), (["--seeds", "-2"], "--seeds"),
                        (["--nets", "/no/such"], "/no/such")]:
        done = run_script(*args, "--out", "")
        assert done.returncode == 2, args
        assert match in done.stderr.strip().splitlines()[-1]
