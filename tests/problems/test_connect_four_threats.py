"""Threat planes: the cells where each player would make four, checked against the
solver's bitboard rule; nets that read them, through NetConfig and checkpoints."""

import numpy as np
import pytest

from async_search.problems import ConnectFour
from async_search.problems.checkpoints import (load_checkpoint, read_checkpoint,
                                               save_checkpoint)
from async_search.problems.connect_four import ConnectFourState
from async_search.problems.connect_four_solver import _winning_cells
from async_search.problems.nets import (NetConfig, check_weights, config_of,
                                        initial_weights, to_model, weights_of)
from async_search.problems.connect_four_threats import FeaturedNet, threat_planes
from tests.net_weights import perturbed_weights

GAME = ConnectFour()


def random_states(count, seed, max_moves=40):
    """States after random moves; a game that ends stops there (terminal ones too)."""
    rng = np.random.default_rng(seed)
    states = []
    for _ in range(count):
        state = GAME.initial_state()
        for _ in range(int(rng.integers(0, max_moves))):
            if GAME.terminal_value(state) is not None:
                break
            legal = GAME.legal_actions(state)
            state = GAME.play(state, legal[int(rng.integers(len(legal)))])
        states.append(state)
    return states


def expected_planes(states):
    """The solver's winning cells of each side (an independent bitboard rule), encoded
    as the game encodes stones."""
    cells = [ConnectFourState(_winning_cells(s.to_move, s.to_move | s.waiting),
                              _winning_cells(s.waiting, s.to_move | s.waiting))
             for s in states]
    return np.concatenate([GAME.encode(states), GAME.encode(cells)], axis=1)


def test_the_threat_planes_are_the_solvers_winning_cells_of_each_side():
    states = random_states(400, 0)
    got = threat_planes(GAME.encode(states))
    want = expected_planes(states)
    assert got.dtype == np.float32 and got.shape == (400, 4, 6, 7)
    assert np.array_equal(got, want)
    # Not a vacuous match: both sides have threats somewhere, and not everywhere.
    assert 0 < got[:, 2].sum() < got[:, 2].size and 0 < got[:, 3].sum() < got[:, 3].size


def test_a_win_at_once_and_a_win_to_block_are_marked_for_the_right_side():
    state = GAME.from_moves([0, 6, 1, 6, 2])  # X: three along the bottom; O to move
    planes = threat_planes(GAME.encode([state]))[0]
    assert planes[2].sum() == 0                       # O (to move) has no threat
    assert planes[3].nonzero() == ((0,), (3,))        # X wins on the bottom of column 3
    state = GAME.play(state, 5)                       # now X is to move
    planes = threat_planes(GAME.encode([state]))[0]
    assert planes[2].nonzero() == ((0,), (3,)) and planes[3].sum() == 0


def test_a_cell_taken_or_a_line_shared_is_no_threat():
    # X X X O along the bottom: O took the cell that would make X's four.
    state = GAME.from_moves([0, 3, 1, 6, 2])
    planes = threat_planes(GAME.encode([state]))[0]
    assert planes[2:].sum() == 0
    # Without O's stone on it, the same three threaten it.
    assert threat_planes(GAME.encode([GAME.from_moves([0, 5, 1, 6, 2])]))[0, 3, 0, 3] == 1


def test_rows_are_the_same_whatever_their_batch_mates():
    x = GAME.encode(random_states(64, 1))
    whole = threat_planes(x)
    for i in (0, 17, 63):
        assert np.array_equal(threat_planes(x[i:i + 1])[0], whole[i])
    assert threat_planes(x[:0]).shape == (0, 4, 6, 7)


def test_the_planes_of_a_mirrored_board_are_the_mirrored_planes():
    x = GAME.encode(random_states(100, 2))
    assert np.array_equal(threat_planes(x[..., ::-1]), threat_planes(x)[..., ::-1])


@pytest.mark.parametrize("shape", [(3, 84), (3, 4, 6, 7), (2, 6, 7), (3, 2, 7, 6)])
def test_planes_of_another_shape_are_refused_naming_the_shape(shape):
    with pytest.raises(ValueError, match=r"\[n, 2, 6, 7\].*" + str(shape[0])):
        threat_planes(np.zeros(shape, np.float32))


CONFIGS = [NetConfig("policy_value", "connect_four", (16, 8), features="threats"),
           NetConfig("policy_value", "connect_four", architecture="residual", channels=4,
                     blocks=1, value_hidden=8, features="threats")]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.describe())
def test_a_featured_net_takes_the_games_planes_and_its_body_reads_the_threats(config):
    weights = perturbed_weights(config, 3)
    model = to_model(config, weights)
    assert isinstance(model, FeaturedNet)
    assert model.input_spec == GAME.input_spec
    x = GAME.encode(random_states(50, 3))
    logits, value = model(x)
    body_logits, body_value = model.body(threat_planes(x))
    assert logits.tobytes() == body_logits.tobytes()
    assert value.tobytes() == body_value.tobytes()
    assert logits.shape == (50, 7) and value.shape == (50, 1)
    # The threat planes move the outputs: the body reads more than the stones.
    no_threats = threat_planes(x)
    no_threats[:, 2:] = 0
    assert not np.array_equal(model.body(no_threats)[0], logits)
    assert config_of(model) == config
    # Its weights (on the grid) make the same model again.
    again = to_model(config, weights_of(model))
    for got, want in zip(again(x), (logits, value)):
        assert got.tobytes() == want.tobytes()


def test_a_featured_mlp_has_an_input_layer_for_the_four_planes():
    config = CONFIGS[0]
    assert config.input_shape == (2, 6, 7) and config.body_input_shape == (4, 6, 7)
    assert config.layer_shapes[0] == (168, 16)
    assert config.describe() == "mlp 16x8 + threats"
    with pytest.raises(ValueError, match="do not fit"):
        check_weights(config, initial_weights(NetConfig("policy_value", "connect_four",
                                                        (16, 8)), 0))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.describe())
def test_a_featured_checkpoint_round_trips_its_config_and_outputs(tmp_path, config):
    weights = perturbed_weights(config, 5)
    path = save_checkpoint(tmp_path / "ckpt", weights, config, {"step": 1})
    assert read_checkpoint(path).config == config
    model = load_checkpoint(path)
    x = GAME.encode(random_states(30, 5))
    for got, want in zip(model(x), to_model(config, weights)(x)):
        assert got.tobytes() == want.tobytes()
    again = save_checkpoint(tmp_path / "again", model)  # the config read from the model
    assert read_checkpoint(again).config == config


def test_the_json_names_the_features_only_when_there_are_some():
    plain = NetConfig("policy_value", "connect_four", (16,))
    assert "features" not in plain.to_json()
    featured = NetConfig("policy_value", "connect_four", (16,), features="threats")
    assert featured.to_json()["features"] == "threats"
    assert NetConfig.from_json(featured.to_json()) == featured
    assert NetConfig.from_json(plain.to_json()) == plain


@pytest.mark.parametrize("kwargs,match", [
    (dict(kind="policy_value", problem="connect_four", features="lines"), "features"),
    (dict(kind="policy_value", problem="connect_four", features=None), "features"),
    (dict(kind="heuristic", problem="sliding_puzzle", features="threats"),
     "Connect Four's"),
])
def test_unknown_features_or_threats_for_the_puzzle_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NetConfig(**kwargs)


@pytest.mark.parametrize("config", CONFIGS[:2], ids=lambda c: c.describe())
def test_the_tf_twin_of_a_featured_net_is_bitwise_equal_whatever_the_batch(config):
    pytest.importorskip("tensorflow")
    from async_search.problems import tf_twin
    model = to_model(config, perturbed_weights(config, 6))
    twin = tf_twin(model, max_batch_size=64)
    x = GAME.encode(random_states(70, 6))
    for n in (1, 5, 64):
        for got, want in zip(twin(x[:n]), model(x[:n])):
            assert got.dtype == np.float32 and got.tobytes() == want.tobytes()


def test_tf_twin_refuses_a_featured_net_of_a_body_it_cannot_twin_naming_it():
    pytest.importorskip("tensorflow")
    from async_search.problems import tf_twin
    model = to_model(CONFIGS[1], initial_weights(CONFIGS[1], 0))
    model.body = lambda x: x
    with pytest.raises(TypeError, match="FeaturedNet of a function"):
        tf_twin(model)
