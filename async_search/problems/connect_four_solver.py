"""A Connect Four solver: exact scores and optimal moves for ``ConnectFour`` states.

The method is the one Pascal Pons describes for his solver (written anew here): negamax
with alpha-beta pruning on a bitboard position, a transposition table of bounds, moves
that lose at once never searched, the other moves tried in order of the winning cells
they make (centre columns first among equals), and the exact score found by a sequence
of null-window searches that halve the range of possible scores.

Scores follow Pons's convention. For the player to move, a position won with the k-th
stone of one's own (counting those already on the board) scores ``22 - k``, a position
lost to the opponent's k-th stone scores ``k - 22``, a draw 0: positive means the side
to move wins, and the earlier the game ends the larger the magnitude (at most 18).

States are the project's ``ConnectFourState(to_move, waiting)``: bit ``7 * column + row``
of each board, row 0 at the bottom, the layout of Pons's bitboards. The solver keeps a
position as ``(current, mask)``: the stones of the player to move and all stones;
``solver_position`` and ``state_of_position`` convert between the two.

Positions of self-play-like games with 14 stones or more solve quickly; the fewer the
stones, the longer, and the empty board is out of reach. ``benchmarks/solver.py``
measures how long.

Example:
    >>> from async_search.problems import ConnectFour
    >>> game = ConnectFour()    # a position of Pons's end-game test set, in his notation
    >>> state = game.from_moves(int(c) - 1 for c in "7422341735647741166133573473242566")
    >>> solve(state), optimal_moves(state)
    (1, (1, 5))
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Sequence, Tuple

from async_search.checks import check_int
from async_search.problems.connect_four import ConnectFour, ConnectFourState


_WIDTH, _HEIGHT = 7, 6
_CELLS = _WIDTH * _HEIGHT
_STRIDE = _HEIGHT + 1
_COLUMN_MASKS = tuple(((1 << _HEIGHT) - 1) << (c * _STRIDE) for c in range(_WIDTH))
_BOTTOM = sum(1 << (c * _STRIDE) for c in range(_WIDTH))
_BOARD = sum(_COLUMN_MASKS)
# Columns from the centre out: among moves of equal promise the central ones go first
# (they take part in more lines of four).
_CENTRE_FIRST = (3, 2, 4, 1, 5, 0, 6)

#: The lowest and highest score a position can have (lost, won at the earliest).
MIN_SCORE = -(_CELLS // 2) + 3
MAX_SCORE = (_CELLS + 1) // 2 - 3

# Transposition-table entries: an upper bound u is kept as u, a lower bound l as
# l + _LOWER (scores lie in [MIN_SCORE, MAX_SCORE], so the two ranges never meet).
_LOWER = 64


class SolverPosition(NamedTuple):
    """A position as the solver holds it (Pons's representation)."""

    current: int
    """Stones of the player to move (bit ``7 * column + row``)."""
    mask: int
    """All stones on the board."""


def solver_position(state: ConnectFourState) -> SolverPosition:
    """The solver's ``(current, mask)`` for a ``ConnectFourState``.

        >>> solver_position(ConnectFourState(to_move=1, waiting=128))
        SolverPosition(current=1, mask=129)
    """
    to_move, waiting = state
    return SolverPosition(to_move, to_move | waiting)


def state_of_position(position: SolverPosition) -> ConnectFourState:
    """The ``ConnectFourState`` of a solver position (``solver_position``'s inverse).

        >>> state_of_position(SolverPosition(current=1, mask=129))
        ConnectFourState(to_move=1, waiting=128)
    """
    current, mask = position
    return ConnectFourState(current, mask ^ current)


def outcome(score: int) -> int:
    """+1 for a won score, 0 a draw, -1 a lost one (for the player to move).

        >>> outcome(18), outcome(0), outcome(-3)
        (1, 0, -1)
    """
    return (score > 0) - (score < 0)


def optimal_moves_of_scores(scores: Sequence[Optional[int]]) -> Tuple[int, ...]:
    """The optimal moves given each move's score (None: illegal), as
    ``ConnectFourSolver.optimal_moves`` defines them: those whose outcome is the best
    outcome, and in a lost position those with the best score. Outcomes alone (weak
    scores) suffice unless the position is lost.

        >>> optimal_moves_of_scores([None, 3, 1, -2, 0, None, 5])
        (1, 2, 6)
        >>> optimal_moves_of_scores([-2, -5, -2, None, -3, -2, -2])
        (0, 2, 5, 6)
    """
    legal = [s for s in scores if s is not None]
    if not legal:
        raise ValueError("a position with no legal move has no optimal move")
    best = max(legal)
    if best < 0:
        return tuple(c for c, s in enumerate(scores) if s == best)
    return tuple(c for c, s in enumerate(scores) if s is not None and
                 outcome(s) == outcome(best))


def _winning_cells(stones: int, mask: int) -> int:
    """The empty cells on which ``stones`` would make four in a row."""
    # Vertical: three stones right below.
    cells = (stones << 1) & (stones << 2) & (stones << 3)
    for shift in (_STRIDE, _STRIDE - 1, _STRIDE + 1):  # horizontal, both diagonals
        pair = (stones << shift) & (stones << 2 * shift)
        cells |= pair & ((stones << 3 * shift) | (stones >> shift))
        pair = (stones >> shift) & (stones >> 2 * shift)
        cells |= pair & ((stones >> 3 * shift) | (stones << shift))
    return cells & (_BOARD ^ mask)


def _check_position(state: ConnectFourState) -> Tuple[int, int, int]:
    """``(current, mask, stones)`` of a valid position that is not over."""
    game = ConnectFour()
    game.check_state(state)
    if game.terminal_value(state) is not None:
        raise ValueError(f"the game is over in state {state!r} (value "
                         f"{game.terminal_value(state)} for the player to move); a "
                         f"solver needs a position with a legal move")
    current, mask = solver_position(state)
    return current, mask, mask.bit_count()


class ConnectFourSolver:
    """Solves Connect Four positions; keeps its transposition table between calls.

    Bounds found for one position help with positions that share its subtrees: a
    position's children (``move_scores``, ``optimal_moves``), or the same position asked
    again. (Positions of different games share little: labelling the 200 shipped
    middle-game positions took as long with one solver as with one each.) The table
    holds at most ``max_table_entries`` positions (about 72 bytes each: 75 MB by
    default) and is emptied when full; ``nodes`` counts the positions searched.

    Args:
        max_table_entries: the size limit of the transposition table (>= 1).

    Example:
        >>> from async_search.problems import ConnectFour
        >>> solver = ConnectFourSolver()
        >>> state = ConnectFour().from_moves(
        ...     int(c) - 1 for c in "3575316255751336464276636772271112")
        >>> solver.solve(state), solver.solve(state, weak=True)
        (-3, -1)
        >>> solver.move_scores(state)
        (-3, -3, -3, -4, -3, None, None)
        >>> solver.optimal_moves(state)     # lost: the moves that lose latest
        (0, 1, 2, 4)
    """

    def __init__(self, *, max_table_entries: int = 1 << 20):
        self.max_table_entries = check_int("max_table_entries", max_table_entries,
                                           minimum=1)
        self.nodes = 0
        """Positions searched so far (calls of the negamax), for measurements."""
        self._table: Dict[int, int] = {}

    def __repr__(self) -> str:
        return f"ConnectFourSolver(max_table_entries={self.max_table_entries})"

    def reset(self) -> None:
        """Forget the transposition table (and the node count)."""
        self._table.clear()
        self.nodes = 0

    # -- public ---------------------------------------------------------------------------

    def solve(self, state: ConnectFourState, *, weak: bool = False) -> int:
        """The score of ``state`` for the player to move (Pons's convention).

        Args:
            state: a position that is not over.
            weak: only the outcome: the result is then 1 (won), 0 (drawn) or -1 (lost),
                found with a narrower, much cheaper search.

        Raises:
            ValueError: for a malformed state or one where the game is over.
        """
        current, mask, stones = _check_position(state)
        return self._solve(current, mask, stones, weak)

    def move_scores(self, state: ConnectFourState, *, weak: bool = False
                    ) -> Tuple[Optional[int], ...]:
        """The score of each column for the player to move: ``-solve(child)``, or the
        winning score for a move that wins at once; None for a full column.

        With ``weak``, outcomes only: 1 (the move wins), 0 (draws), -1 (loses).
        """
        current, mask, stones = _check_position(state)
        return self._move_scores(current, mask, stones, weak)

    def optimal_moves(self, state: ConnectFourState) -> Tuple[int, ...]:
        """The columns that keep the game's value, ascending.

        In a won position, the moves that still win (however slowly); in a drawn one,
        those that keep the draw; in a lost position, where every move keeps the loss,
        the moves that lose latest (the best score), so that a lost position still tells
        good play from bad. (Pons's test sets count any outcome-keeping move correct,
        which makes every move of a lost position correct.)
        """
        current, mask, stones = _check_position(state)
        return self._optimal_moves(current, mask, stones)

    # -- internals ------------------------------------------------------------------------

    def _optimal_moves(self, current: int, mask: int, stones: int) -> Tuple[int, ...]:
        # The outcomes first (weak searches are cheaper); exact scores only for a loss.
        outcomes = self._move_scores(current, mask, stones, True)
        if max(s for s in outcomes if s is not None) >= 0:
            return optimal_moves_of_scores(outcomes)
        return optimal_moves_of_scores(self._move_scores(current, mask, stones, False))

    def _move_scores(self, current: int, mask: int, stones: int, weak: bool
                     ) -> Tuple[Optional[int], ...]:
        scores = []
        win_now = _winning_cells(current, mask)
        for column_mask in _COLUMN_MASKS:
            move = (mask + _BOTTOM) & column_mask
            if not move:
                scores.append(None)
            elif move & win_now:
                scores.append(1 if weak else (_CELLS + 1 - stones) // 2)
            else:
                child_mask = mask | move
                scores.append(-self._solve(current ^ mask, child_mask, stones + 1, weak))
        return tuple(scores)

    def _solve(self, current: int, mask: int, stones: int, weak: bool) -> int:
        if stones >= _CELLS:
            return 0
        if _winning_cells(current, mask) & (mask + _BOTTOM):
            score = (_CELLS + 1 - stones) // 2
            return 1 if weak else score
        low = -((_CELLS - stones) // 2)
        high = (_CELLS + 1 - stones) // 2
        if weak:
            low, high = -1, 1
        negamax = self._negamax_function()
        while low < high:  # null-window searches: is the score above `probe`?
            probe = low + (high - low) // 2
            # Probe near zero first: the sign of the score settles most of the range.
            if probe <= 0 and int(low / 2) < probe:
                probe = int(low / 2)
            elif probe >= 0 and int(high / 2) > probe:
                probe = int(high / 2)
            result = negamax(current, mask, stones, probe, probe + 1)
            if result <= probe:
                high = result
            else:
                low = result
        # A weak search's answers lie outside [-1, 1] when they settle the outcome.
        return outcome(low) if weak else low

    def _negamax_function(self):
        """The alpha-beta search as a closure over local constants (fast in CPython)."""
        table = self._table
        limit = self.max_table_entries
        bottom, board = _BOTTOM, _BOARD
        # (tie-break, column mask): the centre column has the largest tie-break.
        column_order = tuple((7 - rank, _COLUMN_MASKS[c])
                             for rank, c in enumerate(_CENTRE_FIRST))
        cells, lower_flag = _CELLS, _LOWER
        counter = [0]

        def negamax(current: int, mask: int, stones: int, alpha: int, beta: int,
                    threats: int) -> int:
            # Preconditions: the player to move cannot win at once; alpha < beta;
            # threats = the opponent's winning cells, _winning_cells(current ^ mask,
            # mask): the parent computed them to order its moves.
            counter[0] += 1
            possible = (mask + bottom) & board
            forced = possible & threats
            if forced:
                if forced & (forced - 1):  # two cells to block: lost next move
                    return -((cells - stones) // 2)
                possible = forced
            # Never play right below a cell where the opponent would then win.
            moves = possible & ~(threats >> 1)
            if not moves:
                return -((cells - stones) // 2)
            if stones >= cells - 2:  # nobody can win any more
                return 0
            low = -((cells - 2 - stones) // 2)  # we cannot lose before our next stone
            if alpha < low:
                alpha = low
                if alpha >= beta:
                    return alpha
            high = (cells - 1 - stones) // 2  # we cannot win at once
            key = current + mask
            entry = table.get(key)
            if entry is not None:
                if entry >= lower_flag:
                    bound = entry - lower_flag
                    if alpha < bound:
                        alpha = bound
                        if alpha >= beta:
                            return alpha
                elif entry < high:
                    high = entry
            if beta > high:
                beta = high
                if alpha >= beta:
                    return beta
            # Order by the winning cells a move makes (most first, the centre first
            # among equals); they are the child's threats too.
            ordered = []
            free = board ^ mask
            for tie_break, column_mask in column_order:
                move = moves & column_mask
                if move:
                    mine = current | move
                    wins = (mine << 1) & (mine << 2) & (mine << 3)
                    pair = (mine << 7) & (mine << 14)
                    wins |= pair & ((mine << 21) | (mine >> 7))
                    pair = (mine >> 7) & (mine >> 14)
                    wins |= pair & ((mine >> 21) | (mine << 7))
                    pair = (mine << 6) & (mine << 12)
                    wins |= pair & ((mine << 18) | (mine >> 6))
                    pair = (mine >> 6) & (mine >> 12)
                    wins |= pair & ((mine >> 18) | (mine << 6))
                    pair = (mine << 8) & (mine << 16)
                    wins |= pair & ((mine << 24) | (mine >> 8))
                    pair = (mine >> 8) & (mine >> 16)
                    wins |= pair & ((mine >> 24) | (mine << 8))
                    wins &= free ^ move
                    ordered.append((wins.bit_count() * 8 + tie_break, move, wins))
            if len(ordered) > 1:
                ordered.sort(reverse=True)
            opponent = current ^ mask
            for _, move, wins in ordered:
                score = -negamax(opponent, mask | move, stones + 1, -beta, -alpha, wins)
                if score >= beta:
                    if len(table) >= limit:
                        table.clear()
                    table[key] = score + lower_flag
                    return score
                if score > alpha:
                    alpha = score
            if len(table) >= limit:
                table.clear()
            table[key] = alpha
            return alpha

        def counted(current: int, mask: int, stones: int, alpha: int, beta: int) -> int:
            try:
                return negamax(current, mask, stones, alpha, beta,
                               _winning_cells(current ^ mask, mask))
            finally:
                self.nodes += counter[0]
                counter[0] = 0

        return counted


def solve(state: ConnectFourState, *, weak: bool = False) -> int:
    """The score of ``state`` (``ConnectFourSolver().solve``, with a fresh table).

        >>> from async_search.problems import ConnectFour
        >>> solve(ConnectFour().from_moves([0, 1, 0, 1, 0, 1]))   # column 0 wins at once
        18
    """
    return ConnectFourSolver().solve(state, weak=weak)


def move_scores(state: ConnectFourState, *, weak: bool = False
                ) -> Tuple[Optional[int], ...]:
    """The score of each column (``ConnectFourSolver().move_scores``)."""
    return ConnectFourSolver().move_scores(state, weak=weak)


def optimal_moves(state: ConnectFourState) -> Tuple[int, ...]:
    """The columns that keep the game's value (``ConnectFourSolver().optimal_moves``).

        >>> from async_search.problems import ConnectFour
        >>> optimal_moves(ConnectFour().from_moves(
        ...     int(c) - 1 for c in "2252576253462244111563365343671351441"))
        (5,)
    """
    return ConnectFourSolver().optimal_moves(state)
