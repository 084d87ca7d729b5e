"""The trainer and the net configs: the loss, fitting, determinism, the exported model."""

import json
import math

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from async_search import problems  # noqa: E402
from async_search.problems.nets import (NetConfig, initial_weights, to_model,  # noqa: E402
                                        weights_of)
from async_search.training.replay import Minibatch, ReplayBuffer  # noqa: E402
from async_search.training.trainer import LossTerms, Trainer  # noqa: E402
from tests.game_positions import connect_four_positions  # noqa: E402

GAME = problems.ConnectFour()
PUZZLE = problems.SlidingPuzzle(3)
PV = NetConfig("policy_value", "connect_four", (16,))
H = NetConfig("heuristic", "sliding_puzzle", (16,), size=3)


positions = connect_four_positions  # encoded, from random games (terminal ones included)


def game_buffer(count=64, seed=0):
    """A buffer of ``count`` fixed positions with fixed random policy/value targets."""
    rng = np.random.default_rng(seed + 100)
    buf = ReplayBuffer(count, seed=seed)
    buf.add(positions(count, seed), rng.dirichlet(np.full(7, 0.3), count),
            rng.choice([-1.0, 0.0, 1.0], count))
    return buf


def puzzle_states(count, seed=0):
    rng = np.random.default_rng(seed)
    return [PUZZLE.scramble(int(k), seed=seed * 1000 + i)
            for i, k in enumerate(rng.integers(0, 30, count))]


def manhattan_buffer(count=256, seed=0):
    """A value-only buffer whose targets are exactly the Manhattan distance."""
    states = puzzle_states(count, seed)
    buf = ReplayBuffer(count, seed=seed)
    buf.add(PUZZLE.encode(states), None,
            np.array([PUZZLE.manhattan_distance(s) for s in states], np.float32))
    return buf


def zero_weights(config):
    return [(np.zeros_like(w), np.zeros_like(b)) for w, b in initial_weights(config, 0)]


def assert_weights_bitwise_equal(a, b):
    for (w, bias), (w0, bias0) in zip(a, b, strict=True):
        assert w.tobytes() == w0.tobytes() and bias.tobytes() == bias0.tobytes()


def weights_differ(a, b):
    return any(not np.array_equal(w, w0) for (w, _), (w0, _) in zip(a, b))


# -- the loss ------------------------------------------------------------------------------


def test_the_loss_falls_well_below_its_start_on_a_fixed_tiny_dataset():
    buf = game_buffer()
    data = buf.arrays()
    trainer = Trainer(PV, batch_size=32, learning_rate=3e-3, seed=0)
    first = trainer.loss(data)
    terms = trainer.train_steps(buf, 200)
    last = trainer.loss(data)
    assert terms.steps == 200 and trainer.steps_taken == 200
    assert last.total < 0.6 * first.total
    assert last.value < 0.25 * first.value
    assert last.policy < first.policy


def test_with_zero_weights_the_policy_loss_is_ln_7_and_the_value_loss_the_mean_square():
    trainer = Trainer(PV, weights=zero_weights(PV), l2=0.1)
    rng = np.random.default_rng(0)
    policy = rng.dirichlet(np.ones(7), 5).astype(np.float32)
    value = np.array([1.0, -1.0, 0.0, 0.5, 1.0], np.float32)
    terms = trainer.loss(Minibatch(positions(5), policy, value))
    assert terms.policy == pytest.approx(math.log(7), rel=1e-6)  # uniform logits
    assert terms.value == pytest.approx(float(np.mean(value ** 2)), rel=1e-6)
    assert terms.l2 == 0.0
    assert terms.total == pytest.approx(math.log(7) + 3.25 / 5, rel=1e-6)
    assert terms.steps == 0


def test_the_loss_terms_are_cross_entropy_squared_error_and_l2_on_known_logits():
    # Zero first layer: the hidden units are 0, so the output is the last bias whatever
    # the input, and the last kernel (all ones) only adds to the L2 term.
    logits = np.array([2.0, -1.0, 0.5, 0.0, 3.0, -2.0, 1.0], np.float32)
    predicted = 0.25
    (w0, b0), (w1, _) = zero_weights(PV)
    weights = [(w0, b0), (np.ones_like(w1), np.append(logits, predicted).astype(np.float32))]
    trainer = Trainer(PV, weights=weights, l2=1e-3, value_weight=2.0)
    policy = np.array([[0, 0, 0, 0, 1, 0, 0], [0.5, 0, 0, 0, 0.5, 0, 0]], np.float32)
    value = np.array([1.0, -1.0], np.float32)
    terms = trainer.loss(Minibatch(positions(2), policy, value))

    log_softmax = logits - np.log(np.exp(logits.astype(np.float64)).sum())
    cross_entropy = float(np.mean(-(policy * log_softmax).sum(axis=1)))
    squared = float(np.mean((predicted - value) ** 2))
    l2 = 1e-3 * w1.size
    assert terms.policy == pytest.approx(cross_entropy, rel=1e-5)
    assert terms.value == pytest.approx(squared, rel=1e-6)
    assert terms.l2 == pytest.approx(l2, rel=1e-6)
    assert terms.total == pytest.approx(cross_entropy + 2.0 * squared + l2, rel=1e-5)


def test_a_residual_heuristic_net_fits_the_target_minus_manhattan():
    buf = manhattan_buffer()
    data = buf.arrays()
    # With zero weights the residual net already predicts Manhattan: loss exactly 0; a
    # net without the residual predicts 0 and pays the whole squared distance.
    assert Trainer(H, weights=zero_weights(H)).loss(data).value == 0.0
    plain = NetConfig("heuristic", "sliding_puzzle", (16,), size=3, residual=False)
    assert Trainer(plain, weights=zero_weights(plain)).loss(data).value == pytest.approx(
        float(np.mean(data.value ** 2)), rel=1e-6)
    # From random weights it learns the zero correction quickly.
    trainer = Trainer(H, batch_size=64, learning_rate=1e-2, l2=0.0, seed=0)
    start = trainer.loss(data).value
    trainer.train_steps(buf, 100)
    end = trainer.loss(data)
    assert end.policy == 0.0 and start > 0.05 and end.value < 0.01
    h = trainer.model()(data.x)[:, 0]
    assert np.abs(h - data.value).max() < 0.25


# -- determinism and the optimizer -----------------------------------------------------------


def test_training_is_deterministic_for_the_seeds():
    results = []
    for _ in range(2):
        trainer = Trainer(PV, batch_size=16, seed=3)
        trainer.train_steps(game_buffer(seed=5), 15)
        results.append(trainer.weights)
    assert_weights_bitwise_equal(*results)
    assert weights_differ(results[0], initial_weights(PV, 3))


def test_a_different_seed_gives_different_initial_weights():
    assert weights_differ(Trainer(PV, seed=0).weights, Trainer(PV, seed=1).weights)


def test_reset_optimizer_keeps_the_learning_rate_and_training_still_moves_the_weights():
    trainer = Trainer(PV, batch_size=16, learning_rate=2e-3)
    buf = game_buffer()
    trainer.train_steps(buf, 5)
    trainer.reset_optimizer()
    assert float(trainer.optimizer.learning_rate.numpy()) == pytest.approx(2e-3)
    assert int(trainer.optimizer.iterations.numpy()) == 0
    before = trainer.weights
    trainer.train_steps(buf, 5)
    assert weights_differ(before, trainer.weights)


def test_after_reset_optimizer_a_trainer_continues_like_a_fresh_one(tmp_path):
    buf_a = game_buffer(seed=1)
    a = Trainer(PV, batch_size=16, seed=0)
    a.train_steps(buf_a, 10)
    midway = a.weights
    buf_a.save(tmp_path / "replay.npz")   # B samples the same minibatches from here
    buf_b = ReplayBuffer.load(tmp_path / "replay.npz")
    buf_c = ReplayBuffer.load(tmp_path / "replay.npz")

    a.reset_optimizer()
    a.train_steps(buf_a, 10)
    b = Trainer(PV, batch_size=16, weights=midway)
    b.train_steps(buf_b, 10)
    assert_weights_bitwise_equal(a.weights, b.weights)

    # Without the reset, Adam's moments carry over and the weights come out otherwise.
    c = Trainer(PV, batch_size=16, seed=0)
    c.train_steps(game_buffer(seed=1), 10)
    c.train_steps(buf_c, 10)
    assert weights_differ(c.weights, b.weights)


def test_weights_and_set_weights_round_trip():
    trainer = Trainer(PV)
    weights = initial_weights(PV, 9)
    trainer.set_weights(weights)
    assert_weights_bitwise_equal(trainer.weights, weights)
    with pytest.raises(ValueError, match="do not fit"):
        trainer.set_weights(initial_weights(NetConfig("policy_value", "connect_four",
                                                      (8,)), 0))


# -- the exported model ------------------------------------------------------------------------


def test_model_is_within_the_grid_rounding_of_the_float_keras_model():
    trainer = Trainer(PV, batch_size=16, seed=0)
    trainer.train_steps(game_buffer(), 20)
    x = positions(100, seed=7)
    model = trainer.model()
    assert isinstance(model, problems.PolicyValueMLP)
    logits, value = model(x)
    out = trainer.keras_model(x.reshape(len(x), -1)).numpy()
    # Not equal: the NumPy model's weights are rounded to multiples of 2**-10 and its
    # activations (input and hidden) to multiples of 2**-8, which makes its rows exact
    # and batch-independent. For a (16,) net that moves outputs by about 5e-3 at most
    # (measured); 0.05 leaves a tenfold margin and still catches a wrong layer.
    assert np.abs(logits - out[:, :7]).max() < 0.05
    assert np.abs(value[:, 0] - np.clip(out[:, 7], -1, 1)).max() < 0.05
    assert np.abs(logits - out[:, :7]).max() > 0  # the rounding is real


def test_model_rows_are_batch_independent_bitwise():
    trainer = Trainer(PV, batch_size=16, seed=0)
    trainer.train_steps(game_buffer(), 5)
    model = trainer.model()
    x = positions(33, seed=2)
    logits, value = model(x)
    for i in (0, 5, 32):
        alone_logits, alone_value = model(x[i:i + 1])
        assert alone_logits.tobytes() == logits[i:i + 1].tobytes()
        assert alone_value.tobytes() == value[i:i + 1].tobytes()
    sub_logits, _ = model(x[3:20])
    assert sub_logits.tobytes() == logits[3:20].tobytes()


def test_model_round_trips_through_weights_of():
    trainer = Trainer(H, seed=4)
    model = trainer.model()
    assert isinstance(model, problems.LearnedHeuristic)
    again = to_model(H, weights_of(model))
    x = PUZZLE.encode(puzzle_states(10))
    assert again(x).tobytes() == model(x).tobytes()


def test_the_tf_twin_of_a_trained_policy_value_model_is_bitwise_equal():
    trainer = Trainer(PV, batch_size=16, seed=0)
    trainer.train_steps(game_buffer(), 10)
    model = trainer.model()
    twin = problems.tf_twin(model, max_batch_size=32)
    x = positions(17, seed=4)
    for n in (1, 3, 17):
        logits, value = model(x[:n])
        tf_logits, tf_value = twin(x[:n])
        assert tf_logits.dtype == np.float32 and tf_logits.shape == (n, 7)
        assert tf_logits.tobytes() == logits.tobytes()
        assert tf_value.tobytes() == value.tobytes()


def test_the_tf_twin_of_a_trained_heuristic_is_bitwise_equal():
    trainer = Trainer(H, batch_size=32, learning_rate=1e-2, seed=0)
    trainer.train_steps(manhattan_buffer(64), 10)
    model = trainer.model()
    twin = problems.tf_twin(model, max_batch_size=32)
    x = PUZZLE.encode(puzzle_states(17, seed=3))
    for n in (1, 3, 17):
        y = twin(x[:n])
        assert y.dtype == np.float32 and y.shape == (n, 1)
        assert y.tobytes() == model(x[:n]).tobytes()


# -- bad arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, name", [
    ({"learning_rate": 0.0}, "learning_rate"), ({"learning_rate": -1e-3}, "learning_rate"),
    ({"learning_rate": float("nan")}, "learning_rate"), ({"l2": -1e-4}, "l2"),
    ({"batch_size": 0}, "batch_size"), ({"value_weight": 0.0}, "value_weight"),
    ({"seed": -1}, "seed"),
])
def test_bad_trainer_arguments_raise_value_error_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Trainer(PV, **kwargs)


def test_initial_weights_that_do_not_fit_raise_value_error():
    with pytest.raises(ValueError, match="do not fit"):
        Trainer(PV, weights=initial_weights(H, 0))


@pytest.fixture(scope="module")
def trainer():
    return Trainer(PV, batch_size=4)


def test_training_zero_steps_raises_value_error(trainer):
    with pytest.raises(ValueError, match="n must be"):
        trainer.train_steps(game_buffer(8), 0)


def test_training_on_an_empty_buffer_raises_value_error(trainer):
    with pytest.raises(ValueError, match="empty"):
        trainer.train_steps(ReplayBuffer(8), 1)


def test_training_on_a_buffer_of_other_states_raises_value_error_and_trains_nothing(trainer):
    before = trainer.weights
    with pytest.raises(ValueError, match="states"):
        trainer.train_steps(manhattan_buffer(8), 1)
    assert_weights_bitwise_equal(before, trainer.weights)


@pytest.mark.parametrize("num_actions", [None, 5])
def test_training_a_policy_net_on_other_policy_targets_raises_value_error(trainer,
                                                                          num_actions):
    trainer.train_steps(game_buffer(8), 1)  # traced once with 7 columns
    before, steps = trainer.weights, trainer.steps_taken
    buf = ReplayBuffer(8)
    x = positions(8)
    buf.add(x, None if num_actions is None else np.ones((8, num_actions)), np.zeros(8))
    with pytest.raises(ValueError, match="policy"):
        trainer.train_steps(buf, 1)
    assert_weights_bitwise_equal(before, trainer.weights)
    assert trainer.steps_taken == steps


def test_loss_terms_as_dict_lists_every_term():
    assert LossTerms(1.0, 2.0, 0.5, 3.5, 4).as_dict() == {
        "policy": 1.0, "value": 2.0, "l2": 0.5, "total": 3.5, "steps": 4}


# -- NetConfig -------------------------------------------------------------------------------


@pytest.mark.parametrize("args, kwargs, match", [
    (("value", "connect_four", (16,)), {}, "kind"),
    (("policy_value", "chess", (16,)), {}, "problem"),
    (("heuristic", "connect_four", (16,)), {}, "does not fit"),
    (("policy_value", "sliding_puzzle", (16,)), {}, "does not fit"),
    (("policy_value", "connect_four", (16, 0)), {}, "hidden_sizes"),
    (("policy_value", "connect_four", ()), {}, "hidden_sizes"),
    (("heuristic", "sliding_puzzle", (-4,)), {"size": 3}, "hidden_sizes"),
    # int() ran before the check: 1.5 and True became 1, "64" became 64
    (("policy_value", "connect_four", (1.5,)), {}, "hidden_sizes must be integer"),
    (("policy_value", "connect_four", (True,)), {}, "hidden_sizes must be integer"),
    (("policy_value", "connect_four", ("64",)), {}, "hidden_sizes must be integer"),
    (("policy_value", "connect_four", 64), {}, "hidden_sizes must be integer"),
])
def test_an_invalid_net_config_raises_value_error_naming_the_field(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        NetConfig(*args, **kwargs)


@pytest.mark.parametrize("config", [
    PV, H, NetConfig("policy_value", "connect_four", [32, 8]),
    NetConfig("heuristic", "sliding_puzzle", (64, 64), size=4, residual=False),
])
def test_a_net_config_round_trips_through_json_text(config):
    again = NetConfig.from_json(json.loads(json.dumps(config.to_json())))
    assert again == config and isinstance(again.hidden_sizes, tuple)


def test_net_config_shapes():
    assert PV.input_shape == (2, 6, 7) and PV.num_actions == 7 and PV.output_size == 8
    assert PV.layer_shapes == [(84, 16), (16, 8)]
    assert H.input_shape == (9, 9) and H.num_actions is None and H.output_size == 1
    assert H.layer_shapes == [(81, 16), (16, 1)]
    assert isinstance(H.make_problem(), problems.SlidingPuzzle)
    assert H.make_problem().size == 3


# -- convolutional nets ---------------------------------------------------------------------

RESIDUAL = NetConfig("policy_value", "connect_four", architecture="residual", channels=8,
                     blocks=1, value_hidden=16)


@pytest.mark.parametrize("architecture", ["conv", "residual"])
def test_a_convolutional_nets_loss_falls_well_below_its_start(architecture):
    config = NetConfig("policy_value", "connect_four", architecture=architecture,
                       channels=8, blocks=1, value_hidden=16)
    buf = game_buffer()
    data = buf.arrays()
    trainer = Trainer(config, batch_size=32, learning_rate=3e-3, seed=0)
    first = trainer.loss(data)
    trainer.train_steps(buf, 200)
    last = trainer.loss(data)
    assert last.total < 0.6 * first.total
    assert last.policy < first.policy and last.value < first.value


def test_a_convolutional_trainers_model_is_the_numpy_net_of_its_weights():
    trainer = Trainer(RESIDUAL, batch_size=16, seed=1)
    trainer.train_steps(game_buffer(), 20)
    model = trainer.model()
    assert isinstance(model, problems.PolicyValueConvNet)
    x = positions(20, 5)
    for got, want in zip(model(x), to_model(RESIDUAL, trainer.weights)(x)):
        assert got.tobytes() == want.tobytes()
    again = Trainer(RESIDUAL, weights=weights_of(model))
    for name, w in trainer.weights.items():
        assert again.weights[name].tobytes() == w.tobytes()


def test_a_convolutional_nets_l2_term_covers_its_kernels_only():
    trainer = Trainer(RESIDUAL, l2=1e-3, seed=2)
    weights = trainer.weights
    want = 1e-3 * sum(float(np.square(w.astype(np.float64)).sum())
                      for name, w in weights.items() if name.endswith(".weight"))
    rng = np.random.default_rng(0)
    terms = trainer.loss(Minibatch(positions(4), rng.dirichlet(np.ones(7), 4),
                                   np.zeros(4, np.float32)))
    assert terms.l2 == pytest.approx(want, rel=1e-5)


def test_a_convolutional_trainer_refuses_an_mlps_weights():
    with pytest.raises(ValueError, match="named arrays"):
        Trainer(RESIDUAL, weights=initial_weights(PV, 0))


def test_net_configs_of_every_architecture_round_trip_through_json():
    for config in (PV, H, RESIDUAL, NetConfig("policy_value", "connect_four",
                                              architecture="conv", blocks=0)):
        assert NetConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    assert "architecture" not in PV.to_json()  # an MLP's JSON is as it was
    assert RESIDUAL.describe() == "residual 8x1" and PV.describe() == "mlp 16"


@pytest.mark.parametrize("changes,match", [
    (dict(architecture="transformer"), "architecture"),
    (dict(architecture="residual", channels=0), "channels"),
    (dict(architecture="conv", blocks=-1), "blocks"),
    (dict(architecture="conv", value_hidden=1.5), "value_hidden"),
])
def test_bad_net_configs_are_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        NetConfig("policy_value", "connect_four", **changes)


def test_a_convolutional_heuristic_is_refused():
    with pytest.raises(ValueError, match="mlp"):
        NetConfig("heuristic", "sliding_puzzle", architecture="residual")


def test_the_config_of_a_convolutional_model_is_read_from_it():
    from async_search.problems.nets import config_of
    model = to_model(RESIDUAL, initial_weights(RESIDUAL, 0))
    assert config_of(model) == RESIDUAL


@pytest.mark.parametrize("weights", ["model", [None, None], {"w": np.zeros(1)}])
def test_weights_that_are_not_layers_are_refused_naming_what_came(weights):
    # A model passed for its weights got a raw "'PolicyValueMLP' object is not iterable".
    config = NetConfig("policy_value", "connect_four", (8,))
    if weights == "model":
        weights = to_model(config, initial_weights(config, 0))
    with pytest.raises(ValueError, match="weights do not fit .*an mlp takes a list of "
                                         r"\(w, b\) layers"):
        Trainer(config, weights=weights)
