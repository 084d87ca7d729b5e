"""Threat planes: Connect Four's encoded planes plus, for each player, the empty cells
where a stone would make four in a row.

An MLP on the raw stones must learn every one of the 69 lines of four by itself, and it
generalises poorly from its own games to others (``benchmarks/net_inputs.py``). These
two planes are the game's own rule applied one move ahead, computed exactly from the
stones, so the net that reads them (``NetConfig(features="threats")``) needs no search
to see a win at once or a win to block; whether the cell is playable now it still reads
from the stones.

``FeaturedNet`` serves such a net: it takes the game's encoded planes (its input spec is
the game's) and adds the threat planes before its body, so every caller, search and
server sees the same input as for any other net.

Example:
    >>> from async_search.problems import ConnectFour
    >>> game = ConnectFour()
    >>> state = game.from_moves([0, 6, 1, 6, 2])   # X has three in the bottom row
    >>> planes = threat_planes(game.encode([state]))
    >>> planes.shape
    (1, 4, 6, 7)
    >>> planes[0, 3, 0].tolist()    # O to move: X (the waiting player) wins on cell 3
    [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
"""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from async_search.base import TensorSpec


ROWS, COLUMNS, LINE = 6, 7, 4
#: The planes a featured net reads: the game's two, then the two threat planes.
THREAT_PLANES = 4


def _line_cells() -> Tuple[Tuple[Tuple[slice, slice], ...], ...]:
    """Each direction of the lines of four as slices: for each offset k along a line,
    the (rows, columns) of the k-th cell of every line of that direction."""
    directions = []
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        rows = ROWS - (LINE - 1) * dr              # lines' first cells fit in these
        columns = COLUMNS - (LINE - 1) * abs(dc)
        first_column = (LINE - 1) if dc < 0 else 0
        directions.append(tuple(
            (slice(k * dr, k * dr + rows),
             slice(first_column + k * dc, first_column + k * dc + columns))
            for k in range(LINE)))
    return tuple(directions)


LINE_CELLS = _line_cells()


def threat_planes(planes: np.ndarray) -> np.ndarray:
    """float32 ``[n, 4, 6, 7]``: ``planes`` (``ConnectFour.encode``'s ``[n, 2, 6, 7]``,
    the player to move's stones, then the opponent's), then the empty cells where the
    player to move, then the opponent, would complete a line of four. Exact (counts of
    stones), and the same for a row whatever its batch-mates."""
    x = np.asarray(planes, np.float32)
    if x.ndim != 4 or x.shape[1:] != (2, ROWS, COLUMNS):
        raise ValueError(f"threat_planes takes Connect Four planes [n, 2, {ROWS}, "
                         f"{COLUMNS}], got shape {x.shape}")
    n = len(x)
    # Elementwise on the planes, a direction at a time (no matrix product: BLAS threads
    # stall when the cores are busy with self-play).
    stones = x > 0                                       # [n, 2, rows, columns]
    near = np.zeros_like(stones)
    for cells in LINE_CELLS:
        count = sum(stones[:, :, r, c].astype(np.int8) for r, c in cells)
        three = (count == 3) & (count[:, ::-1] == 0)     # three, and none of the foe's
        for r, c in cells:
            near[:, :, r, c] |= three
    empty = ~(stones[:, 0] | stones[:, 1])
    out = np.empty((n, THREAT_PLANES, ROWS, COLUMNS), np.float32)
    out[:, :2] = x
    out[:, 2:] = near & empty[:, None]
    return out


class FeaturedNet:
    """A net whose body reads the threat planes, served on the game's planes.

    Args:
        body: the model on ``[n, 4, 6, 7]`` (a ``PolicyValueMLP`` or
            ``PolicyValueConvNet`` made for that input).
        input_spec: the game's input spec (``[2, 6, 7]`` float32).
        net_config: the ``NetConfig`` it was made from (read by ``nets.config_of``).
    """

    def __init__(self, body: Any, input_spec: TensorSpec, net_config: Any = None):
        self.body = body
        self.input_spec = input_spec
        self.net_config = net_config

    def __call__(self, batch: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        return self.body(threat_planes(batch))
