"""The sliding-tile puzzle: the 8-puzzle (size 3) and the 15-puzzle (size 4)."""

from __future__ import annotations

import functools
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

from async_search.base import TensorSpec
from async_search.checks import check_int, is_int


class SlidingPuzzle:
    """The ``size`` x ``size`` sliding-tile puzzle as a search problem with unit step costs.

    A state is ``bytes`` of length ``size * size``: ``state[p]`` is the tile at position
    ``p`` (row-major), tile 0 is the blank. The goal is ``1, 2, ..., size*size - 1, 0``.
    A move slides a tile next to the blank into it. ``encode`` gives, for each state, the
    one-hot matrix ``x[tile, position]`` as float32 of shape ``(size*size, size*size)``.

    Args:
        size: the side of the board; 3 is the 8-puzzle, 4 the 15-puzzle.

    Raises:
        ValueError: if ``size`` is not an integer from 2 to 8.

    Example:
        >>> puzzle = SlidingPuzzle(3)
        >>> start = puzzle.scramble(20, seed=0)
        >>> len(puzzle.neighbors(start)) in (2, 3, 4)
        True
        >>> puzzle.encode([start]).shape
        (1, 9, 9)
    """

    def __init__(self, size: int = 3):
        if not is_int(size) or not 2 <= size <= 8:
            raise ValueError(f"SlidingPuzzle size must be an integer from 2 to 8 (3 is "
                             f"the 8-puzzle, 4 the 15-puzzle), got {size!r}")
        self.size = int(size)
        self.num_cells = n = self.size * self.size
        self.goal: bytes = bytes([*range(1, n), 0])
        self.input_spec = TensorSpec((n, n), np.float32)
        # For each blank position, the positions it can swap with, in a fixed order
        # (up, left, right, down) so that neighbours come out in a deterministic order.
        moves = []
        for p in range(n):
            r, c = divmod(p, self.size)
            adjacent = []
            if r > 0:
                adjacent.append(p - self.size)
            if c > 0:
                adjacent.append(p - 1)
            if c < self.size - 1:
                adjacent.append(p + 1)
            if r < self.size - 1:
                adjacent.append(p + self.size)
            moves.append(tuple(adjacent))
        self._moves: Tuple[Tuple[int, ...], ...] = tuple(moves)
        self._tiles = np.arange(n, dtype=np.uint8)
        self._keys: Optional[PuzzleKeys] = None

    def __repr__(self) -> str:
        return f"SlidingPuzzle({self.size})"

    # -- states ---------------------------------------------------------------------------

    def state(self, tiles: Iterable[int]) -> bytes:
        """The state with ``tiles`` (row-major, 0 the blank), checked.

        Raises:
            ValueError: if the tiles are not a solvable arrangement of ``0..size*size-1``.
        """
        try:
            values = list(tiles)
            if isinstance(tiles, str) or not all(is_int(t) for t in values):
                raise TypeError("not integers")  # int() would round 1.9 down, read "1"
            state = bytes(int(t) for t in values)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{self!r}: tiles must be integers 0..{self.num_cells - 1}, "
                             f"got {tiles!r}") from e
        self.check_state(state)
        return state

    def check_state(self, state: bytes) -> None:
        """Raise ValueError unless ``state`` is a well-formed, solvable state.

        Raises:
            ValueError: naming the puzzle and the fix, if ``state`` is not ``bytes``, has
                the wrong length, is not a permutation of the tiles, or is unsolvable.
        """
        if not self.is_solvable(state):
            raise ValueError(f"{self!r}: state {tuple(state)} is unsolvable (its "
                             f"permutation parity cannot reach the goal); swap two "
                             f"non-blank tiles, or start from puzzle.scramble(moves, seed)")

    def _check_tiles(self, state: bytes) -> None:
        """ValueError unless ``state`` is bytes holding each tile once (of this size)."""
        n = self.num_cells
        if not isinstance(state, bytes):
            raise ValueError(f"{self!r}: a state must be bytes of length {n}; build one "
                             f"with puzzle.state(tiles) or puzzle.scramble(moves, seed), "
                             f"got {type(state).__name__} {state!r}")
        if len(state) != n or sorted(state) != list(range(n)):
            raise ValueError(f"{self!r}: a state must hold each tile 0..{n - 1} exactly "
                             f"once, got {tuple(state)}")

    def is_solvable(self, state: bytes) -> bool:
        """Whether the goal is reachable from ``state``.

        Raises:
            ValueError: ``state`` is not a permutation of this puzzle's tiles.
        """
        self._check_tiles(state)
        tiles = [t for t in state if t]
        inversions = sum(1 for i, a in enumerate(tiles) for b in tiles[i + 1:] if a > b)
        if self.size % 2:
            return inversions % 2 == 0
        # Even width: a vertical move changes the inversion count by size - 1 (odd) and
        # the blank's row by one, so inversions + blank row keeps its parity (the goal's).
        blank_row = state.index(0) // self.size
        return (inversions + blank_row) % 2 == (self.size - 1) % 2

    def scramble(self, moves: int, seed: int) -> bytes:
        """The state ``moves`` random moves away from the goal, never undoing the last.

        Deterministic given ``seed``; always solvable.

        Raises:
            ValueError: if ``moves`` is negative.
        """
        moves = check_int(f"{self!r}.scramble: moves", moves, minimum=0)
        # None (fresh entropy) would scramble anew at every call
        rng = np.random.default_rng(check_int(f"{self!r}.scramble: seed", seed, minimum=0))
        cells = bytearray(self.goal)
        blank = self.num_cells - 1
        previous = -1
        for _ in range(int(moves)):
            choices = [p for p in self._moves[blank] if p != previous]
            p = choices[int(rng.integers(len(choices)))]
            cells[blank], cells[p] = cells[p], 0
            previous, blank = blank, p
        return bytes(cells)

    # -- the search problem ---------------------------------------------------------------

    def neighbors(self, state: bytes) -> List[Tuple[bytes, int]]:
        """The states one move away, each with step cost 1, in a fixed order.

        Raises:
            ValueError: ``state`` is not bytes of this puzzle's length (one of another
                size would get moves of the wrong board).
        """
        if not isinstance(state, bytes) or len(state) != self.num_cells:
            self._check_tiles(state)
        blank = state.index(0)
        out = []
        for p in self._moves[blank]:
            cells = bytearray(state)
            cells[blank] = cells[p]
            cells[p] = 0
            out.append((bytes(cells), 1))
        return out

    def is_goal(self, state: bytes) -> bool:
        """Whether ``state`` is the goal.

        Raises:
            ValueError: ``state`` is not bytes of this puzzle's length.
        """
        if not isinstance(state, bytes) or len(state) != self.num_cells:
            self._check_tiles(state)
        return state == self.goal

    def encode(self, states: Sequence[bytes]) -> np.ndarray:
        """One-hot tile positions: float32 ``[len(states), tile, position]``."""
        n = self.num_cells
        for state in states:
            if not isinstance(state, bytes) or len(state) != n:
                self._check_tiles(state)
        cells = np.frombuffer(b"".join(states), np.uint8).reshape(len(states), n)
        return (cells[:, None, :] == self._tiles[None, :, None]).astype(np.float32)

    def compact_keys(self) -> Optional["PuzzleKeys"]:
        """The puzzle's states as ints for A* (``problems.base.CompactKeys``), for sizes
        up to 4; None for larger boards (A* then works on the ``bytes`` states), and
        for a subclass that changes the rules the keys stand for (its own ``neighbors``,
        ``is_goal`` or ``encode``): A* then calls those."""
        cls = type(self)
        if self.num_cells > 16 or (cls.neighbors is not SlidingPuzzle.neighbors
                                   or cls.is_goal is not SlidingPuzzle.is_goal
                                   or cls.encode is not SlidingPuzzle.encode):
            return None
        if self._keys is None:
            self._keys = PuzzleKeys(self)
        return self._keys

    def decode(self, x: np.ndarray) -> List[bytes]:
        """The states of an encoded batch ``[k, tile, position]`` (inverse of encode)."""
        return [bytes(row) for row in np.argmax(x, axis=1).astype(np.uint8)]

    def manhattan_distance(self, state: bytes) -> int:
        """Sum over tiles of the grid distance to their goal positions (a lower bound).

        Raises:
            ValueError: ``state`` is not a permutation of this puzzle's tiles.
        """
        self._check_tiles(state)
        total = 0
        for p, t in enumerate(state):
            if t:
                r, c = divmod(p, self.size)
                gr, gc = divmod(t - 1, self.size)
                total += abs(r - gr) + abs(c - gc)
        return total


@functools.lru_cache(maxsize=None)
def _key_tables(size: int) -> Tuple[tuple, np.ndarray]:
    """PuzzleKeys' tables for a ``size`` x ``size`` board (built once a size).

    ``moves[b][q]``: the moves of a blank at b, without the one back to q (q = b: none
    left out), each as (shift of the position p the blank moves to, in the upper half
    of a key; xor table by the tile t there); the move puts t at b and the blank at p.
    ``rows[v]``: for a byte v of a key's lower half (the positions of two tiles), the
    one-hot rows of those two tiles, as ``encode`` lays them out.
    """
    n = size * size
    half = 4 * n
    adjacent = SlidingPuzzle(size)._moves
    move = {(b, p): (half + 4 * p, tuple(
        (b ^ p) ^ ((p ^ b) << 4 * t)                # the blank's and t's positions
        ^ (t << half + 4 * p) ^ (t << half + 4 * b)  # the tiles at p and b
        for t in range(16))) for b in range(n) for p in adjacent[b]}
    moves = tuple(tuple(tuple(move[b, p] for p in adjacent[b] if p != q) for q in range(n))
                  for b in range(n))
    rows = np.zeros((256, 2, n), np.float32)
    for v in range(256):
        for r, position in enumerate((v & 15, v >> 4)):
            if position < n:
                rows[v, r, position] = 1
    rows.flags.writeable = False
    return moves, rows


class PuzzleKeys:
    """A sliding puzzle's states as ints, for A* (``problems.base.CompactKeys``).

    A key holds, in 4 bits each, the position of every tile (tile 0, the blank, in the
    low 4 bits), then, above them, the tile at every position: ``n`` x 8 bits, 128 for
    the 15-puzzle. A move is one table lookup and one xor (the blank's position is the
    key's low 4 bits, the moved tile is read from the upper half), and the one-hot
    ``[tile, position]`` rows sent to the model come straight from the lower half: a
    row per tile, picked from an identity matrix by the tile's position.

    Example:
        >>> puzzle = SlidingPuzzle(3)
        >>> keys = puzzle.compact_keys()
        >>> keys.state(keys.key(puzzle.goal)) == puzzle.goal
        True
        >>> goal = keys.key(puzzle.goal)
        >>> children, counts = keys.expand([goal], [goal])  # no parent to leave out
        >>> neighbors = [s for s, _ in puzzle.neighbors(puzzle.goal)]
        >>> [keys.state(c) for c in children] == neighbors
        True
    """

    step_cost = 1

    def __init__(self, puzzle: SlidingPuzzle):
        n = puzzle.num_cells
        if n > 16:
            raise ValueError(f"{puzzle!r}: compact keys hold at most 16 cells")
        self.puzzle = puzzle
        self._n = n
        self._half = half = 4 * n  # bits of the lower half: the tiles' positions
        self._low = (1 << half) - 1
        self.goal_keys = frozenset({self.key(puzzle.goal)})
        self._moves, self._rows = _key_tables(puzzle.size)
        self._bytes = (n + 1) // 2

    def __repr__(self) -> str:
        return f"PuzzleKeys({self.puzzle!r})"

    def key(self, state: bytes) -> int:
        """The key of ``state`` (assumed valid: see ``SlidingPuzzle.check_state``)."""
        key = 0
        for p, t in enumerate(state):
            key |= (p << 4 * t) | (t << self._half + 4 * p)
        return key

    def state(self, key: int) -> bytes:
        """The ``bytes`` state of ``key``."""
        return bytes((key >> self._half + 4 * p) & 15 for p in range(self._n))

    def expand(self, keys: Sequence[int], parents: Sequence[int]) -> Tuple[List[int],
                                                                              List[int]]:
        """The children of each key, in ``neighbors`` order, without its parent."""
        moves = self._moves
        children: List[int] = []
        counts: List[int] = []
        count = counts.append
        for key, parent in zip(keys, parents):
            row = moves[key & 15][parent & 15]
            # Unrolled by the number of moves (the loop is the search's hottest).
            n = len(row)
            if n == 2:
                (s0, t0), (s1, t1) = row
                children += (key ^ t0[(key >> s0) & 15], key ^ t1[(key >> s1) & 15])
            elif n == 3:
                (s0, t0), (s1, t1), (s2, t2) = row
                children += (key ^ t0[(key >> s0) & 15], key ^ t1[(key >> s1) & 15],
                             key ^ t2[(key >> s2) & 15])
            else:
                children += [key ^ table[(key >> shift) & 15] for shift, table in row]
            count(n)
        return children, counts

    def encode(self, keys: Sequence[int]) -> np.ndarray:
        """``SlidingPuzzle.encode`` of the keys' states, without building them."""
        low, k, n, nb = self._low, len(keys), self._n, self._bytes
        positions = np.array([key & low for key in keys], np.uint64).view(np.uint8)
        if nb < 8:
            positions = positions.reshape(k, 8)[:, :nb]
        # x[i, tile, :] is the one-hot row of the tile's position, two tiles a byte.
        x = self._rows.take(positions, 0).reshape(k, 2 * nb, n)
        return x if 2 * nb == n else x[:, :n].copy()
