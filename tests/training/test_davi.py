"""DAVI: scrambled boards, Bellman targets against brute force, and a short run."""

import collections
import dataclasses
import json
import math
import shutil

import numpy as np
import pytest

from async_search.errors import CheckpointError, ModelOutputError

from async_search.problems import LearnedHeuristic, ManhattanHeuristic, SlidingPuzzle
from async_search.problems.nets import NetConfig
from async_search.training.davi import (Davi, DaviConfig, DaviRecord, bellman_targets,
                                        scrambled_states)
from async_search.training.replay import ReplayBuffer

PUZZLE = SlidingPuzzle(3)
DEPTH = 14  # BFS radius: the 8-puzzle has a few thousand states this close to the goal


def as_states(boards):
    return [bytes(row) for row in boards]


@pytest.fixture(scope="module")
def distance():
    """Exact distances to the goal of every 8-puzzle state within DEPTH moves."""
    dist = {PUZZLE.goal: 0}
    queue = collections.deque([PUZZLE.goal])
    while queue:
        state = queue.popleft()
        if dist[state] == DEPTH:
            continue
        for nb, _ in PUZZLE.neighbors(state):
            if nb not in dist:
                dist[nb] = dist[state] + 1
                queue.append(nb)
    return dist


def brute_force_targets(states, h):
    """0 for the goal, else min over neighbours of 1 + (0 at the goal, else h)."""
    out = []
    for s in states:
        if PUZZLE.is_goal(s):
            out.append(0.0)
        else:
            out.append(min(1.0 + (0.0 if PUZZLE.is_goal(nb) else h(nb))
                           for nb, _ in PUZZLE.neighbors(s)))
    return np.array(out, np.float32)


# -- scrambled_states ---------------------------------------------------------------------


@pytest.mark.parametrize("size", [3, 4])
def test_scrambled_states_are_valid_solvable_boards(size):
    puzzle = SlidingPuzzle(size)
    boards = scrambled_states(puzzle, 300, 40, np.random.default_rng(0))
    assert boards.shape == (300, size * size) and boards.dtype == np.uint8
    for state in as_states(boards):
        puzzle.check_state(state)  # a permutation of the tiles, and solvable
        assert puzzle.is_solvable(state)
    assert len(set(as_states(boards))) > 250  # and varied


def test_scrambled_states_are_deterministic_for_a_seed():
    a = scrambled_states(PUZZLE, 100, 30, np.random.default_rng(5))
    b = scrambled_states(PUZZLE, 100, 30, np.random.default_rng(5))
    c = scrambled_states(PUZZLE, 100, 30, np.random.default_rng(6))
    assert a.tobytes() == b.tobytes() and a.tobytes() != c.tobytes()


def test_no_scrambled_states_is_an_empty_batch_that_the_targets_and_buffer_take():
    boards = scrambled_states(PUZZLE, 0, 5, np.random.default_rng(0))
    assert boards.shape == (0, 9) and boards.dtype == np.uint8
    targets = bellman_targets(PUZZLE, boards, ManhattanHeuristic(PUZZLE))
    assert targets.shape == (0,) and targets.dtype == np.float32
    buf = ReplayBuffer(4)
    buf.add(PUZZLE.encode(as_states(boards)), None, targets)
    assert len(buf) == 0


@pytest.mark.parametrize("call, match", [
    (lambda rng: scrambled_states(PUZZLE, -1, 5, rng),
     "n must be an integer >= 0, got -1"),
    (lambda rng: scrambled_states(PUZZLE, 2.0, 5, rng),
     "n must be an integer >= 0, got 2.0"),
    (lambda rng: scrambled_states(PUZZLE, 3, 0, rng),
     "max_moves must be an integer >= 1, got 0"),
    (lambda rng: scrambled_states(PUZZLE, 3, True, rng),
     "max_moves must be an integer >= 1, got True"),
    (lambda rng: bellman_targets(PUZZLE, scrambled_states(PUZZLE, 3, 5, rng),
                                 ManhattanHeuristic(PUZZLE), chunk=0),
     "chunk must be an integer >= 1, got 0"),
    (lambda rng: bellman_targets(PUZZLE, scrambled_states(PUZZLE, 3, 5, rng),
                                 ManhattanHeuristic(PUZZLE), chunk=2.5),
     "chunk must be an integer >= 1, got 2.5"),
])
def test_bad_sizes_raise_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call(np.random.default_rng(0))


@pytest.mark.parametrize("rng", [0, None])
def test_scrambled_states_refuses_what_is_no_generator(rng):
    with pytest.raises(TypeError, match="rng must be a Generator instance"):
        scrambled_states(PUZZLE, 3, 5, rng)


def test_a_board_scrambled_with_one_move_is_exactly_one_move_from_the_goal():
    boards = scrambled_states(PUZZLE, 50, 1, np.random.default_rng(1))
    goal_neighbours = {nb for nb, _ in PUZZLE.neighbors(PUZZLE.goal)}
    states = as_states(boards)
    assert set(states) == goal_neighbours  # both moves from the corner blank occur


def test_scrambled_states_lie_within_max_moves_of_the_goal(distance):
    boards = scrambled_states(PUZZLE, 400, 10, np.random.default_rng(2))
    depths = [distance[s] for s in as_states(boards)]  # KeyError: farther than DEPTH
    assert max(depths) <= 10
    assert min(depths) >= 1 and max(depths) >= 8  # 1..K moves, not all short


# -- bellman_targets ------------------------------------------------------------------------


def test_bellman_targets_with_manhattan_equal_a_brute_force_computation():
    boards = scrambled_states(PUZZLE, 300, 30, np.random.default_rng(3))
    states = as_states(boards)
    expected = brute_force_targets(states, PUZZLE.manhattan_distance)
    got = bellman_targets(PUZZLE, boards, ManhattanHeuristic(PUZZLE))
    assert got.dtype == np.float32 and got.shape == (300,)
    np.testing.assert_array_equal(got, expected)


def test_bellman_targets_give_zero_for_the_goal_and_one_next_to_it():
    neighbour = PUZZLE.neighbors(PUZZLE.goal)[0][0]
    boards = np.frombuffer(PUZZLE.goal + neighbour, np.uint8).reshape(2, 9)
    big = lambda x: np.full((len(x), 1), 100.0, np.float32)  # noqa: E731
    # Even with an h that is 100 everywhere, the goal is 0 and its neighbour 1.
    for h in (ManhattanHeuristic(PUZZLE), big):
        np.testing.assert_array_equal(bellman_targets(PUZZLE, boards, h), [0.0, 1.0])


def test_bellman_targets_take_one_value_per_neighbour_as_a_column_or_a_vector():
    boards = scrambled_states(PUZZLE, 50, 20, np.random.default_rng(5))
    h = ManhattanHeuristic(PUZZLE)
    flat = lambda x: np.asarray(h(x)).reshape(-1)  # noqa: E731
    np.testing.assert_array_equal(bellman_targets(PUZZLE, boards, flat),
                                  bellman_targets(PUZZLE, boards, h))


@pytest.mark.parametrize("h", [
    lambda x: np.full((1, 1), 5.0, np.float32),  # one row, broadcast to all, before
    lambda x: np.zeros((1, len(x)), np.float32),  # a row, not a column
    lambda x: np.zeros((len(x), 2), np.float32),
    lambda x: np.zeros(len(x) + 1, np.float32),
], ids=["one row", "a row", "two columns", "one too many"])
def test_a_heuristic_not_giving_one_value_per_neighbour_raises_model_output_error(h):
    boards = scrambled_states(PUZZLE, 3, 20, np.random.default_rng(0))
    with pytest.raises(ModelOutputError, match=r"h_target returned an array of shape "
                                               r"\(.*\) for a batch of \d+ neighbours: "
                                               r"it must return one value per neighbour"):
        bellman_targets(PUZZLE, boards, h)


@pytest.mark.parametrize("h, match", [
    (lambda x: np.full(len(x), np.nan, np.float32), "a NaN or an infinity"),
    (lambda x: np.full(len(x), np.inf), "a NaN or an infinity"),
    (lambda x: np.ones(len(x)) * (1 + 2j), "complex values"),
])
def test_a_heuristic_giving_no_finite_real_values_raises_model_output_error(h, match):
    # NaN and infinite targets went on to the net silently; a complex one lost its
    # imaginary part with a warning only.
    boards = scrambled_states(PUZZLE, 3, 20, np.random.default_rng(0))
    with pytest.raises(ModelOutputError, match=match):
        bellman_targets(PUZZLE, boards, h)


def test_davi_refuses_a_resume_that_is_no_bool_and_a_config_that_is_no_davi_config():
    with pytest.raises(ValueError, match="resume must be True or False, got 1"):
        Davi(DaviConfig(**SHORT), resume=1)
    with pytest.raises(TypeError, match="config must be a DaviConfig instance"):
        Davi(SHORT)


def _boards(*rows, dtype=np.uint8):
    return np.array(rows, dtype)


@pytest.mark.parametrize("boards, match", [
    (_boards([9] * 9), r"boards\[0\] is not a board: SlidingPuzzle\(3\): a state must "
                       r"hold each tile 0..8 exactly once"),
    (_boards([1, 2, 3, 4, 5, 6, 7, 8, 0], [1, 1, 3, 4, 5, 6, 7, 8, 0]),
     r"boards\[1\] is not a board: .* exactly once"),
    (_boards([1, 2, 3, 4, 5, 6, 7, 300, 0], dtype=np.int64), "tiles must be integers 0..8"),
    (_boards([1, 2, 3, 4, 5, 6, 7, -8, 0], dtype=np.int64), "tiles must be integers 0..8"),
    (_boards([1, 2, 3, 4, 5, 6, 7, 8, 0], dtype=np.float64), "tiles must be integers 0..8"),
    (_boards([2, 1, 3, 4, 5, 6, 7, 8, 0]), "unsolvable"),
    (np.zeros((2, 16), np.uint8),
     r"boards must be an array \[n, 9\] .* got shape \(2, 16\)"),
    (np.frombuffer(PUZZLE.goal, np.uint8), r"got shape \(9,\)"),
], ids=["tile 9", "a tile twice", "tile 300", "tile -8", "floats", "unsolvable",
        "15-puzzle boards", "one board, not a batch"])
def test_a_board_that_is_not_one_of_the_puzzle_raises_value_error_naming_it(boards, match):
    with pytest.raises(ValueError, match=match):
        bellman_targets(PUZZLE, boards, ManhattanHeuristic(PUZZLE))


def test_bellman_targets_do_not_depend_on_the_chunk_size():
    boards = scrambled_states(PUZZLE, 100, 20, np.random.default_rng(4))
    h = ManhattanHeuristic(PUZZLE)
    np.testing.assert_array_equal(bellman_targets(PUZZLE, boards, h, chunk=7),
                                  bellman_targets(PUZZLE, boards, h))


def test_the_exact_distance_is_a_fixed_point_of_the_bellman_targets(distance):
    def exact(x):
        return np.array([[distance[s]] for s in PUZZLE.decode(x)], np.float32)

    near = [s for s, d in distance.items() if d < DEPTH]  # all neighbours within DEPTH
    states = near[:40] + near[40::max(1, len(near) // 600)]  # BFS order: every depth
    boards = np.frombuffer(b"".join(states), np.uint8).reshape(len(states), 9)
    got = bellman_targets(PUZZLE, boards, exact)
    np.testing.assert_array_equal(got, [distance[s] for s in states])
    assert {distance[s] for s in states} == set(range(DEPTH))


# -- Davi -------------------------------------------------------------------------------------

SHORT = dict(size=3, rounds=3, states_per_round=500, train_steps=20, hidden_sizes=(16,))


def test_a_short_davi_run_returns_a_record_per_round_and_a_learned_heuristic():
    pytest.importorskip("tensorflow")
    davi = Davi(DaviConfig(**SHORT))
    seen = []
    records = davi.run(on_round=seen.append)
    assert len(records) == 3 and seen == records == davi.history
    assert [r.round for r in records] == [1, 2, 3]
    for r in records:
        assert isinstance(r, DaviRecord)
        assert math.isfinite(r.value_loss) and r.value_loss >= 0
        assert math.isfinite(r.mean_target) and r.mean_target >= 1.0
        assert r.seconds >= 0
    updates = [r.target_updates for r in records]
    assert updates == sorted(updates) and updates[-1] == davi.target_updates <= 3
    assert len(davi.buffer) == 1500
    model = davi.model()
    assert isinstance(model, LearnedHeuristic) and model.residual
    h = model(PUZZLE.encode([PUZZLE.goal, PUZZLE.scramble(20, seed=0)]))
    assert h.shape == (2, 1) and np.isfinite(h).all() and (h >= 0).all()
    assert davi.run() == records  # the rounds are done


def test_the_target_net_is_refreshed_exactly_when_the_loss_is_below_the_threshold():
    pytest.importorskip("tensorflow")
    always = Davi(DaviConfig(**{**SHORT, "rounds": 2}, loss_threshold=1e9))
    always.run()
    assert [r.target_updates for r in always.history] == [1, 2]
    x = PUZZLE.encode([PUZZLE.scramble(12, seed=1)])
    assert always.target(x).tobytes() == always.model()(x).tobytes()
    never = Davi(DaviConfig(**{**SHORT, "rounds": 2}, loss_threshold=1e-12))
    never.run()
    assert [r.target_updates for r in never.history] == [0, 0]


@pytest.mark.parametrize("field, value", [
    ("size", 1), ("rounds", 0), ("states_per_round", 0), ("max_scramble", 0),
    ("train_steps", 0), ("batch_size", 0), ("buffer_capacity", 0), ("seed", -1),
    ("loss_threshold", 0.0), ("learning_rate", 0.0), ("learning_rate", float("inf")),
    ("l2", -1e-6), ("rounds", 1.5),
    # int() split "256" into the widths 2, 5, 6 and rounded 1.5 to 1, without a word
    ("hidden_sizes", "256"), ("hidden_sizes", (1.5,)), ("hidden_sizes", (True, 64)),
    # "False" is truthy: it trained with the Manhattan term, without a word
    ("residual", "False"), ("residual", 0),
])
def test_a_bad_davi_config_raises_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DaviConfig(**{field: value})


def test_a_davi_config_holds_numpy_numbers_as_python_numbers():
    config = DaviConfig(**{**SHORT, "seed": np.int64(1), "rounds": np.int32(2)})
    assert type(config.seed) is int and type(config.rounds) is int
    json.dumps(dataclasses.asdict(config))  # JSON refused int64


def test_a_davi_config_describes_its_net():
    config = DaviConfig(size=3, hidden_sizes=[32, 8], residual=False)
    assert config.hidden_sizes == (32, 8)
    assert config.net == NetConfig("heuristic", "sliding_puzzle", (32, 8), 3, False)
    with pytest.raises(ValueError, match="hidden_sizes"):
        DaviConfig(hidden_sizes=(0,)).net


# -- checkpointed rounds: resume, refusals, damaged files ---------------------------------

TINY = DaviConfig(size=3, rounds=3, states_per_round=40, max_scramble=10, train_steps=3,
                  hidden_sizes=(8,), batch_size=16, buffer_capacity=100,
                  loss_threshold=100.0, seed=2)


def rows(davi):
    return [{k: v for k, v in dataclasses.asdict(r).items() if k != "seconds"}
            for r in davi.history]


def assert_same_run(a, b):
    assert rows(a) == rows(b)
    for (wa, ba), (wb, bb) in zip(a.trainer.weights, b.trainer.weights):
        assert wa.tobytes() == wb.tobytes() and ba.tobytes() == bb.tobytes()
    for x, y in zip(a.buffer.arrays(), b.buffer.arrays()):
        assert (x is None and y is None) or x.tobytes() == y.tobytes()
    assert a.buffer.added == b.buffer.added
    state = a.rng.bit_generator.state == b.rng.bit_generator.state
    assert state and a.target_updates == b.target_updates


def test_every_round_is_committed_and_a_resumed_run_gives_the_same_rows(tmp_path):
    pytest.importorskip("tensorflow")
    straight = Davi(TINY, save_dir=str(tmp_path / "a"))
    straight.run()
    first = Davi(dataclasses.replace(TINY, rounds=1), save_dir=str(tmp_path / "b"))
    first.run()
    state = json.loads((tmp_path / "b" / "state.json").read_text())
    assert state["round"] == 1 and len(state["history"]) == 1
    resumed = Davi(TINY, save_dir=str(tmp_path / "b"), resume=True)
    assert resumed.rounds_done == 1
    resumed.run()
    assert_same_run(straight, resumed)
    done = Davi(TINY, save_dir=str(tmp_path / "b"), resume=True)  # already complete
    assert done.rounds_done == 3 and done.run() == done.history
    assert Davi.check_resume(TINY, str(tmp_path / "b")) == 3


def test_a_run_whose_rounds_outgrow_its_buffer_resumes_too(tmp_path):
    # Each round adds more states than the buffer keeps: resuming checks the samples
    # added against the rounds done, so added counts every state, kept or not.
    pytest.importorskip("tensorflow")
    small = dataclasses.replace(TINY, buffer_capacity=TINY.states_per_round // 2)
    straight = Davi(small, save_dir=str(tmp_path / "a"))
    straight.run()
    Davi(dataclasses.replace(small, rounds=1), save_dir=str(tmp_path / "b")).run()
    resumed = Davi(small, save_dir=str(tmp_path / "b"), resume=True)
    resumed.run()
    assert_same_run(straight, resumed)


def test_resume_refuses_a_missing_run_other_parameters_and_weights(tmp_path):
    pytest.importorskip("tensorflow")
    with pytest.raises(ValueError, match="no saved run"):
        Davi(TINY, save_dir=str(tmp_path / "empty"), resume=True)
    with pytest.raises(ValueError, match="no saved run"):
        Davi.check_resume(TINY, str(tmp_path / "empty"))
    Davi(dataclasses.replace(TINY, rounds=1), save_dir=str(tmp_path)).run()
    for check in (lambda c: Davi(c, save_dir=str(tmp_path), resume=True),
                  lambda c: Davi.check_resume(c, str(tmp_path))):
        with pytest.raises(ValueError, match="train_steps differ"):
            check(dataclasses.replace(TINY, train_steps=4))
    with pytest.raises(ValueError, match="pass no weights"):
        Davi(TINY, save_dir=str(tmp_path), resume=True, weights=[])


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    pytest.importorskip("tensorflow")
    folder = tmp_path_factory.mktemp("davi") / "run"
    Davi(dataclasses.replace(TINY, rounds=2), save_dir=str(folder)).run()
    return folder


@pytest.fixture
def run_copy(saved_run, tmp_path):
    shutil.copytree(saved_run, tmp_path / "run")
    return tmp_path / "run"


def edit_state(folder, change):
    file = folder / "state.json"
    state = json.loads(file.read_text())
    change(state)
    file.write_text(json.dumps(state))
    return file


def assert_resume_refused(folder, file, match):
    for resume in (lambda: Davi(TINY, save_dir=str(folder), resume=True),
                   lambda: Davi.check_resume(TINY, str(folder))):
        with pytest.raises(CheckpointError, match=match) as info:
            resume()
        assert str(file) in str(info.value) and "\n" not in str(info.value)
        if "state.json" not in str(file):
            break  # check_resume reads state.json alone


@pytest.mark.parametrize("damage, match", [
    (lambda b: b[:len(b) // 2], "not valid JSON"), (lambda b: b"", "empty"),
    (lambda b: np.random.default_rng(0).bytes(len(b)), "not UTF-8|not valid JSON"),
    (lambda b: b"\xff" + b[1:], "not UTF-8"), (lambda b: b"{}", "format"),
])
def test_a_damaged_state_file_is_refused_naming_it(run_copy, damage, match):
    file = run_copy / "state.json"
    file.write_bytes(damage(file.read_bytes()))
    assert_resume_refused(run_copy, file, match)


def _drop(path):
    def change(state):
        *parents, key = path
        node = state
        for p in parents:
            node = node[p]
        del node[key]
    return change


def _put(path, value):
    def change(state):
        *parents, key = path
        node = state
        for p in parents:
            node = node[p]
        node[key] = value
    return change


@pytest.mark.parametrize("path", [("config",), ("round",), ("target_updates",), ("rng",),
                                  ("history",), ("config", "train_steps"),
                                  ("config", "hidden_sizes"), ("history", 0, "value_loss"),
                                  ("history", 1, "round")])
def test_a_state_file_missing_a_field_is_refused_naming_it(run_copy, path):
    file = edit_state(run_copy, _drop(path))
    assert_resume_refused(run_copy, file, "is missing")


@pytest.mark.parametrize("path, value", [
    (("config",), [1]), (("round",), "2"), (("history",), 5), (("rng",), "pcg"),
    (("config", "residual"), "yes"), (("config", "hidden_sizes"), 8),
    (("config", "train_steps"), 3.0), (("history", 0), 7),
    (("history", 0, "value_loss"), "0.5"), (("history", 1, "target_updates"), [1]),
    (("history", 0, "round"), True)])
def test_a_state_file_with_a_field_of_the_wrong_type_is_refused_naming_it(run_copy, path,
                                                                          value):
    file = edit_state(run_copy, _put(path, value))
    assert_resume_refused(run_copy, file, r"must be|not a valid")


@pytest.mark.parametrize("path, value", [
    (("round",), 5), (("target_updates",), -1), (("history", 0, "value_loss"), -1.0),
    (("history", 0, "round"), 2), (("history", 1, "target_updates"), 9),
    (("history", 0, "mean_target"), float("inf")), (("config", "size"), 1),
    (("config", "buffer_capacity"), 0), (("rng",), {"bit_generator": "MT19937"}),
    (("history", 0, "extra"), 1),
    # numpy's state setter raises OverflowError for these, not a ValueError
    (("rng", "state", "state"), -1), (("rng", "state", "inc"), 2 ** 200),
    (("rng", "uinteger"), -1)])
def test_a_state_file_with_a_number_out_of_range_is_refused_naming_it(run_copy, path,
                                                                      value):
    file = edit_state(run_copy, _put(path, value))
    assert_resume_refused(run_copy, file,
                          r"must be|not a valid|not a PCG64|unknown|never writes")


def _generation(folder):
    return folder / json.loads((folder / "state.json").read_text())["generation"]


@pytest.mark.parametrize("name", ["buffer.npz", "latest/config.json", "target/config.json"])
@pytest.mark.parametrize("how", ["truncated", "empty"])
def test_a_damaged_net_or_buffer_is_refused_naming_it(run_copy, name, how):
    file = _generation(run_copy) / name
    data = file.read_bytes()
    file.write_bytes(data[:len(data) // 2] if how == "truncated" else b"")
    with pytest.raises(CheckpointError) as info:
        Davi(TINY, save_dir=str(run_copy), resume=True)
    assert str(file) in str(info.value)


def test_a_buffer_of_another_run_is_refused_naming_it(run_copy):
    other = ReplayBuffer(TINY.buffer_capacity, TINY.seed + 1)
    other.save(_generation(run_copy) / "buffer.npz")
    with pytest.raises(CheckpointError, match="does not belong to the run") as info:
        Davi(TINY, save_dir=str(run_copy), resume=True)
    assert "buffer.npz" in str(info.value)
