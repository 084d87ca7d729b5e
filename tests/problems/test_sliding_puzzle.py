import collections
import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from async_search.problems import SlidingPuzzle


def reachable_from_goal(puzzle):
    seen = {puzzle.goal}
    queue = collections.deque([puzzle.goal])
    while queue:
        for n, _ in puzzle.neighbors(queue.popleft()):
            if n not in seen:
                seen.add(n)
                queue.append(n)
    return seen


scrambles = st.tuples(st.sampled_from([3, 4]), st.integers(0, 80), st.integers(0, 2**32))


def test_goal_is_tiles_in_order_with_blank_last():
    assert SlidingPuzzle(3).goal == bytes([1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert SlidingPuzzle(4).goal == bytes([*range(1, 16), 0])


def test_neighbors_of_goal_slide_the_tiles_above_and_left_into_the_blank():
    puzzle = SlidingPuzzle(3)
    assert puzzle.neighbors(puzzle.goal) == [
        (bytes([1, 2, 3, 4, 5, 0, 7, 8, 6]), 1),
        (bytes([1, 2, 3, 4, 5, 6, 7, 0, 8]), 1),
    ]


def test_center_blank_has_four_neighbors_each_costing_one():
    puzzle = SlidingPuzzle(3)
    state = puzzle.state([1, 2, 3, 4, 0, 5, 7, 8, 6])
    neighbors = puzzle.neighbors(state)
    assert len(neighbors) == 4
    assert {cost for _, cost in neighbors} == {1}


@settings(max_examples=30, deadline=None)
@given(scrambles)
def test_moves_are_reversible(args):
    size, moves, seed = args
    puzzle = SlidingPuzzle(size)
    state = puzzle.scramble(moves, seed=seed)
    for neighbor, _ in puzzle.neighbors(state):
        assert state in [s for s, _ in puzzle.neighbors(neighbor)]


@settings(max_examples=30, deadline=None)
@given(scrambles)
def test_scrambled_states_are_valid_and_solvable(args):
    size, moves, seed = args
    puzzle = SlidingPuzzle(size)
    state = puzzle.scramble(moves, seed=seed)
    puzzle.check_state(state)
    assert puzzle.is_solvable(state)


@settings(max_examples=30, deadline=None)
@given(scrambles, st.data())
def test_swapping_two_tiles_makes_a_state_unsolvable(args, data):
    size, moves, seed = args
    puzzle = SlidingPuzzle(size)
    cells = bytearray(puzzle.scramble(moves, seed=seed))
    tiles = [p for p in range(len(cells)) if cells[p]]
    i, j = data.draw(st.sampled_from(list(itertools.combinations(tiles, 2))))
    cells[i], cells[j] = cells[j], cells[i]
    assert not puzzle.is_solvable(bytes(cells))
    with pytest.raises(ValueError, match=r"SlidingPuzzle\(%d\).*unsolvable" % size):
        puzzle.check_state(bytes(cells))


@pytest.mark.parametrize("size", [2, 3])
def test_is_solvable_holds_exactly_for_states_reachable_from_the_goal(size):
    puzzle = SlidingPuzzle(size)
    reachable = reachable_from_goal(puzzle)
    permutations = [bytes(p) for p in itertools.permutations(range(size * size))]
    if size == 3:  # a sample of the 362880
        rng = np.random.default_rng(0)
        permutations = [permutations[i] for i in rng.choice(len(permutations), 3000)]
    for state in permutations:
        assert puzzle.is_solvable(state) == (state in reachable)


def test_scramble_is_deterministic_given_seed():
    puzzle = SlidingPuzzle(4)
    assert puzzle.scramble(50, seed=7) == puzzle.scramble(50, seed=7)
    assert len({puzzle.scramble(50, seed=s) for s in range(10)}) == 10


def test_scramble_of_zero_moves_is_the_goal():
    puzzle = SlidingPuzzle(3)
    assert puzzle.scramble(0, seed=3) == puzzle.goal


def test_scramble_rejects_negative_moves():
    with pytest.raises(ValueError, match="moves must be an integer >= 0, got -1"):
        SlidingPuzzle(3).scramble(-1, seed=0)


def test_scramble_refuses_a_bool_for_moves():
    with pytest.raises(ValueError, match="moves must be an integer >= 0, got True"):
        SlidingPuzzle(3).scramble(True, seed=0)


@pytest.mark.parametrize("bad, message", [
    ((1, 2, 3, 4, 5, 6, 7, 8, 0), "must be bytes of length 9"),
    (bytes([1, 2, 3, 4, 5, 6, 7, 0]), "each tile 0..8 exactly once"),
    (bytes([1, 1, 3, 4, 5, 6, 7, 8, 0]), "each tile 0..8 exactly once"),
    (bytes([2, 1, 3, 4, 5, 6, 7, 8, 0]), "unsolvable"),
])
def test_check_state_rejects_malformed_states_naming_the_puzzle(bad, message):
    with pytest.raises(ValueError, match=r"SlidingPuzzle\(3\).*" + message):
        SlidingPuzzle(3).check_state(bad)


def test_state_builds_a_checked_state_from_tiles():
    puzzle = SlidingPuzzle(3)
    assert puzzle.state([1, 2, 3, 4, 5, 6, 7, 0, 8]) == bytes([1, 2, 3, 4, 5, 6, 7, 0, 8])
    with pytest.raises(ValueError, match="unsolvable"):
        puzzle.state([2, 1, 3, 4, 5, 6, 7, 8, 0])


@pytest.mark.parametrize("size", [1, 9, 3.0, "3", True])
def test_size_outside_2_to_8_raises(size):
    with pytest.raises(ValueError, match="size must be an integer from 2 to 8"):
        SlidingPuzzle(size)


def test_encode_is_one_hot_of_tile_positions():
    puzzle = SlidingPuzzle(3)
    state = puzzle.state([1, 2, 3, 4, 5, 6, 7, 0, 8])
    x = puzzle.encode([puzzle.goal, state])
    assert x.shape == (2, 9, 9) and x.dtype == np.float32
    assert (x.sum(axis=1) == 1).all() and (x.sum(axis=2) == 1).all()
    assert x[1, 8, 8] == 1 and x[1, 0, 7] == 1 and x[0, 0, 8] == 1
    assert puzzle.decode(x) == [puzzle.goal, state]


def test_manhattan_distance_counts_moves_of_each_tile():
    puzzle = SlidingPuzzle(3)
    assert puzzle.manhattan_distance(puzzle.goal) == 0
    assert puzzle.manhattan_distance(puzzle.state([0, 1, 2, 3, 4, 5, 6, 7, 8])) == 12


# -- compact keys (A*'s fast path) ---------------------------------------------------------

@pytest.mark.parametrize("size", [2, 3, 4])
def test_compact_keys_agree_exactly_with_states(size):
    from async_search.problems.base import CompactKeys
    puzzle = SlidingPuzzle(size)
    keys = puzzle.compact_keys()
    assert isinstance(keys, CompactKeys) and keys.step_cost == 1
    assert keys.goal_keys == {keys.key(puzzle.goal)}
    states = [puzzle.scramble(m, seed=s) for s in range(25) for m in (0, 1, 7, 60)]
    ints = [keys.key(s) for s in states]
    assert [keys.state(k) for k in ints] == states
    assert len(set(ints)) == len(set(states))
    for state, key in zip(states, ints):
        assert (key in keys.goal_keys) == puzzle.is_goal(state)
    # encode: the same bytes as the states' encoding, for any batch size.
    for batch in (ints[:1], ints[:3], ints):
        x = keys.encode(batch)
        expected = puzzle.encode([keys.state(k) for k in batch])
        assert x.dtype == expected.dtype and x.shape == expected.shape
        assert x.flags.c_contiguous and x.tobytes() == expected.tobytes()


@pytest.mark.parametrize("size", [2, 3, 4])
def test_compact_expand_is_neighbors_in_order_without_the_parent(size):
    puzzle = SlidingPuzzle(size)
    keys = puzzle.compact_keys()
    states = [puzzle.scramble(m, seed=s) for s in range(20) for m in (0, 3, 40)]
    ints = [keys.key(s) for s in states]
    # A parent equal to its key leaves nothing out.
    children, counts = keys.expand(ints, ints)
    assert counts == [len(puzzle.neighbors(s)) for s in states]
    assert children == [keys.key(n) for s in states for n, _ in puzzle.neighbors(s)]
    for state, key in zip(states, ints):
        for neighbor, _ in puzzle.neighbors(state):
            grandchildren, counts = keys.expand([keys.key(neighbor)], [key])
            assert [keys.state(k) for k in grandchildren] == [
                n for n, _ in puzzle.neighbors(neighbor) if n != state]
            assert counts == [len(grandchildren)]


def test_compact_keys_exist_up_to_the_15_puzzle_and_share_their_tables():
    assert SlidingPuzzle(5).compact_keys() is None
    a, b = SlidingPuzzle(4).compact_keys(), SlidingPuzzle(4).compact_keys()
    assert a is not b and a._moves is b._moves
    puzzle = SlidingPuzzle(4)
    assert puzzle.compact_keys() is puzzle.compact_keys()



@pytest.mark.parametrize("tiles", [[1.9, 2, 3, 4, 5, 6, 7, 8, 0.5],
                                   [1.0, 2, 3, 4, 5, 6, 7, 8, 0], "123456780",
                                   [True, 2, 3, 4, 5, 6, 7, 8, 0]])
def test_tiles_that_are_not_integers_are_refused_not_rounded(tiles):
    with pytest.raises(ValueError, match="tiles must be integers"):
        SlidingPuzzle(3).state(tiles)


def test_tiles_as_numpy_integers_or_bytes_are_taken():
    puzzle = SlidingPuzzle(3)
    assert puzzle.state(np.array([1, 2, 3, 4, 5, 6, 7, 8, 0], np.int64)) == puzzle.goal
    assert puzzle.state(puzzle.goal) == puzzle.goal


@pytest.mark.parametrize("seed", [None, -1, 1.5])
def test_a_scramble_needs_a_seed_so_that_it_is_the_same_every_time(seed):
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        SlidingPuzzle(3).scramble(10, seed=seed)


class KorfGoal(SlidingPuzzle):
    """Korf's convention: the blank first."""

    def is_goal(self, state):
        return state == bytes(range(self.num_cells))


class CostlyMoves(SlidingPuzzle):
    def neighbors(self, state):
        return [(s, 2) for s, _ in super().neighbors(state)]


@pytest.mark.parametrize("search_fn", ["batched_astar", "continuous_astar"])
def test_a_subclass_that_changes_the_rules_is_searched_by_its_own_rules(search_fn):
    # The inherited keys stood for SlidingPuzzle's goal and unit moves: A* returned a
    # "goal" that the subclass's is_goal refused, and costs of 1 for moves of 2.
    import asyncio

    import async_search as asr
    from async_search import search

    zero = asr.immediate(lambda b: np.zeros((len(b), 1), np.float32))
    options = {"buffer_size": 4} if search_fn == "batched_astar" else {}
    fn = functools.partial(getattr(search, search_fn), **options)
    korf = KorfGoal(3)
    assert korf.compact_keys() is None and SlidingPuzzle(3).compact_keys() is not None
    start = korf.scramble(6, seed=1)
    result = asyncio.run(fn(korf, start, zero, budget=10 ** 6))
    assert result.path and korf.is_goal(result.path[-1])
    costly = CostlyMoves(3)
    result = asyncio.run(fn(costly, costly.scramble(6, seed=1), zero, budget=10 ** 6))
    steps = sum(dict(costly.neighbors(a))[b] for a, b in zip(result.path, result.path[1:]))
    assert result.cost == steps == 2 * (len(result.path) - 1)


@pytest.mark.parametrize("state", [b"", bytes(9), "abc", SlidingPuzzle(4).goal])
def test_parity_and_manhattan_refuse_what_is_not_a_state_of_the_puzzle(state):
    # Both answered plausibly: True, and 0 for the 15-puzzle's goal on the 8-puzzle.
    puzzle = SlidingPuzzle(3)
    for call in (puzzle.is_solvable, puzzle.manhattan_distance):
        with pytest.raises(ValueError, match="SlidingPuzzle\\(3\\): a state must"):
            call(state)


@pytest.mark.parametrize("size, other", [(3, 4), (4, 3), (3, 5)])
def test_a_state_of_another_size_is_refused_by_neighbors_is_goal_and_encode(size, other):
    """A 15-puzzle state given to the 8-puzzle got moves of the wrong board (a diagonal
    swap) or an IndexError, and is_goal a quiet False: each names the state now."""
    puzzle, foreign = SlidingPuzzle(size), SlidingPuzzle(other)
    for state in (foreign.goal, foreign.scramble(5, seed=1), list(puzzle.goal),
                  bytearray(puzzle.goal)):
        for call in (puzzle.neighbors, puzzle.is_goal, lambda s: puzzle.encode([s])):
            with pytest.raises(ValueError, match=r"SlidingPuzzle\(\d\): a state must"):
                call(state)
    assert puzzle.is_goal(puzzle.goal) and len(puzzle.neighbors(puzzle.goal)) == 2
