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


@pytest.mark.parametrize("architecture,features,value_planes,value_net", [
    ("residual", "threats", 8, "head"), ("residual", "planes", 1, "head"),
    ("conv", "threats", 1, "head"), ("residual", "threats", 1, "mlp"),
    ("residual", "planes", 1, "mlp")])
def test_the_tf_twin_of_a_convolutional_net_is_bitwise_equal_whatever_the_batch(
        architecture, features, value_planes, value_net):
    from async_search.problems.nets import NetConfig, initial_weights, to_model
    from tests.game_positions import connect_four_positions

    config = NetConfig("policy_value", "connect_four", architecture=architecture,
                       channels=6, blocks=2, value_hidden=8, features=features,
                       value_planes=value_planes, value_net=value_net,
                       hidden_sizes=(24, 12))
    rng = np.random.default_rng(3)  # large enough that activations reach the grid's bound
    weights = {name: ((w + rng.standard_normal(w.shape) * 0.1) * 3).astype(np.float32)
               for name, w in initial_weights(config, 3).items()}
    net = to_model(config, weights)
    twin = tf_nets.tf_twin(net, max_batch_size=32)
    x = connect_four_positions(45, 2, max_moves=35)
    logits, value = net(x)
    assert np.abs(logits).max() > 1.0 and 0 < np.abs(value).max() <= 1.0
    for n in (1, 3, 17, 45):  # padded to 1, 4, 32, and chunked by 32
        tf_logits, tf_value = twin(x[:n])
        assert tf_logits.tobytes() == logits[:n].tobytes()
        assert tf_value.tobytes() == value[:n].tobytes()


def test_tf_twin_refuses_what_it_cannot_twin_naming_it():
    with pytest.raises(TypeError, match="PolicyValueConvNet"):
        tf_nets.tf_twin(lambda x: x)


def test_batch_sizes_beyond_1024_are_taken_without_a_max_batch_size():
    # The helpers passed their default max_batch_size of 1024 beside the batch sizes,
    # which the adapters then refused as over it.
    from async_search.problems import heuristic_mlp, heuristic_tf_net, tf_twin

    puzzle = SlidingPuzzle(3)
    assert heuristic_tf_net(puzzle, hidden_sizes=(8,),
                            batch_sizes=(8, 2048)).batch_sizes == (8, 2048)
    twin = tf_twin(heuristic_mlp(puzzle, hidden_sizes=(8,)), batch_sizes=(8, 2048))
    assert twin.batch_sizes == (8, 2048)
    with pytest.raises(ValueError, match="over max_batch_size=1024"):
        tf_twin(heuristic_mlp(puzzle, hidden_sizes=(8,)), max_batch_size=1024,
                batch_sizes=(2048,))
