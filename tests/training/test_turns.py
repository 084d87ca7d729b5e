"""training.turning_points: the solver's value along a recorded game, and its changes."""

import numpy as np
import pytest

from async_search import problems
from async_search.problems.connect_four_solver import ConnectFourSolver, outcome
from async_search.training.arena import MatchGame
from async_search.training.turns import Turn, game_values, turning_points

GAME = problems.ConnectFour()
# 34 plies after which the player to move (the first player) is lost (the solver's
# doctest); "4534" then hands the win over and takes it back.
OPENING = tuple(int(c) - 1 for c in "3575316255751336464276636772271112")
HANDED_BACK = OPENING + tuple(int(c) - 1 for c in "4534")


def record_of(moves, player_first=True, opening_plies=0):
    final = GAME.from_moves(moves)
    mover_value = GAME.terminal_value(final)
    player_moves_last = (len(moves) % 2 == 0) == player_first
    return MatchGame(moves=tuple(moves), opening_plies=opening_plies,
                     player_first=player_first,
                     outcome=mover_value if player_moves_last else -mover_value)


def random_finish(moves, rng):
    state, moves = GAME.from_moves(moves), list(moves)
    while GAME.legal_actions(state):
        legal = GAME.legal_actions(state)
        moves.append(int(legal[int(rng.integers(len(legal)))]))
        state = GAME.play(state, moves[-1])
    return tuple(moves)


def test_a_win_handed_over_and_taken_back_gives_two_turns_seen_from_either_side():
    first = record_of(HANDED_BACK, player_first=True)
    second = record_of(HANDED_BACK, player_first=False)
    assert first.outcome == -1.0 and second.outcome == 1.0
    assert game_values(first, from_ply=34) == (-1, -1, 1, -1, -1)
    assert game_values(second, from_ply=34) == (1, 1, -1, 1, 1)
    assert turning_points(first, from_ply=34) == [
        Turn(ply=35, by_player=False, before=-1, after=1),
        Turn(ply=36, by_player=True, before=1, after=-1)]
    assert turning_points(second, from_ply=34) == [
        Turn(ply=35, by_player=True, before=1, after=-1),
        Turn(ply=36, by_player=False, before=-1, after=1)]


def test_the_last_value_is_the_outcome_and_a_game_over_before_from_ply_has_none():
    record = record_of(HANDED_BACK)
    assert game_values(record, from_ply=len(HANDED_BACK)) == (record.outcome,)
    assert game_values(record, from_ply=36)[-1] == record.outcome
    assert turning_points(record, from_ply=len(HANDED_BACK)) == []
    # A game over before from_ply has no positions to value (a short game of a match).
    assert game_values(record, from_ply=39) == ()
    assert turning_points(record, from_ply=39) == []


@pytest.mark.parametrize("seed", range(6))
def test_turns_are_exactly_the_moves_the_solver_calls_mistakes(seed):
    # Random finishes from 30-odd stones: a move changes the value exactly when its
    # column's weak score is below the position's best, and then only downward for
    # its mover.
    rng = np.random.default_rng(seed)
    moves = random_finish(OPENING[:28] if seed % 2 else OPENING[:31], rng)
    record = record_of(moves, player_first=bool(seed % 3))
    start = 28
    solver = ConnectFourSolver()
    turns = {turn.ply: turn for turn in turning_points(record, from_ply=start)}
    for ply in range(start, len(moves)):
        state = GAME.from_moves(moves[:ply])
        scores = solver.move_scores(state, weak=True)
        best = max(outcome(s) for s in scores if s is not None)
        mistake = outcome(scores[moves[ply]]) < best
        assert (ply in turns) == mistake, ply
        if mistake:
            turn = turns[ply]
            assert turn.by_player == record.player_moved(ply)
            # Down for its mover: for the player if it moved, else up for the player.
            assert (turn.after < turn.before) == turn.by_player


def test_a_solver_passed_in_is_used():
    solver = ConnectFourSolver()
    game_values(record_of(HANDED_BACK), from_ply=34, solver=solver)
    assert solver.nodes > 0


@pytest.mark.parametrize("record, from_ply, match", [
    ("moves", 0, "must be a MatchGame"),
    (MatchGame(moves=OPENING, opening_plies=0, player_first=True, outcome=0.0), 0,
     "not over"),
    (MatchGame(moves=HANDED_BACK + (0,), opening_plies=0, player_first=True,
               outcome=-1.0), 0, "over after 38 plies"),
    (MatchGame(moves=(7,), opening_plies=0, player_first=True, outcome=0.0), 0,
     "not legal"),
    (MatchGame(moves=HANDED_BACK, opening_plies=0, player_first=True, outcome=1.0), 34,
     "outcome"),
    (record_of(HANDED_BACK), -1, "from_ply"),
    (record_of(HANDED_BACK), 34.0, "from_ply"),
])
def test_bad_records_and_plies_are_refused(record, from_ply, match):
    with pytest.raises(ValueError, match=match):
        game_values(record, from_ply=from_ply)
    with pytest.raises(ValueError, match=match):
        turning_points(record, from_ply=from_ply)
