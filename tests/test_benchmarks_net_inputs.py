"""benchmarks/net_inputs.py: nets taught by the solver, judged on the shipped sets."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "benchmarks/net_inputs.py", *args, "--out",
         str(tmp_path / "net_inputs.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": ROOT})


def test_the_script_trains_each_net_and_writes_its_accuracy(tmp_path):
    done = run(tmp_path, "--positions", "20", "--stones", "34", "37", "--steps", "3",
               "--nets", "mlp,residual:threats", "--hidden_sizes", "8", "--channels", "2",
               "--blocks", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "net_inputs.json").read_text())
    assert json.loads(done.stdout) == result
    assert 0 < result["training_positions"] <= 20
    assert set(result["nets"]) == {"mlp", "residual:threats"}
    assert result["nets"]["mlp"]["net"] == "mlp 8"
    assert result["nets"]["residual:threats"]["net"] == "residual 2x1 + threats"
    for row in result["nets"].values():
        for key in ("accuracy_end", "accuracy_middle", "accuracy_train"):
            assert 0 <= row[key] <= 1
        assert row["us_per_row_256"] > 0 and row["policy_loss"] > 0


def test_an_unknown_net_is_refused_before_any_work(tmp_path):
    done = run(tmp_path, "--nets", "mlp:lines")
    assert done.returncode != 0 and "features" in done.stderr
    assert not (tmp_path / "net_inputs.json").exists()
