"""Checkpoints: bitwise round trips, atomic replacement, and clear refusals."""

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from async_search.problems import LearnedHeuristic, PolicyValueMLP, SlidingPuzzle
from async_search.problems.checkpoints import (FORMAT, CheckpointError, load_checkpoint,
                                               read_checkpoint, save_checkpoint)
from async_search.problems.nets import NetConfig, initial_weights, to_model, weights_of
from tests.game_positions import connect_four_positions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLICY_VALUE = NetConfig("policy_value", "connect_four", (16,))
HEURISTIC = NetConfig("heuristic", "sliding_puzzle", (16,), size=3)
METADATA = {"iteration": 3, "elo": 12.5, "note": "gated", "scores": [1, 0.5, None],
            "nested": {"a": True}}


def trained_looking_weights(config, seed):
    """Off-grid float32 weights with non-zero biases, as a trainer leaves them."""
    rng = np.random.default_rng(seed)
    return [(w, rng.normal(0, 0.1, b.shape).astype(np.float32))
            for w, b in initial_weights(config, seed)]


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


def weights_file(path):
    """The weights file the checkpoint's config.json names."""
    return path / json.loads((path / "config.json").read_text())["weights_file"]


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
    assert sorted(os.listdir(path)) == ["config.json", weights_file(path).name]
    assert re.fullmatch(r"weights-[0-9a-f]{16}\.npz", weights_file(path).name)


def test_a_trailing_separator_names_the_same_folder(tmp_path):
    path = save_checkpoint(f"{tmp_path / 'ckpt'}{os.sep}", initial_weights(HEURISTIC, 0),
                           HEURISTIC, {"n": 1})
    assert path == str(tmp_path / "ckpt")
    save_checkpoint(f"{path}{os.sep}", initial_weights(HEURISTIC, 1), HEURISTIC, {"n": 2})
    assert read_checkpoint(f"{path}{os.sep}").metadata == {"n": 2}
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    assert sorted(os.listdir(path)) == ["config.json", weights_file(tmp_path / "ckpt").name]


def test_a_checkpoint_of_format_1_loads_and_is_replaced_by_the_current_format(tmp_path):
    path = tmp_path / "old"
    save_checkpoint(path, initial_weights(HEURISTIC, 0), HEURISTIC, {"v": 1})
    header = json.loads((path / "config.json").read_text())
    weights_file(path).rename(path / "weights.npz")
    header["format"] = "async_search.checkpoint/1"
    del header["weights_file"], header["config_sha256"]
    (path / "config.json").write_text(json.dumps(header))
    assert read_checkpoint(path).metadata == {"v": 1}
    save_checkpoint(path, initial_weights(HEURISTIC, 1), HEURISTIC, {"v": 2})
    assert read_checkpoint(path).metadata == {"v": 2}
    assert "weights.npz" not in os.listdir(path) and len(os.listdir(path)) == 2


def test_a_checkpoint_of_format_2_loads_without_its_config_tied_to_its_weights(tmp_path):
    path = tmp_path / "two"
    save_checkpoint(path, initial_weights(HEURISTIC, 0), HEURISTIC, {"v": 1})
    header = json.loads((path / "config.json").read_text())
    header["format"] = "async_search.checkpoint/2"
    del header["config_sha256"]
    (path / "config.json").write_text(json.dumps(header))
    assert read_checkpoint(path).metadata == {"v": 1}
    header["config_sha256"] = "0" * 64  # a field format 2 has not
    (path / "config.json").write_text(json.dumps(header))
    with pytest.raises(CheckpointError, match="unknown fields"):
        read_checkpoint(path)


@pytest.mark.parametrize("config, edit", [
    (NetConfig("policy_value", "connect_four", architecture="residual", channels=4,
               blocks=2), {"architecture": "conv"}),
    (NetConfig("policy_value", "connect_four", architecture="conv", channels=4,
               blocks=2), {"architecture": "residual"}),
    (NetConfig("heuristic", "sliding_puzzle", (8,), size=3, residual=True),
     {"residual": False}),
    (NetConfig("heuristic", "sliding_puzzle", (8,), size=3, residual=False),
     {"residual": True}),
])
def test_a_config_edited_to_another_net_whose_weights_fit_is_refused(tmp_path, config, edit):
    """Weights of one shape serve two nets: the config's digest tells them apart (the
    weights' digest alone let the file load as the other net, with other outputs)."""
    path = save_checkpoint(tmp_path / "ckpt", to_model(config, initial_weights(config, 0)))
    file = tmp_path / "ckpt" / "config.json"
    header = json.loads(file.read_text())
    header["config"].update(edit)
    file.write_text(json.dumps(header))
    with pytest.raises(CheckpointError, match="not the one its weights were saved with"):
        load_checkpoint(path)
    header["config"] = json.loads(json.dumps(config.to_json()))  # back as it was
    file.write_text(json.dumps(header))
    assert load_checkpoint(path).net_config == config


def test_the_shipped_checkpoints_still_load():
    from async_search import problems

    assert problems.pretrained("connect_four").net_config.problem == "connect_four"


def test_a_file_in_the_way_is_refused_and_left_alone(tmp_path):
    (tmp_path / "ckpt").write_text("mine")
    with pytest.raises(ValueError, match="a file has that name"):
        save_checkpoint(tmp_path / "ckpt", initial_weights(HEURISTIC, 0), HEURISTIC)
    assert (tmp_path / "ckpt").read_text() == "mine"


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


@pytest.mark.parametrize("metadata", [[1, 2], "text", 3, (1, 2)])
def test_metadata_that_is_not_a_dict_is_refused_at_save_and_the_previous_checkpoint_stays(
        tmp_path, metadata):
    path = tmp_path / "ckpt"
    weights = trained_looking_weights(HEURISTIC, 1)
    save_checkpoint(path, weights, HEURISTIC, {"iteration": 1})
    files = sorted(os.listdir(path))
    with pytest.raises(ValueError, match="metadata must be a dict"):
        save_checkpoint(path, trained_looking_weights(HEURISTIC, 2), HEURISTIC, metadata)
    assert sorted(os.listdir(path)) == files  # nothing written
    checkpoint = read_checkpoint(path)
    assert checkpoint.metadata == {"iteration": 1}
    assert_weights_bitwise_equal(checkpoint.weights, weights)


def test_no_metadata_is_saved_as_an_empty_object(tmp_path):
    save_checkpoint(tmp_path / "ckpt", initial_weights(HEURISTIC, 0), HEURISTIC, None)
    assert read_checkpoint(tmp_path / "ckpt").metadata == {}


def test_metadata_keys_load_back_as_the_strings_json_writes_and_mixed_keys_are_refused(
        tmp_path):
    path = tmp_path / "ckpt"
    save_checkpoint(path, initial_weights(HEURISTIC, 0), HEURISTIC,
                    {1: "a", 2: {3.5: (3, 4)}})
    want = {"1": "a", "2": {"3.5": [3, 4]}}
    assert read_checkpoint(path).metadata == want
    with pytest.raises(ValueError, match=r"metadata must be JSON.*\['1'\] twice"):
        save_checkpoint(path, initial_weights(HEURISTIC, 1), HEURISTIC, {"1": 1, 1: 2})
    assert read_checkpoint(path).metadata == want
    # Keys of several types that do not collide: JSON holds them (their sorting in the
    # header raised "'<' not supported between instances of 'int' and 'str'").
    mixed = {"iteration": 1, 3: "x", "scores": {1: 0.5, "best": 2, None: 0}}
    save_checkpoint(path, initial_weights(HEURISTIC, 2), HEURISTIC, mixed)
    assert read_checkpoint(path).metadata == {
        "iteration": 1, "3": "x", "scores": {"1": 0.5, "best": 2, "null": 0}}


def test_a_heuristic_over_another_problem_with_a_puzzles_config_is_refused_as_a_misfit(
        tmp_path):
    """Reading the model's own config asked a synthetic graph for its size: an
    AttributeError, where save_checkpoint promises ValueError."""
    from async_search.problems import SyntheticGraph, heuristic_mlp
    graph = SyntheticGraph(branching=3, depth=8)
    model = LearnedHeuristic(graph, heuristic_mlp(graph, hidden_sizes=(8,)), residual=False)
    with pytest.raises(ValueError, match="do not fit"):
        save_checkpoint(tmp_path / "c", model,
                        NetConfig("heuristic", "sliding_puzzle", (8,), 3, False))
    assert not (tmp_path / "c").exists()


RESIDUAL_NET = NetConfig("policy_value", "connect_four", (16,), architecture="residual",
                         channels=4, blocks=1, value_hidden=8)


@pytest.mark.parametrize("config, change, field", [
    (RESIDUAL_NET, {"architecture": "conv"}, "architecture"),
    (HEURISTIC, {"residual": False}, "residual")])
def test_a_config_that_is_not_the_models_own_is_refused_at_save(tmp_path, config, change,
                                                                field):
    """A residual net saved with a conv net's config (or a heuristic with its Manhattan
    term under a config without) has the same weight shapes: it loaded as the other
    net, computing other outputs, without a word."""
    model = to_model(config, initial_weights(config, 0))
    other = dataclasses.replace(config, **change)
    with pytest.raises(ValueError, match=f"not the model's: {field} "):
        save_checkpoint(tmp_path / "ckpt", model, other)
    assert not (tmp_path / "ckpt").exists()
    for given in (None, config, config.to_json()):  # its own, or none: saved
        save_checkpoint(tmp_path / "ckpt", model, given)
        saved = read_checkpoint(tmp_path / "ckpt").config
        assert getattr(saved, field) == getattr(config, field)
        assert given is None or saved == config


@pytest.mark.parametrize("change, match", [
    ({"size": 9}, "config.size"), ({"size": 1}, "config.size")])
def test_a_config_that_loading_would_refuse_is_refused_at_save_and_nothing_is_written(
        tmp_path, change, match):
    config = dataclasses.replace(POLICY_VALUE, **change)  # a game ignores size
    with pytest.raises(ValueError, match=f"load_checkpoint would refuse it.*{match}"):
        save_checkpoint(tmp_path / "ckpt", initial_weights(config, 0), config)
    assert not (tmp_path / "ckpt").exists()


def test_a_residual_flag_that_is_no_bool_is_refused_where_the_config_is_made():
    # (refused at save before: "False" trained with the Manhattan term meanwhile)
    with pytest.raises(ValueError, match="NetConfig.residual must be True or False, got 1"):
        dataclasses.replace(POLICY_VALUE, residual=1)


@pytest.mark.parametrize("dtype", [object, np.complex64])
def test_weights_that_are_not_real_numbers_are_refused_at_save_and_nothing_is_written(
        tmp_path, dtype):
    # Object arrays: loading reads no pickles. Complex ones were saved, and loading
    # dropped their imaginary part with only a ComplexWarning.
    weights = [(w.astype(dtype) * (1j if dtype is np.complex64 else 1), b)
               for w, b in initial_weights(POLICY_VALUE, 0)]
    with pytest.raises(ValueError, match="weights must be real numbers"):
        save_checkpoint(tmp_path / "ckpt", weights, POLICY_VALUE)
    assert not (tmp_path / "ckpt").exists()


# -- a load while a save replaces the checkpoint -------------------------------------------


def saving_after_each_read(monkeypatch, path, saves):
    """Makes each of the first ``saves`` reads of ``path``'s config.json complete a save
    over the checkpoint before the load goes on: the interleaving of a load that reads
    the old config.json, then a save that commits and removes the old weights. Returns
    the list of the weights saved (seeds 10, 11, ...), appended as they are."""
    import async_search.schema as schema

    read_json, saved = schema.read_json, []

    def read_then_save(file):
        header = read_json(file)
        if os.path.basename(file) == "config.json" and len(saved) < saves:
            saved.append(trained_looking_weights(POLICY_VALUE, 10 + len(saved)))
            save_checkpoint(path, saved[-1], POLICY_VALUE, {"save": len(saved)})
        return header

    monkeypatch.setattr(schema, "read_json", read_then_save)
    return saved


@pytest.mark.parametrize("old_format", [False, True])
def test_a_load_overtaken_by_a_save_reads_config_json_again_and_loads_the_new_checkpoint(
        tmp_path, monkeypatch, old_format):
    path = tmp_path / "ckpt"
    save_checkpoint(path, trained_looking_weights(POLICY_VALUE, 1), POLICY_VALUE,
                    {"save": 0})
    old = weights_file(path)
    if old_format:  # a format-1 checkpoint, weights.npz, replaced by the current format
        header = json.loads((path / "config.json").read_text())
        old = old.rename(path / "weights.npz")
        header["format"] = "async_search.checkpoint/1"
        del header["weights_file"], header["config_sha256"]
        (path / "config.json").write_text(json.dumps(header))
    saved = saving_after_each_read(monkeypatch, path, saves=1)
    checkpoint = read_checkpoint(path)
    assert len(saved) == 1 and not old.exists()  # the load met the removed weights
    assert checkpoint.metadata == {"save": 1}
    assert_weights_bitwise_equal(checkpoint.weights, saved[0])


def test_a_load_overtaken_by_saves_several_times_loads_the_newest(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    save_checkpoint(path, trained_looking_weights(POLICY_VALUE, 1), POLICY_VALUE)
    saved = saving_after_each_read(monkeypatch, path, saves=3)
    model = load_checkpoint(path)
    assert len(saved) == 3 and model.checkpoint_metadata == {"save": 3}
    assert_weights_bitwise_equal(read_checkpoint(path).weights, saved[-1])


def test_a_load_overtaken_by_a_save_at_every_read_gives_up_naming_the_folder(
        tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    save_checkpoint(path, trained_looking_weights(POLICY_VALUE, 1), POLICY_VALUE)
    saved = saving_after_each_read(monkeypatch, path, saves=100)
    with pytest.raises(CheckpointError, match="a save removed the weights") as info:
        read_checkpoint(path)
    assert str(path) in str(info.value) and len(saved) <= 10  # bounded, not a loop


# -- a kill or a full disk during a save ---------------------------------------------------


def test_a_save_killed_at_any_file_operation_leaves_the_old_or_the_new_checkpoint(
        tmp_path):
    from tests.training.kill_points import Recorder

    path = tmp_path / "ckpt"
    old, new = trained_looking_weights(HEURISTIC, 1), trained_looking_weights(HEURISTIC, 2)
    save_checkpoint(path, old, HEURISTIC, {"v": 1})
    pristine = tmp_path / "pristine"
    shutil.copytree(path, pristine)
    shutil.copytree(path, tmp_path / "count")
    recorder = Recorder()
    try:
        recorder.arm()
        save_checkpoint(tmp_path / "count", new, HEURISTIC, {"v": 2})
        recorder.armed = False
        ops = list(recorder.ops)
        kill_each(recorder, ops, path, pristine, old, new)
    finally:
        recorder.uninstall()


def kill_each(recorder, ops, path, pristine, old, new):
    """Saves ``new`` over ``old`` in a child killed at each of ``ops`` in turn."""

    def save_in_child(kill_at):
        pid = os.fork()
        if pid == 0:  # never returns into pytest
            try:
                recorder.arm(kill_at)
                save_checkpoint(path, new, HEURISTIC, {"v": 2})
            finally:
                os._exit(0)
        return os.waitpid(pid, 0)[1]

    assert {op.split()[0] for op in ops} >= {"open", "write", "fsync", "replace", "unlink"}
    seen = set()
    for kill_at in range(1, len(ops) + 1):
        status = save_in_child(kill_at)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        checkpoint = read_checkpoint(path)  # never absent, never a mix
        seen.add(checkpoint.metadata["v"])
        assert_weights_bitwise_equal(checkpoint.weights, old if checkpoint.metadata["v"] == 1
                                     else new)
        save_checkpoint(path, new, HEURISTIC, {"v": 2})  # cleans what the kill left
        assert sorted(os.listdir(path)) == ["config.json", weights_file(path).name]
        shutil.rmtree(path)
        shutil.copytree(pristine, path)
    assert seen == {1, 2}


# -- saves from threads and processes at once -------------------------------------------


SAVE_AFTER_MARKER = """
import sys
sys.path.insert(0, sys.argv[1])
from async_search.problems.checkpoints import save_checkpoint
from tests.problems.test_checkpoints import HEURISTIC, trained_looking_weights
weights = trained_looking_weights(HEURISTIC, 2)
open(sys.argv[3], "w").close()
save_checkpoint(sys.argv[2], weights, HEURISTIC, {"v": 2})
"""


@pytest.mark.parametrize("other", ["thread", "process"])
def test_a_save_waits_for_the_save_in_progress_in_its_folder(tmp_path, monkeypatch,
                                                             other):
    # Each save removes every weights file but its own: one that ran while another was
    # between writing its weights and naming them in config.json removed those, and
    # the folder no longer loaded.
    import async_search.problems.checkpoints as checkpoints

    path = tmp_path / "ckpt"
    save_checkpoint(path, trained_looking_weights(HEURISTIC, 0), HEURISTIC, {"v": 0})
    real_write, written, go, errors = checkpoints.write_file, threading.Event(), \
        threading.Event(), []

    def write_then_wait(file, content):
        out = real_write(file, content)
        if threading.current_thread() is first and "weights-" in os.path.basename(file):
            written.set()  # its weights are there, not yet named
            if not go.wait(30):
                raise TimeoutError("never resumed")
        return out

    def save(v):
        try:
            save_checkpoint(path, trained_looking_weights(HEURISTIC, v), HEURISTIC,
                            {"v": v})
        except BaseException as e:  # noqa: BLE001 - the test reads it
            errors.append(e)

    monkeypatch.setattr(checkpoints, "write_file", write_then_wait)
    first = threading.Thread(target=save, args=(1,), daemon=True)
    first.start()
    try:
        assert written.wait(30)
        if other == "thread":
            second = threading.Thread(target=save, args=(2,), daemon=True)
            second.start()
            second.join(1.0)
            assert second.is_alive(), "the second save did not wait for the first"
        else:
            marker = tmp_path / "saving"
            second = subprocess.Popen([sys.executable, "-c", SAVE_AFTER_MARKER, ROOT,
                                       str(path), str(marker)], cwd=ROOT)
            deadline = time.monotonic() + 60
            while not marker.exists():
                assert second.poll() is None and time.monotonic() < deadline
                time.sleep(0.01)
            with pytest.raises(subprocess.TimeoutExpired):  # waiting for the first
                second.wait(1.0)
    finally:
        go.set()
        first.join(30)
    if other == "thread":
        second.join(30)
        assert not second.is_alive()
    else:
        assert second.wait(60) == 0
    assert not errors and not first.is_alive()
    checkpoint = read_checkpoint(path)  # the second's: it finished last
    assert checkpoint.metadata == {"v": 2}
    assert_weights_bitwise_equal(checkpoint.weights,
                                 trained_looking_weights(HEURISTIC, 2))
    assert sorted(os.listdir(path)) == ["config.json", weights_file(path).name]


SAVE_IN_ROUNDS = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from async_search.problems.checkpoints import save_checkpoint
from tests.problems.test_checkpoints import HEURISTIC, trained_looking_weights
path, v = sys.argv[2], int(sys.argv[3])
weights, errors = trained_looking_weights(HEURISTIC, v), []
print("ready", flush=True)  # imported: the rounds' times come once every process is
rounds = json.loads(sys.stdin.readline())
for start, end in rounds:
    time.sleep(max(0.0, start - time.time()))
    saves = 0
    while saves < 3 or time.time() < end:
        try:
            save_checkpoint(path, weights, HEURISTIC, {"v": v})
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
        saves += 1
print(json.dumps(errors[:3]))
"""


def test_saves_from_threads_and_processes_at_once_leave_a_whole_checkpoint(tmp_path):
    # Two threads shared one temporary name (FileWriteError), and a save removed the
    # weights another was about to name: 1 to 6 rounds of 10 left it unloadable.
    path = tmp_path / "ckpt"
    weights = {v: trained_looking_weights(HEURISTIC, v) for v in range(5)}
    save_checkpoint(path, weights[0], HEURISTIC, {"v": 0})
    processes = [subprocess.Popen([sys.executable, "-c", SAVE_IN_ROUNDS, ROOT, str(path),
                                   str(v)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, cwd=ROOT) for v in (3, 4)]
    try:
        for process in processes:  # EOF ("") if one died: the assertion says so
            assert process.stdout.readline().strip() == "ready"
        first = time.time() + 0.2
        rounds = [(first + 0.7 * r, first + 0.7 * r + 0.6) for r in range(3)]
        for process in processes:
            process.stdin.write(json.dumps(rounds) + "\n")
            process.stdin.flush()
        for round_, (start, end) in enumerate(rounds):
            errors, loaded = [], []

            def save(v):
                saves = 0
                while saves < 3 or time.time() < end:
                    try:
                        save_checkpoint(path, weights[v], HEURISTIC, {"v": v})
                    except Exception as e:  # noqa: BLE001 - the test reads it
                        errors.append(e)
                    saves += 1

            def load():  # loads take no lock: they meet the saves (once at least)
                while time.time() < end or not (loaded or errors):
                    try:
                        loaded.append(read_checkpoint(path).metadata["v"])
                    except Exception as e:  # noqa: BLE001 - the test reads it
                        errors.append(e)

            time.sleep(max(0.0, start - time.time()))
            threads = [threading.Thread(target=save, args=(v,), daemon=True)
                       for v in (1, 2)] + [threading.Thread(target=load, daemon=True)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
                assert not thread.is_alive()
            assert errors == [], (round_, errors[:3])
            checkpoint = read_checkpoint(path)
            assert_weights_bitwise_equal(checkpoint.weights,
                                         weights[checkpoint.metadata["v"]])
            assert loaded and set(loaded) <= set(weights)
        for process in processes:
            out, _ = process.communicate(timeout=60)
            assert process.returncode == 0 and json.loads(out) == [], out
    finally:
        for process in processes:
            process.kill()
            process.wait(30)
    checkpoint = read_checkpoint(path)
    assert_weights_bitwise_equal(checkpoint.weights, weights[checkpoint.metadata["v"]])
    assert sorted(os.listdir(path)) == ["config.json", weights_file(path).name]


def test_a_full_disk_during_a_save_names_the_file_and_keeps_the_previous_checkpoint(
        tmp_path):
    path = tmp_path / "ckpt"
    weights = trained_looking_weights(POLICY_VALUE, 1)
    save_checkpoint(path, weights, POLICY_VALUE, {"iteration": 1})
    out = run_with_file_size_limit(f"""
from async_search.training import save_checkpoint
from tests.problems.test_checkpoints import POLICY_VALUE, trained_looking_weights
save_checkpoint({str(path)!r}, trained_looking_weights(POLICY_VALUE, 2), POLICY_VALUE)
""")
    assert out.startswith("FileWriteError 27 cannot write"), out
    assert str(path) in out and "File too large" in out and ".tmp-" in out
    checkpoint = read_checkpoint(path)
    assert checkpoint.metadata == {"iteration": 1}
    assert_weights_bitwise_equal(checkpoint.weights, weights)
    assert sorted(os.listdir(path)) == ["config.json", weights_file(path).name]


def run_with_file_size_limit(code: str, limit: int = 1000) -> str:
    """Runs ``code`` in a child whose files may not grow past ``limit`` bytes (SIGXFSZ
    ignored, so a write fails with EFBIG as on a full disk); returns what it printed:
    ``ErrorType errno message`` for the error it raised."""
    script = (f"import resource, signal, sys\nsys.path.insert(0, {ROOT!r})\n"
              f"signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
              f"try:\n" + "".join(f"    {line}\n" for line in code.strip().splitlines())
              + "except OSError as e:\n    print(type(e).__name__, e.errno, e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


# -- refusals: every file damaged every way -----------------------------------------------


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
    assert "\n" not in str(info.value)
    with pytest.raises(CheckpointError):
        load_checkpoint(path)


BYTES_DAMAGE = {
    "truncated": lambda b: b[: len(b) // 2],
    "empty": lambda b: b"",
    "random bytes": lambda b: np.random.default_rng(1).bytes(max(len(b), 64)),
    "not utf-8": lambda b: b"\xff\xfe\x00" + b[3:],
    "flipped bytes": lambda b: b[:len(b) // 2] + bytes(x ^ 0xFF for x in b[len(b) // 2:
                                                                         len(b) // 2 + 8])
    + b[len(b) // 2 + 8:],
}


@pytest.mark.parametrize("how", sorted(BYTES_DAMAGE))
def test_a_damaged_config_file_is_refused_naming_it(checkpoint, how):
    file = checkpoint / "config.json"
    file.write_bytes(BYTES_DAMAGE[how](file.read_bytes()))
    assert_refused_naming(checkpoint, file,
                          match="not valid JSON|empty|not UTF-8|format|digest|field")


@pytest.mark.parametrize("how", sorted(BYTES_DAMAGE))
def test_a_damaged_weights_file_is_refused_naming_it(checkpoint, how):
    file = weights_file(checkpoint)
    file.write_bytes(BYTES_DAMAGE[how](file.read_bytes()))
    assert_refused_naming(checkpoint, file, match="digest")


def edit_header(checkpoint, change):
    file = checkpoint / "config.json"
    header = json.loads(file.read_text())
    change(header)
    file.write_text(json.dumps(header))
    return file


@pytest.mark.parametrize("header", [{"format": "async_search.checkpoint/0"}, {}, [1, 2],
                                    {"format": None}])
def test_a_config_of_another_format_is_refused_naming_it(checkpoint, header):
    file = checkpoint / "config.json"
    if isinstance(header, dict) and header:
        real = json.loads(file.read_text())
        real.update(header)
        header = real
    file.write_text(json.dumps(header))
    assert_refused_naming(checkpoint, file, match=FORMAT)


FIELDS = ["config", "metadata", "layers", "weights_sha256", "weights_file"]


@pytest.mark.parametrize("field", FIELDS + ["config.kind", "config.problem",
                                            "config.hidden_sizes"])
def test_a_config_file_missing_a_field_is_refused_naming_the_field(checkpoint, field):
    def drop(header):
        node = header
        *parents, key = field.split(".")
        for part in parents:
            node = node[part]
        del node[key]
    file = edit_header(checkpoint, drop)
    assert_refused_naming(checkpoint, file, match=rf"'{field}' is missing")


@pytest.mark.parametrize("field, value", [
    ("config", [1]), ("metadata", "notes"), ("layers", "2"), ("layers", True),
    ("weights_sha256", 12), ("weights_file", ["w.npz"]), ("config.hidden_sizes", 16),
    ("config.residual", "yes"), ("config.size", 4.5), ("config.kind", 3),
])
def test_a_config_file_with_a_field_of_the_wrong_type_is_refused_naming_it(
        checkpoint, field, value):
    def put(header):
        node = header
        *parents, key = field.split(".")
        for part in parents:
            node = node[part]
        node[key] = value
    file = edit_header(checkpoint, put)
    assert_refused_naming(checkpoint, file, match=rf"'{field}' must be")


@pytest.mark.parametrize("field, value, match", [
    ("layers", 0, "'layers' must be an integer >= 1"),
    ("layers", 7, "says 7 layers"),
    ("config.hidden_sizes", [0], "widths >= 1"),
    ("config.size", 1, "'config.size' must be an integer in \\[2, 8\\]"),
    ("weights_sha256", "0" * 63, "'weights_sha256' must be a string matching"),
    ("weights_file", "../../etc/passwd", "'weights_file' must be a string matching"),
])
def test_a_config_file_with_a_number_or_name_out_of_range_is_refused_naming_it(
        checkpoint, field, value, match):
    def put(header):
        node = header
        *parents, key = field.split(".")
        for part in parents:
            node = node[part]
        node[key] = value
    file = edit_header(checkpoint, put)
    assert_refused_naming(checkpoint, file, match=match)


def test_a_config_file_with_an_unknown_field_is_refused_naming_it(checkpoint):
    file = edit_header(checkpoint, lambda h: h.update(extra=1))
    assert_refused_naming(checkpoint, file, match="unknown fields")


def test_an_invalid_net_config_is_refused_naming_the_config_file(checkpoint):
    file = edit_header(checkpoint, lambda h: h["config"].update(kind="value_only"))
    assert_refused_naming(checkpoint, file, match="invalid net config")


def test_a_config_that_does_not_fit_the_weights_is_refused_naming_the_weights(checkpoint):
    # The digest still matches the weights.
    edit_header(checkpoint, lambda h: h["config"].update(hidden_sizes=[32]))
    assert_refused_naming(checkpoint, weights_file(checkpoint), match="do not fit")


@pytest.mark.parametrize("arrays", [{"w0": np.zeros(3)}, "extra"])
def test_a_weights_file_with_other_arrays_is_refused_naming_it(checkpoint, arrays):
    file = weights_file(checkpoint)
    if arrays == "extra":
        with np.load(file) as data:
            arrays = {**data, "w9": np.zeros(2)}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    file.write_bytes(buffer.getvalue())
    edit_header(checkpoint, lambda h: h.update(
        weights_sha256=hashlib.sha256(buffer.getvalue()).hexdigest()))
    assert_refused_naming(checkpoint, file, match="holds arrays")


def test_non_finite_weights_on_disk_are_refused_naming_the_file(checkpoint):
    file = weights_file(checkpoint)
    with np.load(file) as data:
        arrays = dict(data)
    arrays["b0"] = arrays["b0"].copy()
    arrays["b0"][0] = np.inf
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    file.write_bytes(buffer.getvalue())
    edit_header(checkpoint, lambda h: h.update(
        weights_sha256=hashlib.sha256(buffer.getvalue()).hexdigest()))
    assert_refused_naming(checkpoint, file, match="finite")


def test_a_missing_config_file_is_refused_naming_it(checkpoint):
    (checkpoint / "config.json").unlink()
    assert_refused_naming(checkpoint, checkpoint / "config.json", match="missing")


def test_a_missing_weights_file_is_refused_naming_it(checkpoint):
    file = weights_file(checkpoint)
    file.unlink()
    assert_refused_naming(checkpoint, file, match="missing")


def test_a_config_that_still_names_missing_weights_when_read_again_is_refused(
        checkpoint, monkeypatch):
    import async_search.schema as schema

    read_json, reads = schema.read_json, []
    monkeypatch.setattr(schema, "read_json",
                        lambda file: reads.append(file) or read_json(file))
    file = weights_file(checkpoint)
    file.unlink()
    assert_refused_naming(checkpoint, file, match="which config.json names, is missing")
    assert len(reads) == 2 * 2  # each load read it again once, then gave up


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


# -- convolutional nets -------------------------------------------------------------------

RESIDUAL = NetConfig("policy_value", "connect_four", architecture="residual", channels=4,
                     blocks=1, value_hidden=8)


def trained_looking_conv_weights(config, seed):
    rng = np.random.default_rng(seed)
    return {name: (w + rng.normal(0, 0.05, w.shape)).astype(np.float32)
            for name, w in initial_weights(config, seed).items()}


@pytest.mark.parametrize("architecture,value_planes,value_net", [
    ("conv", 1, "head"), ("residual", 1, "head"), ("residual", 3, "head"),
    ("residual", 1, "mlp")])
def test_a_convolutional_checkpoint_round_trips_weights_and_outputs_bitwise(
        tmp_path, architecture, value_planes, value_net):
    config = NetConfig("policy_value", "connect_four", (16, 8), architecture=architecture,
                       channels=4, blocks=2, value_hidden=8, value_planes=value_planes,
                       value_net=value_net)
    weights = trained_looking_conv_weights(config, 1)
    path = save_checkpoint(tmp_path / "ckpt", weights, config, METADATA)
    saved = read_checkpoint(path)
    assert saved.config == config and saved.metadata == METADATA
    assert sorted(saved.weights) == sorted(weights)
    for name, w in weights.items():
        assert saved.weights[name].tobytes() == w.tobytes()
    x = connect_four_positions(30, 1)
    model = load_checkpoint(path)
    for got, want in zip(model(x), to_model(config, weights)(x)):
        assert got.tobytes() == want.tobytes()
    again = save_checkpoint(tmp_path / "again", model)  # its config read from the model
    assert read_checkpoint(again).config == config


def test_a_convolutional_net_refuses_an_mlps_layers_and_the_other_way(tmp_path):
    with pytest.raises(ValueError, match="named arrays"):
        save_checkpoint(tmp_path / "a", trained_looking_weights(POLICY_VALUE, 0), RESIDUAL)
    with pytest.raises(ValueError, match="named arrays"):
        save_checkpoint(tmp_path / "b", trained_looking_conv_weights(RESIDUAL, 0),
                        POLICY_VALUE)
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


def test_a_convolutional_checkpoint_missing_an_array_is_refused_naming_it(tmp_path):
    path = save_checkpoint(tmp_path / "ckpt", trained_looking_conv_weights(RESIDUAL, 0),
                           RESIDUAL)
    file = weights_file(path_obj := tmp_path / "ckpt")
    with np.load(file) as data:
        arrays = {k: v for k, v in data.items() if k != "stem.bias"}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    file.write_bytes(buffer.getvalue())
    edit_header(path_obj, lambda h: h.update(
        weights_sha256=hashlib.sha256(buffer.getvalue()).hexdigest()))
    assert path == str(path_obj)
    assert_refused_naming(path_obj, file, match="holds arrays")


@pytest.mark.parametrize("field,value", [("channels", 0), ("value_planes", 0),
                                         ("value_planes", 2.5), ("value_net", "dense"),
                                         ("value_net", 1)])
def test_a_convolutional_config_with_a_bad_size_is_refused_naming_the_config_file(
        tmp_path, field, value):
    save_checkpoint(tmp_path / "ckpt", trained_looking_conv_weights(RESIDUAL, 0), RESIDUAL)
    file = edit_header(tmp_path / "ckpt", lambda h: h["config"].update({field: value}))
    assert_refused_naming(tmp_path / "ckpt", file, match=field)


def test_a_one_plane_value_head_is_written_as_before_value_planes_existed(tmp_path):
    save_checkpoint(tmp_path / "ckpt", trained_looking_conv_weights(RESIDUAL, 0), RESIDUAL)
    header = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert "value_planes" not in header["config"]  # checkpoints of earlier versions load
    wide = dataclasses.replace(RESIDUAL, value_planes=4)
    save_checkpoint(tmp_path / "wide", trained_looking_conv_weights(wide, 0), wide)
    header = json.loads((tmp_path / "wide" / "config.json").read_text())
    assert header["config"]["value_planes"] == 4
    assert read_checkpoint(tmp_path / "wide").config == wide
    assert wide.describe() == "residual 4x1 (value 4 planes)"


def test_an_mlp_value_is_written_into_the_config_and_a_head_value_is_not(tmp_path):
    header = json.loads((save_checkpoint(tmp_path / "head", trained_looking_conv_weights(
        RESIDUAL, 0), RESIDUAL) and tmp_path / "head" / "config.json").read_text())
    assert "value_net" not in header["config"]  # checkpoints of earlier versions load
    tower = dataclasses.replace(RESIDUAL, value_net="mlp", hidden_sizes=(8, 4))
    save_checkpoint(tmp_path / "tower", trained_looking_conv_weights(tower, 0), tower)
    header = json.loads((tmp_path / "tower" / "config.json").read_text())
    assert header["config"]["value_net"] == "mlp"
    assert header["config"]["hidden_sizes"] == [8, 4]
    assert read_checkpoint(tmp_path / "tower").config == tower
    assert tower.describe() == "residual 4x1 + mlp value 8x4"
    # A head net's arrays do not fit the tower's config: refused, naming what is missing.
    with pytest.raises(ValueError, match="value.mlp.0.weight"):
        save_checkpoint(tmp_path / "mixed", trained_looking_conv_weights(RESIDUAL, 0),
                        tower)


def test_an_mlps_config_json_is_written_as_before_the_architectures_existed(tmp_path):
    save_checkpoint(tmp_path / "ckpt", trained_looking_weights(POLICY_VALUE, 0),
                    POLICY_VALUE)
    header = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert sorted(header["config"]) == ["hidden_sizes", "kind", "problem", "residual",
                                        "size"]



@pytest.mark.parametrize("size", [9, 100])
def test_a_puzzle_size_no_puzzle_has_is_refused_naming_the_config_file(checkpoint, size):
    file = edit_header(checkpoint, lambda h: h["config"].update(size=size))
    assert_refused_naming(checkpoint, file, match="config.size")


# -- hostile files: refused before they can hang a load or take the memory ----------------


def _rewrite_weights(checkpoint, write):
    """Replaces the weights file with what ``write(path)`` makes, with the digest in
    config.json updated to match (as a hostile file would have it)."""
    import hashlib

    file = weights_file(checkpoint)
    file.unlink()
    write(file)
    header = json.loads((checkpoint / "config.json").read_text())
    if file.is_file():
        header["weights_sha256"] = hashlib.sha256(file.read_bytes()).hexdigest()
    (checkpoint / "config.json").write_text(json.dumps(header))
    return file


@pytest.mark.timeout(30)
def test_weights_that_are_a_fifo_or_a_device_are_refused_not_read(checkpoint):
    # A FIFO blocked the load for good; /dev/zero was read until the memory ran out.
    file = _rewrite_weights(checkpoint, lambda f: os.mkfifo(f))
    assert_refused_naming(checkpoint, file, match="not a regular file")
    file.unlink()
    file.symlink_to("/dev/zero")
    assert_refused_naming(checkpoint, file, match="not a regular file")


def test_a_zip_bomb_or_a_header_declaring_terabytes_is_refused_before_it_inflates(
        checkpoint):
    import zipfile

    arrays = dict(np.load(weights_file(checkpoint)))

    def bomb(f):  # w0 inflates to 400 MB, from a file of under a megabyte
        with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as npz:
            for name, array in arrays.items():
                with npz.open(f"{name}.npy", "w") as out:
                    np.lib.format.write_array(
                        out, np.zeros((10_000, 10_000), np.float32) if name == "w0"
                        else array)

    file = _rewrite_weights(checkpoint, bomb)
    assert os.path.getsize(file) < 1 << 20
    assert_refused_naming(checkpoint, file, match="do not fit.*'w0' takes 400,000,128")

    def declared(f):  # w0's header says [2**20, 2**20] and it holds a few bytes
        with zipfile.ZipFile(f, "w") as npz:
            for name, array in arrays.items():
                with npz.open(f"{name}.npy", "w") as out:
                    if name == "w0":
                        np.lib.format.write_array_header_1_0(out, {
                            "descr": "<f4", "fortran_order": False,
                            "shape": (2 ** 20, 2 ** 20)})
                        out.write(b"\0" * 16)
                    else:
                        np.lib.format.write_array(out, array)

    file = _rewrite_weights(checkpoint, declared)
    assert_refused_naming(checkpoint, file, match="'w0' declares \\[1048576, 1048576\\]")


@pytest.mark.parametrize("text", ["9" * 5000, "[" * 100_000 + "]" * 100_000])
def test_json_past_pythons_limits_is_refused_naming_the_file(checkpoint, text):
    # An integer of over 4,300 digits raised a ValueError naming no file.
    (checkpoint / "config.json").write_text('{"format": ' + text + "}")
    assert_refused_naming(checkpoint, checkpoint / "config.json", match="not valid JSON")


def test_a_json_file_past_the_size_limit_is_refused_unread(checkpoint, monkeypatch):
    from async_search import schema

    monkeypatch.setattr(schema, "MAX_JSON_BYTES", 64)
    assert_refused_naming(checkpoint, checkpoint / "config.json",
                          match="more than the 64 such a file may")


def test_weights_of_the_widest_float_still_load(tmp_path):
    # The size bound of a hostile-file check took 8 bytes an element: long double
    # weights (16 bytes here) saved but no longer loaded.
    weights = [(w.astype(np.longdouble), b.astype(np.longdouble))
               for w, b in initial_weights(POLICY_VALUE, 0)]
    save_checkpoint(tmp_path / "c", weights, POLICY_VALUE)
    assert_weights_bitwise_equal(read_checkpoint(tmp_path / "c").weights, weights)
