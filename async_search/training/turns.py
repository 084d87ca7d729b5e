"""Where a Connect Four game turned: the solver's value of each position of a recorded
game, and the moves that changed it.

A move can only keep or lower its mover's game-theoretic value, so every change of
value is a mistake: by the player (a won game let go to a draw or a loss, a draw to a
loss) or by its opponent. Match scores say how often an agent loses; these say where:
in which ply, from which value, and whether the opponent handed the game back.

Solving costs with the stones left: from about 12 stones on, a position takes
milliseconds to a second (``benchmarks/solver.py``); near the empty board, minutes.
Hence ``from_ply``.

Example: 34 plies of a game lost for the first player (the solver's doctest), then 4
more in which the second player hands the win over and the first lets it go again.

    >>> from async_search.training.arena import MatchGame
    >>> moves = tuple(int(c) - 1 for c in "3575316255751336464276636772271112" "4534")
    >>> record = MatchGame(moves=moves, opening_plies=0, player_first=True, outcome=-1.0)
    >>> for turn in turning_points(record, from_ply=34):
    ...     print(turn)
    Turn(ply=35, by_player=False, before=-1, after=1)
    Turn(ply=36, by_player=True, before=1, after=-1)
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from async_search.checks import check_int
from async_search.problems.connect_four import ConnectFour
from async_search.problems.connect_four_solver import ConnectFourSolver, outcome
from async_search.training.arena import MatchGame

_GAME = ConnectFour()


@dataclasses.dataclass(frozen=True)
class Turn:
    """A move that changed the game's value; values are for the record's player."""

    ply: int
    """The move's index in ``MatchGame.moves``."""
    by_player: bool
    """Whether the player made it (a mistake of its own) or its opponent did."""
    before: int
    """The value before the move: +1 won, 0 drawn, -1 lost, under perfect play."""
    after: int
    """The value after it."""


def game_values(record: MatchGame, *, from_ply: int = 0,
                solver: Optional[ConnectFourSolver] = None) -> Tuple[int, ...]:
    """The value for the player of each position of ``record`` from ``from_ply`` on.

    Element ``i`` is the value of the position before ``moves[from_ply + i]``; the last
    is the final position's (the game's outcome); a game over before ``from_ply`` has
    none. Each is +1 (won under perfect play), 0 (drawn) or -1 (lost), found by the
    solver's weak search.

    Args:
        record: a Connect Four game on the standard board (``training.play_games``).
        from_ply: the first position valued (>= 0): the number of moves before it.
        solver: a solver to reuse (its table helps along one game); a new one if None.

    Raises:
        ValueError: for a record that is not a legal, finished Connect Four game, or a
            negative ``from_ply``.

    Example:
        >>> moves = tuple(int(c) - 1 for c in "3575316255751336464276636772271112" "4534")
        >>> record = MatchGame(moves=moves, opening_plies=0, player_first=False,
        ...                     outcome=1.0)
        >>> game_values(record, from_ply=34)      # the second player's view
        (1, 1, -1, 1, 1)
    """
    states = _replay(record)
    from_ply = check_int("from_ply", from_ply, minimum=0)
    solver = ConnectFourSolver() if solver is None else solver
    values = []
    for ply in range(from_ply, len(record.moves) + 1):
        state = states[ply]
        if ply == len(record.moves):
            mover_value = int(_GAME.terminal_value(state))
        else:
            mover_value = outcome(solver.solve(state, weak=True))
        values.append(mover_value if record.player_moved(ply) else -mover_value)
    return tuple(values)


def turning_points(record: MatchGame, *, from_ply: int = 0,
                   solver: Optional[ConnectFourSolver] = None) -> List[Turn]:
    """The moves of ``record`` from ``from_ply`` on that changed the game's value.

    Args and errors: as ``game_values``.

    Example:
        >>> moves = tuple(int(c) - 1 for c in "3575316255751336464276636772271112" "4534")
        >>> record = MatchGame(moves=moves, opening_plies=0, player_first=False,
        ...                     outcome=1.0)
        >>> [(turn.ply, turn.by_player) for turn in turning_points(record, from_ply=34)]
        [(35, True), (36, False)]
    """
    values = game_values(record, from_ply=from_ply, solver=solver)
    return [Turn(ply=from_ply + i, by_player=record.player_moved(from_ply + i),
                 before=before, after=after)
            for i, (before, after) in enumerate(zip(values, values[1:])) if after != before]


def _replay(record: MatchGame) -> List:
    """Every position of ``record``, checked: legal moves, over exactly at the end, and
    the outcome the record says."""
    if not isinstance(record, MatchGame):
        raise ValueError(f"record must be a MatchGame (training.play_games), got "
                         f"{record!r}")
    state = _GAME.initial_state()
    states = [state]
    for ply, move in enumerate(record.moves):
        legal = _GAME.legal_actions(state)
        if not legal:
            raise ValueError(f"the game is over after {ply} plies, but the record has "
                             f"{len(record.moves)} moves")
        if move not in legal:
            raise ValueError(f"move {ply} ({move!r}) is not legal; legal columns are "
                             f"{legal}")
        state = _GAME.play(state, int(move))
        states.append(state)
    if _GAME.legal_actions(state):
        raise ValueError(f"the game is not over after its {len(record.moves)} moves: "
                         f"a record holds a whole game")
    mover_value = float(_GAME.terminal_value(state))
    final = mover_value if record.player_moved(len(record.moves)) else -mover_value
    if final != record.outcome:
        raise ValueError(f"the record's outcome {record.outcome!r} is not the game's: "
                         f"{final} for the player")
    return states
