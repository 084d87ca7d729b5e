"""Gumbel-Top-k and the Sequential Halving schedule (search/halving.py)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from async_search.search.halving import gumbel_top_k, halving_schedule, phase_order


def planned(schedule):
    return sum(size * each for size, each in schedule)


def test_top_k_takes_the_largest_scores_first_and_ties_to_the_lower_index():
    assert gumbel_top_k([0.5, 2.0, -1.0, 2.0], 3) == [1, 3, 0]
    assert gumbel_top_k([0.0] * 5, 2) == [0, 1]
    assert gumbel_top_k([1.0, -math.inf, 3.0], 5) == [2, 0, 1]


def test_phase_order_sorts_only_the_candidates():
    assert phase_order([4, 0, 2], [9.0, 8.0, 1.0, 0.0, 1.0]) == [0, 2, 4]


def test_gumbel_top_k_samples_without_replacement_from_the_softmax():
    # The first of Gumbel-Top-k is a sample of softmax(logits) (the Gumbel-max trick).
    logits = np.log([0.5, 0.3, 0.2])
    rng = np.random.default_rng(0)
    firsts = [gumbel_top_k(list(rng.gumbel(size=3) + logits), 2)[0] for _ in range(6000)]
    assert np.allclose(np.bincount(firsts, minlength=3) / 6000, [0.5, 0.3, 0.2], atol=0.02)


@pytest.mark.parametrize("n, k, expected", [
    (16, 4, [(4, 2), (2, 4)]),
    (32, 7, [(7, 1), (4, 2), (2, 5), (2, 5)]),
    (16, 16, [(16, 1)]),                      # one simulation per considered action
    (5, 16, [(16, 1)]),                       # fewer simulations than actions
    (10, 1, [(1, 10)]),                       # one action takes every simulation
    (7, 2, [(2, 3), (2, 3)]),                 # two actions: one phase, then a cut one
    (200, 16, [(16, 3), (8, 6), (4, 12), (2, 25), (2, 25)]),  # 194 planned: one more
])
def test_schedule_examples(n, k, expected):
    assert halving_schedule(n, k) == expected


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 600), k=st.integers(1, 40))
def test_schedule_covers_the_budget_and_halves(n, k):
    schedule = halving_schedule(n, k)
    assert schedule[0][0] == k
    # Every phase but the last is run in full; the last reaches the budget.
    assert planned(schedule[:-1]) < n <= planned(schedule)
    for (size, each), (next_size, _) in zip(schedule, schedule[1:]):
        assert next_size == (size if size <= 2 else max(2, math.ceil(size / 2)))
    for size, each in schedule:
        assert each >= 1 and (k == 1 or size >= 2)
    if n >= 2 * k * max(1, math.ceil(math.log2(k))):  # a budget that spans the phases
        assert len(schedule) >= max(1, math.ceil(math.log2(k)))


@pytest.mark.parametrize("n, k", [(0, 4), (4, 0)])
def test_schedule_refuses_an_empty_budget_or_no_action(n, k):
    with pytest.raises(ValueError, match="num_simulations >= 1 and num_considered >= 1"):
        halving_schedule(n, k)
