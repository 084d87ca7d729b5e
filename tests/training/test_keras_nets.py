"""The trainer's Keras nets: the NumPy net's architecture, and weights moved bitwise."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from async_search.problems.nets import NetConfig, initial_weights, to_model  # noqa: E402
from async_search.training.keras_nets import KerasNet  # noqa: E402
from tests.game_positions import connect_four_positions  # noqa: E402
from tests.net_weights import perturbed_weights  # noqa: E402

def positions(count, seed=0):
    return connect_four_positions(count, seed, max_moves=35)


CONFIGS = [NetConfig("policy_value", "connect_four", (16, 8)),
           NetConfig("policy_value", "connect_four", architecture="conv", channels=4,
                     blocks=2, value_hidden=8),
           NetConfig("policy_value", "connect_four", architecture="residual", channels=5,
                     blocks=1, value_hidden=6),
           NetConfig("policy_value", "connect_four", (16, 8), features="threats"),
           NetConfig("policy_value", "connect_four", architecture="residual", channels=5,
                     blocks=1, value_hidden=6, features="threats"),
           NetConfig("policy_value", "connect_four", architecture="residual", channels=5,
                     blocks=1, value_hidden=6, features="threats", value_planes=3),
           NetConfig("policy_value", "connect_four", (12, 6), architecture="residual",
                     channels=5, blocks=1, features="threats", value_net="mlp")]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.describe())
def test_weights_set_are_the_weights_read_back_bitwise(config):
    net = KerasNet(tf, config)
    weights = perturbed_weights(config, 2)
    net.set_weights(weights)
    got = net.weights
    if config.convolutional:
        assert list(got) == list(config.conv_shapes)
        for name, w in weights.items():
            assert got[name].tobytes() == w.tobytes()
    else:
        for (w, b), (w0, b0) in zip(got, weights, strict=True):
            assert w.tobytes() == w0.tobytes() and b.tobytes() == b0.tobytes()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.describe())
def test_the_keras_net_computes_what_the_numpy_net_serves_up_to_its_grid(config):
    net = KerasNet(tf, config)
    weights = perturbed_weights(config, 4)
    net.set_weights(weights)
    x = positions(40, 4)
    keras_in = config.featurize(x)  # the trainer adds the threat planes, if any
    keras_in = keras_in if config.convolutional else keras_in.reshape(len(x), -1)
    out = net.model(keras_in).numpy()
    assert out.shape == (40, config.output_size)
    logits, value = to_model(config, weights)(x)
    assert np.abs(out[:, :7] - logits).max() < 0.05
    assert np.abs(np.clip(out[:, 7:], -1, 1) - value).max() < 0.05
    assert np.abs(logits).max() > 0.05  # not zeros against zeros


def test_the_l2_kernels_are_every_weight_matrix_and_convolution_kernel():
    config = CONFIGS[2]
    net = KerasNet(tf, config)
    kernels = sorted(tuple(k.shape) for k in net.kernels)
    want = sorted(tuple(np.transpose(w, (2, 3, 1, 0)).shape) if w.ndim == 4 else w.T.shape
                  for n, w in initial_weights(config, 0).items() if n.endswith("weight"))
    assert kernels == want
