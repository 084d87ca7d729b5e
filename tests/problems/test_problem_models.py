"""The NumPy models: exactness, admissibility, seeding, and batch-independence."""

import collections

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from async_search.problems import (ConnectFour, DepthHeuristic, ManhattanHeuristic,
                                   PolicyValueMLP, SlidingPuzzle, SyntheticGraph,
                                   heuristic_mlp)


def random_puzzle_batch(size, n, seed):
    puzzle = SlidingPuzzle(size)
    return puzzle.encode([puzzle.scramble(60, seed=seed * 1000 + i) for i in range(n)])


def random_game_batch(n, seed):
    game = ConnectFour()
    rng = np.random.default_rng(seed)
    states = []
    for _ in range(n):
        state = game.initial_state()
        for _ in range(rng.integers(0, 20)):
            legal = game.legal_actions(state)
            if not legal:
                break
            state = game.play(state, legal[rng.integers(len(legal))])
        states.append(state)
    return game.encode(states)


def graph_batch(n):
    graph = SyntheticGraph(branching=3, depth=8, seed=0)
    states, frontier = [], [graph.start()]
    while len(states) < n:
        frontier = [c for s in frontier for c, _ in graph.neighbors(s)]
        states.extend(frontier)
    return graph.encode(states[:n])


MODELS = {
    "manhattan-8": (lambda: ManhattanHeuristic(SlidingPuzzle(3)),
                    lambda: random_puzzle_batch(3, 61, 0)),
    "manhattan-15": (lambda: ManhattanHeuristic(SlidingPuzzle(4)),
                     lambda: random_puzzle_batch(4, 61, 1)),
    "mlp-15": (lambda: heuristic_mlp(SlidingPuzzle(4), hidden_sizes=(64, 32), seed=3),
               lambda: random_puzzle_batch(4, 61, 2)),
    "depth": (lambda: DepthHeuristic(SyntheticGraph(branching=3, depth=8)),
              lambda: graph_batch(61)),
    "mlp-graph": (lambda: heuristic_mlp(SyntheticGraph(branching=3, depth=8), seed=1),
                  lambda: graph_batch(61)),
    "policy-value": (lambda: PolicyValueMLP(ConnectFour(), hidden_sizes=(64,), seed=5),
                     lambda: random_game_batch(61, 0)),
}


def as_tuple(y):
    return y if isinstance(y, tuple) else (y,)


def assert_same_bits(a, b):
    for x, y in zip(as_tuple(a), as_tuple(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_output_for_a_row_does_not_depend_on_batch_mates(name):
    make_model, make_batch = MODELS[name]
    model, batch = make_model(), make_batch()
    full = model(batch)
    order = np.random.default_rng(0).permutation(len(batch))
    shuffled = model(batch[order])
    for i in range(len(batch)):
        alone = model(batch[i:i + 1])
        assert_same_bits(alone, tuple(y[i:i + 1] for y in as_tuple(full)))
    assert_same_bits(shuffled, tuple(y[order] for y in as_tuple(full)))
    assert_same_bits(model(batch[7:40]), tuple(y[7:40] for y in as_tuple(full)))


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([3, 4]), st.integers(0, 100), st.integers(0, 2**32))
def test_manhattan_model_equals_manhattan_distance(size, moves, seed):
    puzzle = SlidingPuzzle(size)
    state = puzzle.scramble(moves, seed=seed)
    y = ManhattanHeuristic(puzzle)(puzzle.encode([state]))
    assert y.shape == (1, 1) and y.dtype == np.float32
    assert y[0, 0] == puzzle.manhattan_distance(state)


def test_manhattan_never_overestimates_the_true_distance():
    puzzle = SlidingPuzzle(3)
    distance = {puzzle.goal: 0}
    queue = collections.deque([puzzle.goal])
    while queue and len(distance) < 20000:
        state = queue.popleft()
        for n, _ in puzzle.neighbors(state):
            if n not in distance:
                distance[n] = distance[state] + 1
                queue.append(n)
    states = list(distance)
    h = ManhattanHeuristic(puzzle)(puzzle.encode(states))[:, 0]
    assert all(h[i] <= distance[s] for i, s in enumerate(states))
    assert max(distance.values()) >= 10


def test_depth_heuristic_is_the_remaining_depth():
    graph = SyntheticGraph(branching=2, depth=7)
    y = DepthHeuristic(graph)(graph.encode([(0, 5), (3, 9), (7, 1)]))
    assert y.tolist() == [[7.0], [4.0], [0.0]]


def test_heuristic_mlp_is_seeded():
    puzzle = SlidingPuzzle(3)
    x = random_puzzle_batch(3, 8, 4)
    a = heuristic_mlp(puzzle, hidden_sizes=(16,), seed=1)(x)
    b = heuristic_mlp(puzzle, hidden_sizes=(16,), seed=1)(x)
    c = heuristic_mlp(puzzle, hidden_sizes=(16,), seed=2)(x)
    assert a.shape == (8, 1) and a.tobytes() == b.tobytes()
    assert not np.array_equal(a, c)


def test_policy_value_net_gives_logits_per_action_and_values_in_unit_range():
    game = ConnectFour()
    x = random_game_batch(20, 1)
    logits, value = PolicyValueMLP(game, hidden_sizes=(32,), seed=0)(x)
    assert logits.shape == (20, 7) and logits.dtype == np.float32
    assert value.shape == (20, 1) and value.dtype == np.float32
    assert np.all(np.abs(value) <= 1) and len(np.unique(value)) > 1
    logits2, _ = PolicyValueMLP(game, hidden_sizes=(32,), seed=1)(x)
    assert not np.array_equal(logits, logits2)


@pytest.mark.parametrize("make, seed", [
    (lambda seed: heuristic_mlp(SlidingPuzzle(3), seed=seed), None),
    (lambda seed: heuristic_mlp(SlidingPuzzle(3), seed=seed), True),
    (lambda seed: heuristic_mlp(SlidingPuzzle(3), seed=seed), -1),
    (lambda seed: heuristic_mlp(SlidingPuzzle(3), seed=seed), 1.5),
    (lambda seed: PolicyValueMLP(ConnectFour(), seed=seed), None)])
def test_seeded_nets_refuse_a_seed_that_is_not_an_integer_naming_it(make, seed):
    # None drew new weights at every call: two processes' "seeded" nets differed.
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        make(seed)


def test_a_model_for_another_kind_of_problem_is_refused_naming_what_it_takes():
    # Bare AttributeErrors: no attribute 'num_actions', no attribute 'size'.
    with pytest.raises(TypeError, match="PolicyValueMLP takes a game"):
        PolicyValueMLP(SlidingPuzzle(3))
    for problem in (ConnectFour(), SyntheticGraph()):
        with pytest.raises(TypeError, match="ManhattanHeuristic measures a SlidingPuzzle"):
            ManhattanHeuristic(problem)


@pytest.mark.parametrize("name", sorted(set(MODELS) - {"policy-value"}) + ["pretrained-15"])
def test_a_model_called_directly_on_rows_of_another_size_names_both_shapes(name):
    """Outside serve (which checks requests first), rows of a 4x4 board given to a
    model of a 3x3 one (or the reverse) get InputSpecError, not a reshape error."""
    from async_search.errors import InputSpecError
    from async_search.problems import pretrained
    model = pretrained("15-puzzle") if name == "pretrained-15" else MODELS[name][0]()
    elements = int(np.prod(model.input_spec.shape))
    wrong = np.zeros((3, elements + 1), np.float32)
    with pytest.raises(InputSpecError, match=r"expected a batch of shape \[n, .*\], "
                                             rf"got \(3, {elements + 1}\)"):
        model(wrong)
    assert len(np.asarray(model(np.zeros((3, *model.input_spec.shape), np.float32)))) == 3
