"""Connect Four on bitboards: a two-player game for MCTS."""

from __future__ import annotations

import functools
import itertools
from typing import Callable, Iterable, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from async_search.base import TensorSpec
from async_search.checks import is_int


_ROWS, _COLUMNS = 6, 7
_STRIDE = _ROWS + 1  # one empty sentinel bit on top of each column keeps shifts apart
_COLUMN_BITS = (1 << _ROWS) - 1
_BOARD = sum(_COLUMN_BITS << (c * _STRIDE) for c in range(_COLUMNS))
# Bit of (row, column), rows counted from the bottom: the layout of encode's planes.
_CELL_BITS = np.array([[c * _STRIDE + r for c in range(_COLUMNS)] for r in range(_ROWS)],
                      np.int64)
# encode's gather: bit i of a state's two little-endian int64 boards, unpacked into 128
# bits per state, is bit i (to move) or 64 + i (waiting); _BYTE_BITS unpacks a byte.
_PLANE_BITS = np.concatenate([_CELL_BITS.ravel(), 64 + _CELL_BITS.ravel()])
_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1,
                           bitorder="little").astype(np.float32)
_TOP_BITS = tuple(1 << (c * _STRIDE + _ROWS - 1) for c in range(_COLUMNS))
_TOP_ROW = sum(_TOP_BITS)
_BOTTOM = tuple(1 << (c * _STRIDE) for c in range(_COLUMNS))
_COLUMN = tuple(_COLUMN_BITS << (c * _STRIDE) for c in range(_COLUMNS))
# The legal columns of a position that is not over, keyed by its stones in the top row.
# (Column c is full when bit c of m is set.)
_OPEN_COLUMNS = {sum(b for c, b in enumerate(_TOP_BITS) if m >> c & 1):
                 tuple(c for c in range(_COLUMNS) if not m >> c & 1)
                 for m in range(1 << _COLUMNS)}


class ConnectFourState(NamedTuple):
    """A position: the stones of each player as bitboards (bit ``7 * column + row``)."""

    to_move: int
    """Stones of the player to move."""
    waiting: int
    """Stones of the player who moved last."""


# ConnectFourState(to_move, waiting) without the NamedTuple's Python-level __new__.
_new_state = functools.partial(tuple.__new__, ConnectFourState)


def _has_four(stones: int) -> bool:
    # Vertical (1), horizontal (7) and both diagonals (6, 8): a run of four in a
    # direction leaves a bit set after two shift-and-mask steps.
    for shift in (1, _STRIDE, _STRIDE - 1, _STRIDE + 1):
        pairs = stones & (stones >> shift)
        if pairs & (pairs >> (2 * shift)):
            return True
    return False


def _child(state: ConnectFourState, action: int
           ) -> Tuple[ConnectFourState, Optional[float], None]:
    """``play`` for search, unchecked (``action`` a legal column of a position that is
    not over), with the child's terminal value (as ``terminal_value``): the rules in
    the form ``search.tree`` asks of ``ConnectFour._mcts_rules``. The third item (the
    child's legal actions) is None: ``_open_columns`` gives them when they are needed.

        >>> _child(ConnectFourState(0, 0), 3)
        (ConnectFourState(to_move=0, waiting=2097152), None, None)
    """
    mine, theirs = state
    # The lowest empty cell of a column: adding its bottom bit carries through the stones.
    mover = mine | (((mine | theirs) + _BOTTOM[action]) & _COLUMN[action])
    child = _new_state((theirs, mover))
    # _has_four(mover), unrolled: a move can only make four for the player who made it.
    pairs = mover & (mover >> 1)
    if pairs & (pairs >> 2):
        return child, -1.0, None
    pairs = mover & (mover >> _STRIDE)
    if pairs & (pairs >> (2 * _STRIDE)):
        return child, -1.0, None
    pairs = mover & (mover >> (_STRIDE - 1))
    if pairs & (pairs >> (2 * _STRIDE - 2)):
        return child, -1.0, None
    pairs = mover & (mover >> (_STRIDE + 1))
    if pairs & (pairs >> (2 * _STRIDE + 2)):
        return child, -1.0, None
    if mover | theirs == _BOARD:
        return child, 0.0, None
    return child, None, None


def _open_columns(state: ConnectFourState) -> Tuple[int, ...]:
    """``legal_actions`` of a position that is not over (unchecked): one table look-up.

        >>> _open_columns(ConnectFourState(0, 0))
        (0, 1, 2, 3, 4, 5, 6)
    """
    return _OPEN_COLUMNS[(state[0] | state[1]) & _TOP_ROW]


class ConnectFour:
    """Connect Four on a 6 x 7 board; actions are the columns 0..6.

    States are ``ConnectFourState(to_move, waiting)`` bitboard pairs: hashable, compact,
    and cheap to play. Values are from the point of view of the player to move; a state
    in which the player who just moved has four in a row is terminal with value -1, and a
    full board without four is a draw (0). ``encode`` gives float32 planes
    ``[2, 6, 7]``: the stones of the player to move, then the opponent's, rows counted
    from the bottom.

    Example:
        >>> game = ConnectFour()
        >>> s = game.play(game.initial_state(), 3)
        >>> game.legal_actions(s)
        (0, 1, 2, 3, 4, 5, 6)
        >>> game.encode([s]).shape
        (1, 2, 6, 7)
    """

    num_actions = _COLUMNS
    rows = _ROWS
    columns = _COLUMNS

    def __init__(self) -> None:
        self.input_spec = TensorSpec((2, _ROWS, _COLUMNS), np.float32)

    def __repr__(self) -> str:
        return "ConnectFour()"

    def initial_state(self) -> ConnectFourState:
        """The empty board, first player to move."""
        return ConnectFourState(0, 0)

    def from_moves(self, columns: Iterable[int]) -> ConnectFourState:
        """The state after playing ``columns`` in turn from the empty board."""
        state = self.initial_state()
        for column in columns:
            state = self.play(state, column)
        return state

    def check_state(self, state: ConnectFourState) -> None:
        """Raise ValueError unless ``state`` is a well-formed position.

        Checks the type, that stones lie on the board, fall to the bottom of their column
        and alternate in number, and that the player to move has not already won.
        """
        if not (isinstance(state, tuple) and len(state) == 2
                and all(type(b) is int and b >= 0 for b in state)):  # not a bool
            raise ValueError(f"{self!r}: a state must be a ConnectFourState of two "
                             f"bitboards (use game.initial_state() or game.from_moves), "
                             f"got {state!r}")
        mine, theirs = state
        both = mine | theirs
        if mine & theirs or both & ~_BOARD:
            raise ValueError(f"{self!r}: state {state!r} puts two stones on a cell or a "
                             f"stone off the board")
        for c in range(_COLUMNS):
            column = (both >> (c * _STRIDE)) & _COLUMN_BITS
            if column & (column + 1):
                raise ValueError(f"{self!r}: state {state!r} has a floating stone in "
                                 f"column {c}; stones fall to the bottom")
        if theirs.bit_count() - mine.bit_count() not in (0, 1) or (
                mine.bit_count() + theirs.bit_count()) % 2 != (
                theirs.bit_count() - mine.bit_count()):
            raise ValueError(f"{self!r}: state {state!r} has {mine.bit_count()} stones "
                             f"for the player to move and {theirs.bit_count()} for the "
                             f"other; moves alternate, first player first")
        if _has_four(mine):
            raise ValueError(f"{self!r}: in state {state!r} the player to move already "
                             f"has four in a row; the game ended before")

    # -- rules ----------------------------------------------------------------------------

    def legal_actions(self, state: ConnectFourState) -> Tuple[int, ...]:
        """The columns that are not full, ascending; empty once the game is over."""
        mine, theirs = state
        return () if _has_four(theirs) else _OPEN_COLUMNS[(mine | theirs) & _TOP_ROW]

    def play(self, state: ConnectFourState, action: int) -> ConnectFourState:
        """Drop a stone of the player to move into column ``action``.

        Raises:
            ValueError: if ``action`` is not a column, the column is full, or the game is
                over.
        """
        mine, theirs = state
        if type(mine) is not int or type(theirs) is not int:
            self.check_state(state)  # NumPy ints, bools...: the error that says so
        if not is_int(action) or not 0 <= action < _COLUMNS:
            raise ValueError(f"{self!r}: an action is a column 0..{_COLUMNS - 1}, got "
                             f"{action!r}")
        if _has_four(theirs):
            raise ValueError(f"{self!r}: cannot play column {action}, the game is over "
                             f"(the last player won)")
        shift = int(action) * _STRIDE
        height = (((mine | theirs) >> shift) & _COLUMN_BITS).bit_length()
        if height == _ROWS:
            raise ValueError(f"{self!r}: column {action} is full; legal columns are "
                             f"{self.legal_actions(state)}")
        return ConnectFourState(theirs, mine | (1 << (shift + height)))

    def terminal_value(self, state: ConnectFourState) -> float | None:
        """-1.0 if the player who just moved won, 0.0 for a full board, else None."""
        mine, theirs = state
        if _has_four(theirs):
            return -1.0
        if (mine | theirs) == _BOARD:
            return 0.0
        return None

    def is_terminal(self, state: ConnectFourState) -> bool:
        """Whether the game is over."""
        return self.terminal_value(state) is not None

    def winner(self, state: ConnectFourState) -> int | None:
        """+1 if the first player won, -1 the second, 0 a draw, None while playing."""
        value = self.terminal_value(state)
        if value is None:
            return None
        if value == 0.0:
            return 0
        mine, theirs = state  # a plain (to_move, waiting) pair too
        first_moved_last = (mine | theirs).bit_count() % 2 == 1
        return 1 if first_moved_last else -1

    # -- network input --------------------------------------------------------------------

    def encode(self, states: Sequence[ConnectFourState]) -> np.ndarray:
        """float32 ``[len(states), 2, 6, 7]``: player-to-move stones, then opponent's."""
        n = len(states)
        try:
            pairs = sum(map(len, states)) == 2 * n
        except TypeError:
            pairs = False
        if pairs:  # pairs of bitboards, as they should be: the fast way
            boards = np.fromiter(itertools.chain.from_iterable(states), "<i8", 2 * n)
        else:  # the error message of a malformed state, as before
            boards = np.array(states, "<i8").reshape(n, 2)
        # All 128 bits of each state (two little-endian int64 boards, a byte at a time,
        # as float32), then the cells.
        bits = _BYTE_BITS.take(boards.view(np.uint8), axis=0).reshape(n, 128)
        return bits.take(_PLANE_BITS, axis=1).reshape(n, 2, _ROWS, _COLUMNS)

    def _mcts_rules(self) -> Optional[Tuple[Callable, Callable]]:
        """Internal, for ``search.tree``: ``(child, open_columns)``, unchecked forms of
        ``play`` (with the child's terminal value) and ``legal_actions`` for states that
        the search made itself, or None when a subclass changed the rules."""
        cls = type(self)
        if (cls.play is not ConnectFour.play or cls.legal_actions is not
                ConnectFour.legal_actions or cls.terminal_value is not
                ConnectFour.terminal_value):
            return None
        return _child, _open_columns

    def render(self, state: ConnectFourState) -> str:
        """The board as text, top row first: X the first player, O the second."""
        mine, theirs = state
        first, second = (mine, theirs) if (mine | theirs).bit_count() % 2 == 0 else (
            theirs, mine)
        lines = []
        for r in reversed(range(_ROWS)):
            row = ""
            for c in range(_COLUMNS):
                bit = 1 << (c * _STRIDE + r)
                row += "X" if first & bit else "O" if second & bit else "."
            lines.append(row)
        return "\n".join(lines)
