"""benchmarks/buffer_swap.py: a net trained further on other runs' buffers, then played."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from async_search.problems import ConnectFour  # noqa: E402
from async_search.problems.checkpoints import read_checkpoint, save_checkpoint  # noqa: E402
from async_search.problems.nets import NetConfig, initial_weights  # noqa: E402
from async_search.training import ReplayBuffer  # noqa: E402
from benchmarks.buffer_swap import train_on  # noqa: E402
from tests.game_positions import connect_four_positions  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = NetConfig("policy_value", "connect_four", architecture="residual", channels=4,
                   blocks=1, value_hidden=8, features="threats", value_planes=2)


def checkpoint(path):
    return save_checkpoint(path, initial_weights(CONFIG, 3), CONFIG)


def buffer_file(path, value, seed=0):
    """A buffer whose every sample has the same value target."""
    rng = np.random.default_rng(seed)
    x = connect_four_positions(64, seed, max_moves=30)
    buffer = ReplayBuffer(256, seed)
    buffer.add(x, rng.random((len(x), 7)) + 0.1, np.full(len(x), value))
    buffer.save(path)
    return str(path)


def test_training_on_a_buffer_moves_the_value_toward_its_targets(tmp_path, monkeypatch):
    import benchmarks.buffer_swap as buffer_swap

    ckpt = checkpoint(tmp_path / "net")
    x = ConnectFour().encode([ConnectFour().initial_state()])
    before = read_checkpoint(ckpt).model()(x)[1][0, 0]
    for target in (0.9, -0.9):
        trainer, buffer, losses = train_on(ckpt, buffer_file(tmp_path / f"{target}.npz",
                                                             target),
                                           steps=150, from_scratch=False)
        assert len(buffer) == 64 and [loss.steps for loss in losses] == [150]
        after = trainer.model()(x)[1][0, 0]
        assert abs(after - target) < abs(before - target)
    monkeypatch.setattr(buffer_swap, "STEPS_PER_RESET", 4)  # Adam reset every 4 steps
    trainer, _, losses = train_on(ckpt, buffer_file(tmp_path / "b.npz", 0.5), steps=10,
                                  from_scratch=True)
    assert [loss.steps for loss in losses] == [4, 4, 2] and trainer.steps_taken == 10
    # From the config's initial (seed 0) weights, not the file's (seed 3): ten Adam steps
    # of 1e-3 move a weight by about 0.01 at most.
    stem = trainer.weights["stem.weight"]
    assert np.abs(stem - initial_weights(CONFIG, 0)["stem.weight"]).max() < 0.02
    assert np.abs(stem - initial_weights(CONFIG, 3)["stem.weight"]).max() > 0.1


def test_the_script_trains_and_plays_once_per_buffer_and_writes_the_json(tmp_path):
    out = tmp_path / "buffer_swap.json"
    buffers = [buffer_file(tmp_path / "a.npz", 0.5), buffer_file(tmp_path / "b.npz", -0.5)]
    done = subprocess.run(
        [sys.executable, "benchmarks/buffer_swap.py", "--checkpoint",
         checkpoint(tmp_path / "net"), "--buffer", *buffers, "--steps", "3", "--games", "2",
         "--seeds", "1", "--rollouts", "4", "--simulations", "4",
         "--save_dir", str(tmp_path / "nets"), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,  # as a user runs it:
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})  # no PYTHONPATH
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(done.stdout) == result
    assert [run["buffer"] for run in result["runs"]] == buffers
    for i, run in enumerate(result["runs"]):
        games = run["vs_uct4"]
        assert games["wins"] + games["draws"] + games["losses"] == 2
        assert run["samples"] == 64 and run["losses"][0]["steps"] == 3
        assert read_checkpoint(tmp_path / "nets" / f"buffer{i}").config == CONFIG


@pytest.mark.parametrize("args,match", [(["--steps", "0"], "--steps"),
                                        (["--buffer", "/no/such.npz"], "no such file"),
                                        (["--buffer", "BAD"], "not a replay buffer"),
                                        (["--checkpoint", "/no/such"], "/no/such")])
def test_bad_arguments_are_refused_in_one_line(tmp_path, args, match):
    (tmp_path / "bad.npz").write_text("garbage")
    args = [str(tmp_path / "bad.npz") if a == "BAD" else a for a in args]
    base = ["--checkpoint", checkpoint(tmp_path / "net"), "--buffer",
            buffer_file(tmp_path / "a.npz", 0)]
    done = subprocess.run([sys.executable, "benchmarks/buffer_swap.py", *base, *args,
                           "--out", ""], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 2 and match in done.stderr.strip().splitlines()[-1]
