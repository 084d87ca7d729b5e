"""The arena: players for two-player games, matches between them, gating and Elo.

A ``Player`` picks a move with ``await player.choose(game, state, rng)``. Baselines need
no model (``RandomPlayer``, ``OnePlyPlayer``, ``UCTPlayer``, a pure-Python UCT with
random rollouts); ``MCTSPlayer`` and ``PolicyPlayer`` play with a policy-value network
through an ``evaluate`` callable. ``play_match`` plays games concurrently, so that the
network players' requests batch through one serving coroutine, and returns a
``MatchResult``; ``gate`` applies AlphaZero's arena rule, and ``elo_difference`` and
``fit_rating`` turn scores into ratings anchored at the random player
(``RANDOM_RATING``).

Example:
    >>> import asyncio
    >>> from async_search.problems import ConnectFour
    >>> result = asyncio.run(play_match(ConnectFour(), OnePlyPlayer(), RandomPlayer(),
    ...                                 num_games=4, seed=0))
    >>> result.games
    4
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Callable, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import numpy as np

from async_search.base import Evaluate
from async_search.errors import ModelOutputError
from async_search.problems.base import Game, State
from async_search.problems.connect_four import ConnectFour, ConnectFourState
from async_search.search.alphazero import mcts
from async_search.checks import check_float, check_int

__all__ = ["Player", "RandomPlayer", "OnePlyPlayer", "UCTPlayer", "MCTSPlayer",
           "PolicyPlayer", "MatchResult", "play_match", "gate", "elo_difference",
           "fit_rating", "RANDOM_RATING"]

#: The rating of ``RandomPlayer``: the anchor of every rating this module reports.
RANDOM_RATING = 0.0

_LN10_OVER_400 = math.log(10.0) / 400.0


@runtime_checkable
class Player(Protocol):
    """Something that plays a game: ``await player.choose(game, state, rng)``.

    ``choose`` returns one of ``game.legal_actions(state)`` (the state is never
    terminal) and draws any randomness it needs from ``rng``, so that a match is a
    deterministic function of its seed.
    """

    name: str
    """A short label for reports, e.g. ``"uct300"``."""

    async def choose(self, game: Game, state: State, rng: np.random.Generator) -> int:
        """The action to play in ``state``."""


def _legal(game: Game, state: State, who: str) -> Tuple[int, ...]:
    legal = game.legal_actions(state)
    if not legal:
        raise ValueError(f"{who}: cannot choose a move in a finished game ({game!r}, "
                         f"state {state!r}); pass a state with a legal action")
    return legal


def _mover_won(game: Game, state: State) -> bool:
    # terminal_value is for the player to move: below zero, the player who just moved won.
    value = game.terminal_value(state)
    return value is not None and value < 0


class RandomPlayer:
    """Plays a uniformly random legal action (the rating anchor, ``RANDOM_RATING``).

    Example:
        >>> import asyncio
        >>> from async_search.problems import ConnectFour
        >>> game = ConnectFour()
        >>> rng = np.random.default_rng(0)
        >>> asyncio.run(RandomPlayer().choose(game, game.initial_state(), rng)) in range(7)
        True
    """

    name = "random"

    def __repr__(self) -> str:
        return "RandomPlayer()"

    async def choose(self, game: Game, state: State, rng: np.random.Generator) -> int:
        legal = _legal(game, state, self.name)
        return int(legal[int(rng.integers(len(legal)))])


class OnePlyPlayer:
    """Takes a win, else blocks the opponent's immediate win, else plays at random.

    Generic over ``Game``: a win is an action after which ``terminal_value`` is
    negative (the mover won). A threat is an action ``b`` with which the opponent would
    win right after some other move ``a != b`` of ours; if there are threats the player
    plays one (the only one, or a random one of several: the game is lost anyway).

    Example:
        >>> import asyncio
        >>> from async_search.problems import ConnectFour
        >>> game = ConnectFour()
        >>> state = game.from_moves([0, 6, 1, 6, 2, 5])     # column 3 wins
        >>> asyncio.run(OnePlyPlayer().choose(game, state, np.random.default_rng(0)))
        3
    """

    name = "one-ply"

    def __repr__(self) -> str:
        return "OnePlyPlayer()"

    async def choose(self, game: Game, state: State, rng: np.random.Generator) -> int:
        legal = _legal(game, state, self.name)
        after = [game.play(state, a) for a in legal]
        for a, s in zip(legal, after):
            if _mover_won(game, s):
                return int(a)
        threats = set()
        for a, s in zip(legal, after):
            for b in game.legal_actions(s):
                if b != a and b not in threats and _mover_won(game, game.play(s, b)):
                    threats.add(b)
        blocks = [a for a in legal if a in threats]
        choices = blocks or legal
        return int(choices[int(rng.integers(len(choices)))])


class _Uniforms:
    """Uniform floats in [0, 1) drawn from ``rng`` in chunks: one call per chunk."""

    __slots__ = ("rng", "chunk", "values", "index")

    def __init__(self, rng: np.random.Generator, chunk: int = 2048):
        self.rng, self.chunk = rng, chunk
        self.values: List[float] = []
        self.index = 0

    def refill(self) -> None:
        self.values = self.rng.random(self.chunk).tolist()
        self.index = 0


class _UCTNode:
    __slots__ = ("state", "action", "untried", "children", "visits", "value")

    def __init__(self, state: State, action: int, legal: Sequence[int]):
        self.state = state
        self.action = action
        self.untried = list(legal)
        self.children: List[_UCTNode] = []
        self.visits = 0
        self.value = 0.0  # summed outcomes for the player who moved INTO this node


def _random_playout(game: Game, state: State, legal: Sequence[int],
                    uniforms: _Uniforms) -> float:
    """The outcome of a uniformly random game from ``state``, for its player to move."""
    play, legal_actions = game.play, game.legal_actions
    values, i = uniforms.values, uniforms.index
    sign = 1.0
    while legal:
        if i >= len(values):
            uniforms.refill()
            values, i = uniforms.values, 0
        state = play(state, legal[int(values[i] * len(legal))])
        i += 1
        sign = -sign
        legal = legal_actions(state)
    uniforms.index = i
    return sign * float(game.terminal_value(state))


def _connect_four_playout(game: ConnectFour, state: ConnectFourState,
                          legal: Sequence[int], uniforms: _Uniforms) -> float:
    """``_random_playout`` on Connect Four's bitboards, about three times faster.

    It draws the same uniforms and makes the same moves as the generic playout (legal
    columns ascending, ``legal[int(u * len(legal))]``), so it returns the same outcome.
    """
    if not legal:
        return float(game.terminal_value(state))
    stride, rows = game.rows + 1, game.rows
    mine, theirs = state
    both = mine | theirs
    # heights[c]: the bit of column c's lowest empty cell.
    heights = [c * stride + ((both >> (c * stride)) & ((1 << rows) - 1)).bit_length()
               for c in range(game.columns)]
    legal = list(legal)
    s1, s2, s3 = stride - 1, stride, stride + 1
    values, i = uniforms.values, uniforms.index
    sign = 1.0
    while legal:
        if i >= len(values):
            uniforms.refill()
            values, i = uniforms.values, 0
        k = int(values[i] * len(legal))
        i += 1
        column = legal[k]
        height = heights[column]
        mine |= 1 << height
        heights[column] = height + 1
        if height + 1 == column * stride + rows:
            del legal[k]
        sign = -sign
        # Four in a row for the mover: vertical, horizontal and both diagonals.
        pairs = mine & (mine >> 1)
        if (pairs & (pairs >> 2) or (pairs := mine & (mine >> s2)) & (pairs >> 2 * s2)
                or (pairs := mine & (mine >> s1)) & (pairs >> 2 * s1)
                or (pairs := mine & (mine >> s3)) & (pairs >> 2 * s3)):
            uniforms.index = i
            return -sign  # the mover won: -1 for the side to move now, times sign
        mine, theirs = theirs, mine
    uniforms.index = i
    return 0.0


def _uct_visit_counts(game: Game, state: State, rollouts: int, c: float,
                     rng: np.random.Generator) -> dict:
    """Run ``rollouts`` UCT iterations from ``state``; visits of each root action."""
    root = _UCTNode(state, -1, _legal(game, state, "UCT"))
    playout = _connect_four_playout if type(game) is ConnectFour else _random_playout
    uniforms = _Uniforms(rng)
    uniforms.refill()
    log, sqrt = math.log, math.sqrt
    for _ in range(rollouts):
        node, path = root, [root]
        # Selection: UCB1 over fully expanded nodes.
        while not node.untried and node.children:
            explore = c * c * log(node.visits)
            best, best_score = node.children[0], -math.inf
            for child in node.children:
                n = child.visits
                score = child.value / n + sqrt(explore / n)
                if score > best_score:
                    best, best_score = child, score
            node = best
            path.append(node)
        # Expansion: one random untried action, swap-removed.
        if node.untried:
            if uniforms.index >= len(uniforms.values):
                uniforms.refill()
            untried = node.untried
            k = int(uniforms.values[uniforms.index] * len(untried))
            uniforms.index += 1
            action = untried[k]
            untried[k] = untried[-1]
            untried.pop()
            child_state = game.play(node.state, action)
            legal = game.legal_actions(child_state)
            child = _UCTNode(child_state, action, legal)
            node.children.append(child)
            path.append(child)
            outcome = playout(game, child_state, legal, uniforms)
        else:  # a terminal node: its exact value
            outcome = float(game.terminal_value(node.state))
        # Backup: the outcome is for the leaf's player to move; a node stores it for
        # the player who moved into it, so the sign flips at every level.
        reward = -outcome
        for visited in reversed(path):
            visited.visits += 1
            visited.value += reward
            reward = -reward
    return {child.action: child.visits for child in root.children}


class UCTPlayer:
    """Plain UCT: a UCB1 tree grown by one node per iteration, random rollouts.

    Each of ``rollouts`` iterations descends the tree by UCB1
    (``mean + c * sqrt(ln N / n)``), expands one random untried action, plays uniformly
    random moves to the end of the game and backs the outcome up with a sign flip per
    ply. The most visited root action is played (ties: the lowest action). Terminal
    nodes back up their exact value, so an immediate win (+1 on every visit) draws the
    visits. Pure Python over the ``Game`` protocol; deterministic given ``rng``.

    Args:
        rollouts: iterations per move (>= 1).
        c: the exploration constant (>= 0).

    Example:
        >>> import asyncio
        >>> from async_search.problems import ConnectFour
        >>> game = ConnectFour()
        >>> state = game.from_moves([0, 6, 1, 6, 2, 5])     # column 3 wins
        >>> asyncio.run(UCTPlayer(100).choose(game, state, np.random.default_rng(0)))
        3
    """

    def __init__(self, rollouts: int, c: float = 1.4):
        self.rollouts = check_int("rollouts", rollouts, minimum=1)
        self.c = check_float("c", c, minimum=0.0)
        self.name = f"uct{self.rollouts}"

    def __repr__(self) -> str:
        return f"UCTPlayer(rollouts={self.rollouts}, c={self.c})"

    async def choose(self, game: Game, state: State, rng: np.random.Generator) -> int:
        legal = _legal(game, state, self.name)
        if len(legal) == 1:
            return int(legal[0])
        visits = _uct_visit_counts(game, state, self.rollouts, self.c, rng)
        return int(max(legal, key=lambda a: (visits.get(a, 0), -a)))


class MCTSPlayer:
    """AlphaZero MCTS (``search.mcts``) without root noise: plays the most visited action.

    Args:
        evaluate: the policy-value network, ``await evaluate(game.encode(states))``.
        simulations: simulations per move (>= 1).
        num_parallel: leaves in flight per tree, evaluated in one request (>= 1).
        c_puct: PUCT's exploration constant (> 0).
        name: the label in reports.

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search.problems import ConnectFour, PolicyValueMLP
        >>> game = ConnectFour()
        >>> player = MCTSPlayer(asr.immediate(PolicyValueMLP(game)), simulations=16)
        >>> rng = np.random.default_rng(0)
        >>> asyncio.run(player.choose(game, game.initial_state(), rng)) in range(7)
        True
    """

    def __init__(self, evaluate: Evaluate, simulations: int = 100, num_parallel: int = 8,
                 c_puct: float = 1.25, name: str = "mcts"):
        if not callable(evaluate):
            raise ValueError(f"evaluate must be an awaitable callable such as "
                             f"asr.immediate(model), got {evaluate!r}")
        self.evaluate = evaluate
        self.simulations = check_int("simulations", simulations, minimum=1)
        self.num_parallel = check_int("num_parallel", num_parallel, minimum=1)
        self.c_puct = check_float("c_puct", c_puct, minimum=0.0, strict=True)
        self.name = str(name)

    def __repr__(self) -> str:
        return (f"MCTSPlayer(simulations={self.simulations}, "
                f"num_parallel={self.num_parallel}, c_puct={self.c_puct}, "
                f"name={self.name!r})")

    async def choose(self, game: Game, state: State, rng: np.random.Generator) -> int:
        # No noise: the search is deterministic and does not use rng.
        result = await mcts(game, state, self.evaluate, num_simulations=self.simulations,
                            num_parallel=self.num_parallel, c_puct=self.c_puct,
                            dirichlet_fraction=0.0)
        return int(result.action)


class PolicyPlayer:
    """Plays the legal action with the largest policy logit (ties: the lowest action).

    One request of one state per move: the raw network, no search.

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search.problems import ConnectFour, PolicyValueMLP
        >>> game = ConnectFour()
        >>> player = PolicyPlayer(asr.immediate(PolicyValueMLP(game)))
        >>> rng = np.random.default_rng(0)
        >>> asyncio.run(player.choose(game, game.initial_state(), rng)) in range(7)
        True
    """

    def __init__(self, evaluate: Evaluate, name: str = "policy"):
        if not callable(evaluate):
            raise ValueError(f"evaluate must be an awaitable callable such as "
                             f"asr.immediate(model), got {evaluate!r}")
        self.evaluate = evaluate
        self.name = str(name)

    def __repr__(self) -> str:
        return f"PolicyPlayer(name={self.name!r})"

    async def choose(self, game: Game, state: State, rng: np.random.Generator) -> int:
        legal = _legal(game, state, self.name)
        y = await self.evaluate(game.encode([state]))
        num_actions = int(game.num_actions)
        if not (isinstance(y, (tuple, list)) and len(y) == 2):
            raise ModelOutputError(f"a policy-value model must return the tuple "
                                   f"(policy_logits [1, {num_actions}], value [1, 1]), "
                                   f"got {type(y).__name__}")
        logits = np.asarray(y[0], np.float64)
        if logits.shape != (1, num_actions):
            raise ModelOutputError(f"policy logits must have shape [1, {num_actions}], "
                                   f"got {logits.shape}")
        row = logits[0]
        return int(max(legal, key=lambda a: (row[a], -a)))


@dataclasses.dataclass(frozen=True)
class MatchResult:
    """The outcome of a match, from the first-named player's point of view."""

    wins: int
    """Games the player won."""
    draws: int
    """Games drawn."""
    losses: int
    """Games the player lost (the opponent won)."""

    def __post_init__(self):
        for field in ("wins", "draws", "losses"):
            check_int(field, getattr(self, field), minimum=0)
        if self.games < 1:
            raise ValueError("a MatchResult needs at least one game, got wins=0, "
                             "draws=0, losses=0")

    @property
    def games(self) -> int:
        """Games played: ``wins + draws + losses``."""
        return self.wins + self.draws + self.losses

    @property
    def score(self) -> float:
        """``(wins + 0.5 * draws) / games``, in [0, 1]."""
        return (self.wins + 0.5 * self.draws) / self.games

    def describe(self) -> str:
        """One line, e.g. ``"+24 =6 -10 of 40: score 0.675, Elo +127"``."""
        elo = elo_difference(self.score, self.games)
        return (f"+{self.wins} ={self.draws} -{self.losses} of {self.games}: "
                f"score {self.score:.3f}, Elo {elo:+.0f}")


def _opening(game: Game, moves: int, rng: np.random.Generator) -> Tuple[State, int]:
    state, plies = game.initial_state(), 0
    for _ in range(moves):
        legal = game.legal_actions(state)
        if not legal:
            break
        state = game.play(state, legal[int(rng.integers(len(legal)))])
        plies += 1
    return state, plies


async def _play_game(game: Game, player: Player, opponent: Player, k: int, seed: int,
                     opening_moves: int) -> float:
    """Game ``k``; its outcome for ``player``: +1 a win, 0 a draw, -1 a loss."""
    rng = np.random.default_rng([seed, k])
    state, plies = _opening(game, opening_moves,
                            np.random.default_rng([seed, k // 2, 999]))
    # player moves on even plies in even games (it moves first), on odd plies otherwise.
    sides = (player, opponent) if k % 2 == 0 else (opponent, player)
    while True:
        legal = game.legal_actions(state)
        if not legal:
            break
        mover = sides[plies % 2]
        action = await mover.choose(game, state, rng)
        if action not in legal:
            raise ValueError(f"player {mover.name!r} chose action {action!r} in game {k}, "
                             f"which is not legal; legal actions are {legal}")
        state = game.play(state, action)
        plies += 1
    value = float(game.terminal_value(state))  # for the side to move at the end
    player_side = k % 2  # compare sides, not objects: player may be opponent
    return value if plies % 2 == player_side else -value


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
        >>> r = asyncio.run(play_match(ConnectFour(), UCTPlayer(50), RandomPlayer(),
        ...                            num_games=2, seed=1))
        >>> r.games
        2
    """
    num_games = check_int("num_games", num_games, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    opening_moves = check_int("opening_moves", opening_moves, minimum=0)
    for role, p in (("player", player), ("opponent", opponent)):
        if not (isinstance(getattr(p, "name", None), str) and callable(
                getattr(p, "choose", None))):
            raise ValueError(f"{role} must be a Player (a name and an async "
                             f"choose(game, state, rng)), got {p!r}")
    if on_game is not None and not callable(on_game):
        raise ValueError(f"on_game must be a callable taking no arguments or None, got "
                         f"{on_game!r}")

    async def one(k: int) -> float:
        outcome = await _play_game(game, player, opponent, k, seed, opening_moves)
        if on_game is not None:
            on_game()
        return outcome

    outcomes = await asyncio.gather(*(one(k) for k in range(num_games)))
    return MatchResult(wins=sum(o > 0 for o in outcomes),
                       draws=sum(o == 0 for o in outcomes),
                       losses=sum(o < 0 for o in outcomes))


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


def elo_difference(score: float, games: Optional[int] = None) -> float:
    """The rating difference implied by an expected score: ``-400 log10(1/score - 1)``.

    A score of 0 or 1 has no finite difference; it is clipped to
    ``[0.5 / games, 1 - 0.5 / games]`` when ``games`` is given (half a game's doubt),
    else to ``[1e-3, 1 - 1e-3]``.

    Args:
        score: the expected score in [0, 1].
        games: the games behind the score (>= 1), or None.

    Example:
        >>> round(elo_difference(0.76))
        200
    """
    score = check_float("score", score, minimum=0.0)
    if score > 1.0:
        raise ValueError(f"score must be in [0, 1], got {score!r}")
    if games is None:
        low = 1e-3
    else:
        low = 0.5 / check_int("games", games, minimum=1)
    score = min(max(score, low), 1.0 - low)
    if score == 0.5:
        return 0.0
    return -400.0 * math.log10(1.0 / score - 1.0)


def _expected(rating: float, opponent: float) -> float:
    return 1.0 / (1.0 + 10.0 ** ((opponent - rating) / 400.0))


def fit_rating(results: Sequence[Tuple[float, MatchResult]]) -> float:
    """The maximum-likelihood rating of a player from matches against rated opponents.

    Logistic Elo model: against an opponent rated ``r`` a player rated ``R`` scores
    ``1 / (1 + 10 ** ((r - R) / 400))`` per game. A weak prior, half a virtual draw
    against each opponent, keeps the answer finite for all wins or all losses. The
    log-likelihood is concave in ``R``; its derivative's root is found by bisection.

    Args:
        results: ``(opponent_rating, result)`` pairs, results from the player's view.

    Returns:
        The rating, on the opponents' scale (``RANDOM_RATING`` anchors this module's).

    Example:
        >>> round(fit_rating([(0.0, MatchResult(wins=76, draws=0, losses=24))]))
        199
    """
    pairs = []
    for item in results:
        if not (isinstance(item, tuple) and len(item) == 2
                and isinstance(item[1], MatchResult)):
            raise ValueError(f"results must hold (opponent_rating, MatchResult) pairs, "
                             f"got {item!r}")
        rating = float(item[0])
        if not math.isfinite(rating):
            raise ValueError(f"opponent ratings must be finite, got {item[0]!r}")
        r = item[1]
        # Half a virtual draw: a quarter of a win and a quarter of a loss.
        pairs.append((rating, r.wins + 0.5 * r.draws + 0.25, r.games + 0.5))
    if not pairs:
        raise ValueError("results must hold at least one (opponent_rating, MatchResult) "
                         "pair, got none")

    def slope(rating: float) -> float:  # the log-likelihood's derivative, up to ln10/400
        return sum(points - games * _expected(rating, opponent)
                   for opponent, points, games in pairs)

    low = min(p[0] for p in pairs) - 400.0
    high = max(p[0] for p in pairs) + 400.0
    while slope(low) < 0:
        low -= 2 * (high - low)
    while slope(high) > 0:
        high += 2 * (high - low)
    for _ in range(200):
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        if slope(mid) > 0:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)
