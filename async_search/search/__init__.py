"""Searches as coroutines over ``evaluate``: batched and continuous A*, rollouts, MCTS
(PUCT and Gumbel, with tree reuse between moves); ``move_accuracy`` judges a player's
moves on solver-labelled positions.

Each search takes a problem, a start and ``evaluate`` (``asr.immediate(model)`` or the
function that ``asr.serve(model)`` yields), awaits ``evaluate`` for its model calls, and
returns a frozen result. None starts an event loop or reads a clock: given the model's
outputs (and a seed), the result is the same however requests are batched.

Example:
    >>> import asyncio, async_search as asr
    >>> from async_search import problems, search
    >>> puzzle = problems.SlidingPuzzle(3)
    >>> ev = asr.immediate(problems.ManhattanHeuristic(puzzle))
    >>> r = asyncio.run(search.batched_astar(puzzle, puzzle.scramble(20, seed=0), ev,
    ...                                      budget=2000, buffer_size=16))
    >>> r.status.value, r.cost
    ('goal_found', 14)
"""

from async_search.search.accuracy import (MoveAccuracy, gumbel_chooser, mcts_chooser,
                                          move_accuracy, policy_chooser)
from async_search.search.astar import AStarResult, batched_astar
from async_search.search.base import Status
from async_search.search.continuous import continuous_astar
from async_search.search.gumbel import GumbelResult, gumbel_mcts
from async_search.search.puct import MCTSResult, mcts
from async_search.search.rollout import (MultiRolloutResult, RolloutResult, multi_rollout,
                                         rollout_seeds, simple_rollout)

__all__ = [
    "Status",
    "batched_astar", "continuous_astar", "AStarResult",
    "simple_rollout", "multi_rollout", "rollout_seeds", "RolloutResult",
    "MultiRolloutResult",
    "mcts", "MCTSResult", "gumbel_mcts", "GumbelResult",
    "move_accuracy", "MoveAccuracy", "policy_chooser", "mcts_chooser",
    "gumbel_chooser",
]
