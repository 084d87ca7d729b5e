"""benchmarks/head_swap.py: policy and value heads swapped between two nets."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from async_search import problems
from async_search.problems.checkpoints import save_checkpoint
from async_search.problems.nets import NetConfig, initial_weights
from benchmarks.head_swap import SwappedHeads
from tests.game_positions import connect_four_positions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESIDUAL = NetConfig("policy_value", "connect_four", architecture="residual", channels=4,
                     blocks=1, value_hidden=8, features="threats", value_planes=2)


def residual_checkpoint(path):
    return save_checkpoint(path, initial_weights(RESIDUAL, 3), RESIDUAL)


def run_script(*args):
    return subprocess.run([sys.executable, "benchmarks/head_swap.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})


def test_swapped_heads_take_the_logits_of_one_net_and_the_value_of_the_other(tmp_path):
    from async_search.problems.checkpoints import load_checkpoint

    shipped = problems.pretrained("connect_four")
    other = load_checkpoint(residual_checkpoint(tmp_path / "res"))
    x = connect_four_positions(12, 0)
    logits, value = SwappedHeads(shipped, other)(x)
    assert np.array_equal(logits, shipped(x)[0]) and np.array_equal(value, other(x)[1])
    assert not np.array_equal(value, shipped(x)[1])


def test_nets_of_different_inputs_are_refused():
    puzzle_net = problems.pretrained("15-puzzle")
    with pytest.raises(ValueError, match="different inputs"):
        SwappedHeads(problems.pretrained("connect_four"), puzzle_net)


def test_the_script_plays_four_agents_on_every_seed_and_writes_the_json(tmp_path):
    out = tmp_path / "head_swap.json"
    done = run_script("--a", residual_checkpoint(tmp_path / "res"), "--games", "2",
                      "--seeds", "1", "2", "--rollouts", "4", "--simulations", "4",
                      "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(done.stdout) == result
    assert list(result["agents"]) == ["a", "b", "policy_a_value_b", "policy_b_value_a"]
    for agent in result["agents"].values():
        assert agent["wins"] + agent["draws"] + agent["losses"] == 4
        assert 0.0 <= agent["score"] <= 1.0


@pytest.mark.parametrize("args,match", [(["--games", "0"], "--games"),
                                        (["--seeds", "-1"], "--seeds"),
                                        (["--b", "/no/such"], "/no/such")])
def test_bad_counts_are_refused_in_one_line(args, match):
    done = run_script("--a", "shipped", *args, "--out", "")
    assert done.returncode == 2 and match in done.stderr.strip().splitlines()[-1]
