"""The residual nets' NumPy definition: architecture, weights, output conventions."""

import re
import subprocess
import sys

import numpy as np
import pytest

from async_search.problems import (ConnectFour, CostToGoResNet, PolicyValueResNet,
                                   SlidingPuzzle)
from tests.problems.residual_cases import (GAME, PUZZLE, board_inputs, puzzle_inputs,
                                           small_cost_to_go, small_policy_value)


def test_importing_the_nets_imports_no_framework():
    code = ("import sys, async_search.problems; "
            "from async_search.problems import residual_torch, residual_tf, residual_jax; "
            "bad = [m for m in ('torch', 'tensorflow', 'jax') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_policy_value_net_returns_what_mcts_expects():
    net = small_policy_value()
    assert net.input_spec == GAME.input_spec
    logits, value = net(board_inputs(5))
    assert logits.shape == (5, GAME.num_actions) and logits.dtype == np.float32
    assert value.shape == (5, 1) and value.dtype == np.float32
    assert np.all(np.abs(value) <= 1.0) and np.isfinite(logits).all()
    assert len(np.unique(value)) > 1  # the positions are told apart


def test_cost_to_go_net_returns_one_value_per_state():
    net = small_cost_to_go()
    assert net.input_spec == PUZZLE.input_spec
    h = net(puzzle_inputs(6))
    assert h.shape == (6, 1) and h.dtype == np.float32
    assert len(np.unique(h)) == 6


def test_a_batch_of_zero_rows_gives_outputs_of_zero_rows():
    policy, value = PolicyValueResNet(GAME, channels=4, blocks=1)(board_inputs(1)[:0])
    assert policy.shape == (0, GAME.num_actions) and value.shape == (0, 1)
    assert CostToGoResNet(PUZZLE, first_width=8, width=8, blocks=1)(
        puzzle_inputs(1)[:0]).shape == (0, 1)


def test_sizes_shape_the_weights():
    net = PolicyValueResNet(GAME, channels=16, blocks=3, value_hidden=24)
    w = net.weights
    assert w["stem.conv.weight"].shape == (16, 2, 3, 3)
    assert w["blocks.2.conv2.weight"].shape == (16, 16, 3, 3)
    assert "blocks.3.conv1.weight" not in w
    assert w["policy.fc.weight"].shape == (7, 2 * 42)
    assert w["value.fc1.weight"].shape == (24, 42)
    assert net.sizes == {"channels": 16, "blocks": 3, "value_hidden": 24}
    h = CostToGoResNet(SlidingPuzzle(3), first_width=40, width=20, blocks=1)
    assert h.weights["fc1.weight"].shape == (40, 81)
    assert h.weights["blocks.0.fc2.weight"].shape == (20, 20)
    assert h.weights["out.weight"].shape == (1, 20)
    assert all(v.dtype == np.float32 for v in h.weights.values())


def test_no_blocks_is_a_net_too():
    logits, value = PolicyValueResNet(GAME, channels=4, blocks=0)(board_inputs(2))
    assert logits.shape == (2, 7) and value.shape == (2, 1)
    assert CostToGoResNet(PUZZLE, first_width=8, width=8, blocks=0)(
        puzzle_inputs(2)).shape == (2, 1)


def test_seeds_give_the_same_or_other_weights():
    a, b, c = (PolicyValueResNet(GAME, channels=4, seed=s) for s in (0, 0, 1))
    assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)
    assert not np.array_equal(a.weights["stem.conv.weight"], c.weights["stem.conv.weight"])


def test_a_row_does_not_depend_on_its_batch_mates():
    net, x = small_policy_value(), board_inputs(9)
    together = net(x)
    for i in (0, 4, 8):
        alone = net(x[i:i + 1])
        for t, a in zip(together, alone):
            np.testing.assert_allclose(t[i:i + 1], a, rtol=1e-6, atol=1e-6)


def test_the_convolution_is_the_textbook_one():
    """One output cell of the stem, computed by hand: padding 1, kernel not flipped."""
    net = small_policy_value()
    x = board_inputs(1, seed=5)
    w = net.weights
    kernel = w["stem.conv.weight"].astype(np.float64)
    padded = np.pad(x[0].astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    from async_search.problems import residual_nets
    conv = residual_nets._conv2d(x.astype(np.float64), kernel)
    for o, r, c in [(0, 0, 0), (3, 2, 5), (7, 5, 6)]:
        expected = (padded[:, r:r + 3, c:c + 3] * kernel[o]).sum()
        assert conv[0, o, r, c] == pytest.approx(expected)


def test_with_weights_swaps_them_and_refuses_others_by_name():
    net, other = small_policy_value(1), small_policy_value(2)
    swapped = net.with_weights(other.weights)
    x = board_inputs(3)
    np.testing.assert_array_equal(swapped(x)[0], other(x)[0])
    assert not np.array_equal(net(x)[0], other(x)[0])  # the original kept its own
    missing = dict(net.weights)
    del missing["value.fc2.bias"]
    with pytest.raises(ValueError, match="value.fc2.bias"):
        net.with_weights(missing)
    wrong = dict(net.weights, **{"stem.conv.weight": np.zeros((8, 2, 5, 5), np.float32)})
    with pytest.raises(ValueError, match="stem.conv.weight"):
        net.with_weights(wrong)
    with pytest.raises(ValueError, match="unexpected"):
        net.with_weights(dict(net.weights, extra=np.zeros(1)))
    # Not named arrays at all: an AttributeError ('list' object has no attribute
    # 'items') came out of the check.
    for weights in (list(net.weights.items()), None):
        with pytest.raises(ValueError, match="takes named arrays"):
            net.with_weights(weights)


@pytest.mark.parametrize("make, name", [
    (lambda: PolicyValueResNet(GAME, channels=0), "channels"),
    (lambda: PolicyValueResNet(GAME, blocks=-1), "blocks"),
    (lambda: PolicyValueResNet(GAME, value_hidden=True), "value_hidden"),
    (lambda: PolicyValueResNet(GAME, seed=-1), "seed"),
    (lambda: CostToGoResNet(PUZZLE, width=2.0), "width"),
    (lambda: CostToGoResNet(PUZZLE, first_width="8"), "first_width"),
    (lambda: PolicyValueResNet(PUZZLE), "planes"),
])
def test_bad_sizes_are_named(make, name):
    with pytest.raises(ValueError, match=name):
        make()



@pytest.mark.parametrize("change, said", [(lambda v: v + 1j, "is complex128"),
                                          (lambda v: v * 0 + 1e300, "past float32's range")])
def test_weights_a_cast_to_float32_would_change_are_refused(change, said):
    # They were cast as they came: a complex weight lost its imaginary part, 1e300
    # became inf, where the adapters refuse both.
    game = ConnectFour()
    net = PolicyValueResNet(game, channels=4, blocks=1)
    weights = dict(net.weights)
    weights["value.fc2.bias"] = change(weights["value.fc2.bias"].astype(np.float64))
    with pytest.raises(ValueError, match=f"'value.fc2.bias' .*{re.escape(said)}"):
        net.with_weights(weights)
    ints = {k: np.round(v).astype(np.int64) for k, v in net.weights.items()}
    assert net.with_weights(ints).weights["value.fc2.bias"].dtype == np.float32
