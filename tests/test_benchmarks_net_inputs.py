"""benchmarks/net_inputs.py: nets taught by the solver, judged on the shipped sets."""

import json
import os
import subprocess
import sys

import argparse

import pytest

pytest.importorskip("tensorflow")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import net_inputs  # noqa: E402

DEFAULTS = argparse.Namespace(hidden_sizes=[256, 256], channels=16, blocks=2)


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


def test_a_spec_without_sizes_takes_the_flags_sizes():
    config = net_inputs.parse_net("residual:threats", DEFAULTS)
    assert (config.architecture, config.features) == ("residual", "threats")
    assert (config.channels, config.blocks) == (16, 2)
    assert net_inputs.parse_net("mlp", DEFAULTS).hidden_sizes == (256, 256)


def test_a_spec_names_an_mlps_widths_or_a_conv_nets_channels_and_blocks():
    assert net_inputs.parse_net("mlp:threats:512x128x64", DEFAULTS).hidden_sizes == (
        512, 128, 64)
    config = net_inputs.parse_net("residual:threats:8x1", DEFAULTS)
    assert (config.channels, config.blocks, config.features) == (8, 1, "threats")
    assert net_inputs.parse_net("conv::4x3", DEFAULTS).features == "planes"


@pytest.mark.parametrize("spec", ["residual:threats:8", "residual:threats:8x1x2",
                                  "mlp:threats:wide", "mlp:planes:0",
                                  "mlp:threats:99999999999x2", "residual::4096x64"])
def test_malformed_sizes_are_refused_by_name(spec):
    with pytest.raises(ValueError, match=r"sizes|hidden|NetConfig|weights"):
        net_inputs.parse_net(spec, DEFAULTS)


def test_malformed_sizes_are_refused_before_any_work(tmp_path):
    done = run(tmp_path, "--nets", "mlp,residual:threats:8")
    assert done.returncode == 2 and "CHANNELSxBLOCKS" in done.stderr
    assert not (tmp_path / "net_inputs.json").exists()
