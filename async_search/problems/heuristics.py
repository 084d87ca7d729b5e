"""NumPy heuristic models for the search problems: exact heuristics and a seeded MLP.

Every model here computes each row independently and exactly, so its output for an
element is bitwise the same whatever its batch-mates: a search run through a batching
server gives the same result as a search that calls the model directly.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from async_search.base import TensorSpec
from async_search.models import MLP
from async_search.models.numpy_models import float64_rows
from async_search.problems.base import SearchProblem
from async_search.problems.sliding_puzzle import SlidingPuzzle
from async_search.problems.synthetic_graph import SyntheticGraph


class ManhattanHeuristic:
    """The Manhattan distance of sliding-puzzle states, as a model over ``encode``'s output.

    It is the dot product of the one-hot ``[tile, position]`` encoding with a table of
    each tile's distance from its goal position, computed in float64 on small integers,
    so it is exact and row-independent. It is admissible and consistent: A* with weight
    1 and this model finds shortest solutions.

    Output: float32 ``[n, 1]``, the number of moves it at least takes to solve.

    Example:
        >>> puzzle = SlidingPuzzle(3)
        >>> h = ManhattanHeuristic(puzzle)
        >>> float(h(puzzle.encode([puzzle.goal]))[0, 0])
        0.0
    """

    def __init__(self, puzzle: SlidingPuzzle):
        if not isinstance(puzzle, SlidingPuzzle):
            raise TypeError(f"ManhattanHeuristic measures a SlidingPuzzle's tiles, got "
                            f"{type(puzzle).__name__}")
        size, n = puzzle.size, puzzle.num_cells
        self.input_spec = puzzle.input_spec
        self.output_spec = TensorSpec((1,), np.float32)
        table = np.zeros((n, n), np.float64)  # [tile, position] -> moves to the goal
        for tile in range(1, n):
            goal_row, goal_col = divmod(tile - 1, size)
            for p in range(n):
                row, col = divmod(p, size)
                table[tile, p] = abs(row - goal_row) + abs(col - goal_col)
        self._table = table.reshape(n * n, 1)

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        x = float64_rows(batch, self.input_spec.shape, flat=True)
        return (x @ self._table).astype(np.float32)

    @property
    def table(self) -> np.ndarray:
        """``[n * n, 1]``: each (tile, cell) one-hot entry's distance; h = x @ table."""
        return self._table


class DepthHeuristic:
    """A SyntheticGraph's remaining depth (``encode``'s first feature) as a model.

    Every goal of a SyntheticGraph is a leaf, so the remaining depth is the exact cost to
    the nearest goal below, when there is one: an admissible heuristic.
    Output: float32 ``[n, 1]``.

    Example:
        >>> graph = SyntheticGraph(branching=2, depth=5)
        >>> float(DepthHeuristic(graph)(graph.encode([graph.start()]))[0, 0])
        5.0
    """

    def __init__(self, graph: SyntheticGraph):
        self.input_spec = graph.input_spec
        self.output_spec = TensorSpec((1,), np.float32)

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return float64_rows(batch, self.input_spec.shape, flat=True)[:, :1].astype(np.float32)


def heuristic_mlp(problem: SearchProblem, *, hidden_sizes: Sequence[int] = (64,),
                  seed: int = 0) -> MLP:
    """A seeded, untrained MLP from ``problem.encode``'s output to one value ``[n, 1]``.

    Its outputs are deterministic and row-independent (see ``models.MLP``), not a useful
    heuristic; ``tf_nets.heuristic_tf_net`` with the same arguments computes bitwise the
    same outputs on TensorFlow.

    Example:
        >>> model = heuristic_mlp(SlidingPuzzle(3), hidden_sizes=(32,), seed=0)
        >>> model(np.zeros((2, 9, 9), np.float32)).shape
        (2, 1)
    """
    return MLP(problem.input_spec.shape, tuple(hidden_sizes), 1, seed)


class LearnedHeuristic:
    """A trained cost-to-go net for the sliding puzzle: ``max(0, base(x) + mlp(x))``.

    ``mlp`` is a ``models.MLP`` (trained weights on its exact grid) from ``encode``'s
    output to one value; ``base`` is the Manhattan distance when ``residual`` is true
    (the net then learns what Manhattan misses: linear conflicts, corners, the last
    moves), else 0. Both terms are exact and row-independent, so the output for an
    element does not depend on its batch-mates. ``training.Trainer`` makes these (see
    ``training.davi``); ``problems.pretrained("15-puzzle")`` returns one.

    Output: float32 ``[n, 1]``.

    Example:
        >>> puzzle = SlidingPuzzle(3)
        >>> h = LearnedHeuristic(puzzle, heuristic_mlp(puzzle, seed=0), residual=True)
        >>> h(puzzle.encode([puzzle.goal])).shape
        (1, 1)
    """

    def __init__(self, puzzle: SlidingPuzzle, mlp: MLP, *, residual: bool = True):
        self.puzzle = puzzle
        self.mlp = mlp
        self.residual = bool(residual)
        self.input_spec = puzzle.input_spec
        self.output_spec = TensorSpec((1,), np.float32)
        #: Manhattan, which the net corrects when ``residual`` (else None).
        self.base = ManhattanHeuristic(puzzle) if self.residual else None

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        h = self.mlp(batch).astype(np.float64)
        if self.base is not None:
            h = h + self.base(batch)
        return np.maximum(h, 0.0).astype(np.float32)
