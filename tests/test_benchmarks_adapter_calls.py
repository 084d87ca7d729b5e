"""benchmarks/adapter_calls.py: one side of an adapter pair, called in a loop."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import adapter_calls  # noqa: E402


@pytest.mark.parametrize("side", ["direct", "adapter"])
def test_each_side_agrees_with_the_other_and_makes_the_calls_asked(side):
    pytest.importorskip("torch")
    assert adapter_calls.main(["--framework", "torch", "--side", side, "--calls", "3",
                               "--warmup", "1", "--rows", "5"]) == 3


def test_calls_below_one_are_refused(capsys):
    with pytest.raises(SystemExit):
        adapter_calls.main(["--framework", "torch", "--side", "direct", "--calls", "0"])
    assert "--calls and --rows >= 1" in capsys.readouterr().err
