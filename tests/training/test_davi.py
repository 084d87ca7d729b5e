"""DAVI: scrambled boards, Bellman targets against brute force, and a short run."""

import collections
import math

import numpy as np
import pytest

from async_search.problems import LearnedHeuristic, ManhattanHeuristic, SlidingPuzzle
from async_search.training.davi import (Davi, DaviConfig, DaviRecord, bellman_targets,
                                        scrambled_states)
from async_search.training.nets import NetConfig

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
])
def test_a_bad_davi_config_raises_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DaviConfig(**{field: value})


def test_a_davi_config_describes_its_net():
    config = DaviConfig(size=3, hidden_sizes=[32, 8], residual=False)
    assert config.hidden_sizes == (32, 8)
    assert config.net == NetConfig("heuristic", "sliding_puzzle", (32, 8), 3, False)
    with pytest.raises(ValueError, match="hidden_sizes"):
        DaviConfig(hidden_sizes=(0,)).net
