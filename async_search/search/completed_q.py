"""Policy improvement from completed Q-values (Gumbel AlphaZero), as pure functions.

At a node with network value ``v`` and prior ``pi = softmax(logits)`` over its legal
actions, after ``N(a)`` completed visits of each action with mean value ``q(a)`` (both
for the player to move at the node):

- the mixed value ``v_mix = (v + sum_b N(b) * sum_{a visited} pi(a) q(a) /
  sum_{a visited} pi(a)) / (1 + sum_b N(b))`` estimates the node's value, its prior
  standing in for the actions never tried;
- the completed Q-values are ``q(a)`` where visited, ``v_mix`` elsewhere;
- ``sigma(q) = (c_visit + max_b N(b)) * c_scale * q`` on a completed Q normalised to
  [0, 1] by the smallest and largest value the search has seen (``ValueBounds``);
- the improved policy is ``softmax(logits + sigma(completed Q))``;
- a search that did not use ``sigma`` (PUCT) still yields the improved policy at its
  root (``root_improved_policy``), with Q normalised by the root's own completed values
  (mctx's ``qtransform_completed_by_mix_value``);
- below the root the search takes ``argmax_a pi'(a) - N(a) / (1 + sum_b N(b))``, the
  action whose visits lag furthest behind the improved policy (deterministic).

Logits enter only through a softmax, so ``log(prior)`` serves for them (they differ by a
constant); a prior that underflowed to 0 has logit -inf.

Example:
    >>> bounds = ValueBounds()
    >>> for v in (-1.0, 1.0):
    ...     bounds.add(v)
    >>> q = completed_values([0.5, 0.0], [1, 0], mixed_value(0.0, [0.5, 0.5], [1, 0],
    ...                                                       [0.5, 0.0]))
    >>> q                  # the unvisited action gets v_mix = (0 + 1 * 0.5) / 2
    [0.5, 0.25]
    >>> p = improved_policy([math.log(0.5)] * 2, sigma(q, [1, 0], bounds, 50.0, 0.1))
    >>> round(p[0], 4), round(p[1], 4)
    (0.6542, 0.3458)
"""

from __future__ import annotations

import math
from typing import List, Sequence

from async_search.search.sums import left_sum


class ValueBounds:
    """The smallest and largest value a search has seen, to normalise Q into [0, 1]."""

    __slots__ = ("low", "high")

    def __init__(self) -> None:
        self.low = math.inf
        self.high = -math.inf

    def add(self, value: float) -> None:
        """Widen the bounds to take in ``value``."""
        if value < self.low:
            self.low = value
        if value > self.high:
            self.high = value

    def normalise(self, value: float) -> float:
        """``value`` mapped linearly to [0, 1] (clipped); 0.0 while the bounds are a
        single value or empty (a constant shift: the softmax does not see it)."""
        span = self.high - self.low
        if not span > 0.0:
            return 0.0
        return min(1.0, max(0.0, (value - self.low) / span))


def log_priors(priors: Sequence[float]) -> List[float]:
    """``log(prior)`` for each action, -inf where a prior underflowed to 0."""
    log = math.log
    return [log(p) if p > 0.0 else -math.inf for p in priors]


def mixed_value(value: float, priors: Sequence[float], visits: Sequence[int],
                value_sums: Sequence[float]) -> float:
    """``v_mix``: the network's ``value`` mixed with the prior-weighted mean Q of the
    visited actions, weighted by the visits (``value`` alone with no visit).

    When every visited action has prior 0 the plain mean Q of the visited actions
    stands in for the weighted one.
    """
    total = 0
    weighted = mass = plain = 0.0
    for p, n, w in zip(priors, visits, value_sums):
        if n:
            total += n
            q = w / n
            weighted += p * q
            mass += p
            plain += q
    if not total:
        return value
    mean = weighted / mass if mass > 0.0 else plain / sum(1 for n in visits if n)
    return (value + total * mean) / (1 + total)


def completed_values(value_sums: Sequence[float], visits: Sequence[int],
                     v_mix: float) -> List[float]:
    """Each action's mean value where visited, ``v_mix`` where not."""
    return [w / n if n else v_mix for w, n in zip(value_sums, visits)]


def sigma(completed: Sequence[float], visits: Sequence[int], bounds: ValueBounds,
          c_visit: float, c_scale: float) -> List[float]:
    """``(c_visit + max visits) * c_scale * q`` with each completed ``q`` normalised to
    [0, 1] by ``bounds``: how far the value moves the policy's logits."""
    scale = (c_visit + max(visits, default=0)) * c_scale
    return [scale * bounds.normalise(q) for q in completed]


def improved_policy(logits: Sequence[float], sigmas: Sequence[float]) -> List[float]:
    """``softmax(logits + sigmas)``."""
    scores = [x + s for x, s in zip(logits, sigmas)]
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = left_sum(weights)
    return [w / total for w in weights]


def select_by_visit_deficit(policy: Sequence[float], visits: Sequence[int]) -> int:
    """``argmax_a policy(a) - visits(a) / (1 + sum visits)``, ties to the first: the
    action whose share of the visits lags furthest behind ``policy``.

    ``visits`` may count descents still in flight (a visit not yet backed up), so that
    several descents of one round spread over the actions.
    """
    scale = 1.0 / (1 + sum(visits))
    best, best_score = 0, -math.inf
    for i, (p, n) in enumerate(zip(policy, visits)):
        score = p - n * scale
        if score > best_score:
            best, best_score = i, score
    return best


def root_improved_policy(priors: Sequence[float], visits: Sequence[int],
                         action_values: Sequence[float], value: float, *,
                         c_visit: float = 50.0, c_scale: float = 0.1) -> List[float]:
    """The improved policy at a searched root: ``softmax(log(priors) + sigma(completed
    Q))`` over its legal actions, Q normalised to [0, 1] by the smallest and largest
    completed Q (mctx's ``qtransform_completed_by_mix_value``).

    Any search that counts visits and mean values at the root gives it, so a PUCT
    search's policy target can be the improved policy instead of its visit counts.

    Args:
        priors: the network's prior of each legal action (before any root noise).
        visits: each action's completed visits.
        action_values: each action's mean value for the player to move (read where
            visited).
        value: the network's value of the root.
        c_visit, c_scale: ``sigma``'s constants.

    Raises:
        ValueError: no action, or lists of different lengths.

    Example:
        >>> p = root_improved_policy([0.5, 0.5], [3, 1], [0.5, -0.5], 0.0)
        >>> [round(x, 4) for x in p]     # sigma = (50 + 3) * 0.1 * [1, 0]
        [0.995, 0.005]
    """
    if not priors or not len(priors) == len(visits) == len(action_values):
        raise ValueError(f"root_improved_policy needs one prior, visit count and value "
                         f"per action, at least one: got {len(priors)}, {len(visits)} "
                         f"and {len(action_values)}")
    sums = [q * n for q, n in zip(action_values, visits)]
    v_mix = mixed_value(value, priors, visits, sums)
    q = completed_values(sums, visits, v_mix)
    bounds = ValueBounds()
    for x in q:
        bounds.add(x)
    return improved_policy(log_priors(priors), sigma(q, visits, bounds, c_visit, c_scale))
