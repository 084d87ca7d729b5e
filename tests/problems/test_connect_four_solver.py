"""The Connect Four solver: scores against hand-checked positions, Pons's published
scores and an exhaustive minimax; symmetry; conversions; its table and its errors."""

import functools

import numpy as np
import pytest

from async_search.problems import ConnectFour, ConnectFourSolver, ConnectFourState
from async_search.problems.connect_four_solver import (MAX_SCORE, MIN_SCORE,
                                                       SolverPosition, move_scores,
                                                       optimal_moves,
                                                       optimal_moves_of_scores, outcome,
                                                       solve, solver_position,
                                                       state_of_position)

GAME = ConnectFour()
# A full board with no four in a row (tests/problems/test_connect_four.py's DRAW).
DRAW = [int(c) for c in "310016216252113255306515632662543304404404"]


def pons(moves: str) -> ConnectFourState:
    """A position from Pons's notation (columns 1..7)."""
    return GAME.from_moves(int(c) - 1 for c in moves)


def mirror(state: ConnectFourState) -> ConnectFourState:
    def flip(board):
        return sum(((board >> (7 * c)) & 0x3F) << (7 * (6 - c)) for c in range(7))
    return ConnectFourState(flip(state.to_move), flip(state.waiting))


@functools.lru_cache(maxsize=None)
def brute_force(state: ConnectFourState) -> int:
    """Plain minimax over the game's own rules, no pruning: Pons's score of ``state``."""
    stones = (state.to_move | state.waiting).bit_count()
    best = None
    for column in GAME.legal_actions(state):
        child = GAME.play(state, column)
        value = GAME.terminal_value(child)
        if value == -1.0:
            score = (43 - stones) // 2  # won with this stone
        elif value == 0.0:
            score = 0
        else:
            score = -brute_force(child)
        best = score if best is None else max(best, score)
    return best


def brute_force_move_scores(state):
    scores = []
    stones = (state.to_move | state.waiting).bit_count()
    for column in range(7):
        if column not in GAME.legal_actions(state):
            scores.append(None)
            continue
        child = GAME.play(state, column)
        value = GAME.terminal_value(child)
        scores.append((43 - stones) // 2 if value == -1.0 else 0 if value == 0.0
                      else -brute_force(child))
    return tuple(scores)


def random_positions(n, stones, seed, informed=False):
    """Positions of seeded random games with ``stones`` stones, not over."""
    from async_search.problems.solved_positions import informed_move, random_move

    mover = informed_move if informed else random_move
    rng = np.random.default_rng(seed)
    positions = []
    while len(positions) < n:
        state = GAME.initial_state()
        for _ in range(stones):
            state = GAME.play(state, mover(GAME, state, rng))
            if GAME.terminal_value(state) is not None:
                break
        else:
            positions.append(state)
    return positions


# -- hand-checked positions -------------------------------------------------------------

def test_a_win_at_once_scores_22_minus_the_winning_stone():
    state = GAME.from_moves([0, 1, 0, 1, 0, 1])     # column 0 makes four with stone 4
    assert solve(state) == 22 - 4 == MAX_SCORE
    assert solve(state, weak=True) == 1


def test_an_unstoppable_double_threat_loses_to_the_opponents_next_stone():
    state = GAME.from_moves([3, 0, 2, 0, 4])        # X threatens columns 1 and 5
    assert solve(state) == -(22 - 4) == MIN_SCORE
    assert solve(state, weak=True) == -1
    assert move_scores(state) == (-18,) * 7
    assert optimal_moves(state) == tuple(range(7))  # all lose equally fast


def test_the_last_empty_cell_of_a_drawn_board_draws():
    state = GAME.from_moves(DRAW[:-1])
    assert solve(state) == 0 and move_scores(state) == (None,) * 4 + (0,) + (None,) * 2
    assert optimal_moves(state) == (4,)


@pytest.mark.parametrize("moves, score", [
    # Pascal Pons's published test positions and scores (his notation, columns 1..7).
    ("2252576253462244111563365343671351441", -1),
    ("7422341735647741166133573473242566", 1),
    ("23163416124767223154467471272416755633", 0),
    ("65214673556155731566316327373221417", -1),
    ("52677675164321472411331752454", 0),
    ("67152117737262713366376314254", 6),
    ("2762751722231276466633475674533", 5),
    ("427566236745127177115664464254", 2),
    ("3575316255751336464276636772271112", -3),
    ("43745416472735", -13),
])
def test_pons_published_scores(moves, score):
    state = pons(moves)
    assert solve(state) == score
    assert solve(state, weak=True) == outcome(score)


# -- exhaustive agreement ---------------------------------------------------------------

@pytest.mark.parametrize("stones, informed", [(28, False), (31, False), (34, False),
                                              (28, True), (31, True), (34, True)])
def test_scores_agree_with_exhaustive_minimax_on_late_positions(stones, informed):
    solver = ConnectFourSolver()
    for state in random_positions(40, stones, seed=stones, informed=informed):
        exact = brute_force_move_scores(state)
        assert solver.move_scores(state) == exact, GAME.render(state)
        assert solver.solve(state) == max(s for s in exact if s is not None)
        assert solver.move_scores(state, weak=True) == tuple(
            None if s is None else outcome(s) for s in exact)
        assert solver.optimal_moves(state) == optimal_moves_of_scores(exact)


def test_a_tiny_table_that_is_emptied_often_gives_the_same_scores():
    small, large = ConnectFourSolver(max_table_entries=8), ConnectFourSolver()
    for state in random_positions(20, 26, seed=1, informed=True):
        assert small.solve(state) == large.solve(state)
    assert len(small._table) <= 8


def test_a_reused_solver_answers_as_fresh_ones_do():
    reused = ConnectFourSolver()
    states = random_positions(12, 24, seed=2, informed=True)
    assert [reused.solve(s) for s in states] == [solve(s) for s in states]
    assert reused.nodes > 0
    reused.reset()
    assert reused.nodes == 0 and not reused._table


# -- symmetry ---------------------------------------------------------------------------

def test_mirror_flips_the_columns():
    moves = [3, 2, 2, 0, 6, 6, 5, 1]
    assert mirror(GAME.from_moves(moves)) == GAME.from_moves([6 - c for c in moves])


def test_a_mirrored_position_has_the_same_score_and_mirrored_moves():
    solver = ConnectFourSolver()
    for stones in (22, 26, 30):
        for state in random_positions(10, stones, seed=stones, informed=True):
            flipped = mirror(state)
            assert solver.solve(flipped) == solver.solve(state)
            assert solver.move_scores(flipped) == solver.move_scores(state)[::-1]
            assert solver.optimal_moves(flipped) == tuple(
                sorted(6 - c for c in solver.optimal_moves(state)))


# -- conversions ------------------------------------------------------------------------

def test_solver_positions_and_states_convert_both_ways():
    for state in random_positions(30, 17, seed=3):
        position = solver_position(state)
        assert position == SolverPosition(state.to_move, state.to_move | state.waiting)
        assert position.mask.bit_count() == 17
        assert state_of_position(position) == state
        assert solver_position(state_of_position(position)) == position
    assert solver_position(GAME.initial_state()) == SolverPosition(0, 0)


def test_pons_bit_layout_is_the_games():
    # Pons's bit 7 * column + row, row 0 at the bottom: the first stone in column 3.
    state = GAME.from_moves([3])
    assert solver_position(state) == SolverPosition(0, 1 << 21)


# -- scores -----------------------------------------------------------------------------

def test_outcome_and_optimal_moves_of_scores():
    assert [outcome(s) for s in (-18, -1, 0, 1, 18)] == [-1, -1, 0, 1, 1]
    assert optimal_moves_of_scores([None, 3, 1, -2, 0, None, 5]) == (1, 2, 6)
    assert optimal_moves_of_scores([0, -1, 0, None, None, None, None]) == (0, 2)
    assert optimal_moves_of_scores([-2, -5, -2, None, -3, -2, -2]) == (0, 2, 5, 6)
    with pytest.raises(ValueError, match="no legal move"):
        optimal_moves_of_scores([None] * 7)


# -- errors -----------------------------------------------------------------------------

def test_finished_and_malformed_positions_are_refused():
    won = GAME.from_moves([0, 6, 1, 6, 2, 6, 3])
    with pytest.raises(ValueError, match="game is over"):
        solve(won)
    with pytest.raises(ValueError, match="game is over"):
        optimal_moves(GAME.from_moves(DRAW))
    with pytest.raises(ValueError, match="floating stone"):
        ConnectFourSolver().move_scores(ConnectFourState(0, 2))
    with pytest.raises(ValueError, match="max_table_entries"):
        ConnectFourSolver(max_table_entries=0)
    with pytest.raises(ValueError, match="max_table_entries"):
        ConnectFourSolver(max_table_entries=True)
