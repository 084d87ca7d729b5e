import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from async_search.problems import ConnectFour, ConnectFourState

# A full board with no four in a row (found once by a seeded random playout).
DRAW = [int(c) for c in "310016216252113255306515632662543304404404"]


@pytest.fixture
def game():
    return ConnectFour()


def test_initial_state_is_empty_with_all_columns_legal(game):
    state = game.initial_state()
    assert state == ConnectFourState(0, 0)
    assert game.legal_actions(state) == tuple(range(7))
    assert game.terminal_value(state) is None and game.winner(state) is None


def test_stones_stack_in_a_column_and_players_alternate(game):
    state = game.from_moves([3, 3, 4])
    assert game.render(state).splitlines()[-2:] == ["...O...", "...XX.."]


@pytest.mark.parametrize("moves, winner", [
    ([0, 6, 1, 6, 2, 6, 3], 1),                     # horizontal, first player
    ([0, 6, 0, 6, 0, 6, 1, 6], -1),                 # vertical, second player
    ([0, 1, 1, 2, 2, 3, 2, 3, 3, 6, 3], 1),         # rising diagonal
    ([6, 5, 5, 4, 4, 3, 4, 3, 3, 0, 3], 1),         # falling diagonal
])
def test_four_in_a_row_ends_the_game_with_a_loss_for_the_player_to_move(game, moves,
                                                                          winner):
    before = game.from_moves(moves[:-1])
    assert game.terminal_value(before) is None
    state = game.play(before, moves[-1])
    assert game.terminal_value(state) == -1.0
    assert game.winner(state) == winner
    assert game.legal_actions(state) == ()


def test_full_board_without_four_is_a_draw(game):
    state = game.from_moves(DRAW)
    assert game.terminal_value(state) == 0.0 and game.winner(state) == 0
    assert game.legal_actions(state) == ()
    assert "." not in game.render(state)


def test_playing_a_full_column_raises(game):
    state = game.from_moves([0] * 6)
    assert 0 not in game.legal_actions(state)
    with pytest.raises(ValueError, match="column 0 is full"):
        game.play(state, 0)


def test_playing_after_a_win_raises(game):
    state = game.from_moves([0, 6, 1, 6, 2, 6, 3])
    with pytest.raises(ValueError, match="game is over"):
        game.play(state, 4)


@pytest.mark.parametrize("action", [-1, 7, 2.0, None, True])
def test_playing_outside_the_columns_raises(game, action):
    with pytest.raises(ValueError, match="an action is a column 0..6"):
        game.play(game.initial_state(), action)


def test_encode_gives_planes_of_player_to_move_then_opponent(game):
    state = game.from_moves([3, 3, 4])  # second player to move
    x = game.encode([game.initial_state(), state])
    assert x.shape == (2, 2, 6, 7) and x.dtype == np.float32
    assert x[0].sum() == 0
    assert x[1, 0].sum() == 1 and x[1, 0, 1, 3] == 1         # own stone on row 1
    assert x[1, 1].sum() == 2 and x[1, 1, 0, 3] == x[1, 1, 0, 4] == 1


@pytest.mark.parametrize("bad, message", [
    ((1, 2, 3), "must be a ConnectFourState"),
    (ConnectFourState(1, 1), "two stones on a cell"),
    (ConnectFourState(0, 1 << 6), "off the board"),
    (ConnectFourState(0, 1 << 1), "floating stone in column 0"),
    (ConnectFourState(1 << 7, 0), "moves alternate"),
    (ConnectFourState(0b1111, 0b1111 << 7), "already has four"),
])
def test_check_state_rejects_impossible_positions(game, bad, message):
    with pytest.raises(ValueError, match=message):
        game.check_state(bad)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=42))
def test_every_position_of_a_legal_game_is_valid(moves):
    game = ConnectFour()
    state = game.initial_state()
    for ply, move in enumerate(moves):
        legal = game.legal_actions(state)
        if not legal:
            break
        state = game.play(state, legal[move % len(legal)])
        game.check_state(state)
        assert (state.to_move | state.waiting).bit_count() == ply + 1


def reference_encode(states):
    """encode as first written (a shift per cell): the faster one must equal it."""
    cells = np.array([[c * 7 + r for c in range(7)] for r in range(6)], np.int64)
    boards = np.array(states, np.int64).reshape(len(states), 2)
    return ((boards[:, :, None, None] >> cells[None, None]) & 1).astype(np.float32)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=42))
def test_the_internal_search_rules_and_encode_agree_with_the_public_ones(moves):
    from async_search.problems.connect_four import _child, _open_columns

    game = ConnectFour()
    state, seen = game.initial_state(), [game.initial_state()]
    for move in moves:
        legal = game.legal_actions(state)
        if not legal:
            break
        assert _open_columns(state) == legal
        action = legal[move % len(legal)]
        child, terminal, actions = _child(state, action)
        state = game.play(state, action)
        assert child == state and type(child) is ConnectFourState and actions is None
        assert terminal == game.terminal_value(state)
        seen.append(state)
    x = game.encode(seen)
    assert x.dtype == np.float32 and x.flags.c_contiguous
    assert np.array_equal(x, reference_encode(seen))


def test_encode_of_no_state_and_of_malformed_states(game):
    assert game.encode([]).shape == (0, 2, 6, 7)
    for bad in ([(1, 2, 3)], [(1,)], [1, 2]):
        with pytest.raises(ValueError, match="cannot reshape"):
            game.encode(bad)


def test_draw_and_win_are_terminal_for_the_internal_rules():
    from async_search.problems.connect_four import _child

    game = ConnectFour()
    assert _child(game.from_moves(DRAW[:-1]), DRAW[-1])[1] == 0.0
    assert _child(game.from_moves([0, 6, 1, 6, 2, 5]), 3)[1] == -1.0
    assert game._mcts_rules() is not None


def test_winner_takes_a_plain_pair_as_the_other_methods_do():
    # It read state.to_move: AttributeError on a tuple.
    game = ConnectFour()
    state = tuple(game.from_moves([0, 1, 0, 1, 0, 1, 0]))
    game.check_state(state)
    assert game.winner(state) == 1 and game.winner(game.from_moves([0, 1, 0, 1, 0, 1, 0])) == 1


@pytest.mark.parametrize("state", [(np.int64(0), np.int64(0)), (False, True), (0, True)])
def test_bitboards_that_are_not_python_ints_are_refused_by_check_state_and_play(state):
    # play raised AttributeError ('numpy.int64' has no bit_length); a bool was taken.
    game = ConnectFour()
    for call in (lambda: game.check_state(state), lambda: game.play(state, 3)):
        with pytest.raises(ValueError, match="a state must be a ConnectFourState"):
            call()
