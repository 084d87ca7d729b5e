"""Checkpoints: bitwise round trips, atomic replacement, and clear refusals."""

import json
import os

import numpy as np
import pytest

from async_search.problems import (ConnectFour, LearnedHeuristic, PolicyValueMLP,
                                   SlidingPuzzle)
from async_search.training.checkpoints import (FORMAT, CheckpointError, load_checkpoint,
                                               read_checkpoint, save_checkpoint)
from async_search.training.nets import NetConfig, initial_weights, to_model, weights_of

POLICY_VALUE = NetConfig("policy_value", "connect_four", (16,))
HEURISTIC = NetConfig("heuristic", "sliding_puzzle", (16,), size=3)
METADATA = {"iteration": 3, "elo": 12.5, "note": "gated", "scores": [1, 0.5, None],
            "nested": {"a": True}}


def trained_looking_weights(config, seed):
    """Off-grid float32 weights with non-zero biases, as a trainer leaves them."""
    rng = np.random.default_rng(seed)
    return [(w, rng.normal(0, 0.1, b.shape).astype(np.float32))
            for w, b in initial_weights(config, seed)]


def connect_four_positions(count, seed=0):
    game = ConnectFour()
    rng = np.random.default_rng(seed)
    states = []
    while len(states) < count:
        state = game.initial_state()
        for _ in range(int(rng.integers(0, 30))):
            legal = game.legal_actions(state)
            if not legal:
                break
            state = game.play(state, legal[int(rng.integers(len(legal)))])
        states.append(state)
    return game.encode(states)


def puzzle_positions(count):
    puzzle = SlidingPuzzle(3)
    return puzzle.encode([puzzle.scramble(5 + i, seed=i) for i in range(count)])


def assert_weights_bitwise_equal(got, want):
    assert len(got) == len(want)
    for (w, b), (w0, b0) in zip(got, want):
        for a, a0 in ((w, w0), (b, b0)):
            assert a.dtype == np.asarray(a0).dtype and a.shape == np.shape(a0)
            assert a.tobytes() == np.asarray(a0).tobytes()


def outputs(model, x):
    y = model(x)
    return y if isinstance(y, tuple) else (y,)


@pytest.mark.parametrize("config, positions, kind", [
    (POLICY_VALUE, lambda: connect_four_positions(40), PolicyValueMLP),
    (HEURISTIC, lambda: puzzle_positions(40), LearnedHeuristic),
])
def test_a_checkpoint_round_trips_weights_outputs_and_metadata_bitwise(
        tmp_path, config, positions, kind):
    weights = trained_looking_weights(config, seed=1)
    path = save_checkpoint(tmp_path / "ckpt", weights, config, METADATA)
    assert path == str(tmp_path / "ckpt")
    checkpoint = read_checkpoint(path)
    assert checkpoint.config == config
    assert checkpoint.metadata == METADATA
    assert_weights_bitwise_equal(checkpoint.weights, weights)

    model = load_checkpoint(path)
    assert isinstance(model, kind)
    assert model.checkpoint_metadata == METADATA and model.net_config == config
    x = positions()
    for got, want in zip(outputs(model, x), outputs(to_model(config, weights), x)):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("config", [POLICY_VALUE, HEURISTIC])
def test_saving_a_model_round_trips_its_grid_weights_and_outputs(tmp_path, config):
    model = to_model(config, trained_looking_weights(config, seed=2))
    save_checkpoint(tmp_path / "m", model, config)
    loaded = load_checkpoint(tmp_path / "m")
    assert_weights_bitwise_equal(weights_of(loaded), weights_of(model))
    assert loaded.checkpoint_metadata == {}
    x = connect_four_positions(25) if config is POLICY_VALUE else puzzle_positions(25)
    for got, want in zip(outputs(loaded, x), outputs(model, x)):
        assert got.tobytes() == want.tobytes()


def test_other_dtypes_are_kept_as_saved(tmp_path):
    weights = [(w.astype(np.float64), b.astype(np.float64))
               for w, b in initial_weights(POLICY_VALUE, 0)]
    save_checkpoint(tmp_path / "c", weights, POLICY_VALUE)
    assert_weights_bitwise_equal(read_checkpoint(tmp_path / "c").weights, weights)


def test_saving_over_an_existing_checkpoint_replaces_it(tmp_path):
    path = tmp_path / "ckpt"
    first = trained_looking_weights(POLICY_VALUE, 1)
    second = trained_looking_weights(POLICY_VALUE, 2)
    save_checkpoint(path, first, POLICY_VALUE, {"iteration": 1})
    save_checkpoint(path, second, POLICY_VALUE, {"iteration": 2})
    checkpoint = read_checkpoint(path)
    assert checkpoint.metadata == {"iteration": 2}
    assert_weights_bitwise_equal(checkpoint.weights, second)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temporary or old folder left
    assert sorted(os.listdir(path)) == ["config.json", "weights.npz"]


def test_saving_weights_that_do_not_fit_the_config_raises_value_error(tmp_path):
    with pytest.raises(ValueError, match="do not fit"):
        save_checkpoint(tmp_path / "c", initial_weights(POLICY_VALUE, 0), HEURISTIC)
    assert not (tmp_path / "c").exists()


def test_non_json_metadata_is_refused_at_save_and_the_previous_checkpoint_stays(tmp_path):
    path = tmp_path / "ckpt"
    weights = trained_looking_weights(HEURISTIC, 1)
    save_checkpoint(path, weights, HEURISTIC, {"iteration": 1})
    with pytest.raises(ValueError, match="metadata must be JSON"):
        save_checkpoint(path, trained_looking_weights(HEURISTIC, 2), HEURISTIC,
                        {"iteration": 2, "when": object()})
    with pytest.raises(ValueError, match="metadata must be JSON"):
        save_checkpoint(path, trained_looking_weights(HEURISTIC, 2), HEURISTIC,
                        {"loss": float("nan")})
    checkpoint = read_checkpoint(path)
    assert checkpoint.metadata == {"iteration": 1}
    assert_weights_bitwise_equal(checkpoint.weights, weights)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


# -- refusals ----------------------------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    save_checkpoint(path, trained_looking_weights(POLICY_VALUE, 3), POLICY_VALUE, METADATA)
    return path


def assert_refused_naming(path, file, match=None):
    with pytest.raises(CheckpointError, match=match) as info:
        read_checkpoint(path)
    assert isinstance(info.value, ValueError)
    assert str(file) in str(info.value)
    with pytest.raises(CheckpointError):
        load_checkpoint(path)


def test_a_weights_file_with_flipped_bytes_is_refused_naming_it(checkpoint):
    file = checkpoint / "weights.npz"
    data = bytearray(file.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    file.write_bytes(bytes(data))
    assert_refused_naming(checkpoint, file, match="digest")


def test_a_truncated_weights_file_is_refused_naming_it(checkpoint):
    file = checkpoint / "weights.npz"
    file.write_bytes(file.read_bytes()[:-100])
    assert_refused_naming(checkpoint, file, match="truncated or corrupt")


def test_a_truncated_config_file_is_refused_naming_it(checkpoint):
    file = checkpoint / "config.json"
    file.write_bytes(file.read_bytes()[:40])
    assert_refused_naming(checkpoint, file, match="not valid JSON")


def test_a_config_file_that_is_not_text_is_refused_naming_it(checkpoint):
    file = checkpoint / "config.json"
    file.write_bytes(b"\xff\xfe\x00garbage")
    assert_refused_naming(checkpoint, file, match="not valid JSON")


@pytest.mark.parametrize("header", [{"format": "async_search.checkpoint/0"}, {}, [1, 2]])
def test_a_config_of_another_format_is_refused_naming_it(checkpoint, header):
    file = checkpoint / "config.json"
    if isinstance(header, dict) and header:
        real = json.loads(file.read_text())
        real.update(header)
        header = real
    file.write_text(json.dumps(header))
    assert_refused_naming(checkpoint, file, match=FORMAT)


def test_an_invalid_net_config_is_refused_naming_the_config_file(checkpoint):
    file = checkpoint / "config.json"
    header = json.loads(file.read_text())
    header["config"]["kind"] = "value_only"
    file.write_text(json.dumps(header))
    assert_refused_naming(checkpoint, file, match="invalid net config")


def test_a_config_that_does_not_fit_the_weights_is_refused_naming_the_weights(checkpoint):
    file = checkpoint / "config.json"
    header = json.loads(file.read_text())
    header["config"]["hidden_sizes"] = [32]  # the digest still matches the weights
    file.write_text(json.dumps(header))
    assert_refused_naming(checkpoint, checkpoint / "weights.npz", match="do not fit")


@pytest.mark.parametrize("name", ["config.json", "weights.npz"])
def test_a_missing_file_is_refused_naming_it(checkpoint, name):
    (checkpoint / name).unlink()
    assert_refused_naming(checkpoint, checkpoint / name, match="missing")


def test_a_missing_folder_is_refused_naming_it(tmp_path):
    path = tmp_path / "never-saved"
    assert_refused_naming(path, path, match="missing")


def test_non_finite_weights_are_refused_at_save(tmp_path):
    weights = trained_looking_weights(POLICY_VALUE, 4)
    weights[0][0][0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        save_checkpoint(tmp_path / "nan", weights, POLICY_VALUE)
    assert not (tmp_path / "nan").exists()


def test_the_config_may_be_a_json_dict_or_read_from_the_model(tmp_path):
    from async_search import problems
    from async_search.training import config_of, load_checkpoint

    net = problems.pretrained("connect_four")
    for i, config in enumerate((None, net.net_config.to_json())):
        path = save_checkpoint(tmp_path / f"c{i}", net, config, {"i": i})
        again = load_checkpoint(path)
        game = problems.ConnectFour()
        x = game.encode([game.initial_state(), game.from_moves([3, 2])])
        assert again(x)[0].tobytes() == net(x)[0].tobytes()
    fresh = problems.PolicyValueMLP(problems.ConnectFour(), hidden_sizes=(8,), seed=1)
    assert config_of(fresh).hidden_sizes == (8,)
    h = problems.pretrained("15-puzzle")
    assert config_of(h) == h.net_config
    with pytest.raises(ValueError, match="cannot tell"):
        save_checkpoint(tmp_path / "x", problems.heuristic_mlp(problems.SlidingPuzzle(3)))
    with pytest.raises(ValueError, match="need their NetConfig"):
        save_checkpoint(tmp_path / "y", initial_weights(HEURISTIC, 0))
    with pytest.raises(ValueError, match="config must be"):
        save_checkpoint(tmp_path / "z", net, {"hidden": 3})
