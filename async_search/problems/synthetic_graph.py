"""A synthetic search tree with a tunable CPU cost per expansion, for benchmarks."""

from __future__ import annotations

import time
from typing import List, Sequence, Tuple

import numpy as np

from async_search.base import TensorSpec
from async_search.checks import check_float, check_int


_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a fast, well-spread 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _busy_wait(microseconds: float) -> None:
    # Spinning on the clock (not sleeping) keeps the CPU and the GIL busy, as real
    # expansion work would, and costs the same on any machine.
    end = time.perf_counter_ns() + int(microseconds * 1000)
    while time.perf_counter_ns() < end:
        pass


class SyntheticGraph:
    """A forest of uniform trees whose successors come from a hash, with a set CPU cost.

    A state is ``(level, node_id)``. A node at a level below ``depth`` has ``branching``
    children at the next level, whose ids are hashes of the parent's id, so the trees are
    deterministic given ``seed`` and cost no memory. Leaves (level ``depth``) are goals
    with probability about ``goal_fraction``; all steps cost 1, so every goal path costs
    ``depth``. Each call to ``neighbors`` spins for ``node_cost_us`` microseconds, so a
    benchmark can set the ratio of search CPU time to model time.

    ``encode`` gives float32 ``[num_features]`` per state: the remaining depth
    ``depth - level`` (an admissible, exact-cost-bound heuristic on its own; see
    ``problems.DepthHeuristic``), then the low ``num_features - 1`` bits of the id.

    Args:
        branching: children per inner node (>= 1).
        depth: the level of the leaves (>= 1).
        node_cost_us: busy CPU time per expansion, in microseconds (0 to 3.6e9: an
            hour).
        seed: selects the forest.
        goal_fraction: the chance that a leaf is a goal, in [0, 1].
        num_features: the width of ``encode``'s rows (>= 1).

    Example:
        >>> graph = SyntheticGraph(branching=3, depth=4, node_cost_us=0, seed=1)
        >>> start = graph.start(0)
        >>> [level for (level, _), cost in graph.neighbors(start)]
        [1, 1, 1]
    """

    def __init__(self, branching: int = 4, depth: int = 10, node_cost_us: float = 0.0,
                 seed: int = 0, *, goal_fraction: float = 0.05, num_features: int = 32):
        for name, value, low in (("branching", branching, 1), ("depth", depth, 1),
                                 ("num_features", num_features, 1)):
            check_int(f"SyntheticGraph {name}", value, minimum=low)
        # (at most an hour an expansion: beyond a float's range it failed in neighbors)
        check_float("SyntheticGraph node_cost_us", node_cost_us, minimum=0, maximum=3.6e9)
        check_float("SyntheticGraph goal_fraction", goal_fraction, minimum=0, maximum=1)
        check_int("SyntheticGraph seed", seed)  # 1.5 would be seed 1, silently
        self.branching = int(branching)
        self.depth = int(depth)
        self.node_cost_us = float(node_cost_us)
        self.seed = int(seed)
        self.goal_fraction = float(goal_fraction)
        self.num_features = int(num_features)
        self.input_spec = TensorSpec((self.num_features,), np.float32)
        self._salts = tuple(_mix64(self.seed * 1_000_003 + i + 1)
                            for i in range(self.branching))
        self._goal_threshold = int(self.goal_fraction * 2 ** 32)
        self._bit_shifts = np.arange(self.num_features - 1, dtype=np.uint64)

    def __repr__(self) -> str:
        return (f"SyntheticGraph(branching={self.branching}, depth={self.depth}, "
                f"node_cost_us={self.node_cost_us}, seed={self.seed})")

    def start(self, index: int = 0) -> Tuple[int, int]:
        """The root of tree number ``index`` (an integer) of the forest."""
        check_int("SyntheticGraph.start's index", index)
        return (0, _mix64(_mix64(self.seed) ^ int(index)))

    def check_state(self, state: Tuple[int, int]) -> None:
        """Raise ValueError unless ``state`` is a ``(level, node_id)`` pair of the graph."""
        if not (isinstance(state, tuple) and len(state) == 2
                and all(isinstance(v, int) for v in state)
                and 0 <= state[0] <= self.depth and 0 <= state[1] <= _MASK64):
            raise ValueError(f"{self!r}: a state must be a (level, node_id) pair with "
                             f"level in 0..{self.depth} and a 64-bit id; use "
                             f"graph.start(i), got {state!r}")

    def neighbors(self, state: Tuple[int, int]) -> List[Tuple[Tuple[int, int], int]]:
        """The children of ``state`` (none at the last level), each at cost 1."""
        if self.node_cost_us:
            _busy_wait(self.node_cost_us)
        level, node = state
        if level >= self.depth:
            return []
        return [((level + 1, _mix64(node ^ salt)), 1) for salt in self._salts]

    def is_goal(self, state: Tuple[int, int]) -> bool:
        """Whether ``state`` is a goal leaf."""
        return state[0] == self.depth and (state[1] >> 32) < self._goal_threshold

    def encode(self, states: Sequence[Tuple[int, int]]) -> np.ndarray:
        """float32 ``[len(states), num_features]``: remaining depth, then id bits."""
        levels = np.fromiter((s[0] for s in states), np.float32, len(states))
        ids = np.fromiter((s[1] for s in states), np.uint64, len(states))
        out = np.empty((len(states), self.num_features), np.float32)
        out[:, 0] = self.depth - levels
        out[:, 1:] = (ids[:, None] >> self._bit_shifts[None, :]) & np.uint64(1)
        return out
