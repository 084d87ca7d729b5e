"""Completed Q-values, sigma and the improved policy (search/completed_q.py)."""

import math

import numpy as np
import pytest

from async_search.search.completed_q import (ValueBounds, completed_values,
                                             improved_policy, log_priors, mixed_value,
                                             select_by_visit_deficit, sigma)


def bounds_of(*values):
    bounds = ValueBounds()
    for v in values:
        bounds.add(v)
    return bounds


def test_bounds_normalise_linearly_and_clip():
    bounds = bounds_of(-0.5, 0.5, 0.0)
    assert (bounds.low, bounds.high) == (-0.5, 0.5)
    assert [bounds.normalise(v) for v in (-0.5, 0.0, 0.25, 0.5, 2.0, -2.0)] == [
        0.0, 0.5, 0.75, 1.0, 1.0, 0.0]


@pytest.mark.parametrize("values", [(), (0.3,), (0.3, 0.3)])
def test_bounds_without_a_span_normalise_everything_to_zero(values):
    assert bounds_of(*values).normalise(0.3) == 0.0


def test_mixed_value_is_the_network_value_before_any_visit():
    assert mixed_value(0.4, [0.5, 0.5], [0, 0], [0.0, 0.0]) == 0.4


def test_mixed_value_weights_visited_q_by_their_prior():
    priors, visits, sums = [0.6, 0.3, 0.1], [2, 0, 3], [1.0, 0.0, -1.5]
    q = {0: 0.5, 2: -0.5}
    weighted = (0.6 * q[0] + 0.1 * q[2]) / 0.7
    expected = (0.2 + 5 * weighted) / 6
    assert mixed_value(0.2, priors, visits, sums) == pytest.approx(expected, abs=1e-15)


def test_mixed_value_with_only_zero_prior_visits_uses_their_plain_mean():
    assert mixed_value(0.0, [1.0, 0.0, 0.0], [0, 1, 1], [0.0, 0.5, -0.1]) == \
        pytest.approx((0 + 2 * 0.2) / 3)


def test_completed_values_fill_unvisited_actions_with_v_mix():
    assert completed_values([1.0, 0.0, -0.9], [2, 0, 3], 0.7) == [0.5, 0.7, -0.3]


def test_sigma_scales_with_the_most_visited_action():
    bounds = bounds_of(-1.0, 1.0)
    assert sigma([1.0, 0.0, -1.0], [3, 1, 0], bounds, 50.0, 0.1) == pytest.approx(
        [5.3, 2.65, 0.0])
    assert sigma([1.0], [0], bounds, 50.0, 0.0) == [0.0]


def test_improved_policy_is_the_softmax_of_logits_plus_sigma():
    logits, sigmas = [0.1, -0.4, 1.2], [0.5, 2.0, 0.0]
    expected = np.exp(np.add(logits, sigmas))
    assert improved_policy(logits, sigmas) == pytest.approx(list(expected / expected.sum()))
    # A logit of -inf (a prior that underflowed) keeps probability 0.
    assert improved_policy([0.0, -math.inf], [0.0, 9.0]) == [1.0, 0.0]


def test_log_priors_map_zero_to_minus_inf():
    assert log_priors([1.0, 0.0]) == [0.0, -math.inf]


def test_visit_deficit_follows_the_policy_and_ties_to_the_first():
    policy = [0.5, 0.3, 0.2]
    assert select_by_visit_deficit(policy, [0, 0, 0]) == 0
    taken = [0, 0, 0]
    for _ in range(10):
        taken[select_by_visit_deficit(policy, taken)] += 1
    assert taken == [5, 3, 2]  # visits track the policy
    assert select_by_visit_deficit([0.5, 0.5], [1, 1]) == 0
