"""The arena: matches between players, and AlphaZero's gate.

``play_match`` plays games concurrently, so that the network players' requests batch
through one serving coroutine, and returns a ``MatchResult``; ``play_games`` plays the
same games and returns each one's moves (a ``MatchGame``); ``gate`` applies
AlphaZero's arena rule to a match.

Example:
    >>> import asyncio
    >>> from async_search.problems import ConnectFour
    >>> from async_search.training.players import OnePlyPlayer, RandomPlayer
    >>> result = asyncio.run(play_match(ConnectFour(), OnePlyPlayer(), RandomPlayer(),
    ...                                 num_games=4, seed=0))
    >>> result.games
    4
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from async_search.checks import check_float, check_int, is_async, is_int, plain_fields
from async_search.problems.base import Game, State
from async_search.search.base import GAME_METHODS, check_protocol
from async_search.training.players import Player
from async_search.training.ratings import MatchResult


@dataclasses.dataclass(frozen=True)
class MatchGame:
    """One game of a match, seen from the reported player's side.

    Example:
        >>> from async_search.problems import ConnectFour
        >>> from async_search.training.players import OnePlyPlayer, RandomPlayer
        >>> [record] = asyncio.run(play_games(ConnectFour(), OnePlyPlayer(),
        ...                                   RandomPlayer(), num_games=1, seed=0))
        >>> record.player_first, record.outcome, len(record.moves) >= 7
        (True, 1.0, True)
    """

    moves: Tuple[int, ...]
    """Every action of the game in order, the random opening's included."""
    opening_plies: int
    """How many of ``moves`` were the random opening (``opening_moves``)."""
    player_first: bool
    """Whether the player has the first mover's colour: it plays the even plies."""
    outcome: float
    """+1 the player won, 0 a draw, -1 the player lost."""

    def __post_init__(self):
        plain_fields(self)
        if not isinstance(self.moves, tuple) or not all(is_int(m) for m in self.moves):
            raise ValueError(f"moves must be a tuple of integer actions, got "
                             f"{self.moves!r}")
        check_int("opening_plies", self.opening_plies, minimum=0,
                  maximum=len(self.moves))
        if not isinstance(self.player_first, bool):
            raise ValueError(f"player_first must be a bool, got {self.player_first!r}")
        if isinstance(self.outcome, bool) or self.outcome not in (-1, 0, 1):
            raise ValueError(f"outcome must be +1, 0 or -1, got {self.outcome!r}")

    def player_moved(self, ply: int) -> bool:
        """Whether ``moves[ply]`` was the player's move (or the opening's, on its side)."""
        return (ply % 2 == 0) == self.player_first


def _opening(game: Game, plies: int, rng: np.random.Generator
             ) -> Tuple[State, List[int]]:
    state, moves = game.initial_state(), []
    for _ in range(plies):
        legal = game.legal_actions(state)
        if not legal:
            break
        moves.append(int(legal[int(rng.integers(len(legal)))]))
        state = game.play(state, moves[-1])
    return state, moves


async def _play_game(game: Game, player: Player, opponent: Player, k: int, seed: int,
                     opening_moves: int) -> MatchGame:
    """Game ``k``, recorded for ``player``."""
    rng = np.random.default_rng([seed, k])
    state, moves = _opening(game, opening_moves,
                            np.random.default_rng([seed, k // 2, 999]))
    opening_plies = len(moves)
    # player moves on even plies in even games (it moves first), on odd plies otherwise.
    sides = (player, opponent) if k % 2 == 0 else (opponent, player)
    while True:
        legal = game.legal_actions(state)
        if not legal:
            break
        mover = sides[len(moves) % 2]
        action = await mover.choose(game, state, rng)
        if action not in legal:
            raise ValueError(f"player {mover.name!r} chose action {action!r} in game {k}, "
                             f"which is not legal; legal actions are {legal}")
        state = game.play(state, action)
        moves.append(int(action))
    value = float(game.terminal_value(state))  # for the side to move at the end
    player_side = k % 2  # compare sides, not objects: player may be opponent
    return MatchGame(moves=tuple(moves), opening_plies=opening_plies,
                     player_first=player_side == 0,
                     outcome=value if len(moves) % 2 == player_side else -value)


async def play_match(game: Game, player: Player, opponent: Player, *, num_games: int,
                     seed: int = 0, opening_moves: int = 0,
                     on_game: Optional[Callable[[], None]] = None) -> MatchResult:
    """Play ``num_games`` games of ``player`` against ``opponent``, all concurrently.

    Game ``k`` has ``player`` move first when ``k`` is even and ``opponent`` when it is
    odd; both players draw from ``np.random.default_rng([seed, k])``. With
    ``opening_moves > 0`` the games ``2j`` and ``2j + 1`` start from the same random
    opening of that many plies (drawn from ``np.random.default_rng([seed, j, 999])``,
    shorter if the game ends), each side then taken over by the player whose colour it
    is, so that two deterministic players still play different games. The games run
    under one ``asyncio.gather``, so network players' requests meet in a serving
    coroutine and batch.

    Args:
        game: the game (``Game``).
        player: the player whose results are reported.
        opponent: the other player (may be the same object as ``player``).
        num_games: games to play (>= 1).
        seed: seeds the games (>= 0); the same seed replays the same match.
        opening_moves: random plies played before the players take over (>= 0).
        on_game: called with no arguments after each finished game (a progress bar).

    Returns:
        A ``MatchResult`` from ``player``'s point of view.

    Raises:
        ValueError: for a bad argument, or if a player returns an illegal action.

    Example:
        >>> from async_search.problems import ConnectFour
        >>> from async_search.training.players import RandomPlayer, UCTPlayer
        >>> r = asyncio.run(play_match(ConnectFour(), UCTPlayer(50), RandomPlayer(),
        ...                            num_games=2, seed=1))
        >>> r.games
        2
    """
    return tally(await play_games(game, player, opponent, num_games=num_games, seed=seed,
                                  opening_moves=opening_moves, on_game=on_game))


def tally(records: Sequence[MatchGame]) -> MatchResult:
    """The ``MatchResult`` of recorded games (at least one), from their player's view.

    Example:
        >>> tally([MatchGame((0, 1), 0, True, 1.0), MatchGame((0, 1), 0, False, 0.0)])
        MatchResult(wins=1, draws=1, losses=0)
    """
    if not all(isinstance(record, MatchGame) for record in records):
        raise ValueError(f"tally takes MatchGame records (what play_games returns), got "
                         f"{[type(r).__name__ for r in records][:5]}")
    outcomes = [record.outcome for record in records]
    return MatchResult(wins=sum(o > 0 for o in outcomes),
                       draws=sum(o == 0 for o in outcomes),
                       losses=sum(o < 0 for o in outcomes))


async def play_games(game: Game, player: Player, opponent: Player, *, num_games: int,
                     seed: int = 0, opening_moves: int = 0,
                     on_game: Optional[Callable[[], None]] = None) -> List[MatchGame]:
    """``play_match``'s games, each returned with its moves: a ``MatchGame`` per game.

    The same arguments play the same games as ``play_match`` (which sums these
    records), so a match's result can be looked into move by move, e.g. by
    ``training.turns.turning_points``.

    Returns:
        The records of games ``0 .. num_games - 1``, in that order.

    Raises:
        ValueError: for a bad argument, or if a player returns an illegal action.
        Whatever a player raises ends the match: the other games are cancelled, as
        they are when the caller cancels it.

    Example:
        >>> from async_search.problems import ConnectFour
        >>> from async_search.training.players import RandomPlayer
        >>> records = asyncio.run(play_games(ConnectFour(), RandomPlayer(),
        ...                                  RandomPlayer(), num_games=2, seed=1))
        >>> [record.player_first for record in records]
        [True, False]
    """
    num_games = check_int("num_games", num_games, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    opening_moves = check_int("opening_moves", opening_moves, minimum=0)
    check_protocol("game", game, GAME_METHODS, "Game", "problems.ConnectFour()")
    for role, p in (("player", player), ("opponent", opponent)):
        if not (isinstance(getattr(p, "name", None), str) and is_async(
                getattr(p, "choose", None))):  # (a plain choose failed at its await)
            raise ValueError(f"{role} must be a Player (a name and an async "
                             f"choose(game, state, rng)), got {p!r}")
    if on_game is not None and not callable(on_game):
        raise ValueError(f"on_game must be a callable taking no arguments or None, got "
                         f"{on_game!r}")

    async def one(k: int) -> MatchGame:
        record = await _play_game(game, player, opponent, k, seed, opening_moves)
        if on_game is not None:
            on_game()
        return record

    tasks = [asyncio.ensure_future(one(k)) for k in range(num_games)]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # A player that raised, or the caller's cancellation (a timeout): no game may go
        # on playing after the match has ended.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def gate(result: MatchResult, *, threshold: float = 0.55, min_games: int = 40) -> bool:
    """AlphaZero's arena rule: promote the candidate iff it scored ``>= threshold``
    over at least ``min_games`` games.

    The score is compared as a float; ``(wins + 0.5 * draws) / games`` is correctly
    rounded, so a score exactly equal to a decimal threshold (22 of 40 and 0.55) passes.

    Args:
        result: the candidate's match against the current best (candidate first).
        threshold: the score needed, in [0, 1].
        min_games: the fewest games that can promote (>= 1).

    Example:
        >>> gate(MatchResult(wins=22, draws=0, losses=18))
        True
    """
    if not isinstance(result, MatchResult):
        raise ValueError(f"result must be a MatchResult (from play_match), got "
                         f"{result!r}")
    threshold = check_float("threshold", threshold, minimum=0.0)
    if threshold > 1.0:
        raise ValueError(f"threshold must be a score in [0, 1], got {threshold!r}")
    min_games = check_int("min_games", min_games, minimum=1)
    return result.games >= min_games and result.score >= threshold
