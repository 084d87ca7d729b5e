"""The root of Gumbel search: Gumbel-Top-k sampling and the Sequential Halving schedule.

Gumbel AlphaZero (Danihelka et al., 2022, "Policy improvement by planning with Gumbel")
samples ``k`` actions without replacement by taking the ``k`` largest ``g(a) +
logits(a)``, with ``g`` independent Gumbel(0, 1) noise (the Gumbel-Top-k trick), and
spends the simulation budget on them by Sequential Halving: phase after phase, each
action still in contention gets the same number of visits, then the better half (by
``g + logits + sigma(q)``) goes on. Both are pure functions here; ``search.gumbel``
runs them.

Example:
    >>> gumbel_top_k([0.5, 2.0, -1.0, 2.0], 3)
    [1, 3, 0]
    >>> halving_schedule(16, 4)       # 4 actions x 2 visits, then 2 actions x 4 visits
    [(4, 2), (2, 4)]
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple


def gumbel_top_k(scores: Sequence[float], k: int) -> List[int]:
    """The indices of the ``k`` largest ``scores``, largest first; ties go to the lower
    index (so a search without noise is deterministic).

    With ``scores = g + logits`` over the legal actions, these are ``k`` actions sampled
    without replacement from ``softmax(logits)`` (the Gumbel-Top-k trick).
    """
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]


def phase_order(candidates: Sequence[int], scores: Sequence[float]) -> List[int]:
    """``candidates`` (indices into ``scores``) from the highest score to the lowest,
    ties to the lower index: the order in which a phase visits them, and whose head
    survives a halving."""
    return sorted(candidates, key=lambda i: (-scores[i], i))


def halving_schedule(num_simulations: int, num_considered: int) -> List[Tuple[int, int]]:
    """The phases of Sequential Halving: ``(actions in the phase, visits to each)``.

    There are ``ceil(log2(num_considered))`` phases (one for a single action); a phase
    with ``m`` actions gives each ``max(1, num_simulations // (phases * m))`` visits,
    then keeps the better ``ceil(m / 2)`` (never fewer than 2, unless only one action
    was considered). When the planned phases leave budget over, phases of two actions
    follow; the phase that reaches ``num_simulations`` is cut short (its visits are
    given action-major: every action's j-th visit before any (j+1)-th), and the
    schedule ends with it.

    Args:
        num_simulations: the budget (>= 1).
        num_considered: actions sampled at the root (>= 1).

    Example:
        >>> halving_schedule(32, 7)       # Connect Four's 7 actions, 32 simulations
        [(7, 1), (4, 2), (2, 5), (2, 5)]
        >>> halving_schedule(5, 16)       # fewer simulations than actions: one phase
        [(16, 1)]
    """
    if num_simulations < 1 or num_considered < 1:
        raise ValueError(f"halving_schedule needs num_simulations >= 1 and "
                         f"num_considered >= 1, got {num_simulations}, {num_considered}")
    phases = max(1, math.ceil(math.log2(num_considered)))
    schedule: List[Tuple[int, int]] = []
    size, planned = num_considered, 0
    while planned < num_simulations:
        each = max(1, num_simulations // (phases * size))
        schedule.append((size, each))
        planned += size * each
        if size > 2:
            size = max(2, (size + 1) // 2)
    return schedule
