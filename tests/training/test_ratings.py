"""Ratings: match scores, Elo differences and fitted ratings."""

import math

import pytest

from async_search.training.ratings import (RANDOM_RATING, MatchResult, elo_difference,
                                           fit_rating)


def test_match_result_counts_and_score():
    result = MatchResult(wins=24, draws=6, losses=10)
    assert (result.games, result.score) == (40, 0.675)
    assert result.describe() == "+24 =6 -10 of 40: score 0.675, Elo +127"
    with pytest.raises(ValueError, match="wins"):
        MatchResult(wins=-1, draws=0, losses=3)
    with pytest.raises(ValueError, match="at least one game"):
        MatchResult(0, 0, 0)
    with pytest.raises(Exception):
        result.wins = 3  # frozen


def test_elo_difference():
    assert elo_difference(0.5) == 0.0
    assert elo_difference(0.76) == pytest.approx(200.0, abs=1.0)
    assert elo_difference(0.3) == pytest.approx(-elo_difference(0.7), abs=1e-9)
    assert elo_difference(1.0) == pytest.approx(elo_difference(1 - 1e-3))
    assert elo_difference(0.0) == pytest.approx(-elo_difference(1.0))
    assert elo_difference(1.0, games=40) == pytest.approx(elo_difference(1 - 1 / 80))
    assert elo_difference(0.0, games=40) == pytest.approx(-elo_difference(1.0, 40))
    assert elo_difference(1.0, games=1) == 0.0
    for bad in (dict(score=1.2), dict(score=-0.1), dict(score=0.5, games=0)):
        with pytest.raises(ValueError):
            elo_difference(**bad)


@pytest.mark.parametrize("games", [10 ** 15, 2 ** 53, 10 ** 16, 10 ** 300, 10 ** 310],
                         ids=["1e15", "2**53", "1e16", "1e300", "1e310"])
def test_elo_difference_is_finite_and_symmetric_for_any_number_of_games(games):
    # 1 - 0.5 / games rounded to 1.0 here: log10(0) raised "math domain error"; past
    # the floats (1e310) 0.5 / games overflowed.
    best, worst = elo_difference(1.0, games), elo_difference(0.0, games)
    assert math.isfinite(best) and best == -worst
    if games < 2 ** 1000:
        assert best == pytest.approx(-400 * math.log10(0.5 / games), rel=1e-12)
    line = MatchResult(wins=games, draws=0, losses=0).describe()
    assert line.endswith(f"Elo +{best:.0f}")


def test_fit_rating_recovers_a_known_rating():
    true, games = 300.0, 4000
    results = []
    for opponent in (RANDOM_RATING, 200.0, 400.0, 600.0):
        expected = 1 / (1 + 10 ** ((opponent - true) / 400))
        wins = round(expected * games)
        results.append((opponent, MatchResult(wins=wins, draws=0, losses=games - wins)))
    assert fit_rating(results) == pytest.approx(true, abs=3.0)
    # Draws count half: the same scores as draws give the same rating.
    one = fit_rating([(100.0, MatchResult(30, 0, 10))])
    assert fit_rating([(100.0, MatchResult(20, 20, 0))]) == pytest.approx(one)
    assert one == pytest.approx(100.0 + elo_difference(30.25 / 40.5), abs=1e-6)


def test_fit_rating_is_finite_for_all_wins_and_all_losses():
    high = fit_rating([(0.0, MatchResult(40, 0, 0))])
    low = fit_rating([(0.0, MatchResult(0, 0, 40))])
    assert math.isfinite(high) and math.isfinite(low)
    assert high > 400 and low == pytest.approx(-high)
    assert fit_rating([(0.0, MatchResult(10, 0, 0))]) < high


def test_fit_rating_is_finite_for_opponents_rated_far_apart():
    rating = fit_rating([(0.0, MatchResult(5, 0, 5)), (150_000.0, MatchResult(0, 0, 10))])
    assert math.isfinite(rating) and -500 < rating < 500


def test_fit_rating_is_finite_and_exact_for_opponents_near_the_floats_limit():
    # high - low overflowed to inf: the answer was -inf, or off by 1e247.
    even = MatchResult(5, 0, 5)
    assert fit_rating([(1e308, even), (-1e308, even)]) == 0.0
    # The prior's quarter win against the unbeatable one: 5.5 points of 10.5 against 0.
    rating = fit_rating([(1e308, MatchResult(0, 0, 10)), (0.0, even)])
    assert rating == pytest.approx(400 * math.log10(5.5 / 5.0), abs=1e-6)
    # Past the floats' range: the largest float of its sign.
    top = 1.7976931348623157e308
    assert fit_rating([(top, MatchResult(40, 0, 0))]) == top
    assert fit_rating([(-top, MatchResult(0, 0, 40))]) == -top


@pytest.mark.parametrize("results", [[], [(0.0, 0.5)], [(math.inf, MatchResult(1, 0, 1))],
                                     [0.0],
                                     # float()'s own errors, an OverflowError, or a bool
                                     # taken as 1.0
                                     [(None, MatchResult(1, 0, 1))],
                                     [("abc", MatchResult(1, 0, 1))],
                                     [(10 ** 400, MatchResult(1, 0, 1))],
                                     [(True, MatchResult(1, 0, 1))]])
def test_fit_rating_rejects_bad_results(results):
    with pytest.raises(ValueError, match="results must hold|opponent rating"):
        fit_rating(results)
