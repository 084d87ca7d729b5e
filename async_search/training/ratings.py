"""Ratings: a match's score, the Elo difference it implies, and a fitted rating.

``MatchResult`` is a match's outcome from the first-named player's view;
``elo_difference`` turns a score into a rating difference and ``fit_rating`` fits a
player's rating from matches against rated opponents, on a scale anchored at the random
player (``RANDOM_RATING``).

Example:
    >>> round(elo_difference(MatchResult(wins=76, draws=0, losses=24).score))
    200
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Optional, Sequence, Tuple

from async_search.checks import check_float, check_int, plain_fields

#: The rating of ``RandomPlayer``: the anchor of every rating reported.
RANDOM_RATING = 0.0


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
        plain_fields(self)
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
        # In integers: a count past the floats (10**310 wins) still divides exactly.
        return (2 * self.wins + self.draws) / (2 * self.games)

    def describe(self) -> str:
        """One line, e.g. ``"+24 =6 -10 of 40: score 0.675, Elo +127"``."""
        elo = elo_difference(self.score, self.games)
        return (f"+{self.wins} ={self.draws} -{self.losses} of {self.games}: "
                f"score {self.score:.3f}, Elo {elo:+.0f}")


def elo_difference(score: float, games: Optional[int] = None) -> float:
    """The rating difference implied by an expected score: ``-400 log10(1/score - 1)``.

    A score of 0 or 1 has no finite difference; it is clipped to
    ``[0.5 / games, 1 - 0.5 / games]`` when ``games`` is given (half a game's doubt),
    else to ``[1e-3, 1 - 1e-3]``. A score above one half is taken from its distance to
    1 (``elo_difference(1 - s) == -elo_difference(s)``), so that the difference is finite
    for any number of games (``1 - 0.5 / games`` would round to 1 past 2**53 games).

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
        # At least the smallest positive float: 0.5 / 10**310 would overflow.
        low = max(0.5 / min(check_int("games", games, minimum=1), 2 ** 1000), 5e-324)
    sign = 1.0
    if score > 0.5:  # from the near end: 1 - low may round to 1.0, low never to 0
        score, sign = 1.0 - score, -1.0
    score = max(score, low)
    if score >= 0.5:
        return 0.0
    # -400 log10(1/score - 1), with 1 - score to full precision however small score is
    return sign * 400.0 * (math.log10(score) - math.log1p(-score) / _LN10)


_LN10 = math.log(10.0)


def _expected(rating: float, opponent: float) -> float:
    # The logistic as a tanh: 10 ** (d / 400) overflows for ratings 123,000 apart.
    return 0.5 * (1.0 - math.tanh((opponent - rating) * _HALF_LN10_OVER_400))


_HALF_LN10_OVER_400 = math.log(10.0) / 800.0


def fit_rating(results: Sequence[Tuple[float, MatchResult]]) -> float:
    """The maximum-likelihood rating of a player from matches against rated opponents.

    Logistic Elo model: against an opponent rated ``r`` a player rated ``R`` scores
    ``1 / (1 + 10 ** ((r - R) / 400))`` per game. A weak prior, half a virtual draw
    against each opponent, keeps the answer finite for all wins or all losses. The
    log-likelihood is concave in ``R``; its derivative's root is found by bisection.
    The answer is finite for any finite opponent ratings (one past the floats' range,
    about 1.8e308, is the largest float of its sign).

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
        # (None, text, a bool, 10**400: named, not float()'s own error)
        rating = check_float("an opponent rating", item[0])
        r = item[1]
        # Half a virtual draw: a quarter of a win and a quarter of a loss.
        pairs.append((rating, r.wins + 0.5 * r.draws + 0.25, r.games + 0.5))
    if not pairs:
        raise ValueError("results must hold at least one (opponent_rating, MatchResult) "
                         "pair, got none")

    def slope(rating: float) -> float:  # the log-likelihood's derivative, up to ln10/400
        return sum(points - games * _expected(rating, opponent)
                   for opponent, points, games in pairs)

    # Kept within the floats, and no sums or differences of the bounds: for opponents
    # near +-1e308, high - low overflows to inf and the answer came out -inf.
    top = sys.float_info.max
    low = max(min(p[0] for p in pairs) - 400.0, -top)
    high = min(max(p[0] for p in pairs) + 400.0, top)
    step = 400.0
    while slope(low) < 0 and low > -top:
        low, step = max(low - step, -top), 2.0 * step
    step = 400.0
    while slope(high) > 0 and high < top:
        high, step = min(high + step, top), 2.0 * step
    for _ in range(4096):  # ends sooner: the floats between low and high run out
        mid = 0.5 * low + 0.5 * high
        if mid in (low, high):
            break
        gradient = slope(mid)
        if gradient == 0:  # a root (past the floats' precision, a flat stretch of them)
            return mid
        if gradient > 0:
            low = mid
        else:
            high = mid
    return 0.5 * low + 0.5 * high
