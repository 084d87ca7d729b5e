"""The convolutional policy-value net in NumPy: exact rows, its weights, its errors."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from async_search import problems
from async_search.problems.conv_nets import (PolicyValueConvNet, conv_weight_shapes,
                                             initial_conv_weights)
from async_search.problems.residual_nets import _conv2d
from tests.game_positions import connect_four_positions

GAME = problems.ConnectFour()


def boards(count, seed=0):
    """Encoded positions of random games, up to 35 moves (terminal ones included)."""
    return connect_four_positions(count, seed, max_moves=35)


def big_weights(net, seed, scale=3.0):
    """Weights large enough that activations leave the grid's small values."""
    rng = np.random.default_rng(seed)
    return {name: (w + rng.standard_normal(w.shape) * 0.1) * scale
            for name, w in net.weights.items()}


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), residual=st.booleans(), blocks=st.integers(0, 2),
       split=st.integers(1, 40), value_net=st.sampled_from(["head", "mlp"]))
def test_a_rows_outputs_do_not_depend_on_its_batch_mates(seed, residual, blocks, split,
                                                         value_net):
    net = PolicyValueConvNet(GAME, channels=6, blocks=blocks, value_hidden=8,
                             residual=residual, value_net=value_net,
                             value_hidden_sizes=(12, 5), seed=seed)
    net = net.with_weights(big_weights(net, seed))
    x = boards(41, seed)
    logits, value = net(x)
    for part in (slice(0, split), slice(split, 41), slice(split, split + 1)):
        part_logits, part_value = net(x[part])
        assert np.array_equal(part_logits, logits[part])
        assert np.array_equal(part_value, value[part])


def reference(net, x):
    """The same net in float64 without the grid: convolutions by NumPy's einsum."""
    w = {name: v.astype(np.float64) for name, v in net.weights.items()}

    def conv(h, name):
        return _conv2d(h, w[f"{name}.weight"]) + w[f"{name}.bias"][None, :, None, None]

    def dense(h, name):
        return h @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    h = np.maximum(conv(x.astype(np.float64), "stem"), 0)
    for b in range(net.blocks):
        y = np.maximum(conv(h, f"blocks.{b}.conv1"), 0)
        y = conv(y, f"blocks.{b}.conv2")
        h = np.maximum(h + y if net.residual else y, 0)
    p = np.maximum(conv(h, "policy.conv"), 0).reshape(len(x), -1)
    v = np.maximum(conv(h, "value.conv"), 0).reshape(len(x), -1)
    v = np.maximum(dense(v, "value.fc1"), 0)
    return dense(p, "policy.fc"), np.clip(dense(v, "value.fc2"), -1, 1)


@pytest.mark.parametrize("residual", [True, False])
def test_outputs_equal_the_unrounded_net_within_the_grids_rounding(residual):
    net = PolicyValueConvNet(GAME, channels=8, blocks=2, value_hidden=16,
                             residual=residual, seed=3)
    x = boards(30, 3)
    logits, value = net(x)
    want_logits, want_value = reference(net, x)
    assert logits.dtype == value.dtype == np.float32
    assert logits.shape == (30, 7) and value.shape == (30, 1)
    assert np.abs(logits - want_logits).max() < 0.05
    assert np.abs(value - want_value).max() < 0.05
    assert np.abs(logits).max() > 0.1  # not a vacuous comparison of zeros


def test_an_empty_batch_gives_empty_outputs():
    logits, value = PolicyValueConvNet(GAME, channels=4, blocks=1)(boards(0))
    assert logits.shape == (0, 7) and value.shape == (0, 1)
    assert logits.dtype == value.dtype == np.float32


def test_residual_and_plain_blocks_compute_different_nets():
    plain = PolicyValueConvNet(GAME, channels=8, blocks=1, residual=False, seed=1)
    residual = PolicyValueConvNet(GAME, channels=8, blocks=1, residual=True, seed=1)
    x = boards(10, 1)
    assert not np.array_equal(plain(x)[0], residual(x)[0])


def test_the_value_is_clipped_to_minus_one_one():
    net = PolicyValueConvNet(GAME, channels=4, blocks=0, seed=0)
    weights = dict(net.weights)
    weights["value.fc2.bias"] = np.array([5.0], np.float32)
    assert (net.with_weights(weights)(boards(5))[1] == 1.0).all()


def test_weights_are_seeded_named_and_shaped_as_a_state_dict():
    shapes = conv_weight_shapes(2, 6, 7, 7, channels=8, blocks=1, value_hidden=16)
    assert shapes["stem.weight"] == (8, 2, 3, 3)
    assert shapes["blocks.0.conv2.weight"] == (8, 8, 3, 3)
    assert shapes["policy.fc.weight"] == (7, 84)
    assert shapes["value.fc1.weight"] == (16, 42)
    a, b = initial_conv_weights(shapes, 5), initial_conv_weights(shapes, 5)
    assert all(np.array_equal(a[n], b[n]) for n in shapes)
    assert not np.array_equal(a["stem.weight"], initial_conv_weights(shapes, 6)["stem.weight"])
    assert all(a[n].dtype == np.float32 and a[n].shape == s for n, s in shapes.items())
    assert not a["stem.bias"].any()
    plain = initial_conv_weights(shapes, 5, residual=False)
    assert np.allclose(plain["blocks.0.conv2.weight"], a["blocks.0.conv2.weight"] * 10)
    assert np.array_equal(plain["blocks.0.conv1.weight"], a["blocks.0.conv1.weight"])


def test_with_weights_keeps_the_given_weights_and_leaves_the_original_alone():
    net = PolicyValueConvNet(GAME, channels=4, blocks=1, seed=0)
    before = net(boards(4))[0]
    other = net.with_weights(big_weights(net, 1))
    assert np.array_equal(net(boards(4))[0], before)
    assert not np.array_equal(other(boards(4))[0], before)
    assert np.array_equal(other.weights["stem.weight"],
                          big_weights(net, 1)["stem.weight"].astype(np.float32))


def test_with_weights_refuses_missing_unexpected_and_misshapen_arrays():
    net = PolicyValueConvNet(GAME, channels=4, blocks=1, seed=0)
    weights = dict(net.weights)
    with pytest.raises(ValueError, match="missing.*stem.bias"):
        net.with_weights({k: v for k, v in weights.items() if k != "stem.bias"})
    with pytest.raises(ValueError, match="unexpected.*extra"):
        net.with_weights({**weights, "extra": np.zeros(1)})
    with pytest.raises(ValueError, match="'stem.weight' has shape"):
        net.with_weights({**weights, "stem.weight": np.zeros((4, 2, 1, 1))})


def test_a_value_head_of_several_planes_reads_each_of_them():
    shapes = conv_weight_shapes(2, 6, 7, 7, channels=8, blocks=1, value_hidden=16,
                                value_planes=3)
    assert shapes["value.conv.weight"] == (3, 8, 1, 1)
    assert shapes["value.fc1.weight"] == (16, 3 * 42)
    net = PolicyValueConvNet(GAME, channels=8, blocks=1, value_hidden=16, value_planes=3,
                             seed=2)
    assert net.value_planes == 3 and list(net.weights) == list(shapes)
    x = boards(20)
    logits, value = net(x)
    assert logits.shape == (20, 7) and value.shape == (len(x), 1)
    # Each plane reaches the value: silencing the third changes it, not the logits.
    weights = dict(net.weights)
    weights["value.fc1.weight"] = weights["value.fc1.weight"].copy()
    weights["value.fc1.weight"][:, 2 * 42:] = 0.0
    logits2, value2 = net.with_weights(weights)(x)
    assert np.array_equal(logits, logits2) and not np.array_equal(value, value2)


def test_an_mlp_value_is_models_mlps_value_of_the_board_bitwise():
    from async_search.models import MLP

    net = PolicyValueConvNet(GAME, channels=4, blocks=1, value_net="mlp",
                             value_hidden_sizes=(16, 8), seed=4)
    net = net.with_weights(big_weights(net, 4))
    shapes = conv_weight_shapes(2, 6, 7, 7, channels=4, blocks=1, value_hidden=64,
                                value_net="mlp", value_hidden_sizes=(16, 8))
    assert list(net.weights) == list(shapes)
    assert not any(name.startswith(("value.conv", "value.fc")) for name in shapes)
    assert [shapes[f"value.mlp.{i}.weight"] for i in range(3)] == [(16, 84), (8, 16),
                                                                   (1, 8)]
    # The same layers as a models.MLP ([in, out] matrices) give the same value, bitwise.
    mlp = MLP((2, 6, 7), (16, 8), 1, seed=0).with_weights(
        [(net.weights[f"value.mlp.{i}.weight"].T, net.weights[f"value.mlp.{i}.bias"])
         for i in range(3)])
    x = boards(30, 4)
    value = net(x)[1]
    assert np.abs(value).max() > 0.05 and np.abs(value).min() < 1.0  # not all clipped
    assert value.tobytes() == np.clip(mlp(x), -1.0, 1.0).astype(np.float32).tobytes()


def test_an_mlp_value_shares_nothing_with_the_trunk():
    net = PolicyValueConvNet(GAME, channels=4, blocks=1, value_net="mlp",
                             value_hidden_sizes=(16,), seed=5)
    x = boards(20, 5)
    logits, value = net(x)
    trunk = {**net.weights, "stem.weight": net.weights["stem.weight"] * 2.0}
    logits2, value2 = net.with_weights(trunk)(x)
    assert not np.array_equal(logits, logits2) and np.array_equal(value, value2)
    tower = {**net.weights, "value.mlp.1.bias": net.weights["value.mlp.1.bias"] + 0.25}
    logits3, value3 = net.with_weights(tower)(x)
    assert np.array_equal(logits, logits3) and not np.array_equal(value, value3)


def test_an_mlp_values_last_layer_starts_at_a_linear_layers_scale():
    shapes = conv_weight_shapes(2, 6, 7, 7, channels=4, blocks=0, value_hidden=8,
                                value_net="mlp", value_hidden_sizes=(4000,))
    weights = initial_conv_weights(shapes, 0)
    # He-normal (gain 2) for the hidden layer, gain 1 for the linear output.
    assert np.std(weights["value.mlp.0.weight"]) == pytest.approx(np.sqrt(2 / 84), rel=0.05)
    assert np.std(weights["value.mlp.1.weight"]) == pytest.approx(np.sqrt(1 / 4000),
                                                                  rel=0.05)


@pytest.mark.parametrize("kwargs,match", [
    (dict(value_net="dense"), "value_net"), (dict(value_net=None), "value_net"),
    (dict(value_net="mlp", value_hidden_sizes=()), "value_hidden_sizes"),
    (dict(value_net="mlp", value_hidden_sizes=(8, 0)), "value_hidden_sizes"),
    (dict(value_net="mlp", value_hidden_sizes=(8.5,)), "value_hidden_sizes"),
    (dict(value_net="mlp", value_hidden_sizes="64"), "value_hidden_sizes"),
    (dict(value_net="mlp", value_hidden_sizes=8), "value_hidden_sizes")])
def test_a_bad_value_net_or_tower_width_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PolicyValueConvNet(GAME, channels=4, blocks=1, **kwargs)


def test_bad_sizes_and_inputs_that_are_not_planes_are_refused():
    with pytest.raises(ValueError, match="value_planes"):
        PolicyValueConvNet(GAME, value_planes=0)
    with pytest.raises(ValueError, match="channels"):
        PolicyValueConvNet(GAME, channels=0)
    with pytest.raises(ValueError, match="blocks"):
        PolicyValueConvNet(GAME, blocks=-1)
    with pytest.raises(ValueError, match="planes"):
        PolicyValueConvNet(problems.SlidingPuzzle(3))


@pytest.mark.parametrize("sizes", [
    dict(hidden_sizes=(64,)), dict(hidden_sizes=(32, 16), features="threats"),
    dict(architecture="conv", channels=4, blocks=1),
    dict(architecture="residual", channels=8, blocks=2, features="threats"),
    dict(architecture="residual", channels=8, blocks=1, features="threats",
         hidden_sizes=(32, 16), value_net="mlp"),
])
def test_parameter_count_counts_what_the_net_is_made_with(sizes):
    from async_search.problems.nets import NetConfig, initial_weights

    config = NetConfig("policy_value", "connect_four", **sizes)
    weights = initial_weights(config, seed=0)
    arrays = (weights.values() if isinstance(weights, dict)
              else [a for layer in weights for a in layer])
    assert config.parameter_count == sum(np.size(a) for a in arrays)


def test_parameter_count_of_a_typo_sized_net_is_exact_and_allocates_nothing():
    from async_search.problems.nets import NetConfig

    config = NetConfig("heuristic", "sliding_puzzle", hidden_sizes=(99999999999,))
    assert config.parameter_count == 256 * 99999999999 + 99999999999 + 99999999999 + 1
