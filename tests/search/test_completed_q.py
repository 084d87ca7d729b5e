"""Completed Q-values, sigma and the improved policy (search/completed_q.py)."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from async_search.search.completed_q import (ValueBounds, completed_values,
                                             improved_policy, log_priors, mixed_value,
                                             root_improved_policy, select_by_visit_deficit,
                                             sigma)


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


def test_root_improved_policy_is_the_softmax_of_log_prior_plus_sigma_of_rescaled_q():
    priors, visits, q, value = [0.2, 0.3, 0.5], [4, 0, 6], [0.5, 0.0, -0.25], 0.1
    v_mix = (value + 10 * (0.2 * 0.5 + 0.5 * -0.25) / 0.7) / 11
    completed = [0.5, v_mix, -0.25]
    scaled = [(x - -0.25) / 0.75 * (50 + 6) * 0.1 for x in completed]
    want = np.exp(np.log(priors) + scaled)
    got = root_improved_policy(priors, visits, q, value)
    np.testing.assert_allclose(got, want / want.sum(), rtol=1e-12)


def test_root_improved_policy_before_any_visit_is_the_prior():
    np.testing.assert_allclose(root_improved_policy([0.1, 0.6, 0.3], [0, 0, 0],
                                                    [0.0] * 3, 0.4), [0.1, 0.6, 0.3])


@given(st.lists(st.tuples(st.floats(0.01, 1.0), st.integers(1, 50),
                          st.floats(-1.0, 1.0)), min_size=2, max_size=7),
       st.floats(-1.0, 1.0))
def test_root_improved_policy_sums_to_one_and_favours_the_better_of_equal_priors(
        actions, value):
    priors = [1.0 / len(actions)] * len(actions)
    visits = [n for _, n, _ in actions]
    q = [v for _, _, v in actions]
    policy = root_improved_policy(priors, visits, q, value)
    assert sum(policy) == pytest.approx(1.0)
    best, worst = int(np.argmax(q)), int(np.argmin(q))
    assert policy[best] >= policy[worst]
    if q[best] > q[worst]:
        assert policy[best] > policy[worst]


@pytest.mark.parametrize("priors, visits, values", [([], [], []), ([1.0], [1, 2], [0.0]),
                                                    ([0.5, 0.5], [1, 1], [0.0])])
def test_root_improved_policy_refuses_no_action_or_uneven_lists(priors, visits, values):
    with pytest.raises(ValueError, match="one prior, visit count and value per action"):
        root_improved_policy(priors, visits, values, 0.0)
