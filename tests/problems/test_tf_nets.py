"""The TensorFlow nets: bitwise equal to the NumPy ones, whatever the batch."""

import subprocess
import sys

import numpy as np
import pytest

from async_search.problems import (ConnectFour, PolicyValueMLP, SlidingPuzzle,
                                   heuristic_mlp)

tf_nets = pytest.importorskip("async_search.problems.tf_nets")
pytest.importorskip("tensorflow")


def test_importing_the_packages_does_not_import_tensorflow():
    code = ("import sys, async_search, async_search.problems, async_search.search; "
            "sys.exit('tensorflow' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("size, hidden", [(3, (32,)), (4, (64, 64))])
def test_tf_heuristic_net_equals_numpy_mlp_bitwise_for_every_batch_size(size, hidden):
    puzzle = SlidingPuzzle(size)
    net = tf_nets.heuristic_tf_net(puzzle, hidden_sizes=hidden, seed=2, max_batch_size=64)
    reference = heuristic_mlp(puzzle, hidden_sizes=hidden, seed=2)
    x = puzzle.encode([puzzle.scramble(80, seed=i) for i in range(150)])
    expected = reference(x)
    for n in (1, 3, 37, 150):  # padded to 1, 4, 64, and chunked by 64
        y = net(x[:n])
        assert y.dtype == np.float32 and y.shape == (n, 1)
        assert y.tobytes() == expected[:n].tobytes()
    alone = np.concatenate([net(x[i:i + 1]) for i in range(20)])
    assert alone.tobytes() == expected[:20].tobytes()


def test_tf_policy_value_net_equals_numpy_net_bitwise():
    game = ConnectFour()
    net = tf_nets.policy_value_tf_net(game, hidden_sizes=(48,), seed=7, max_batch_size=32)
    reference = PolicyValueMLP(game, hidden_sizes=(48,), seed=7)
    states = [game.from_moves([i % 7, (i * 3) % 7, (i // 7) % 7]) for i in range(40)]
    x = game.encode(states)
    logits, value = reference(x)
    for n in (1, 5, 40):
        tf_logits, tf_value = net(x[:n])
        assert tf_logits.tobytes() == logits[:n].tobytes()
        assert tf_value.tobytes() == value[:n].tobytes()
    assert np.all(np.abs(value) <= 1)
