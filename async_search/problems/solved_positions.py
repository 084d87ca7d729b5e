"""Solver-labelled Connect Four test positions: generated, saved, loaded.

Positions come from two kinds of games, each played from the empty board to a drawn
number of stones:

- ``"random"``: every move uniformly random among the legal columns;
- ``"selfplay"``: a cheap stand-in for an agent's own games (``informed_move``): take a
  win, else block the opponent's win, else avoid a move that lets the opponent win at
  once, else a random column weighted toward the centre. It needs no network, so the
  shipped positions never depend on a checkpoint that later training replaces.

Each position is labelled by ``ConnectFourSolver``: its exact score (Pons's convention),
the score of every move, and the optimal moves (those that keep the outcome; in a lost
position those that lose latest). Positions where every legal move is optimal test
nothing and are skipped.

The package ships two sets (``connect_four_positions``), written by
``write_connect_four_positions`` (``python benchmarks/solver.py --write_positions``):

- ``"end"``: end-game positions, 28 to 37 stones on the board (Pons's end-game sets
  start at 28);
- ``"middle"``: middle-game positions, 14 to 27 stones (Pons's middle-game range).

Each has 200 positions, half from random games and half from self-play-like games.
Generation is deterministic given the seed.

Example:
    >>> positions = connect_four_positions("end")
    >>> len(positions), positions[100].source
    (200, 'selfplay')
    >>> p = positions[100]
    >>> print(ConnectFour().render(p.state))
    .OXOO..
    .XOOX.X
    .OXXX.O
    .XXOO.X
    .OOXXOX
    XOOXOOX
    >>> p.score, p.move_scores, p.optimal_moves    # a draw, if X avoids column 0
    (0, (-5, None, None, None, None, 0, 0), (5, 6))
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from async_search.checks import check_int
from async_search.problems.connect_four import ConnectFour, ConnectFourState
from async_search.problems.connect_four_solver import (ConnectFourSolver,
                                                       optimal_moves_of_scores, outcome)


_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                     "connect_four_positions.json")
_FORMAT = "async_search.connect_four_positions/1"
# Columns weighted toward the centre (they take part in more lines of four).
_CENTRE_WEIGHTS = np.array([1.0, 2.0, 3.0, 4.0, 3.0, 2.0, 1.0])

# generate_positions gives up after this many games in a row without a new position.
_MAX_MISSES = 10_000

#: The shipped sets: name -> (fewest stones, most stones) on the board.
STAGES: Dict[str, Tuple[int, int]] = {"end": (28, 37), "middle": (14, 27)}


@dataclasses.dataclass(frozen=True)
class SolvedPosition:
    """A Connect Four position with its solver labels."""

    moves: Tuple[int, ...]
    """The columns (0..6) played from the empty board to reach it."""
    state: ConnectFourState
    """The position (``ConnectFour().from_moves(moves)``)."""
    score: int
    """Its exact score for the player to move (Pons's convention: positive wins)."""
    move_scores: Tuple[Optional[int], ...]
    """The exact score of each column for the player to move; None for a full column."""
    optimal_moves: Tuple[int, ...]
    """The columns that keep the game's value (``ConnectFourSolver.optimal_moves``)."""
    source: str
    """The kind of game it comes from: ``"random"`` or ``"selfplay"``."""
    stage: str
    """The set it belongs to (``"end"``, ``"middle"``), or ``""`` if in none."""

    @property
    def outcome(self) -> int:
        """+1 won, 0 drawn, -1 lost, for the player to move."""
        return outcome(self.score)


def pons_moves(columns: Sequence[int]) -> str:
    """Columns 0..6 in Pascal Pons's notation: a string of digits 1..7.

        >>> pons_moves([3, 3, 0])
        '441'
    """
    return "".join(str(int(c) + 1) for c in columns)


def from_pons_moves(moves: str) -> Tuple[int, ...]:
    """Pons's notation (digits 1..7) as columns 0..6; ValueError for another character.

        >>> from_pons_moves("441")
        (3, 3, 0)
    """
    if not isinstance(moves, str) or any(c not in "1234567" for c in moves):
        raise ValueError(f"a move sequence in Pons's notation is a string of digits 1..7, "
                         f"got {moves!r}")
    return tuple(int(c) - 1 for c in moves)


def random_move(game: ConnectFour, state: ConnectFourState,
                rng: np.random.Generator) -> int:
    """A uniformly random legal column."""
    legal = game.legal_actions(state)
    return int(legal[int(rng.integers(len(legal)))])


def informed_move(game: ConnectFour, state: ConnectFourState,
                  rng: np.random.Generator) -> int:
    """A cheap, plausible move: a win if there is one; else a random one, weighted
    toward the centre (1:2:3:4:3:2:1), among the moves that block the opponent's wins,
    or if there are none among those that do not let the opponent win at once (among
    all moves if every one does)."""
    legal = game.legal_actions(state)
    children = [game.play(state, c) for c in legal]
    for column, child in zip(legal, children):
        if game.terminal_value(child) == -1.0:
            return int(column)
    # The opponent's immediate wins, were it their move now.
    swapped = ConnectFourState(state.waiting, state.to_move)
    blocks = [c for c in legal if game.terminal_value(game.play(swapped, c)) == -1.0]
    candidates = blocks or [c for c, child in zip(legal, children)
                            if not any(game.terminal_value(game.play(child, d)) == -1.0
                                       for d in game.legal_actions(child))] or list(legal)
    weights = _CENTRE_WEIGHTS[candidates]
    return int(candidates[int(rng.choice(len(candidates), p=weights / weights.sum()))])


#: The movers of ``generate_positions``'s sources, by name.
MOVERS: Dict[str, Callable[[ConnectFour, ConnectFourState, np.random.Generator], int]] = {
    "random": random_move, "selfplay": informed_move}


def _play_to(game: ConnectFour, stones: int, mover, rng: np.random.Generator
             ) -> Optional[Tuple[int, ...]]:
    """The moves of a game played to ``stones`` stones, or None if it ended before."""
    state, moves = game.initial_state(), []
    for _ in range(stones):
        column = mover(game, state, rng)
        state = game.play(state, column)
        moves.append(column)
        if game.terminal_value(state) is not None:
            return None
    return tuple(moves)


def generate_positions(num_positions: int, *, stones: Tuple[int, int], source: str,
                       seed: int, stage: str = "", skip_trivial: bool = True,
                       solver: Optional[ConnectFourSolver] = None
                       ) -> List[SolvedPosition]:
    """Labelled positions from games of one kind, each position from its own game.

    The number of stones of each position is drawn uniformly from ``stones``, and games
    are played until one lasts that long (one that ends before is dropped). A position
    seen before (or its mirror image) is dropped too, and, with ``skip_trivial``, one
    where every legal move is optimal. After 10,000 games in a row without a new
    position it gives up (ValueError): the range holds no more, or games seldom last
    that long.

    Args:
        num_positions: how many positions (>= 0).
        stones: the fewest and most stones on the board, in [0, 41].
        source: the kind of game, a key of ``MOVERS`` (``"random"``, ``"selfplay"``).
        seed: seeds the games; the same arguments give the same positions.
        stage: the label put in each position's ``stage``.
        skip_trivial: drop positions in which every legal move is optimal.
        solver: the solver to label with (a fresh one by default).

    Raises:
        ValueError: for a bad argument, or when the range holds too few positions.

    Example:
        >>> ps = generate_positions(2, stones=(30, 32), source="random", seed=0)
        >>> [len(p.moves) for p in ps]
        [32, 30]
    """
    num_positions = check_int("num_positions", num_positions, minimum=0)
    seed = check_int("seed", seed, minimum=0)
    if not (isinstance(stones, tuple) and len(stones) == 2):
        raise ValueError(f"stones must be a pair (fewest, most), got {stones!r}")
    low = check_int("stones[0]", stones[0], minimum=0, maximum=41)
    high = check_int("stones[1]", stones[1], minimum=low, maximum=41)
    if not isinstance(source, str) or source not in MOVERS:  # a list is unhashable
        raise ValueError(f"source must be one of {sorted(MOVERS)}, got {source!r}")
    mover = MOVERS[source]
    solver = ConnectFourSolver() if solver is None else solver
    game = ConnectFour()
    rng = np.random.default_rng(seed)
    seen = set()
    positions: List[SolvedPosition] = []
    misses = 0  # games in a row that gave no new position
    while len(positions) < num_positions:
        # Replay until a game lasts long enough: dropping the short ones instead would
        # favour the fewest stones, since random games seldom last.
        target = int(rng.integers(low, high + 1))
        moves = None
        while moves is None:
            if misses >= _MAX_MISSES:
                dropped = "ended early, repeated a position" + (
                    " or left no wrong move" if skip_trivial else "")
                raise ValueError(
                    f"found only {len(positions)} of {num_positions} positions with {low} "
                    f"to {high} stones from {source!r} games: {_MAX_MISSES} games in a row "
                    f"{dropped}; ask for fewer positions or a wider range of stones")
            misses += 1
            moves = _play_to(game, target, mover, rng)
        state = game.from_moves(moves)
        mirrored = game.from_moves([6 - c for c in moves])
        if state in seen or mirrored in seen:
            continue
        seen.add(state)
        if skip_trivial and len(game.legal_actions(state)) == 1:
            continue  # a single move: nothing to get wrong, and nothing to solve
        scores = solver.move_scores(state)
        optimal = optimal_moves_of_scores(scores)
        if skip_trivial and len(optimal) == len(game.legal_actions(state)):
            continue
        misses = 0
        positions.append(SolvedPosition(
            moves=moves, state=state, score=max(s for s in scores if s is not None),
            move_scores=scores, optimal_moves=optimal, source=source, stage=stage))
    return positions


def _record(position: SolvedPosition) -> str:
    return json.dumps({"moves": "".join(map(str, position.moves)),
                       "source": position.source, "score": position.score,
                       "move_scores": list(position.move_scores),
                       "optimal": list(position.optimal_moves)})


def write_connect_four_positions(path: str = _PATH, *, seed: int = 0,
                                 per_source: int = 100) -> str:
    """Generates the shipped sets (``STAGES``, ``per_source`` positions from each kind of
    game) and writes them to ``path`` (the package's data file by default), one
    position a line; returns the path. Takes a few minutes on one core.

    Raises:
        FileWriteError: if the file cannot be written.
    """
    from async_search.files import write_file

    seed = check_int("seed", seed, minimum=0)
    per_source = check_int("per_source", per_source, minimum=0)
    solver = ConnectFourSolver()
    lines = ["{", f' "format": {json.dumps(_FORMAT)},',
             ' "about": "Connect Four positions labelled by async_search\'s solver. moves: '
             'the columns (0..6) played from the empty board, one digit each; score: the '
             'exact score for the player to move (Pascal Pons\'s convention: positive '
             'wins, 22 minus the winner\'s stones at the win); move_scores: each '
             'column\'s score (null: full); optimal: the columns that keep the outcome '
             '(in a lost position, those that lose latest). Written by '
             'write_connect_four_positions (python benchmarks/solver.py '
             '--write_positions).",', ' "sets": {']
    for i, (stage, stones) in enumerate(STAGES.items()):
        lines.append(f'  {json.dumps(stage)}: {{"stones": {list(stones)}, "seed": {seed}, '
                     f'"per_source": {per_source}, "skip_trivial": true, "positions": [')
        records = []
        for j, source in enumerate(sorted(MOVERS)):
            records += [_record(p) for p in generate_positions(
                per_source, stones=stones, source=source, seed=seed * 100 + 10 * i + j,
                stage=stage, solver=solver)]
        lines.append(",\n".join("   " + r for r in records))
        lines.append("  ]}" + ("," if i < len(STAGES) - 1 else ""))
    lines += [" }", "}", ""]
    return write_file(path, "\n".join(lines))


def connect_four_positions(stage: str, *, source: Optional[str] = None
                           ) -> List[SolvedPosition]:
    """A shipped set of solver-labelled positions (no solving: the labels are stored).

    Args:
        stage: ``"end"`` (28-37 stones) or ``"middle"`` (14-27 stones).
        source: only positions from ``"random"`` or ``"selfplay"`` games; None: both.

    Raises:
        ValueError: for an unknown stage or source.
    """
    if not isinstance(stage, str) or stage not in STAGES:  # a list is unhashable
        raise ValueError(f"stage must be one of {sorted(STAGES)}, got {stage!r}")
    if source is not None and (not isinstance(source, str) or source not in MOVERS):
        raise ValueError(f"source must be None or one of {sorted(MOVERS)}, got "
                         f"{source!r}")
    with open(_PATH) as f:
        data = json.load(f)
    game = ConnectFour()
    positions = []
    for record in data["sets"][stage]["positions"]:
        if source is not None and record["source"] != source:
            continue
        moves = tuple(int(c) for c in record["moves"])
        positions.append(SolvedPosition(
            moves=moves, state=game.from_moves(moves), score=int(record["score"]),
            move_scores=tuple(record["move_scores"]),
            optimal_moves=tuple(record["optimal"]), source=record["source"],
            stage=stage))
    return positions

